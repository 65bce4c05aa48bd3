//! Faults in the core sequencer's fold loop during a training GEMM (`seq.tile`,
//! `seq.acc_addr`).
//!
//! A training GEMM (and the GEMM of `faultline op`, which runs the same way) runs its folds
//! ([`faultline_hw::mxu::Schedule`]) under the sequencer:
//! * `seq.tile`, the tile counter, is loaded with 0 when the GEMM issues, read at each fold
//!   slot's start and then incremented. The MXU executes the fold the counter names: that fold's
//!   activations, the weight tile then in that fold's weight-buffer slot (`fold mod slots`,
//!   [`crate::inject::memory::WbufSlots`]), that fold's output lines, overwriting or adding as
//!   that fold does. A value past the last fold ends the loop: the remaining slots run nothing.
//! * `seq.acc_addr` is loaded with a fold's first result-line address when that line is
//!   written (the lines and their cycles are [`faultline_hw::mxu::access`]'s: WS rows top
//!   first, OS rows bottom first, IS columns) and advanced line to line (WS `+N`, OS `-N`, IS
//!   `+1`); element `j` of a line goes to `acc_addr + j` (IS: `acc_addr + j * N`) in the
//!   memory the GEMM's result lives in. A narrower WS fold's rows can start before the
//!   previous fold's last: the address is then kept per fold, and a fault in the overlap
//!   changes both.
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
use crate::inject::gemm_fold::fold_psum;
use crate::inject::memory::{StepMap, WordHit, WordSource};
use faultline_hw::fault::ActiveFault;
use faultline_hw::fault::{addr_bits, DMA_ADDR_BITS, TILE_COUNTER_BITS};
use faultline_hw::isa::{self, Instr};
use faultline_hw::matrix::Matrix;
use faultline_hw::memory::dma::AddrReg;
use faultline_hw::mxu::access::ResultLine;
use faultline_hw::mxu::Schedule;
use faultline_hw::{Register, Unit};
use faultline_num::{with_precision, MacFormat};
use std::collections::BTreeMap;

/// One fold slot of the loop as the sequencer ran it: the slot, the fold the tile counter
/// named, and each result line it wrote: (line, write cycle, first word address).
#[derive(Debug, Clone, PartialEq)]
struct Slot {
    slot: usize,
    fold: usize,
    lines: Vec<(ResultLine, u64, u64)>,
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
    let mut counter = AddrReg::new(0, TILE_COUNTER_BITS, start, &tile_faults);
    let mut slots = Vec::with_capacity(s.folds.len());
    for (q, fq) in s.folds.iter().enumerate() {
        let at = start + fq.start;
        let c = counter.use_at(at) as usize;
        counter.advance(1);
        if c >= s.folds.len() {
            break;
        }
        slots.push(Slot { slot: q, fold: c, lines: s.line_addresses(c, at, base, width, &acc_faults) });
    }
    slots
}

/// The cycles (from the GEMM's issue) in which a fault on `seq.tile` changes the fold loop of
/// a GEMM with schedule `s`: from its load at issue to its last read, at the last fold's start.
pub fn counter_window(s: &Schedule) -> std::ops::Range<u64> {
    0..s.folds.last().map_or(0, |f| f.start)
}

