//! Running trials: the whole campaign, a shard of it, or an adaptive campaign round by round
//! (unsharded, or one round of a shard).

use super::rounds::{Next, Rounds};
use super::workers::{run_ordered, Writer, WINDOW_PER_THREAD};
use super::Campaign;
use crate::error::{FaultError, Result};
use crate::outcome::Outcome;
use crate::record::{Summary, TrialRecord};
use crate::spec::Sampling;
use crate::store;
use faultline_hw::ExecMode;
use faultline_train::Trainer;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
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
    /// failing one are written. An adaptive campaign runs as [`Campaign::run_rounds`] without
    /// `after`.
    pub fn run(&self, out: &Path, opts: RunOptions, progress: impl Fn(Progress) + Sync) -> Result<Summary> {
        if matches!(self.info.spec.sampling, Sampling::Adaptive { .. }) {
            return Ok(self.run_rounds(out, opts, None, progress)?.0);
        }
        // The lock is held until the summary is written.
        let (_lock, done) = store::open_output(out, &self.info, &self.id, opts)?;
        let ids: Vec<u64> = opts.shard.trials(self.info.trials).collect();
        progress(Progress::Start { recorded: done as u64, trials: ids.len() as u64 });
        self.run_ids(out, opts, &ids[done.min(ids.len())..], &progress, None)?;
        store::finish(out)
    }

    /// An adaptive campaign: rounds planned from the outcomes of the rounds before
    /// ([`Rounds::advance`]). Unsharded and without `after`, it runs round after round until
    /// the target or the budget is reached. A shard (or `after` given) runs one round, its
    /// slice of it: the first round, or the round after those whose records the merged
    /// directory `after` holds, appending to the shard's slices of the earlier rounds in `out`;
    /// nothing if the campaign is finished. A resumed run plans the same rounds from the same
    /// records and runs what is missing. Returns the summary of `out` and, for the loop, that
    /// the campaign is finished, for one round, the round it ran (or that it is finished).
    pub fn run_rounds(
        &self,
        out: &Path,
        opts: RunOptions,
        after: Option<&Path>,
        progress: impl Fn(Progress) + Sync,
    ) -> Result<(Summary, Next)> {
        let not_adaptive = || FaultError::Invalid {
            file: PathBuf::from(&self.info.spec_file),
            field: "sampling".into(),
            value: format!("{:?}", self.info.spec.sampling),
            allowed: "Adaptive(...): only an adaptive campaign runs in rounds".into(),
        };
        let rounds = Rounds::of(&self.info).ok_or_else(not_adaptive)?;
        // The rounds are planned from campaign.json's weights alone (a merge has no golden
        // run), which must be those the trials are drawn with.
        let strata: Vec<f64> = self.space.strata.iter().map(|s| s.weight).collect();
        let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
        if rounds.weights().len() != strata.len() || !rounds.weights().iter().zip(&strata).all(|(&a, &b)| same(a, b)) {
            return Err(FaultError::Inconsistent(format!(
                "the strata campaign.json describes (weights {:?}) are not those sampled ({strata:?})",
                rounds.weights()
            )));
        }
        self.space.rounds.write().expect("no thread panics holding the rounds").clear();
        if opts.shard == Shard::ALL && after.is_none() {
            self.run_all_rounds(out, opts, rounds, &progress)
        } else {
            self.run_one_round(out, opts, after, rounds, &progress)
        }
    }

    /// Plans in [`Campaign::space`] the rounds `rounds` planned, so trials draw from their
    /// strata.
    fn plan_rounds(&self, rounds: &Rounds) {
        let have = self.space.rounds.read().expect("no thread panics holding the rounds").len();
        for r in &rounds.planned()[have..] {
            self.space.plan_round(r.clone());
        }
    }

    /// Every round, unsharded, until the campaign is finished.
    fn run_all_rounds(
        &self,
        out: &Path,
        opts: RunOptions,
        mut rounds: Rounds,
        progress: &(impl Fn(Progress) + Sync),
    ) -> Result<(Summary, Next)> {
        let (_lock, done) = store::open_output(out, &self.info, &self.id, opts)?;
        let Sampling::Adaptive { budget, .. } = self.info.spec.sampling else { unreachable!("adaptive rounds") };
        progress(Progress::Start { recorded: done as u64, trials: budget });
        // Every trial's outcome in trial order: those recorded before (read once), then each
        // round's as it is written.
        let mut outcomes: Vec<Outcome> = if done > 0 { store::outcomes(out)? } else { Vec::new() };
        loop {
            let next = rounds.advance(&outcomes);
            self.plan_rounds(&rounds);
            let trials = match &next {
                Next::Round { trials, .. } => trials.clone(),
                Next::Finished { trials, .. } if outcomes.len() as u64 > *trials => {
                    return Err(FaultError::Output {
                        path: out.join("records.jsonl"),
                        why: format!(
                            "holds {} trials, past the {trials} after which the adaptive campaign stops",
                            outcomes.len()
                        ),
                    })
                }
                Next::Finished { .. } => return Ok((store::finish(out)?, next)),
            };
            let todo: Vec<u64> = trials.clone().filter(|&t| t >= outcomes.len() as u64).collect();
            self.run_ids(out, opts, &todo, progress, Some(&mut outcomes))?;
            if (outcomes.len() as u64) < trials.end {
                return Err(FaultError::Inconsistent(format!(
                    "trial {} of an adaptive round is not recorded in {}",
                    outcomes.len(),
                    out.display()
                )));
            }
        }
    }

    /// This shard's slice of one round: the first, or the one after the rounds merged in
    /// `after`; `out` must hold this shard's slices of the rounds before it (and may hold part
    /// of this one, which it continues).
    fn run_one_round(
        &self,
        out: &Path,
        opts: RunOptions,
        after: Option<&Path>,
        mut rounds: Rounds,
        progress: &(impl Fn(Progress) + Sync),
    ) -> Result<(Summary, Next)> {
        let info_text = store::json_text(&self.info);
        let merged = match after {
            Some(dir) => store::merged_outcomes(dir, &info_text)?,
            None => Vec::new(),
        };
        let n = merged.len() as u64;
        let next = rounds.advance(&merged);
        let (start, end) = match &next {
            Next::Round { trials, .. } => (trials.start, trials.end),
            Next::Finished { .. } => (next.start(), next.start()),
        };
        let after_path = after.unwrap_or(Path::new(""));
        if n != start {
            let why = match &next {
                Next::Round { index, .. } => format!(
                    "holds {n} trials, which end inside round {} (trials {start}..{end}): merge shards that all \
                     finished that round (run the others with --resume)",
                    index + 1
                ),
                Next::Finished { .. } => {
                    format!("holds {n} trials, past the {start} after which the adaptive campaign stops")
                }
            };
            return Err(FaultError::Output { path: after_path.join("records.jsonl"), why });
        }
        let shard = opts.shard;
        let (before, upto) = (shard.trials(start).count(), shard.trials(end).count());
        let slice = format!("shard {}/{}", shard.index, shard.count);
        if before > 0 && !out.join("campaign.json").exists() {
            return Err(FaultError::Output {
                path: out.into(),
                why: format!(
                    "holds no campaign, but {} holds {n} trials, {before} of them {slice}'s: --out must be the \
                     directory {slice} ran the earlier rounds in",
                    after_path.display()
                ),
            });
        }
        // With `after`, the directory holds the earlier rounds: continuing it is the point.
        let open = RunOptions { resume: opts.resume || after.is_some(), ..opts };
        let (_lock, done) = store::open_output(out, &self.info, &self.id, open)?;
        if done < before {
            return Err(FaultError::Output {
                path: out.into(),
                why: format!(
                    "holds {done} of {slice}'s trials, but {} holds {n} trials, {before} of them {slice}'s: not the \
                     directory merged there (or resume its earlier round first)",
                    after_path.display()
                ),
            });
        }
        if done > upto {
            let got = shard.trials(u64::MAX).nth(done - 1).unwrap_or(0);
            let why = match after {
                Some(dir) => format!(
                    "holds {slice}'s trials up to {got}, past {end}, where the round after the {n} trials of {} ends: \
                     pass the latest merge of the shards as --after",
                    dir.display()
                ),
                None => format!(
                    "holds {slice}'s trials up to {got}, past the first round (trials 0..{end}): pass --after \
                     MERGED_DIR, the merge of the shards' earlier rounds"
                ),
            };
            return Err(FaultError::Output { path: out.into(), why });
        }
        if let Some(dir) = after {
            store::check_slice(out, dir, shard, before as u64)?;
        }
        progress(Progress::Start { recorded: done as u64, trials: upto as u64 });
        if let Next::Round { .. } = next {
            self.plan_rounds(&rounds);
            let todo: Vec<u64> = shard.trials(end).skip(done).collect();
            self.run_ids(out, opts, &todo, progress, None)?;
        }
        Ok((store::finish(out)?, next))
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
