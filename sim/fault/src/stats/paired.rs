//! Two plans on the same faults: each paired trial failed under both, one or neither. Only
//! the discordant pairs (failed under one plan alone) tell plans apart, so the comparison is
//! McNemar's exact test on them, the difference in failure rate with Newcombe's interval for
//! paired proportions, and Connor's (1987) sample size for telling them apart.

use super::{wilson, Interval};
use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, DiscreteCDF};

/// Paired trials of two plans, by which of them failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PairedCounts {
    /// Failed under both.
    pub both: u64,
    /// Failed under the first plan only.
    pub first_only: u64,
    /// Failed under the second plan only.
    pub second_only: u64,
    /// Failed under neither.
    pub neither: u64,
}

impl std::iter::Sum for PairedCounts {
    /// The counts of all the pairs, e.g. of every class's.
    fn sum<I: Iterator<Item = PairedCounts>>(iter: I) -> PairedCounts {
        iter.fold(PairedCounts::default(), |a, c| PairedCounts {
            both: a.both + c.both,
            first_only: a.first_only + c.first_only,
            second_only: a.second_only + c.second_only,
            neither: a.neither + c.neither,
        })
    }
}

impl PairedCounts {
    /// The counts of paired outcomes `(failed under the first, failed under the second)`.
    pub fn of(pairs: impl IntoIterator<Item = (bool, bool)>) -> PairedCounts {
        let mut c = PairedCounts::default();
        for pair in pairs {
            match pair {
                (true, true) => c.both += 1,
                (true, false) => c.first_only += 1,
                (false, true) => c.second_only += 1,
                (false, false) => c.neither += 1,
            }
        }
        c
    }

    /// Paired trials.
    pub fn n(&self) -> u64 {
        self.both + self.first_only + self.second_only + self.neither
    }

    /// Trials on which the plans disagree.
    pub fn discordant(&self) -> u64 {
        self.first_only + self.second_only
    }

    /// Two-sided p-value of McNemar's exact test ([`mcnemar_exact`]).
    pub fn p_value(&self) -> f64 {
        mcnemar_exact(self.first_only, self.second_only)
    }

    /// The first plan's failure rate minus the second's, with Newcombe's (1998) interval for
    /// paired proportions at normal quantile `z` (his method 10: the two rates' Wilson
    /// intervals combined with the pairs' correlation). `n == 0` gives `[-1, 1]`.
    pub fn difference(&self, z: f64) -> Interval {
        let n = self.n();
        if n == 0 {
            return Interval { p: 0.0, lo: -1.0, hi: 1.0 };
        }
        let (a, b, c, d) = (self.both as f64, self.first_only as f64, self.second_only as f64, self.neither as f64);
        let (p1, p2) = ((a + b) / n as f64, (a + c) / n as f64);
        let (l1, u1) = wilson(self.both + self.first_only, n, z);
        let (l2, u2) = wilson(self.both + self.second_only, n, z);
        // The pairs' phi coefficient, 0 when a margin is empty; Newcombe's continuity
        // correction keeps a positive correlation from narrowing the interval too far.
        let den = ((a + b) * (c + d) * (a + c) * (b + d)).sqrt();
        let num = if a * d > b * c { (a * d - b * c - n as f64 / 2.0).max(0.0) } else { a * d - b * c };
        let phi = if den > 0.0 { num / den } else { 0.0 };
        let dl = ((p1 - l1).powi(2) - 2.0 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2).powi(2)).max(0.0).sqrt();
        let du = ((u1 - p1).powi(2) - 2.0 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2).powi(2)).max(0.0).sqrt();
        let diff = p1 - p2;
        Interval { p: diff, lo: (diff - dl).max(-1.0), hi: (diff + du).min(1.0) }
    }

    /// Paired trials that would give McNemar's test at two-sided level `alpha` the power
    /// `power` against the difference these counts show (Connor 1987), at their discordance.
    /// Where they show none (as many failures either way), against the largest difference
    /// their interval at level `alpha` allows, so the answer is the fewest trials that could
    /// tell the plans apart if they differ at all. `None` without paired trials.
    pub fn trials_to_separate(&self, alpha: f64, power: f64) -> Option<u64> {
        let n = self.n();
        if n == 0 {
            return None;
        }
        let za = super::z(1.0 - alpha);
        let zb = super::z(2.0 * power - 1.0);
        let mut delta = (self.first_only as f64 - self.second_only as f64).abs() / n as f64;
        let mut psi = self.discordant() as f64 / n as f64;
        if delta == 0.0 {
            let d = self.difference(za);
            delta = d.hi.max(-d.lo);
            psi = psi.max(delta);
        }
        let need = (za * psi.sqrt() + zb * (psi - delta * delta).max(0.0).sqrt()).powi(2) / (delta * delta);
        Some(need.ceil().min(u64::MAX as f64) as u64)
    }
}

