//! The injection space of a training step, from its program and schedule alone: which (bit,
//! cycle) pairs of each site class may change what the step computes.
//!
//! A [`LiveWindow`] is a block of pairs: some elements of one class (PEs, lanes, words, a
//! control register), all their bits, over a range of cycles. Every pair outside every window
//! is dead: a fault there is masked without running anything (a test samples dead pairs and
//! checks). Pairs inside may still be masked; the windows over-approximate, never under:
//! * MXU registers: while a GEMM runs, every PE of the columns its widest fold uses (columns
//!   right of them feed nothing the accumulators capture); VPU registers: every element while
//!   an instruction runs on the unit.
//! * DMA address registers: a transfer's data phase.
//! * `seq.tile`: a GEMM's issue up to its last fold's start (the counter's last read);
//!   `seq.acc_addr`: each fold's first to last result-row write ([`crate::inject::sequencer`]).
//! * Weight-buffer words: a fold's tile row from its write into the slot to the last read of
//!   that row ([`crate::inject::memory`]).
//! * Unified buffer, accumulators, DRAM: a buffer's words from its first writer's issue (the
//!   step's start for what the host writes) to its last reader's end (the host's: the step's).

use crate::exec::Placed;
use crate::inject::gemm_fold::GemmMap;
use crate::inject::sequencer;
use faultline_graph::StepSchedule;
use faultline_hw::isa::{BufId, ExecUnit, Instr};
use faultline_hw::{FaultSite, HwConfig, Register, SiteClass, Unit};
use serde::Serialize;
use std::collections::BTreeSet;
use std::ops::Range;

/// A block of possibly live (bit, cycle) pairs: elements `elems` of `class` (numbered as
/// [`SiteClass::site_at`] does), all their bits, at `cycles` of the step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveWindow {
    /// The class.
    pub class: SiteClass,
    /// Its elements.
    pub elems: Range<u64>,
    /// Step cycles.
    pub cycles: Range<u64>,
}

impl LiveWindow {
    /// The (bit, cycle) pairs in the window.
    pub fn bit_cycles(&self, hw: &HwConfig) -> u128 {
        let n = |r: &Range<u64>| r.end.saturating_sub(r.start) as u128;
        n(&self.elems) * n(&self.cycles) * self.class.width(hw) as u128
    }

    /// Whether a fault on `site` at `cycle` falls in the window.
    pub fn contains(&self, hw: &HwConfig, site: &FaultSite, cycle: u64) -> bool {
        site.class() == self.class
            && self.elems.contains(&self.class.element_of(hw, site))
            && self.cycles.contains(&cycle)
    }
}

