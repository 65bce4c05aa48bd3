//! Planning a campaign before running it (`faultline plan`): per class and combined, the trials
//! that estimate the failure rate to a stated margin at a stated confidence over the
//! campaign's fault population (Leveugle et al., DATE 2009), at the worst case `p = 0.5` and
//! at a pilot's estimates; how uniform, equal-per-class and Neyman-allocated sampling compare;
//! and the wall time each would take at the pilot's measured cost per trial.

use crate::error::{FaultError, Result};
use crate::record::{CampaignInfo, Summary};
use crate::stats::design::{neyman_allocation, neyman_trials, trials_for_margin, Stratum};
use crate::stats::{self, Estimate};
use serde::Deserialize;
use std::path::Path;

/// The interval half-width a plan aims at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Margin {
    /// In units of the rate (0.005: half a percentage point).
    Absolute(f64),
    /// A fraction of the pilot's combined failure rate (0.5: half of it).
    Relative(f64),
}

/// One class of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassPlan {
    /// Class pattern.
    pub class: String,
    /// Bits in it.
    pub bits: u64,
    /// Faults in it: bits x sampled cycles x injection steps.
    pub population: f64,
    /// Share of its (bit, cycle) pairs that may be live (the rest are skipped as dead).
    pub live_share: f64,
    /// The pilot's failure estimate.
    pub pilot: Estimate,
    /// The pilot's mean wall time per trial on one thread, in seconds.
    pub trial_seconds: f64,
    /// Trials that estimate this class's own rate to the margin at worst case `p = 0.5`.
    pub worst_case: u64,
    /// The same at the pilot's rate (its Jeffreys estimate `(k + 1/2) / (n + 1)`, so a class
    /// without a failure still needs trials).
    pub at_pilot: u64,
    /// Its trials under Neyman allocation of the combined plan.
    pub neyman: u64,
    /// Its trials under Neyman allocation over live faults only (as `Adaptive` draws them).
    pub live_neyman: u64,
    /// The pilot's mean wall time per live (not skipped) trial on one thread, in seconds.
    pub live_trial_seconds: f64,
}

/// A campaign's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct CampaignPlan {
    /// The absolute half-width aimed at.
    pub margin: f64,
    /// Two-sided confidence.
    pub confidence: f64,
    /// The classes.
    pub classes: Vec<ClassPlan>,
    /// The pilot's combined (stratified) failure rate with its 95% interval.
    pub pilot: stats::Interval,
    /// Pilot trials per class.
    pub pilot_trials: u64,
    /// Trials of uniform sampling for the combined rate, at worst case `p = 0.5`.
    pub uniform_worst_case: u64,
    /// Trials of uniform sampling at the pilot's combined rate.
    pub uniform: u64,
    /// Trials of `Stratified` (the same count per class) at the pilot's rates, in all.
    pub equal_per_class: u64,
    /// Trials of Neyman-allocated stratified sampling at the pilot's rates, in all.
    pub neyman: u64,
    /// Trials of Neyman allocation over the classes' live faults only, the dead share counted
    /// masked (what `Adaptive` draws, by class; its bit fields can only need fewer), at the
    /// pilot's rates among its live trials.
    pub live_neyman: u64,
    /// Wall seconds of the golden run.
    pub golden_seconds: f64,
    /// Threads the wall times assume.
    pub threads: usize,
}

impl CampaignPlan {
    /// Expected wall seconds of `trials` spread over the classes as `per_class` says (trial
    /// counts), on [`CampaignPlan::threads`] threads, golden run included.
    pub fn wall_seconds(&self, per_class: &[f64]) -> f64 {
        self.wall_at(per_class, |c| c.trial_seconds)
    }

    /// [`CampaignPlan::wall_seconds`] at `cost` per trial of each class.
    fn wall_at(&self, per_class: &[f64], cost: fn(&ClassPlan) -> f64) -> f64 {
        let work: f64 = self.classes.iter().zip(per_class).map(|(c, n)| cost(c) * n).sum();
        self.golden_seconds + work / self.threads as f64
    }

    /// Wall seconds of uniform sampling with `n` trials (classes by their bits).
    pub fn uniform_seconds(&self, n: u64) -> f64 {
        let total: f64 = self.classes.iter().map(|c| c.bits as f64).sum();
        let shares: Vec<f64> = self.classes.iter().map(|c| n as f64 * c.bits as f64 / total).collect();
        self.wall_seconds(&shares)
    }

    /// Wall seconds of `Stratified` with `n` trials in all.
    pub fn equal_seconds(&self, n: u64) -> f64 {
        let each = n as f64 / self.classes.len() as f64;
        self.wall_seconds(&vec![each; self.classes.len()])
    }

    /// Wall seconds of the Neyman plan.
    pub fn neyman_seconds(&self) -> f64 {
        self.wall_seconds(&self.classes.iter().map(|c| c.neyman as f64).collect::<Vec<_>>())
    }

    /// Wall seconds of the Neyman plan over live faults, at the cost of a live trial.
    pub fn live_neyman_seconds(&self) -> f64 {
        let per_class: Vec<f64> = self.classes.iter().map(|c| c.live_neyman as f64).collect();
        self.wall_at(&per_class, |c| c.live_trial_seconds)
    }
}

/// A line of `timing.jsonl`.
#[derive(Deserialize)]
struct Timing {
    trial: u64,
    wall_us: u64,
}