/// Two-sided exact McNemar test of `b` against `c` discordant pairs: the chance of a split at
/// least this uneven if each discordant pair were as likely to fall either way (a binomial
/// sign test on the `b + c` discordant pairs). 1 without discordant pairs.
pub fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let tail = Binomial::new(0.5, n).expect("p = 1/2 is a probability").cdf(b.min(c));
    (2.0 * tail).min(1.0)
}

/// The weighted sum `sum w x` of independent estimates `x` with intervals, and its interval by
/// Zou & Donner's (2008) MOVER: each side's half-width is the root of the summed squares of
/// the parts' distances to that side, so skewed intervals of rare rates stay skewed and a
/// part seen without a single event still widens the sum.
pub fn mover(parts: &[(f64, Interval)]) -> Interval {
    let p: f64 = parts.iter().map(|(w, x)| w * x.p).sum();
    let side = |f: fn(&Interval) -> f64| parts.iter().map(|(w, x)| (w * f(x)).powi(2)).sum::<f64>().sqrt();
    let (below, above) = (side(|x| x.p - x.lo), side(|x| x.hi - x.p));
    Interval { p, lo: p - below, hi: p + above }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Z95;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn mcnemar_is_the_exact_two_sided_binomial() {
        assert!((mcnemar_exact(6, 0) - 0.03125).abs() < 1e-12);
        assert!((mcnemar_exact(0, 6) - 0.03125).abs() < 1e-12);
        assert!((mcnemar_exact(3, 0) - 0.25).abs() < 1e-12);
        assert_eq!((mcnemar_exact(1, 1), mcnemar_exact(0, 0)), (1.0, 1.0));
        // P(X <= 2), X ~ B(12, 1/2), is 79/4096.
        assert!((mcnemar_exact(10, 2) - 2.0 * 79.0 / 4096.0).abs() < 1e-12);
        assert!(mcnemar_exact(600, 400) < 1e-9);
    }

    /// Newcombe's (1998) method 10 with his correction of a positive correlation, as
    /// Fagerland, Lydersen & Laake (2017, 8.5) give it: its values on 12 both, 2 first only,
    /// 5 second only, 21 neither, the mirror image with the plans swapped, and the Wilson bound
    /// of 0 of 20 either way where nothing failed.
    #[test]
    fn newcombe_interval() {
        let t = PairedCounts { both: 12, first_only: 2, second_only: 5, neither: 21 };
        let d = t.difference(Z95);
        assert!((d.p + 0.075).abs() < 1e-12, "{d:?}");
        assert!((d.lo + 0.20462).abs() < 1e-5 && (d.hi - 0.05942).abs() < 1e-5, "{d:?}");
        let m = PairedCounts { first_only: 5, second_only: 2, ..t }.difference(Z95);
        assert!((m.p + d.p).abs() < 1e-12 && (m.lo + d.hi).abs() < 1e-12 && (m.hi + d.lo).abs() < 1e-12);
        let d = PairedCounts { neither: 20, ..Default::default() }.difference(Z95);
        assert!(d.p == 0.0 && (d.lo + 0.16113).abs() < 1e-5 && (d.hi - 0.16113).abs() < 1e-5, "{d:?}");
    }

    /// Identical plans: every discordant pair falls either way with chance 1/2, and the exact
    /// test rejects at 5% in at most 5% of 2,000 simulated comparisons (it is conservative:
    /// a discrete test cannot spend all of its level).
    #[test]
    fn mcnemar_holds_its_level_on_identical_plans() {
        let mut rng = ChaCha8Rng::seed_from_u64(29);
        for &(n, p_fail, p_flip) in &[(2000u64, 0.01, 0.3), (500, 0.1, 0.5), (5000, 0.002, 1.0)] {
            let reps = 2000;
            let rejected = (0..reps)
                .filter(|_| {
                    // Each plan fails on its own draw of the same per-trial risk.
                    let pairs = (0..n).map(|_| {
                        let shared = rng.gen::<f64>() < p_fail;
                        let own = |rng: &mut ChaCha8Rng| {
                            if rng.gen::<f64>() < p_flip {
                                rng.gen::<f64>() < p_fail
                            } else {
                                shared
                            }
                        };
                        (own(&mut rng), own(&mut rng))
                    });
                    PairedCounts::of(pairs.collect::<Vec<_>>()).p_value() < 0.05
                })
                .count();
            let rate = rejected as f64 / reps as f64;
            assert!(rate <= 0.05, "n {n}: false positives {rate}");
        }
    }

    /// Where the plans truly differ, the paired interval covers the true difference in about
    /// 95% of simulated comparisons, rare and common failures alike.
    #[test]
    fn paired_interval_covers_the_true_difference() {
        let mut rng = ChaCha8Rng::seed_from_u64(1998);
        // (trials, P(first only), P(second only), P(both)).
        for &(n, b, c, a) in &[(2000u64, 0.004, 0.001, 0.002), (400, 0.05, 0.02, 0.1), (1000, 0.003, 0.0, 0.0)] {
            let truth = b - c;
            let reps = 2000;
            let covered = (0..reps)
                .filter(|_| {
                    let pairs: Vec<(bool, bool)> = (0..n)
                        .map(|_| match rng.gen::<f64>() {
                            u if u < a => (true, true),
                            u if u < a + b => (true, false),
                            u if u < a + b + c => (false, true),
                            _ => (false, false),
                        })
                        .collect();
                    let d = PairedCounts::of(pairs).difference(Z95);
                    d.lo <= truth && truth <= d.hi
                })
                .count();
            let cov = covered as f64 / reps as f64;
            assert!(cov >= 0.93, "n {n} b {b} c {c}: coverage {cov}");
        }
    }

    /// Connor's size is about what a simulated study needs: at the size it gives, the exact
    /// test separates plans that differ as the counts say in about the stated share.
    #[test]
    fn trials_to_separate_gives_the_power_asked() {
        let t = PairedCounts { both: 0, first_only: 4, second_only: 1, neither: 995 };
        assert!(t.p_value() > 0.05);
        let need = t.trials_to_separate(0.05, 0.8).unwrap();
        assert!((1000..100_000).contains(&need), "{need}");
        let mut rng = ChaCha8Rng::seed_from_u64(1987);
        let reps = 400;
        let separated = (0..reps)
            .filter(|_| {
                let (mut b, mut c) = (0, 0);
                for _ in 0..need {
                    match rng.gen::<f64>() {
                        u if u < 0.004 => b += 1,
                        u if u < 0.005 => c += 1,
                        _ => {}
                    }
                }
                mcnemar_exact(b, c) < 0.05
            })
            .count();
        let power = separated as f64 / reps as f64;
        assert!((0.7..0.92).contains(&power), "{need} trials: power {power}");
        // No discordance at all: sized against the interval's largest difference, so more
        // trials than were run.
        let none = PairedCounts { neither: 1000, ..Default::default() };
        assert!(none.trials_to_separate(0.05, 0.8).unwrap() > 1000);
        assert_eq!(PairedCounts::default().trials_to_separate(0.05, 0.8), None);
    }

    #[test]
    fn mover_of_one_part_is_the_part() {
        let x = Interval { p: 0.1, lo: 0.05, hi: 0.2 };
        assert_eq!(mover(&[(1.0, x)]), x);
        let s = mover(&[(0.5, x), (0.5, Interval { p: 0.0, lo: 0.0, hi: 0.1 })]);
        assert!((s.p - 0.05).abs() < 1e-12 && s.lo < s.p && s.hi > s.p + 0.05, "{s:?}");
    }
}