/// The possibly live windows of every site class of a step of `exec` (schedule `sched`); in
/// each class, windows on the same elements do not overlap.
pub fn windows(exec: &dyn Placed, sched: &StepSchedule) -> Vec<LiveWindow> {
    let (p, hw) = (exec.program(), exec.hw());
    let span = |i: usize| sched.instrs[i].start..sched.instrs[i].start + sched.instrs[i].cycles;
    let cols = hw.mxu.cols as u64;
    // Each GEMM's fold map and the columns its widest fold uses, once for every class that
    // needs them (an `Err`: no fold schedule, a shape the MXU refuses; all columns count).
    let gemms: Vec<(usize, crate::error::Result<Option<GemmMap>>, u64)> = (0..p.instrs.len())
        .filter(|&i| p.instrs[i].unit() == ExecUnit::Mxu)
        .map(|g| {
            let map = GemmMap::new(hw, &p.instrs[g], sched.instrs[g].start);
            let used = match &map {
                Ok(Some(map)) => map.s.as_ws().folds.iter().map(|f| f.nc).max().unwrap_or(0) as u64,
                _ => cols,
            };
            (g, map, used)
        })
        .collect();
    let mut w = Vec::new();
    for class in SiteClass::all(hw) {
        let mut push = |elems: Range<u64>, cycles: Range<u64>| {
            if !elems.is_empty() && !cycles.is_empty() {
                w.push(LiveWindow { class, elems, cycles });
            }
        };
        let all = 0..class.elements(hw);
        let on = |u: ExecUnit| (0..p.instrs.len()).filter(move |&i| p.instrs[i].unit() == u);
        match class.unit {
            Unit::Mxu => {
                for &(g, _, used) in &gemms {
                    // A GEMM's PEs right of its widest fold's columns: nothing they hold
                    // reaches a used column (activations and strobes move right, partial sums
                    // down) and the accumulators capture used columns only.
                    if used >= cols {
                        push(all.clone(), span(g));
                    } else {
                        (0..hw.mxu.rows as u64).for_each(|r| push(r * cols..r * cols + used, span(g)));
                    }
                }
            }
            Unit::Vpu => on(ExecUnit::Vpu).for_each(|i| push(all.clone(), span(i))),
            Unit::Dma => on(ExecUnit::Dma).for_each(|i| push(all.clone(), span(i).start + p.dma_overhead..span(i).end)),
            Unit::Seq | Unit::Wbuf => {
                for (g, map, _) in &gemms {
                    let map = match map {
                        Ok(Some(map)) => map,
                        Ok(None) => continue,
                        // No fold schedule (a shape the MXU refuses): possibly live for the
                        // whole GEMM (injecting there is refused with the reason).
                        Err(_) => {
                            push(all.clone(), span(*g));
                            continue;
                        }
                    };
                    // The sequencer's windows count from the GEMM's issue.
                    let from_issue = |r: Range<u64>| map.start + r.start..map.start + r.end;
                    match (class.unit, class.register) {
                        (Unit::Wbuf, _) => wbuf_windows(map, &mut push),
                        (_, Register::TileCounter) => push(all.clone(), from_issue(sequencer::counter_window(&map.s))),
                        _ => {
                            for c in 0..map.s.folds.len() {
                                push(all.clone(), from_issue(sequencer::row_window(&map.s, c)));
                            }
                        }
                    }
                }
            }
            mem => {
                for (b, h) in p.homes.iter().enumerate().filter(|(_, h)| h.mem == mem) {
                    let cycles = buffer_window(p, sched, BufId(b as u32));
                    push(h.base..h.base + p.buffers[b].len as u64, cycles);
                }
            }
        }
    }
    merge(w)
}

/// The weight-buffer windows of one GEMM: each fold's tile, row by row, from its write into
/// the slot to the last read of that row ([`faultline_hw::mxu::access`]: WS element `(i, j)`
/// is read `i + j` cycles into the fold).
fn wbuf_windows(map: &GemmMap, push: &mut impl FnMut(Range<u64>, Range<u64>)) {
    let s = &map.s;
    for (f, fold) in s.folds.iter().enumerate() {
        let base = map.wbuf.base(f);
        let written = map.start + map.wbuf.written(s, f);
        let last = fold.n0 + fold.nc - 1;
        for k in fold.k0..fold.k0 + fold.kr {
            // A tile row's words are consecutive; its last word is read last.
            let first = base + s.weight_word(f, k, fold.n0).expect("the tile's own row") as u64;
            let last_read = map.start + fold.start + s.w_read(f, k, last).expect("the tile's own row");
            push(first..first + fold.nc as u64, written..last_read);
        }
    }
}