/// The plan for the campaign `info` from a pilot run of it with `Stratified(per_class:
/// pilot_trials)` sampling, whose summary is `pilot` and whose records are in `dir`, after a
/// golden run of `golden_seconds`, aiming at `margin` at `confidence` on `threads` threads.
pub fn plan(
    info: &CampaignInfo,
    pilot: &Summary,
    dir: &Path,
    golden_seconds: f64,
    margin: Margin,
    confidence: f64,
    threads: usize,
) -> Result<CampaignPlan> {
    let pilot_trials = pilot.classes.first().map_or(0, |c| c.trials);
    let path = dir.join("timing.jsonl");
    let text = std::fs::read_to_string(&path).map_err(FaultError::io(&path))?;
    let mut seconds = vec![(0.0, 0u64); info.classes.len()];
    for line in text.lines() {
        let Ok(t) = serde_json::from_str::<Timing>(line) else { continue };
        if let Some(s) = seconds.get_mut((t.trial / pilot_trials.max(1)) as usize) {
            s.0 += t.wall_us as f64 * 1e-6;
            s.1 += 1;
        }
    }
    let strata: Vec<(f64, Estimate)> = pilot.classes.iter().map(|c| (c.weight, c.failure)).collect();
    let (p, lo, hi) = stats::stratified(&strata);
    let margin = match margin {
        Margin::Absolute(m) => m,
        Margin::Relative(r) if p > 0.0 => r * p,
        Margin::Relative(_) => {
            return Err(FaultError::Invalid {
                file: dir.join("summary.json"),
                field: "failure".into(),
                value: "0".into(),
                allowed: "a pilot that saw a failure, for a relative margin (or give an absolute --margin)".into(),
            })
        }
    };
    let z = stats::z(confidence);
    let (steps, cycles) = (info.spec.inject_steps.count() as f64, cycles_sampled(info));
    // The Jeffreys estimate (the posterior mean under Jeffreys' prior): a class without
    // failures still has a variance, and a pilot without any does not plan for p = 0.
    let jeffreys = |k: u64, n: u64| (k as f64 + 0.5) / (n as f64 + 1.0);
    let centre = |e: &Estimate| jeffreys(e.k, e.n);
    let mut classes: Vec<ClassPlan> = (info.classes.iter().zip(&pilot.classes).zip(&seconds))
        .map(|((k, s), &(secs, n))| {
            let population = k.bits as f64 * cycles * steps;
            // Dead trials cost microseconds: a class's time is its live trials'.
            let live = s.trials - s.skipped_dead;
            ClassPlan {
                class: k.class.clone(),
                bits: k.bits,
                population,
                live_share: (k.live_bit_cycles as f64 / (k.bits as f64 * cycles)).min(1.0),
                pilot: s.failure,
                trial_seconds: if n == 0 { 0.0 } else { secs / n as f64 },
                worst_case: trials_for_margin(population, margin, z, 0.5).ceil() as u64,
                at_pilot: trials_for_margin(population, margin, z, centre(&s.failure)).ceil() as u64,
                neyman: 0,
                live_neyman: 0,
                live_trial_seconds: if live == 0 { 0.0 } else { secs / live as f64 },
            }
        })
        .collect();
    let design: Vec<Stratum> = (pilot.classes.iter().zip(&classes))
        .map(|(s, c)| {
            let q = centre(&s.failure);
            Stratum { weight: s.weight, sd: (q * (1.0 - q)).sqrt(), population: c.population }
        })
        .collect();
    // Over live faults: each class's weight shrinks to its live share, its rate grows to the
    // pilot's among its live trials (every failure is among them).
    let live: Vec<Stratum> = (pilot.classes.iter().zip(&classes))
        .map(|(s, c)| {
            let q = jeffreys(s.failure.k, s.trials - s.skipped_dead);
            let w = s.weight * c.live_share;
            Stratum { weight: w, sd: (q * (1.0 - q)).sqrt(), population: c.population * c.live_share }
        })
        .collect();
    // The fewest trials that reach the margin, spread by Neyman allocation (one at least each).
    let neyman_plan = |strata: &[Stratum]| neyman_allocation(strata, neyman_trials(strata, margin, z).ceil() as u64, 1);
    for ((c, n), l) in classes.iter_mut().zip(neyman_plan(&design)).zip(neyman_plan(&live)) {
        (c.neyman, c.live_neyman) = (n, l);
    }
    let total: f64 = classes.iter().map(|c| c.population).sum();
    // Uniform sampling's rate is the classes' rates weighted by their bits, at the same
    // estimates, so that it never plans fewer trials than Neyman's allocation.
    let pooled: f64 = (pilot.classes.iter()).map(|s| s.weight * centre(&s.failure)).sum();
    let pq: f64 = design.iter().map(|s| s.weight * s.weight * s.sd * s.sd).sum();
    let per_class = (z * z * pq / (margin * margin)).ceil() as u64;
    Ok(CampaignPlan {
        margin,
        confidence,
        pilot: stats::Interval { p, lo, hi },
        pilot_trials,
        uniform_worst_case: trials_for_margin(total, margin, z, 0.5).ceil() as u64,
        uniform: trials_for_margin(total, margin, z, pooled).ceil() as u64,
        equal_per_class: per_class * classes.len() as u64,
        neyman: classes.iter().map(|c| c.neyman).sum(),
        live_neyman: classes.iter().map(|c| c.live_neyman).sum(),
        classes,
        golden_seconds,
        threads,
    })
}

/// Cycles a trial's fault may fall on in one step: all of the step's, or one for faults that
/// cover whole steps.
fn cycles_sampled(info: &CampaignInfo) -> f64 {
    if info.spec.fault.whole_steps() {
        1.0
    } else {
        info.cycles_per_step as f64
    }
}
