//! The rounds of an adaptive campaign, replayed from its outcomes: the one place that decides
//! them, for an unsharded run, a shard running the next round (`--after`) and a merge saying
//! whether another round is due. Each round is a pure function of the spec and the outcomes of
//! the rounds before, so every process that replays the same outcomes plans the same rounds.

use crate::outcome::Outcome;
use crate::record::CampaignInfo;
use crate::spec::{Sampling, Target};
use crate::stats::design::{next_round, Stratum};
use crate::stats::{stratified, Estimate};
use std::ops::Range;

/// Why an adaptive campaign stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The combined failure rate's interval met the target.
    Target,
    /// The budget is spent.
    Budget,
}

/// Where an adaptive campaign stands, given its first outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Round `index` (0-based) is the first whose trials are not all among the outcomes.
    Round {
        /// Its number, 0 for the first.
        index: usize,
        /// Its trial ids: trials are numbered round after round, stratum after stratum.
        trials: Range<u64>,
        /// Its trials in each stratum.
        per_stratum: Vec<u64>,
    },
    /// No round is due: the campaign ends after `rounds` rounds, `trials` trials.
    Finished {
        /// Rounds run.
        rounds: usize,
        /// Trials run.
        trials: u64,
        /// Why it stopped.
        why: Finish,
    },
}

/// The rounds of an adaptive campaign planned so far, and the outcomes they were planned from.
#[derive(Debug, Clone)]
pub struct Rounds {
    /// Each stratum's share of the sampled space (summing to its live share).
    weights: Vec<f64>,
    target: Target,
    budget: u64,
    round: u64,
    floor: u64,
    /// Trials of each stratum in each round planned so far.
    planned: Vec<Vec<u64>>,
    /// Rounds whose outcomes are counted, and the trials they hold.
    counted: usize,
    counted_trials: u64,
    /// `(failures, trials)` of each stratum over the counted rounds.
    counts: Vec<(u64, u64)>,
    finished: Option<Finish>,
}

impl Rounds {
    /// The rounds of a campaign whose strata hold shares `weights` of its space, under
    /// `sampling` (`None` unless it is `Adaptive`).
    pub fn new(weights: Vec<f64>, sampling: Sampling) -> Option<Rounds> {
        let Sampling::Adaptive { target, budget, round, floor } = sampling else { return None };
        let counts = vec![(0, 0); weights.len()];
        Some(Rounds {
            weights,
            target,
            budget,
            round,
            floor,
            planned: Vec::new(),
            counted: 0,
            counted_trials: 0,
            counts,
            finished: None,
        })
    }

    /// The rounds of the campaign `campaign.json` describes (`None` unless it is adaptive): its
    /// strata are each class's bit fields ([`crate::sample::strata_fields`]), class after class, as [`crate::sample::Space`] lays them out, each weighted by the
    /// class's share of the space, the share of it that is sampled (`sampled_share`) and the
    /// field's share of its bits, as the summary weights them; so that a merge can plan
    /// without the golden run.
    pub fn of(info: &CampaignInfo) -> Option<Rounds> {
        let weights = (info.classes.iter())
            .flat_map(|c| {
                let fields: Vec<usize> =
                    (crate::sample::strata_fields(c.format.as_deref(), c.width, c.class.ends_with(".check")).iter())
                        .map(|(_, p)| p.len())
                        .collect();
                let share = c.weight * c.sampled_share.unwrap_or(1.0);
                fields.into_iter().map(move |n| share * n as f64 / f64::from(c.width.max(1)))
            })
            .collect();
        Rounds::new(weights, info.spec.sampling)
    }

    /// Each stratum's share of the sampled space.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Trials of each stratum in each round planned so far.
    pub fn planned(&self) -> &[Vec<u64>] {
        &self.planned
    }

    /// Counts `outcomes` (the campaign's first outcomes in trial order, extending those of
    /// earlier calls) round by round, planning each next round from the rounds before, and
    /// returns the first round not wholly among them, or that the campaign is finished.
    /// Outcomes past the end of a finished campaign are not looked at.
    pub fn advance(&mut self, outcomes: &[Outcome]) -> Next {
        loop {
            if let Some(why) = self.finished {
                return Next::Finished { rounds: self.planned.len(), trials: self.counted_trials, why };
            }
            if self.counted == self.planned.len() {
                match self.plan() {
                    Some(r) => self.planned.push(r),
                    None => continue,
                }
            }
            let per_stratum = &self.planned[self.counted];
            let start = self.counted_trials;
            let trials = start..start + per_stratum.iter().sum::<u64>();
            if (outcomes.len() as u64) < trials.end {
                return Next::Round { index: self.counted, trials, per_stratum: per_stratum.clone() };
            }
            // A round's trials are numbered stratum after stratum.
            let mut t = start as usize;
            for (c, &n) in self.counts.iter_mut().zip(per_stratum) {
                c.0 += outcomes[t..t + n as usize].iter().filter(|o| o.failure()).count() as u64;
                c.1 += n;
                t += n as usize;
            }
            self.counted += 1;
            self.counted_trials = trials.end;
        }
    }

