//! Faults in the core sequencer's fold loop during a training GEMM (`seq.tile`,
//! `seq.acc_addr`).
//!
//! A training GEMM runs its folds ([`faultline_hw::mxu::Schedule`]) under the sequencer, as in
//! [`faultline_hw::op`]:
//! * `seq.tile`, the tile counter, is loaded with 0 when the GEMM issues, read at each fold
//!   slot's start and then incremented. The MXU executes the fold the counter names: that fold's
//!   activations, the weight tile then in that fold's weight-buffer slot (`fold mod slots`,
//!   [`crate::memfault::wbuf_slots`]), that fold's output rows, overwriting or adding as that
//!   fold does. A value past the last fold ends the loop: the remaining slots run nothing.
//! * `seq.acc_addr` is loaded with a fold's first output-row address when that row is written
//!   (WS: row `m` of a fold starting at `s` at `s + m + R + nc`; OS: row `i` at
//!   `s + period - 1 - i`, bottom row first) and advanced by `+N` (WS) / `-N` (OS) per row; the
//!   words of a row go to `acc_addr + j` in the memory the GEMM's result lives in. A narrower
//!   WS fold's rows can start before the previous fold's last: the address is then kept per
//!   fold, and a fault in the overlap changes both.
//!
//! The GEMM's timing does not change (the schedule is the program's). The effect is exact at
//! the words: the result the GEMM leaves (rows never written keep what their words held before,
//! partial sums added to the wrong rows), and the words its misdirected writes land in, which
//! every later read of them sees until they are rewritten. Values come from a fault-free run of
//! the step: the GEMM's operands and the words it overwrites are the same in the faulty run,
//! since nothing before the fault differs. A stuck-at that outlasts one GEMM changes the fold
//! loop of every GEMM it overlaps; the executor takes each later GEMM's values from the step
//! re-run with the earlier GEMMs' changes ([`crate::exec::Executor::step_with_fault`]). That
//! run keeps the words as stored, so one exception is not exact: a later struck GEMM reading,
//! as an operand, a word an earlier struck GEMM's misdirected write changed only for its
//! readers recomputes its fold loop from the word's stored value. A weight-buffer word no GEMM
//! of the step has written reads as 0 (the previous step's tiles are not tracked).

use crate::error::Result;
use crate::gemmfold::{fold_psum, row_times};
use crate::memfault::{tile_written, wbuf_slots, StepMap, WordHit, WordOp};
use faultline_hw::fault::ActiveFault;
use faultline_hw::fault::{addr_bits, DMA_ADDR_BITS, TILE_COUNTER_BITS};
use faultline_hw::isa::{self, Instr};
use faultline_hw::matrix::Matrix;
use faultline_hw::memory::dma::AddrReg;
use faultline_hw::mxu::Schedule;
use faultline_hw::{Dataflow, Register, Unit};
use faultline_num::{with_precision, MacFormat};
use std::collections::BTreeMap;

/// One fold slot of the loop as the sequencer ran it: the slot, the fold the tile counter
/// named, and each output row's (row, write cycle, first word address).
#[derive(Debug, Clone, PartialEq)]
struct Slot {
    slot: usize,
    fold: usize,
    rows: Vec<(usize, u64, u64)>,
}

/// The memory the result of GEMM `g` is written into, and the address of its element 0.
fn dest(m: &StepMap, g: usize) -> (Unit, u64) {
    let Instr::Gemm { out, .. } = &m.p.instrs[g] else { unreachable!("sequencer faults strike GEMMs") };
    let h = m.p.homes[out.buf.index()];
    (h.mem, h.base + out.offset as u64)
}

