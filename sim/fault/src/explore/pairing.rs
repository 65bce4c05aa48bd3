//! Pairing a protected campaign's trials with the unprotected baseline's: the same faults
//! where the plan leaves the program alone, register faults moved to the same point of the
//! same instruction where it adds instructions ([`CycleMap`]).

use super::Pairing;
use crate::campaign::Campaign;
use crate::error::Result;
use crate::model::Anchor;
use crate::spec::CampaignSpec;
use faultline_graph::NodeIndex;
use faultline_hw::budget::HostMemory;
use faultline_hw::isa::ExecUnit;
use faultline_hw::Unit;
use faultline_train::{StepFault, Trainer};
use std::collections::{BTreeMap, HashSet};

/// Campaign `c` (of spec `base`, under plan `pname`) set to run the unprotected `baseline`'s
/// very faults where it can, and which of its trials those are: all of them under a plan that
/// leaves the program alone; under one that adds instructions, the register faults translated
/// onto the longer step (the rest are this campaign's own draws). Trials past the baseline's
/// are a code's check-bit strata, which it lacks. Without a baseline (`c` is it), every trial.
pub(super) fn pair_with_baseline(
    mut c: Campaign,
    baseline: Option<&Campaign>,
    base: &CampaignSpec,
    pname: &str,
    mem: &HostMemory,
) -> Result<(Campaign, Pairing)> {
    let mut paired: Vec<bool> = (0..c.info.trials).map(|t| baseline.is_none_or(|b| t < b.info.trials)).collect();
    let mut translated = HashSet::new();
    if let (Some(b), Some(p)) = (baseline, &c.info.protection) {
        if p.cycles != p.base_cycles || !p.checks.is_empty() {
            let (bt, pt) = (b.trainer(), c.trainer());
            let maps: BTreeMap<ExecUnit, Option<CycleMap>> =
                ExecUnit::ALL.iter().map(|&u| (u, CycleMap::new(&bt, &pt, u))).collect();
            // Held for the whole run: one fault, of `bits` step faults, per trial.
            let per_trial = std::mem::size_of::<(Anchor, Vec<StepFault>)>() as u64
                + base.fault.bits() as u64 * std::mem::size_of::<StepFault>() as u64;
            mem.check(
                &format!("the {} translated faults of campaign `{}` under `{pname}`", c.info.trials, base.name),
                c.info.trials.checked_mul(per_trial),
            )?;
            let mut faults = Vec::with_capacity(c.info.trials as usize);
            paired.clear();
            for t in 0..b.info.trials {
                match translate(b, &maps, t) {
                    Some((f, exact)) => {
                        translated.insert(f.0.class.pattern());
                        faults.push(f);
                        paired.push(exact);
                    }
                    None => {
                        faults.push(c.upset(t));
                        paired.push(false);
                    }
                }
            }
            // Trials past the baseline's: this campaign's own strata (a code's check bits).
            for t in b.info.trials..c.info.trials {
                faults.push(c.upset(t));
                paired.push(false);
            }
            let from = format!(
                "the trials of unprotected campaign `{}`, register faults translated onto this step",
                base.name
            );
            c = c.with_faults(faults, from);
        }
    }
    Ok((c, Pairing { paired, translated }))
}

/// The instructions a fault at a site of `unit` can strike: the MXU's for PE and sequencer
/// registers, the VPU's for lanes, the DMA engine's for its address registers; `None` for
/// memories, whose words hold different buffers once a plan adds instructions.
fn exec_unit(unit: Unit) -> Option<ExecUnit> {
    match unit {
        Unit::Mxu | Unit::Seq => Some(ExecUnit::Mxu),
        Unit::Vpu => Some(ExecUnit::Vpu),
        Unit::Dma => Some(ExecUnit::Dma),
        _ => None,
    }
}

/// Maps cycles of a base step onto a protected step of the same program plus checks and clamps, for the
/// instructions of one unit: a cycle inside the `j`-th instruction (of the unit's original
/// ones) maps to the same offset inside its counterpart; a cycle in the idle gap before it,
/// to the same distance before the counterpart, if that is idle too; a cycle after the last,
/// to the same distance after its counterpart, if the protected step lasts that long.
struct CycleMap {
    /// Base `(start, end)` of each instruction of the unit.
    base: Vec<(u64, u64)>,
    /// Protected `(start, end, end of the unit's previous instruction)` of each counterpart.
    prot: Vec<(u64, u64, u64)>,
    /// Cycles of the protected step: its idle tail after the unit's last instruction can be
    /// shorter than the base step's, when the plan's instructions overlap the tail.
    prot_total: u64,
}

impl CycleMap {
    /// The map for `unit` from `base`'s step to `prot`'s (`None` if the unit's original
    /// instructions do not pair up one to one).
    fn new(base: &Trainer, prot: &Trainer, unit: ExecUnit) -> Option<CycleMap> {
        let tg = &prot.exec.tg;
        let check_nodes: HashSet<NodeIndex> = tg
            .checks()
            .iter()
            .flat_map(|c| c.nodes.iter().copied())
            .chain(tg.clamps().iter().map(|c| c.node))
            .collect();
        let b: Vec<(u64, u64)> =
            base.schedule.instrs.iter().filter(|c| c.unit == unit).map(|c| (c.start, c.start + c.cycles)).collect();
        let tags = &prot.exec.program().tags;
        let mut prev_end = 0;
        let mut p = Vec::new();
        for (i, c) in prot.schedule.instrs.iter().enumerate().filter(|(_, c)| c.unit == unit) {
            if !check_nodes.contains(&tags[i].node) {
                p.push((c.start, c.start + c.cycles, prev_end));
            }
            prev_end = c.start + c.cycles;
        }
        (b.len() == p.len()).then_some(CycleMap { base: b, prot: p, prot_total: prot.schedule.total_cycles })
    }

    /// The protected cycle of base cycle `c`, and whether it is the same point of the same
    /// instruction (or idle gap).
    fn map(&self, c: u64) -> (u64, bool) {
        match self.base.iter().position(|&(_, end)| end > c) {
            Some(j) => {
                let ((bs, _), (ps, _, prev)) = (self.base[j], self.prot[j]);
                if c >= bs {
                    (ps + (c - bs), true)
                } else {
                    let back = ps.saturating_sub(bs - c);
                    (back.max(prev), back >= prev)
                }
            }
            None => {
                let c = match (self.base.last(), self.prot.last()) {
                    (Some(&(_, be)), Some(&(_, pe, _))) => pe + (c - be),
                    _ => c,
                };
                // Past the protected step's end: its last cycle, still in the idle tail.
                if c < self.prot_total {
                    (c, true)
                } else {
                    (self.prot_total.saturating_sub(1), false)
                }
            }
        }
    }
}

/// Trial `t` of `base` translated onto `prot` (the same program with a plan's checks): the
/// same bits at the corresponding cycle ([`CycleMap`]), with whether that pairing is exact;
/// `None` for faults that do not translate (memory words, whole-step stuck-ats).
fn translate(
    base: &Campaign,
    maps: &BTreeMap<ExecUnit, Option<CycleMap>>,
    t: u64,
) -> Option<((Anchor, Vec<StepFault>), bool)> {
    if base.spec().fault.whole_steps() {
        return None;
    }
    let (mut a, mut upset) = base.upset(t);
    let map = maps.get(&exec_unit(a.class.unit)?)?.as_ref()?;
    let (c, exact) = map.map(a.cycle);
    a.cycle = c;
    upset.iter_mut().for_each(|f| f.cycle = c);
    Some(((a, upset), exact))
}