    /// The next round from the counted ones (`floor` per stratum first), or `None` with
    /// `finished` set once the target is met or the budget spent.
    fn plan(&mut self) -> Option<Vec<u64>> {
        let have = self.counted_trials;
        if have == 0 {
            return Some(vec![self.floor; self.weights.len()]);
        }
        let est: Vec<(f64, Estimate)> =
            (self.weights.iter().zip(&self.counts)).map(|(&w, &(k, n))| (w, Estimate::of(k, n))).collect();
        let (p, lo, hi) = stratified(&est);
        if self.target.met(p, lo, hi) {
            self.finished = Some(Finish::Target);
            return None;
        }
        if have >= self.budget {
            self.finished = Some(Finish::Budget);
            return None;
        }
        let design: Vec<Stratum> = est.iter().map(|(w, e)| Stratum::at_wilson_centre(*w, e)).collect();
        let have_per: Vec<u64> = self.counts.iter().map(|c| c.1).collect();
        let r = next_round(&design, &have_per, self.round.min(self.budget - have), 0);
        // An empty round would plan itself forever.
        if r.iter().sum::<u64>() == 0 {
            self.finished = Some(Finish::Budget);
            return None;
        }
        Some(r)
    }
}

impl Next {
    /// The first trial of the round due, or, once finished, the trials run: where the outcomes
    /// of whole earlier rounds end.
    pub fn start(&self) -> u64 {
        match self {
            Next::Round { trials, .. } => trials.start,
            Next::Finished { trials, .. } => *trials,
        }
    }
}

impl std::fmt::Display for Next {
    /// The line `faultline campaign` and `faultline merge` end with (without the advice of
    /// what to run next, which depends on the command).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Next::Round { index, trials, .. } => {
                write!(
                    f,
                    "round {} (trials {}..{}, {})",
                    index + 1,
                    trials.start,
                    trials.end,
                    trials.end - trials.start
                )
            }
            Next::Finished { rounds, trials, why } => {
                let why = match why {
                    Finish::Target => "target met",
                    Finish::Budget => "budget spent",
                };
                write!(f, "finished: {why} after {rounds} rounds, {trials} trials")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rounds(target: Target) -> Rounds {
        Rounds::new(
            vec![1000.0 / 1510.0, 10.0 / 1510.0, 500.0 / 1510.0],
            Sampling::Adaptive { target, budget: 300, round: 50, floor: 5 },
        )
        .expect("adaptive")
    }

    /// Every seventh trial fails.
    fn outcomes(n: usize) -> Vec<Outcome> {
        (0..n).map(|t| if t % 7 == 0 { Outcome::SharpDegrade } else { Outcome::HwMasked }).collect()
    }

    /// Until the campaign is finished, every round until the budget is spent.
    fn replay(r: &mut Rounds) -> Next {
        let mut seen = Vec::new();
        loop {
            match r.advance(&seen) {
                Next::Round { trials, .. } => seen = outcomes(trials.end as usize),
                done => return done,
            }
        }
    }

    /// Outcomes given all at once, round by round or one at a time plan the same rounds: the
    /// floor first, then rounds of `round` trials, the last cut to the budget; outcomes that
    /// end inside a round give that round.
    #[test]
    fn the_rounds_are_the_same_however_the_outcomes_arrive() {
        let mut whole = rounds(Target::Absolute(1e-6));
        let done = replay(&mut whole);
        assert_eq!(done, Next::Finished { rounds: 7, trials: 300, why: Finish::Budget });
        let sizes: Vec<u64> = whole.planned().iter().map(|r| r.iter().sum()).collect();
        assert_eq!(sizes, [15, 50, 50, 50, 50, 50, 35]);
        assert_eq!(whole.planned()[0], [5, 5, 5]);
        let all = outcomes(300);
        let mut at_once = rounds(Target::Absolute(1e-6));
        assert_eq!(at_once.advance(&all), done);
        assert_eq!(at_once.planned(), whole.planned());
        let mut one_by_one = rounds(Target::Absolute(1e-6));
        for n in 0..=300 {
            let next = one_by_one.advance(&all[..n]);
            if let Next::Round { trials, index, .. } = &next {
                assert!(trials.contains(&(n as u64)), "{n} outcomes: {next:?}");
                assert_eq!(whole.planned()[*index].iter().sum::<u64>(), trials.end - trials.start);
            }
        }
        assert_eq!(one_by_one.advance(&all), done);
        assert_eq!(one_by_one.planned(), whole.planned());
        // A target a round meets stops the campaign there.
        let mut met = rounds(Target::Absolute(0.5));
        assert_eq!(replay(&mut met), Next::Finished { rounds: 1, trials: 15, why: Finish::Target });
    }
}
