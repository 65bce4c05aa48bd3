//! A training GEMM fold by fold, as the sequencer runs it ([`faultline_hw::mxu::Schedule`]):
//! when each operand word is read from its SRAM and each result word written, and the GEMM
//! recomputed fold by fold with some of those reads changed.
//!
//! From the GEMM's issue `S`, fold `c` starts at `T = S + fold.start`. The array's reads and
//! writes are [`faultline_hw::mxu::access`]'s, the same that `faultline op` moves words by:
//! * `A[m][k]` is read at `T + a_read` by every fold that covers it (WS: once per column tile,
//!   OS and IS: once per fold of its row tile that covers `k`).
//! * `W[k][n]` is read from its SRAM into the weight buffer when its fold's tile is written
//!   there ([`crate::inject::memory::WbufSlots::written`]), by every fold that multiplies by it.
//! * Result words are written line by line at `T + ` the line's cycle (WS rows top first, OS
//!   rows bottom first, IS columns); a fold that adds to earlier K folds reads the word in the
//!   same cycle, before writing it back.
//!
//! [`run`] recomputes a GEMM this way: every output a changed read reaches through its folds in
//! order (each fold's partial sum from the operands that fold read, added to the accumulator
//! word as the fold read it); every other output is the fault-free GEMM's, which the same
//! recomputation gives when no read is changed.

use crate::error::Result;
use crate::inject::memory::{self, WbufSlots, WordHit};
use faultline_hw::isa::{self, Instr, MatOperand};
use faultline_hw::matrix::Matrix;
use faultline_hw::mxu::{self, Schedule};
use faultline_hw::{ExecMode, FaultSchedule, HwConfig};
use faultline_num::{with_precision, MacFormat};
use std::collections::{BTreeMap, BTreeSet};

/// The (row, column) of element `idx` of an operand stored as `rows x cols` (transposed:
/// `[cols][rows]`).
fn coords(o: &MatOperand, idx: usize, rows: usize, cols: usize) -> (usize, usize) {
    if o.transposed {
        (idx % rows, idx / rows)
    } else {
        (idx / cols, idx % cols)
    }
}

/// The buffer element holding `(row, col)` of an operand stored as `rows x cols` (transposed:
/// `[cols][rows]`): the inverse of [`coords`].
pub(crate) fn element(o: &MatOperand, row: usize, col: usize, rows: usize, cols: usize) -> usize {
    o.offset + if o.transposed { col * rows + row } else { row * cols + col }
}

/// One GEMM instruction of a step and its fold schedule, issued at `start`.
#[derive(Debug, Clone)]
pub struct GemmMap<'a> {
    ins: &'a Instr,
    /// The fold schedule.
    pub s: Schedule,
    /// Issue cycle.
    pub start: u64,
    /// Its weight-buffer tile slots.
    pub wbuf: WbufSlots,
}