/// The fold loop of GEMM `g` with sequencer fault `f` (`None`: fault-free).
fn run_loop(m: &StepMap, g: usize, s: &Schedule, f: Option<ActiveFault>) -> Vec<Slot> {
    let (mem, base) = dest(m, g);
    let on = |r: Register| f.filter(|f| f.event.site.register == r).into_iter().collect::<Vec<_>>();
    let (tile_faults, acc_faults) = (on(Register::TileCounter), on(Register::AccAddr));
    let width = m.hw.memory.sram(mem).map_or(DMA_ADDR_BITS, |c| addr_bits(c.words()));
    let start = m.start(g);
    let n = s.n;
    let ws = s.dataflow == Dataflow::WeightStationary;
    let mut counter = AddrReg::new(0, TILE_COUNTER_BITS, start, &tile_faults);
    let mut slots = Vec::with_capacity(s.folds.len());
    for (q, fq) in s.folds.iter().enumerate() {
        let at = start + fq.start;
        let c = counter.use_at(at) as usize;
        counter.advance(1);
        let Some(fold) = s.folds.get(c) else { break };
        let times = row_times(s, c, at);
        let m0 = if ws { 0 } else { fold.m0 };
        let golden = |row: usize| base + ((m0 + row) * n + fold.n0) as u64;
        let mut reg = AddrReg::new(golden(times[0].0), width, times[0].1, &acc_faults);
        let mut rows = Vec::with_capacity(times.len());
        for (idx, &(row, t)) in times.iter().enumerate() {
            rows.push((row, t, reg.use_at(t)));
            if let Some(&(next, _)) = times.get(idx + 1) {
                reg.advance(golden(next) as i64 - golden(row) as i64);
            }
        }
        slots.push(Slot { slot: q, fold: c, rows });
    }
    slots
}

/// The cycles (from the GEMM's issue) in which a fault on `seq.tile` changes the fold loop of
/// a GEMM with schedule `s`: from its load at issue to its last read, at the last fold's start.
pub fn counter_window(s: &Schedule) -> std::ops::Range<u64> {
    0..s.folds.last().map_or(0, |f| f.start)
}

/// The cycles (from the GEMM's issue) in which fold `c` of `s` uses `seq.acc_addr`: from its
/// first result-row write (the register's load) to its last.
pub fn row_window(s: &Schedule, c: usize) -> std::ops::Range<u64> {
    let t = row_times(s, c, s.folds[c].start);
    t.first().map_or(0, |f| f.1)..t.last().map_or(0, |l| l.1)
}

/// Whether sequencer fault `f` changes the fold loop of GEMM `g` (a fold run out of turn or
/// a row written to another address): the first slot it changes and the fault's cycle from
/// that slot's start (saturating), or `None` when the fault is masked in the registers.
pub fn strikes(m: &StepMap, g: usize, f: ActiveFault) -> Result<Option<(usize, u64)>> {
    let Some(map) = m.gemm(g) else { return Ok(None) };
    let s = &map.s;
    let (golden, faulty) = (run_loop(m, g, s, None), run_loop(m, g, s, Some(f)));
    let first = (0..golden.len()).find(|&q| faulty.get(q) != Some(&golden[q]));
    Ok(first.map(|q| (q, f.start.saturating_sub(m.start(g) + s.folds[q].start))))
}

/// The words sequencer fault `f` in GEMM `g` changes, given the step's buffers `golden` as the
/// faulty run has them up to `g` (nothing released; the fault-free step's when `g` is the
/// first GEMM the fault strikes): the GEMM's result words that differ (written by `g`) and the
/// reads of other buffers' words its misdirected writes land in.
pub fn words(m: &StepMap, g: usize, f: ActiveFault, golden: &[Vec<u32>]) -> Result<Vec<WordHit>> {
    with_precision!(m.hw.mxu.precision(), F => words_typed::<F>(m, g, f, golden))
}