/// When buffer `b`'s words may hold a value something reads: from its first writer's issue
/// (0 if the host writes it before the step) to its last read.
fn buffer_window(p: &faultline_graph::Program, sched: &StepSchedule, b: BufId) -> Range<u64> {
    let (mut first, mut last) = (p.buffers[b.index()].role.is_placeholder().then_some(0), 0u64);
    for (i, ins) in p.instrs.iter().enumerate() {
        let (start, end) = (sched.instrs[i].start, sched.instrs[i].start + sched.instrs[i].cycles);
        let gemm = matches!(ins, Instr::Gemm { .. });
        if ins.writes().contains(&b) {
            first = Some(first.map_or(start, |f: u64| f.min(start)));
            if gemm {
                // A GEMM reads its result back fold by fold to add to it.
                last = last.max(end);
            }
        }
        if ins.reads().contains(&b) {
            last = last.max(end);
        }
    }
    if p.kept.contains(&b) {
        last = sched.total_cycles;
    }
    first.map_or(0..0, |f| f..last)
}

/// Merges overlapping windows of the same class and elements.
fn merge(mut w: Vec<LiveWindow>) -> Vec<LiveWindow> {
    w.sort_by_key(|x| (x.class, x.elems.start, x.elems.end, x.cycles.start));
    let mut out: Vec<LiveWindow> = Vec::with_capacity(w.len());
    for x in w {
        match out.last_mut() {
            Some(l) if l.class == x.class && l.elems == x.elems && x.cycles.start <= l.cycles.end => {
                l.cycles.end = l.cycles.end.max(x.cycles.end)
            }
            _ => out.push(x),
        }
    }
    out
}

/// The (bit, cycle) space of one site class during one training step, summarised from the
/// program alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassSummary {
    /// The class, e.g. `mxu.pe[*][*].psum`.
    pub class: String,
    /// Bits in the class.
    pub bits: u64,
    /// Instructions of the step that run on the class's unit (MXU, VPU, DMA; the GEMMs for the
    /// sequencer and weight buffer) or, for a memory, that access a buffer placed there.
    pub instructions: usize,
    /// Cycles of the step in which the unit runs one of them (DMA: a transfer's data phase);
    /// for a memory, the step's cycles.
    pub busy_cycles: u64,
    /// The (bit, cycle) pairs in the class's [`LiveWindow`]s: what a campaign samples from.
    pub bit_cycles: u128,
    /// The rest of the step's `bits * cycles`: dead, masked without running.
    pub idle_bit_cycles: u128,
}

/// The injection space of a step of `exec` (schedule `sched`) per site class: its bits and its
/// possibly live (bit, cycle) pairs ([`windows`]). Listed without running a step.
pub fn space(exec: &dyn Placed, sched: &StepSchedule) -> Vec<ClassSummary> {
    let (p, hw) = (exec.program(), exec.hw());
    let w = windows(exec, sched);
    let total = sched.total_cycles as u128;
    SiteClass::all(hw)
        .into_iter()
        .map(|c| {
            let bits = c.bit_count(hw);
            let live: u128 = w.iter().filter(|x| x.class == c).map(|x| x.bit_cycles(hw)).sum();
            let n_on = |u: ExecUnit| p.instrs.iter().filter(|i| i.unit() == u).count();
            let (instructions, busy_cycles) = match c.unit {
                Unit::Mxu | Unit::Seq | Unit::Wbuf => (n_on(ExecUnit::Mxu), sched.mxu_cycles),
                Unit::Vpu => (n_on(ExecUnit::Vpu), sched.vpu_cycles),
                Unit::Dma => (n_on(ExecUnit::Dma), sched.dma_cycles),
                mem => {
                    let homed: BTreeSet<BufId> =
                        (0..p.buffers.len()).filter(|&b| p.homes[b].mem == mem).map(|b| BufId(b as u32)).collect();
                    let touching = p
                        .instrs
                        .iter()
                        .filter(|i| i.reads().iter().chain(&i.writes()).any(|b| homed.contains(b)))
                        .count();
                    (touching, sched.total_cycles)
                }
            };
            let live = live.min(bits as u128 * total);
            ClassSummary {
                class: c.pattern(),
                bits,
                instructions,
                busy_cycles,
                bit_cycles: live,
                idle_bit_cycles: bits as u128 * total - live,
            }
        })
        .collect()
}
