//! Random single-bit flips of one GEMM with ABFT checksum columns (`faultline gemm --abft
//! --trials N`): each flip uniform over every MXU site bit and every cycle of the fused GEMM,
//! run at cycle level and classified by what the check saw ([`faultline_hw::protect::abft::classify`]).

use crate::stats::Estimate;
use faultline_hw::fault::{FaultEvent, FaultSchedule};
use faultline_hw::mxu::gemm;
use faultline_hw::protect::abft::{self, AbftOutcome};
use faultline_hw::{ExecMode, HwConfig, HwError, Matrix, SiteClass, Unit};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// The fused GEMM the flips strike: `a x wf`, `wf` being `n` data columns and `d` checksum
/// digit columns ([`abft::augment`]), whose fault-free output is `golden` and which runs
/// `cycles` cycles.
#[derive(Debug, Clone, Copy)]
pub struct FusedGemm<'a> {
    /// The input.
    pub a: &'a Matrix,
    /// The weights with their checksum columns.
    pub wf: &'a Matrix,
    /// Data columns.
    pub n: usize,
    /// Checksum digit columns.
    pub d: usize,
    /// The fault-free output.
    pub golden: &'a Matrix,
    /// The fault-free run's cycles.
    pub cycles: u64,
}

/// What a set of flips did.
#[derive(Debug, Clone)]
pub struct AbftTrials {
    /// The MXU site classes flips were drawn over.
    pub classes: Vec<SiteClass>,
    /// Their bits in all.
    pub site_bits: u64,
    /// Each trial's class (an index into `classes`) and outcome, in trial order.
    pub outcomes: Vec<(usize, AbftOutcome)>,
}

impl AbftTrials {
    /// Trials whose class and outcome `pick` accepts.
    fn count(&self, pick: impl Fn(usize, AbftOutcome) -> bool) -> u64 {
        self.outcomes.iter().filter(|&&(c, o)| pick(c, o)).count() as u64
    }

    /// Trials of each outcome, in [`AbftOutcome::ALL`]'s order.
    pub fn totals(&self) -> Vec<u64> {
        AbftOutcome::ALL.iter().map(|&o| self.count(|_, x| x == o)).collect()
    }

    /// Trials that corrupted C.
    pub fn corrupted(&self) -> u64 {
        self.count(|_, o| o.corrupted())
    }

    /// The share of the trials that corrupted C which the check detected.
    pub fn detection(&self) -> Estimate {
        Estimate::of(self.count(|_, o| o == AbftOutcome::Detected), self.corrupted())
    }

    /// Each class's pattern and its trials of each outcome ([`AbftOutcome::ALL`]'s order).
    pub fn by_class(&self) -> Vec<(String, Vec<u64>)> {
        self.classes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (c.pattern(), AbftOutcome::ALL.iter().map(|&o| self.count(|ci, x| ci == i && x == o)).collect())
            })
            .collect()
    }
}

/// `trials` single-bit flips of `g` on `cfg`, uniform over every MXU site bit (every class
/// [`SiteClass::all`] has on `cfg`) and every cycle, drawn in order from `rng` (so the set does
/// not depend on the threads), run in parallel on the current rayon pool and classified;
/// `done` is called after each.
pub fn run(
    cfg: &HwConfig,
    g: FusedGemm,
    trials: u64,
    rng: &mut ChaCha8Rng,
    done: impl Fn() + Sync,
) -> Result<AbftTrials, HwError> {
    let classes: Vec<SiteClass> = SiteClass::all(cfg).into_iter().filter(|c| c.unit == Unit::Mxu).collect();
    let bits: Vec<u64> = classes.iter().map(|c| c.bit_count(cfg)).collect();
    let site_bits: u64 = bits.iter().sum();
    let events: Vec<(usize, FaultEvent)> = (0..trials)
        .map(|_| {
            let mut idx = rng.gen_range(0..site_bits);
            let ci = bits
                .iter()
                .position(|&b| {
                    let here = idx < b;
                    if !here {
                        idx -= b;
                    }
                    here
                })
                .expect("idx < site_bits");
            let site = classes[ci].site_at(cfg, idx).expect("idx < the class's bit count");
            (ci, FaultEvent::flip(site, 0, rng.gen_range(0..g.cycles)))
        })
        .collect();
    let outcomes = events
        .par_iter()
        .map(|(ci, e)| {
            let out = gemm(cfg, g.a, g.wf, ExecMode::CycleLevel, &FaultSchedule::one(*e))?.out;
            done();
            Ok((*ci, abft::classify(g.golden, &out, g.n, g.d)))
        })
        .collect::<Result<_, HwError>>()?;
    Ok(AbftTrials { classes, site_bits, outcomes })
}