fn words_typed<F: MacFormat>(m: &StepMap, g: usize, f: ActiveFault, golden: &[Vec<u32>]) -> Result<Vec<WordHit>> {
    let ins = &m.p.instrs[g];
    let (&Instr::Gemm { out, m: gm, n, .. }, Some(map)) = (ins, m.gemm(g)) else { return Ok(Vec::new()) };
    let s = &map.s;
    let (am, bm) = isa::gemm_operands(m.hw, ins, golden)?.expect("a GEMM");
    let (mem, base) = dest(m, g);
    let len = (gm * n) as u64;
    // What a word held before this GEMM touched it: the value of the buffer living there (for
    // the result's own words, the one before the GEMM issued: the fault-free run's writes of
    // them are what this loop replaces).
    let before = m.start(g);
    let prior = |addr: u64, t: u64| {
        let t = if (base..base + len).contains(&addr) { before } else { t };
        m.holder(mem, addr, t).and_then(|(b, y)| golden[b.index()].get(y).copied()).unwrap_or(0)
    };
    // The words the loop writes: value and cycle of the last write.
    let mut written: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for sl in run_loop(m, g, s, Some(f)) {
        let fold = s.folds[sl.fold];
        let at = m.start(g) + s.folds[sl.slot].start;
        let w = weights(m, g, s, sl.fold, at, golden, &bm)?;
        let psum = fold_psum(m.hw, s, sl.fold, &am, &w)?;
        for (row, t, first) in sl.rows {
            for j in 0..fold.nc {
                let addr = first + j as u64;
                let p = psum.get(row, j);
                let v = if fold.overwrite {
                    p
                } else {
                    F::add(written.get(&addr).map_or_else(|| prior(addr, t), |w| w.0), p)
                };
                written.insert(addr, (v, t));
            }
        }
    }
    let mut hits = Vec::new();
    // The result: words written, or left holding what was there before the GEMM.
    for e in 0..len {
        let v = written.get(&(base + e)).map_or_else(|| prior(base + e, before), |w| w.0);
        let elem = out.offset + e as usize;
        if golden[out.buf.index()].get(elem) != Some(&v) {
            hits.push(WordHit { written: true, ..WordHit::read(Some(g), out.buf, elem, WordOp::Bits(v)) });
        }
    }
    // Misdirected writes: every read of the word's holder until its next write sees them.
    for (&addr, &(v, t)) in written.range(..base).chain(written.range(base + len..)) {
        if let Some((b, y)) = m.holder(mem, addr, t) {
            hits.extend(m.reads_after(b, y, t, WordOp::Bits(v)));
        }
    }
    Ok(hits)
}

/// The weights fold `c` of GEMM `g` multiplies by when it runs at cycle `at`: the words of its
/// weight-buffer slot (`c mod slots`) then, each from the latest tile written there at or
/// before `at` by any GEMM of the step that covers it (0 if none), in the MXU input format.
fn weights(m: &StepMap, g: usize, s: &Schedule, c: usize, at: u64, golden: &[Vec<u32>], bg: &Matrix) -> Result<Matrix> {
    let (_, slots) = wbuf_slots(m.hw);
    let slot = c as u64 % slots;
    let fold = s.folds[c];
    // Tiles written into the slot by `at`, newest first: (write cycle, GEMM, fold).
    let mut tiles: Vec<(u64, usize, usize)> = Vec::new();
    for h in 0..m.p.instrs.len() {
        let Some(sh) = m.gemm(h).map(|x| &x.s) else { continue };
        if m.start(h) > at {
            continue;
        }
        for f in (0..sh.folds.len()).filter(|&f| f as u64 % slots == slot) {
            let t = m.start(h) + tile_written(sh, f);
            if t <= at {
                tiles.push((t, h, f));
            }
        }
    }
    tiles.sort_by(|x, y| y.cmp(x));
    // Only the tiles that cover some word of this fold's extent matter: the newest first.
    let mut operands: BTreeMap<usize, Matrix> = BTreeMap::new();
    let mut w = Matrix::zeros(fold.kr, fold.nc);
    let mut set = vec![false; fold.kr * fold.nc];
    for (_, h, f) in tiles {
        if set.iter().all(|&x| x) {
            break;
        }
        let tf = m.gemm(h).expect("tiles come from GEMMs").s.folds[f];
        if !operands.contains_key(&h) && h != g {
            let (_, b) = isa::gemm_operands(m.hw, &m.p.instrs[h], golden)?.expect("a GEMM");
            operands.insert(h, b);
        }
        let b = if h == g { bg } else { &operands[&h] };
        for i in 0..fold.kr.min(tf.kr) {
            for j in 0..fold.nc.min(tf.nc) {
                if !set[i * fold.nc + j] {
                    set[i * fold.nc + j] = true;
                    w.set(i, j, b.get(tf.k0 + i, tf.n0 + j));
                }
            }
        }
    }
    Ok(w)
}
