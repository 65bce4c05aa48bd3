//! A fault-free step kept whole, so that a faulted run of the same step starts where its fault
//! does.
//!
//! Everything a step computes before the first instruction a fault reaches is the fault-free
//! step's, bit for bit; a campaign runs hundreds of trials on one golden step, each of which
//! used to recompute that prefix. A [`GoldenStep`] holds every buffer a fault-free run left
//! (nothing released) and each instruction's cycles; a faulted run then starts at the fault's
//! first instruction with the buffers it reads taken from there, and a register fault whose
//! instructions' outputs all come out bit-identical (masked) ends right after the last of
//! them with the golden step's results: the rest of the step would recompute them exactly.
//!
//! Starting late is exact only from an instruction before which every buffer is either
//! complete or not yet written: a buffer written in parts (row tiles, K tiles accumulating into
//! it) on both sides of the start would begin from its final words instead of its partial ones.
//! A [`GoldenStep`] finds, for each instruction, where a run redoing it must start: back at
//! the first write of every such buffer.

use crate::error::{Result, TrainError};
use crate::inject::memory::WordSource;
use crate::inject::Injection;
use faultline_graph::program::Program;

/// A fault-free run of one step program on one state and batch: every buffer as the run left it
/// and each instruction's cycles (what [`crate::Executor::step_with_fault_from`] starts a
/// faulted run of the same step from).
#[derive(Debug, Clone)]
pub struct GoldenStep {
    /// Every buffer of the program, nothing released.
    pub(crate) bufs: Vec<Vec<u32>>,
    /// Each instruction's cycles.
    pub(crate) durations: Vec<u64>,
    /// `restart[i]`: where a run that must redo instruction `i` starts (see the module docs);
    /// one more entry than instructions (the host's reads after the step).
    restart: Vec<usize>,
    /// The first instruction writing each buffer (0 for a bound placeholder an instruction
    /// writes, whose words before the step are the binding's; `usize::MAX`: never written).
    first_write: Vec<usize>,
    /// The last instruction reading each buffer (`None`: never read).
    last_read: Vec<Option<usize>>,
}

/// Where a faulted run starts from a [`GoldenStep`] ([`GoldenStep::start`]).
pub(crate) struct Start<'a> {
    /// The golden step.
    pub golden: &'a GoldenStep,
    /// The first instruction run.
    pub at: usize,
    /// The last instruction a register fault reaches: if every faulted instruction's outputs
    /// are bit-identical, the run ends after it with the golden results (`None`: run to the end).
    pub masked_after: Option<usize>,
}

impl GoldenStep {
    /// The golden step of `p` from `bound` (the buffers bind gave the run: placeholders filled,
    /// the rest empty), `bufs` (every buffer after the fault-free run) and `durations`.
    pub(crate) fn new(p: &Program, bound: &[Vec<u32>], bufs: Vec<Vec<u32>>, durations: Vec<u64>) -> GoldenStep {
        let n = p.instrs.len();
        let mut first_write = vec![usize::MAX; p.buffers.len()];
        let mut last_read = vec![None; p.buffers.len()];
        for (i, ins) in p.instrs.iter().enumerate() {
            for b in ins.writes() {
                let f = &mut first_write[b.index()];
                *f = (*f).min(if bound[b.index()].is_empty() { i } else { 0 });
            }
            for b in ins.reads() {
                last_read[b.index()] = Some(i);
            }
        }
        // earliest[i]: the first write of any buffer written at `i` or later.
        let mut earliest = vec![usize::MAX; n + 1];
        for i in (0..n).rev() {
            let here = p.instrs[i].writes().iter().map(|b| first_write[b.index()]).min().unwrap_or(usize::MAX);
            earliest[i] = earliest[i + 1].min(here);
        }
        let restart = (0..=n)
            .map(|i| {
                let mut s = i;
                while earliest[s] < s {
                    s = earliest[s];
                }
                s
            })
            .collect();
        GoldenStep { bufs, durations, restart, first_write, last_read }
    }

    /// Every buffer of the program as the fault-free run left it (what
    /// [`crate::Executor::step_buffers`] returns for the same state and batch).
    pub fn buffers(&self) -> &[Vec<u32>] {
        &self.bufs
    }

    /// Where a run of `p` (the program this was made from) with `fault` starts, with `bufs` (as
    /// bind gave them for the faulted run) completed to what that instruction finds: the
    /// placeholders must equal the golden step's (else it was made from another state or
    /// batch: an error), and every buffer complete before the start that a later instruction,
    /// the caller or a changed word reads is copied from it.
    pub(crate) fn start(&self, p: &Program, fault: &Injection, bufs: &mut [Vec<u32>]) -> Result<Start<'_>> {
        let mismatch = |why: &str| Err(TrainError::Config(format!("a golden step {why}")));
        if self.bufs.len() != p.buffers.len() || self.durations.len() != p.instrs.len() {
            return mismatch("of another program cannot start this run");
        }
        for (b, (mine, given)) in self.bufs.iter().zip(bufs.iter()).enumerate() {
            if !given.is_empty() && self.first_write[b] == usize::MAX && mine != given {
                return mismatch(&format!("made from another state or batch (buffer {b} differs)"));
            }
        }
        let n = p.instrs.len();
        let (first, masked_after) = match fault {
            Injection::Registers(r) => (r[0].0, r.last().map(|&(i, _)| i)),
            Injection::Words { first, hits } => {
                (hits.iter().map(|h| h.instr.unwrap_or(n)).fold(*first, usize::min), None)
            }
            Injection::Sequencer { gemms, .. } => (gemms[0], None),
        };
        let at = self.restart[first.min(n)];
        let mut needed: Vec<bool> = self.last_read.iter().map(|r| r.is_some_and(|r| r >= at)).collect();
        for &b in p.kept.iter().chain(&p.observed) {
            needed[b.index()] = true;
        }
        for h in fault.hits() {
            needed[h.buf.index()] = true;
            if let WordSource::Copy(src, _) = h.source {
                needed[src.index()] = true;
            }
        }
        for (b, buf) in bufs.iter_mut().enumerate() {
            // Written before the start (a written placeholder included) and not after it.
            if needed[b] && self.first_write[b] < at {
                buf.clone_from(&self.bufs[b]);
            }
        }
        Ok(Start { golden: self, at, masked_after })
    }
}
