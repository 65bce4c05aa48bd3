//! What a resolved fault does to a step, in the terms the executor runs it in: register events
//! on the instructions a register fault reaches, the buffer words a memory or DMA fault
//! changes, or the GEMMs whose fold loops a sequencer fault changes.

use crate::inject::memory::WordHit;
use faultline_hw::fault::ActiveFault;
use faultline_hw::FaultSchedule;

/// A fault injected into a step (see [`crate::exec::Executor::step_with_fault`]). Everything
/// the injection does not name runs in the executor's mode, which is exact by the
/// bit-exact-twin invariant.
#[derive(Debug, Clone, PartialEq)]
pub enum Injection {
    /// A register fault: each instruction it reaches (non-empty, in program order, each once)
    /// runs at cycle level with its events (sites of its unit, times relative to the
    /// instruction's own schedule); a stuck-at that outlasts one instruction reaches the next
    /// ones on its unit.
    Registers(Vec<(usize, FaultSchedule)>),
    /// A memory or DMA fault: the buffer words it changes, as the instructions that read them
    /// see them ([`crate::inject::memory`]).
    Words {
        /// The instruction it struck (a DMA transfer) or first reaches.
        first: usize,
        /// The changed words.
        hits: Vec<WordHit>,
    },
    /// A sequencer fault: the words each GEMM's fold loop changes
    /// ([`crate::inject::sequencer`]), found from a run of the same step.
    Sequencer {
        /// The GEMMs whose fold loops it changes (non-empty, in program order, each once).
        gemms: Vec<usize>,
        /// The fault, on the step's clock (absolute step cycles).
        fault: ActiveFault,
    },
}

impl Injection {
    /// A register fault (`faults`) in instruction `instr`.
    pub fn register(instr: usize, faults: FaultSchedule) -> Injection {
        Injection::Registers(vec![(instr, faults)])
    }

    /// A register fault reaching several instructions of one unit, each with its events
    /// (`None` if the list is empty); put in program order, events of one instruction joined.
    pub fn registers(faults: Vec<(usize, FaultSchedule)>) -> Option<Injection> {
        let mut placed = Vec::with_capacity(faults.len());
        for (i, f) in faults {
            add_events(&mut placed, i, f);
        }
        (!placed.is_empty()).then_some(Injection::Registers(placed))
    }

    /// Memory or DMA words changed by a fault that struck or first reaches `first`.
    pub fn words(first: usize, hits: Vec<WordHit>) -> Injection {
        Injection::Words { first, hits }
    }

    /// A sequencer fault in GEMM `gemm`.
    pub fn sequencer(gemm: usize, fault: ActiveFault) -> Injection {
        Injection::Sequencer { gemms: vec![gemm], fault }
    }

    /// A sequencer fault in several GEMMs (`None` if `gemms` is empty), in program order.
    pub fn sequencer_in(mut gemms: Vec<usize>, fault: ActiveFault) -> Option<Injection> {
        gemms.sort_unstable();
        gemms.dedup();
        (!gemms.is_empty()).then_some(Injection::Sequencer { gemms, fault })
    }

    /// The first instruction the fault reaches (program order; for words, the one it struck
    /// or its first reader): where its effect is reported when nothing changes.
    pub fn instr(&self) -> usize {
        self.instrs().next().expect("an injection reaches at least one instruction")
    }

    /// Every instruction the fault is placed on, in program order: the instructions a register
    /// fault reaches, the GEMMs of a sequencer fault; for words, the first (the hits name
    /// their readers).
    pub fn instrs(&self) -> impl Iterator<Item = usize> + '_ {
        let (regs, first, gemms): (&[(usize, FaultSchedule)], Option<usize>, &[usize]) = match self {
            Injection::Registers(r) => (r, None, &[]),
            Injection::Words { first, .. } => (&[], Some(*first), &[]),
            Injection::Sequencer { gemms, .. } => (&[], None, gemms),
        };
        regs.iter().map(|&(i, _)| i).chain(first).chain(gemms.iter().copied())
    }

    /// The register faults instruction `i` runs with at cycle level (`None`: it runs in the
    /// executor's mode). A memory, DMA or sequencer injection has none.
    pub fn register_faults(&self, i: usize) -> Option<&FaultSchedule> {
        let Injection::Registers(r) = self else { return None };
        r.binary_search_by_key(&i, |&(j, _)| j).ok().map(|k| &r[k].1)
    }

    /// The words a memory or DMA fault changes (none for other injections).
    pub fn hits(&self) -> &[WordHit] {
        match self {
            Injection::Words { hits, .. } => hits,
            _ => &[],
        }
    }

    /// Joins `other`, another bit of the same upset, into this injection: register events
    /// join those already placed on their instructions (or place them, in program order), and
    /// word hits follow these (two bits of one word compose, as the hits apply in turn; the
    /// injection stays on its first instruction). Injections of different kinds do not join:
    /// `other` comes back.
    pub fn join(&mut self, other: Injection) -> Result<(), Injection> {
        match (self, other) {
            (Injection::Registers(placed), Injection::Registers(more)) => {
                for (i, f) in more {
                    add_events(placed, i, f);
                }
                Ok(())
            }
            (Injection::Words { hits, .. }, Injection::Words { hits: more, .. }) => {
                hits.extend(more);
                Ok(())
            }
            (_, other) => Err(other),
        }
    }
}

/// Adds register fault events in instruction `i` (the bits of an upset struck together):
/// joined to the events already placed there, or placing `i` in program order.
fn add_events(placed: &mut Vec<(usize, FaultSchedule)>, i: usize, faults: FaultSchedule) {
    match placed.binary_search_by_key(&i, |&(j, _)| j) {
        Ok(k) => placed[k].1.events.extend(faults.events),
        Err(k) => placed.insert(k, (i, faults)),
    }
}
