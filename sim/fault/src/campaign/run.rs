//! Running trials: the whole campaign, a shard of it, or an adaptive campaign round by round.

use super::workers::{run_ordered, Writer, WINDOW_PER_THREAD};
use super::Campaign;
use crate::error::{FaultError, Result};
use crate::outcome::Outcome;
use crate::record::{Summary, TrialRecord};
use crate::spec::{Sampling, Target};
use crate::stats::design::{next_round, Stratum};
use crate::stats::Estimate;
use crate::store;
use faultline_hw::ExecMode;
use faultline_train::Trainer;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// A deterministic slice of a campaign: trials `t` with `t % count == index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This slice, `0..count`.
    pub index: u64,
    /// Slices in all.
    pub count: u64,
}

impl Shard {
    /// The whole campaign.
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// Parses `I/N` (0-based `I < N`).
    pub fn parse(s: &str) -> std::result::Result<Shard, String> {
        let bad = || format!("`{s}` is not a shard: expected I/N with 0 <= I < N, e.g. 0/4");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// This shard's trials of `trials`, in order.
    pub fn trials(self, trials: u64) -> impl Iterator<Item = u64> {
        (self.index..trials).step_by(self.count as usize)
    }
}

/// What [`Campaign::run`] reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// Before the first trial: this shard's trials, of which `recorded` are in the output
    /// already (a resumed run).
    Start {
        /// Trials recorded before this run.
        recorded: u64,
        /// This shard's trials.
        trials: u64,
    },
    /// A trial ended.
    Trial(&'a TrialRecord),
}

/// How a campaign runs (none of it changes a record).
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Worker threads.
    pub threads: usize,
    /// The slice to run.
    pub shard: Shard,
    /// Continue the records already in the output directory.
    pub resume: bool,
    /// How the injection step runs.
    pub mode: TrialMode,
}

/// How a trial's steps run: never changes a record (the twins are bit-exact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrialMode {
    /// The faulted instruction at register level, everything else functionally; provably dead
    /// faults are not run.
    #[default]
    Hybrid,
    /// Every instruction of every step at register level, dead faults included: the reference
    /// hybrid trials are checked and timed against.
    CycleLevel,
}

impl Campaign {
    /// Runs the campaign's `opts.shard` into `out`, telling `progress` how many trials are
    /// recorded already and then each trial as it ends (from worker threads), and returns the
    /// summary of the records in `out`. Idle workers take the next trial (each with its own
    /// trainer) and records are written in trial order; on an error, the trials before the first
    /// failing one are written.
    pub fn run(&self, out: &Path, opts: RunOptions, progress: impl Fn(Progress) + Sync) -> Result<Summary> {
        if let Sampling::Adaptive { target, budget, round, floor } = self.info.spec.sampling {
            return self.run_adaptive(out, opts, (target, budget, round, floor), &progress);
        }
        // The lock is held until the summary is written.
        let (_lock, done) = store::open_output(out, &self.info, &self.id, opts)?;
        let ids: Vec<u64> = opts.shard.trials(self.info.trials).collect();
        progress(Progress::Start { recorded: done as u64, trials: ids.len() as u64 });
        self.run_ids(out, opts, &ids[done.min(ids.len())..], &progress, None)?;
        store::finish(out)
    }

    /// An adaptive campaign: rounds planned from the records of the rounds before
    /// ([`crate::stats::design::next_round`]), run until the target or the budget is reached.
    /// A resumed run plans the same rounds from the same records and runs what is missing.
    fn run_adaptive(
        &self,
        out: &Path,
        opts: RunOptions,
        (target, budget, round, floor): (Target, u64, u64, u64),
        progress: &(impl Fn(Progress) + Sync),
    ) -> Result<Summary> {
        if opts.shard != Shard::ALL {
            return Err(FaultError::Invalid {
                file: out.join("campaign.json"),
                field: "sampling".into(),
                value: "Adaptive".into(),
                allowed: "an unsharded run (--shard 0/1): each round is planned from every earlier trial".into(),
            });
        }
        let (_lock, done) = store::open_output(out, &self.info, &self.id, opts)?;
        progress(Progress::Start { recorded: done as u64, trials: budget });
        let strata = &self.space.strata;
        let mut counts = vec![(0u64, 0u64); strata.len()];
        // Every trial's outcome in trial order: those recorded before (read once), then each
        // round's as it is written.
        let mut outcomes: Vec<Outcome> = if done > 0 { store::outcomes(out)? } else { Vec::new() };
        self.space.rounds.write().expect("no thread panics holding the rounds").clear();
        loop {
            let have: u64 = counts.iter().map(|c| c.1).sum();
            let next = if have == 0 {
                vec![floor; strata.len()]
            } else {
                let est: Vec<(f64, Estimate)> =
                    (strata.iter().zip(&counts)).map(|(s, &(k, n))| (s.weight, Estimate::of(k, n))).collect();
                let (p, lo, hi) = crate::stats::stratified(&est);
                if target.met(p, lo, hi) || have >= budget {
                    break;
                }
                let design: Vec<Stratum> = est.iter().map(|(w, e)| Stratum::at_wilson_centre(*w, e)).collect();
                let have_per: Vec<u64> = counts.iter().map(|c| c.1).collect();
                next_round(&design, &have_per, round.min(budget - have), 0)
            };
            let ids = self.space.plan_round(next.clone());
            let todo: Vec<u64> = ids.clone().filter(|&t| t >= done as u64).collect();
            self.run_ids(out, opts, &todo, progress, Some(&mut outcomes))?;
            // The round's trials are numbered stratum after stratum.
            let mut t = ids.start;
            for (s, &n) in next.iter().enumerate() {
                for t in t..t + n {
                    let o = outcomes.get(t as usize).ok_or_else(|| {
                        FaultError::Inconsistent(format!(
                            "trial {t} of an adaptive round is not recorded in {}",
                            out.display()
                        ))
                    })?;
                    counts[s].0 += o.failure() as u64;
                }
                counts[s].1 += n;
                t += n;
            }
        }
        store::finish(out)
    }

    /// Runs trials `todo` (in order, after those recorded in `out`) on `opts.threads` workers,
    /// appending their outcomes, in trial order, to `outcomes` if given.
    fn run_ids(
        &self,
        out: &Path,
        opts: RunOptions,
        todo: &[u64],
        progress: &(impl Fn(Progress) + Sync),
        mut outcomes: Option<&mut Vec<Outcome>>,
    ) -> Result<()> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads.max(1))
            .build()
            .map_err(|e| FaultError::Inconsistent(format!("cannot start worker threads: {e}")))?;
        let mut writer = Writer::open(out)?;
        let trainer = || {
            let mut t = self.trainer();
            if opts.mode == TrialMode::CycleLevel {
                t.exec.mode = ExecMode::CycleLevel;
            }
            t
        };
        let trial = |tr: &mut Trainer, i: usize| {
            let clock = Instant::now();
            let (rec, time) = self.trial_timed(tr, todo[i])?;
            let wall = clock.elapsed();
            progress(Progress::Trial(&rec));
            Ok((rec, wall, time))
        };
        let window = WINDOW_PER_THREAD * pool.current_num_threads();
        let ran = run_ordered(&pool, todo.len(), window, trainer, trial, |batch| {
            if let Some(o) = outcomes.as_mut() {
                o.extend(batch.iter().map(|(rec, _, _)| rec.outcome));
            }
            writer.add(&batch)
        });
        // What was recorded is kept, whatever stopped the run.
        writer.finish()?;
        ran
    }
}