/// The cycles (from the GEMM's issue) in which fold `c` of `s` uses `seq.acc_addr`: from its
/// first result-line write (the register's load) to its last.
pub fn row_window(s: &Schedule, c: usize) -> std::ops::Range<u64> {
    let (lines, at) = (s.result_lines(c), s.folds[c].start);
    lines.first().map_or(0, |f| at + f.cycle)..lines.last().map_or(0, |l| at + l.cycle)
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
    let tiles = tiles(m);
    for sl in run_loop(m, g, s, Some(f)) {
        let fold = s.folds[sl.fold];
        let at = m.start(g) + s.folds[sl.slot].start;
        let w = weights(m, g, sl.fold, at, &tiles, golden, &bm)?;
        let psum = fold_psum(m.hw, s, sl.fold, &am, &w)?;
        for (l, t, first) in sl.lines {
            for j in 0..l.len {
                let addr = first + (j * l.stride(n)) as u64;
                let (mm, nn) = l.element(j);
                let p = psum.get(mm - fold.m0, nn - fold.n0);
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
            hits.push(WordHit { written: true, ..WordHit::read(Some(g), out.buf, elem, WordSource::Bits(v)) });
        }
    }
    // Misdirected writes: every read of the word's holder until its next write sees them.
    for (&addr, &(v, t)) in written.range(..base).chain(written.range(base + len..)) {
        if let Some((b, y)) = m.holder(mem, addr, t) {
            hits.extend(m.reads_after(b, y, t, WordSource::Bits(v)));
        }
    }
    Ok(hits)
}

/// Every weight tile the step writes into the weight buffer, newest first: (write cycle, GEMM,
/// fold).
fn tiles(m: &StepMap) -> Vec<(u64, usize, usize)> {
    let mut tiles = Vec::new();
    for h in 0..m.p.instrs.len() {
        let Some(map) = m.gemm(h) else { continue };
        tiles.extend((0..map.s.folds.len()).map(|f| (map.start + map.wbuf.written(&map.s, f), h, f)));
    }
    tiles.sort_by(|x, y| y.cmp(x));
    tiles
}

/// The weights fold `c` of GEMM `g` multiplies by when it runs at cycle `at`: the words of its
/// weight-buffer slot (`c mod slots`) then, each from the latest of `tiles` ([`tiles`]) written
/// over that word at or before `at` by any GEMM of the step (0 if none), in the MXU input
/// format.
fn weights(
    m: &StepMap,
    g: usize,
    c: usize,
    at: u64,
    tiles: &[(u64, usize, usize)],
    golden: &[Vec<u32>],
    bg: &Matrix,
) -> Result<Matrix> {
    let map = m.gemm(g).expect("sequencer faults strike GEMMs");
    let s = &map.s;
    let fold = s.folds[c];
    let base = map.wbuf.base(c);
    let own = |i: usize, j: usize| bg.get(fold.k0 + i, fold.n0 + j);
    let word =
        |i: usize, j: usize| base + s.weight_word(c, fold.k0 + i, fold.n0 + j).expect("the fold's own weights") as u64;
    // Weight words grow with k and n in every dataflow: the corners bound the fold's words.
    let span = word(0, 0)..word(fold.kr.max(1) - 1, fold.nc.max(1) - 1) + 1;
    let mut operands: BTreeMap<usize, Matrix> = BTreeMap::new();
    let mut w = Matrix::zeros(fold.kr, fold.nc);
    // The weights still to find, (i, j, word); `None`: all of them (listed only if a tile
    // other than the fold's own comes first, which only a faulty tile counter makes happen).
    let mut left: Option<Vec<(usize, usize, u64)>> = None;
    // Each weight from the newest tile written by `at` that wrote its word (a tile writes only
    // its own weights): tiles newest first, until every weight has one.
    for &(_, h, f) in &tiles[tiles.partition_point(|t| t.0 > at)..] {
        let other = m.gemm(h).expect("tiles come from GEMMs");
        let (sh, b0) = (&other.s, other.wbuf.base(f));
        let tile = b0..b0 + other.wbuf.words;
        if tile.end <= span.start || span.end <= tile.start {
            continue;
        }
        if (h, f) == (g, c) {
            // The fold's own tile: every weight not overwritten since is its own.
            match &left {
                None => w = Matrix::from_fn(fold.kr, fold.nc, own),
                Some(l) => l.iter().for_each(|&(i, j, _)| w.set(i, j, own(i, j))),
            }
            return Ok(w);
        }
        if !operands.contains_key(&h) && h != g {
            let (_, b) = isa::gemm_operands(m.hw, &m.p.instrs[h], golden)?.expect("a GEMM");
            operands.insert(h, b);
        }
        let b = if h == g { bg } else { &operands[&h] };
        let l = left.get_or_insert_with(|| {
            (0..fold.kr).flat_map(|i| (0..fold.nc).map(move |j| (i, j))).map(|(i, j)| (i, j, word(i, j))).collect()
        });
        l.retain(|&(i, j, word)| {
            let found = tile.contains(&word).then(|| sh.weight_at(f, (word - b0) as usize)).flatten();
            found.inspect(|&(kk, nn)| w.set(i, j, b.get(kk, nn))).is_none()
        });
        if l.is_empty() {
            break;
        }
    }
    Ok(w)
}