impl<'a> GemmMap<'a> {
    /// The map of `ins` issued at `start` (`None` if it is not a GEMM).
    pub fn new(hw: &HwConfig, ins: &'a Instr, start: u64) -> Result<Option<GemmMap<'a>>> {
        let Instr::Gemm { m, k, n, acc, .. } = *ins else { return Ok(None) };
        let s = Schedule::new(&hw.mxu, m, k, n)?;
        let s = if acc { s.accumulating() } else { s };
        Ok(Some(GemmMap { ins, wbuf: WbufSlots::new(hw, &s), s, start }))
    }

    fn operands(&self) -> (&MatOperand, &MatOperand, isa::Dest) {
        let Instr::Gemm { a, b, out, .. } = self.ins else { unreachable!("a GemmMap holds a GEMM") };
        (a, b, *out)
    }

    /// The reads of element `x` of buffer `buf` as an operand: (cycle, fold), in fold order.
    pub fn reads(&self, buf: isa::BufId, x: usize) -> Vec<(u64, usize)> {
        let (a, b, _) = self.operands();
        let s = &self.s;
        let mut v = Vec::new();
        if a.buf == buf && x >= a.offset && x - a.offset < s.m * s.k {
            let (mm, kk) = coords(a, x - a.offset, s.m, s.k);
            let at = |c: usize| s.a_read(c, mm, kk).map(|t| (self.start + s.folds[c].start + t, c));
            v.extend((0..s.folds.len()).filter_map(at));
        }
        if b.buf == buf && x >= b.offset && x - b.offset < s.k * s.n {
            let (kk, nn) = coords(b, x - b.offset, s.k, s.n);
            let read = |c: &usize| s.w_read(*c, kk, nn).is_some();
            v.extend((0..s.folds.len()).filter(read).map(|c| (self.start + self.wbuf.written(s, c), c)));
        }
        v
    }

    /// The writes of result element `e` (from the destination's first word): (cycle, fold,
    /// whether the fold reads the word first to add to it), in fold order.
    pub fn writes(&self, e: usize) -> Vec<(u64, usize, bool)> {
        let s = &self.s;
        let (mm, nn) = (e / s.n, e % s.n);
        let at = |(c, f): (usize, &faultline_hw::mxu::Fold)| {
            s.result_write(c, mm, nn).map(|t| (self.start + f.start + t, c, !f.overwrite))
        };
        s.folds.iter().enumerate().filter_map(at).collect()
    }
}

/// The partial sums of fold `c` of `s`: the rows and columns of `A` the fold reads
/// (`A[m0..m0+mr][k0..k0+kr]`) times `w` (the fold's `kr x nc` weights).
pub fn fold_psum(hw: &HwConfig, s: &Schedule, c: usize, am: &Matrix, w: &Matrix) -> Result<Matrix> {
    let f = s.folds[c];
    let a = Matrix::from_fn(f.mr, f.kr, |i, j| am.get(f.m0 + i, f.k0 + j));
    Ok(mxu::gemm(hw, &a, w, ExecMode::Functional, &FaultSchedule::none())?.out)
}

/// Runs GEMM `ins` on `bufs` fold by fold, with the reads `hits` name (each with its fold)
/// changed: an operand word as that fold reads it, or a result word as a later K fold reads it
/// to add to it. Writes the result; returns the GEMM's cycles and each changed read's
/// (fault-free, changed) raw word.
pub fn run(hw: &HwConfig, ins: &Instr, bufs: &mut [Vec<u32>], hits: &[&WordHit]) -> Result<(u64, Vec<(u32, u32)>)> {
    with_precision!(hw.mxu.precision(), F => run_typed::<F>(hw, ins, bufs, hits))
}

fn run_typed<F: MacFormat>(
    hw: &HwConfig,
    ins: &Instr,
    bufs: &mut [Vec<u32>],
    hits: &[&WordHit],
) -> Result<(u64, Vec<(u32, u32)>)> {
    let map = GemmMap::new(hw, ins, 0)?.expect("gemm_fold::run runs GEMMs");
    let (a, b, out) = map.operands();
    let s = &map.s;
    let (am, bm) = isa::gemm_operands(hw, ins, bufs)?.expect("a GEMM");
    let fmt = hw.mxu.input_format;
    // The accumulators before the first fold: what an accumulating GEMM adds to.
    let init = isa::accumulators(ins, bufs)?;
    // Every output no changed read reaches is the fault-free GEMM's.
    let mut res = mxu::gemm_into(hw, &am, &bm, init.as_ref(), ExecMode::Functional, &FaultSchedule::none())?.out;
    let mut seen = Vec::new();
    // Per fold, the operand values its changed reads see (converted as the MXU's input
    // converter does; keyed (fold, row, k) for `A`, (fold, column, k) for `B`), and the outputs
    // those reach.
    let (mut a_seen, mut w_seen) = (BTreeMap::new(), BTreeMap::new());
    let mut reached = BTreeSet::new();
    // Operand reads, each once with its hits composed (the accumulator's are applied below, to
    // the partial sum as the fold reads it).
    let operand = |h: &&WordHit| h.buf != out.buf || h.elem < out.offset || h.elem - out.offset >= s.m * s.n;
    let reads = memory::compose(hits.iter().copied().filter(operand).enumerate(), bufs, fmt);
    for h in hits.iter().filter(|h| !operand(h) && h.part.is_some()) {
        let e = h.elem - out.offset;
        reached.insert((e / s.n, e % s.n));
    }
    for (_, h, old, new) in reads {
        let Some(c) = h.part else { continue };
        let f = s.folds[c];
        seen.push((old, new));
        let input = isa::to_input(fmt, new);
        if h.buf == a.buf && h.elem >= a.offset && h.elem - a.offset < s.m * s.k {
            let (mm, kk) = coords(a, h.elem - a.offset, s.m, s.k);
            a_seen.insert((c, mm, kk), input);
            reached.extend((f.n0..f.n0 + f.nc).map(|nn| (mm, nn)));
        }
        if h.buf == b.buf && h.elem >= b.offset && h.elem - b.offset < s.k * s.n {
            let (kk, nn) = coords(b, h.elem - b.offset, s.k, s.n);
            w_seen.insert((c, nn, kk), input);
            reached.extend((f.m0..f.m0 + f.mr).map(|mm| (mm, nn)));
        }
    }
    // Each reached output through its folds in order: the fold's partial sum from the operands
    // it read, added to the accumulator word as the fold read it.
    for (mm, nn) in reached {
        let e = mm * s.n + nn;
        let mut v = init.as_ref().map_or(0, |c| c.get(mm, nn));
        for (c, f) in s.folds.iter().enumerate() {
            if !(f.n0..f.n0 + f.nc).contains(&nn) || !(f.m0..f.m0 + f.mr).contains(&mm) {
                continue;
            }
            // The changed operands this fold reads for this output (keys ordered so that each
            // is one range; almost always empty).
            let a_row: Vec<(usize, u32)> =
                a_seen.range((c, mm, 0)..=(c, mm, usize::MAX)).map(|(&(_, _, kk), &v)| (kk, v)).collect();
            let w_col: Vec<(usize, u32)> =
                w_seen.range((c, nn, 0)..=(c, nn, usize::MAX)).map(|(&(_, _, kk), &v)| (kk, v)).collect();
            let seen_at = |v: &[(usize, u32)], kk: usize| v.iter().find(|p| p.0 == kk).map(|p| p.1);
            let ps = (f.k0..f.k0 + f.kr).fold(0, |ps, kk| {
                let x = seen_at(&a_row, kk).unwrap_or_else(|| am.get(mm, kk));
                let y = seen_at(&w_col, kk).unwrap_or_else(|| bm.get(kk, nn));
                F::mac(ps, x, y)
            });
            v = if f.overwrite {
                ps
            } else {
                let elem = out.offset + e;
                // This fold's read of the word: its hits in turn, seen once.
                let old = v;
                for h in hits.iter().filter(|h| h.part == Some(c) && h.buf == out.buf && h.elem == elem) {
                    v = memory::apply(h.source, v, bufs, fmt);
                }
                if v != old {
                    seen.push((old, v));
                }
                F::add(v, ps)
            };
        }
        res.set(mm, nn, v);
    }
    isa::write_result(ins, bufs, out, res.data)?;
    Ok((isa::cycles(hw, ins), seen))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::memory::WordSource;
    use faultline_hw::isa::{BufId, Dest};
    use faultline_hw::Dataflow;
    use faultline_num::Precision;
    use proptest::prelude::*;

    /// `out = A * B` with `A` in buffer 0 (maybe transposed), `B` in buffer 1, `out` in 2.
    fn gemm(m: usize, k: usize, n: usize, at: bool) -> Instr {
        let op = |b: u32, transposed: bool| MatOperand { buf: BufId(b), offset: 0, transposed };
        Instr::Gemm { a: op(0, at), b: op(1, false), out: Dest::whole(BufId(2)), m, k, n, acc: false }
    }

    fn values(len: usize, seed: u64) -> Vec<u32> {
        (0..len as u64).map(|i| (((i * 7919 + seed * 104729) % 2001) as f32 / 400.0 - 2.5).to_bits()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Fold by fold with nothing changed is the GEMM, to the bit; an operand word (of `A`
        /// or of `B`) changed in one fold changes only that fold's outputs, exactly as the
        /// whole GEMM with that word changed does there.
        #[test]
        fn folds_are_the_gemm_and_a_changed_read_reaches_only_its_fold(
            m in 1usize..11, k in 1usize..11, n in 1usize..11, os in any::<bool>(), at in any::<bool>(),
            seed in 0u64..1000, pick in 0usize..1000, of_b in any::<bool>(),
        ) {
            let df = if os { Dataflow::OutputStationary } else { Dataflow::WeightStationary };
            let hw = HwConfig::test_config(4, 4, df, Precision::Bf16Fp32);
            let ins = gemm(m, k, n, at);
            let bufs = vec![values(m * k, seed), values(k * n, seed + 1), Vec::new()];
            let mut golden = bufs.clone();
            isa::execute(&hw, &ins, &mut golden, ExecMode::Functional, &FaultSchedule::none()).unwrap();
            let mut folds = bufs.clone();
            run(&hw, &ins, &mut folds, &[]).unwrap();
            prop_assert_eq!(&folds[2], &golden[2]);

            // Change element `x` of `A` (or `B`) in one of the folds that read it.
            let b = usize::from(of_b);
            let x = pick % bufs[b].len();
            let map = GemmMap::new(&hw, &ins, 0).unwrap().unwrap();
            let reads = map.reads(BufId(b as u32), x);
            prop_assert!(!reads.is_empty());
            let (_, c) = reads[pick % reads.len()];
            let new = (f32::from_bits(bufs[b][x]) * 3.0 + 1.0).to_bits();
            let hit = WordHit { part: Some(c), ..WordHit::read(Some(0), BufId(b as u32), x, WordSource::Bits(new)) };
            let mut one = bufs.clone();
            let (_, seen) = run(&hw, &ins, &mut one, &[&hit]).unwrap();
            prop_assert_eq!(seen, vec![(bufs[b][x], new)]);
            let mut whole = bufs.clone();
            whole[b][x] = new;
            isa::execute(&hw, &ins, &mut whole, ExecMode::Functional, &FaultSchedule::none()).unwrap();
            let f = map.s.folds[c];
            for e in 0..m * n {
                let (r, col) = (e / n, e % n);
                let in_fold = (f.m0..f.m0 + f.mr).contains(&r) && (f.n0..f.n0 + f.nc).contains(&col);
                let want = if in_fold { whole[2][e] } else { golden[2][e] };
                prop_assert_eq!(one[2][e], want, "element {} (fold {} of {:?})", e, c, f);
            }
        }

        /// A result word changed as a later K fold of a WS GEMM reads it to add to it: that
        /// output is the GEMM cut at the fold's K, with the word changed between the two
        /// parts (the cut is exact at fold boundaries); every other output is unchanged.
        #[test]
        fn a_changed_accumulator_read_reaches_only_its_output(
            m in 1usize..9, k in 5usize..13, n in 1usize..9, seed in 0u64..1000, pick in 0usize..1000,
        ) {
            let hw = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
            let ins = gemm(m, k, n, false);
            let bufs = vec![values(m * k, seed), values(k * n, seed + 1), Vec::new()];
            let map = GemmMap::new(&hw, &ins, 0).unwrap().unwrap();
            // A fold that adds (K from 4 on) and an output it writes.
            let adding: Vec<usize> = (0..map.s.folds.len()).filter(|&c| !map.s.folds[c].overwrite).collect();
            let c = adding[pick % adding.len()];
            let f = map.s.folds[c];
            let e = (pick % m) * n + f.n0 + pick % f.nc;
            let flip = faultline_hw::fault::FaultEvent::flip(faultline_hw::FaultSite::word(faultline_hw::Unit::Acc, 0, 30), 0, 0);
            let op = WordSource::Fault(flip.activate(0));
            let hit = WordHit { part: Some(c), ..WordHit::read(Some(0), BufId(2), e, op) };
            let mut one = bufs.clone();
            one[2] = vec![0; m * n];
            let (_, seen) = run(&hw, &ins, &mut one, &[&hit]).unwrap();
            prop_assert_eq!(seen.len(), 1);
            // Independently: A[:, ..k0] * B[..k0, :], the word flipped, then += the rest.
            let mut golden = bufs.clone();
            isa::execute(&hw, &ins, &mut golden, ExecMode::Functional, &FaultSchedule::none()).unwrap();
            let (am, bm) = isa::gemm_operands(&hw, &ins, &bufs).unwrap().unwrap();
            let k0 = f.k0;
            let head = |r, cols| Matrix::from_fn(r, cols, |i, j| am.get(i, j));
            let first = mxu::gemm(&hw, &head(m, k0), &Matrix::from_fn(k0, n, |i, j| bm.get(i, j)), ExecMode::Functional, &FaultSchedule::none()).unwrap().out;
            let mut mid = first.clone();
            mid.set(e / n, e % n, first.get(e / n, e % n) ^ (1 << 30));
            let (a2, b2) = (Matrix::from_fn(m, k - k0, |i, j| am.get(i, k0 + j)), Matrix::from_fn(k - k0, n, |i, j| bm.get(k0 + i, j)));
            let rest = mxu::gemm_into(&hw, &a2, &b2, Some(&mid), ExecMode::Functional, &FaultSchedule::none()).unwrap().out;
            for x in 0..m * n {
                let want = if x == e { rest.data[x] } else { golden[2][x] };
                prop_assert_eq!(one[2][x], want, "element {} (fold {} of {:?})", x, c, f);
            }
        }
    }
}
