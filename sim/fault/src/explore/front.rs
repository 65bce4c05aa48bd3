//! Telling plans apart: every pair compared on the trials that are the same faults under both
//! (McNemar's exact test, the paired difference), and the Pareto fronts by point estimate and
//! at [`CONFIDENCE`].

use super::{PlanComparison, PlanResult, POWER};
use crate::outcome::Outcome;
use crate::stats::paired::{mover, PairedCounts};
use crate::stats::Interval;

/// Every pair of `runs` (plan name, outcomes, which trials pair with the baseline's)
/// compared on the trials paired under both, stratified by the baseline's classes (of
/// `weights`, each trial's in `class_of`), each test at level `alpha`.
pub(super) fn compare_plans(
    weights: &[f64],
    class_of: &[usize],
    runs: &[(&str, &[Outcome], &[bool])],
    alpha: f64,
) -> Vec<PlanComparison> {
    let z = crate::stats::z(1.0 - alpha);
    let mut out = Vec::new();
    for i in 0..runs.len() {
        for j in i + 1..runs.len() {
            let ((ni, oi, pi), (nj, oj, pj)) = (runs[i], runs[j]);
            let mut per_class = vec![Vec::new(); weights.len()];
            for (t, &k) in class_of.iter().enumerate() {
                if pi[t] && pj[t] {
                    per_class[k].push((oi[t].failure(), oj[t].failure()));
                }
            }
            let strata: Vec<PairedCounts> = per_class.into_iter().map(PairedCounts::of).collect();
            let parts: Vec<(f64, Interval)> =
                (strata.iter().zip(weights)).filter(|(c, _)| c.n() > 0).map(|(c, &w)| (w, c.difference(z))).collect();
            let d = mover(&parts);
            let counts: PairedCounts = strata.iter().copied().sum();
            let p_value = counts.p_value();
            out.push(PlanComparison {
                first: ni.to_string(),
                second: nj.to_string(),
                counts,
                difference: Interval { p: d.p, lo: d.lo.max(-1.0), hi: d.hi.min(1.0) },
                p_value,
                separated: p_value < alpha,
                trials_needed: counts.trials_to_separate(alpha, POWER),
            });
        }
    }
    out
}

/// Marks [`PlanResult::front_at_confidence`]: the front with failure rates that `comparisons`
/// cannot tell apart counted as equal.
pub(super) fn mark_front_at_confidence(plans: &mut [PlanResult], comparisons: &[PlanComparison]) {
    let cmp = |a: &str, b: &str| -> Option<std::cmp::Ordering> {
        let c = comparisons.iter().find(|c| (c.first == a && c.second == b) || (c.first == b && c.second == a))?;
        if !c.separated {
            return Some(std::cmp::Ordering::Equal);
        }
        // Told apart: the first fails less when more trials failed under the second alone.
        let first_less = c.counts.second_only > c.counts.first_only;
        Some(if first_less == (c.first == a) { std::cmp::Ordering::Less } else { std::cmp::Ordering::Greater })
    };
    let costs = |p: &PlanResult| [p.area_bits as f64, p.cycle_overhead];
    let dominated: Vec<bool> = plans
        .iter()
        .map(|b| {
            plans.iter().any(|a| {
                let (ca, cb) = (costs(a), costs(b));
                if a.plan == b.plan || !ca.iter().zip(&cb).all(|(x, y)| x <= y) {
                    return false;
                }
                match cmp(&a.plan, &b.plan) {
                    Some(std::cmp::Ordering::Less) => true,
                    Some(std::cmp::Ordering::Equal) => ca.iter().zip(&cb).any(|(x, y)| x < y),
                    _ => false,
                }
            })
        })
        .collect();
    for (p, d) in plans.iter_mut().zip(dominated) {
        p.front_at_confidence = !d;
    }
}

/// Marks the plans no other plan dominates in (residual FIT, check bits, cycle overhead).
pub(super) fn mark_pareto(plans: &mut [PlanResult]) {
    let key = |p: &PlanResult| [p.failure_fit.p, p.area_bits as f64, p.cycle_overhead];
    let keys: Vec<[f64; 3]> = plans.iter().map(key).collect();
    for (i, p) in plans.iter_mut().enumerate() {
        p.pareto = !keys.iter().enumerate().any(|(j, k)| {
            j != i && k.iter().zip(&keys[i]).all(|(a, b)| a <= b) && k.iter().zip(&keys[i]).any(|(a, b)| a < b)
        });
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::CONFIDENCE;
    use super::*;

    pub(crate) fn plan(name: &str, cycle_overhead: f64, failure: f64) -> PlanResult {
        let i = Interval { p: failure, lo: failure, hi: failure };
        PlanResult { cycle_overhead, failure: i, failure_fit: i, ..PlanResult::blank(name.into()) }
    }

    fn compare(first: &str, second: &str, first_only: u64, second_only: u64) -> PlanComparison {
        let counts = PairedCounts { both: 0, first_only, second_only, neither: 1000 };
        PlanComparison {
            first: first.into(),
            second: second.into(),
            counts,
            difference: counts.difference(crate::stats::Z95),
            p_value: counts.p_value(),
            separated: counts.p_value() < 1.0 - CONFIDENCE,
            trials_needed: counts.trials_to_separate(1.0 - CONFIDENCE, POWER),
        }
    }

    /// The front at 95%: a dearer plan stays on it only if it fails demonstrably less than
    /// every cheaper one. `cheap` (3/0 against `none`, not told apart) is dominated by `none`;
    /// `dear` is told apart from `none` (8/0) but not from the cheaper `cheap`, so it is off;
    /// `dearest` is told apart from both and stays. Point estimates alone keep all four.
    #[test]
    fn front_at_confidence_counts_ties_as_equal() {
        let mut plans = vec![
            plan("none", 0.0, 0.010),
            plan("cheap", 0.1, 0.007),
            plan("dear", 0.5, 0.002),
            plan("dearest", 0.9, 0.0),
        ];
        let comparisons = vec![
            compare("none", "cheap", 3, 0),
            compare("none", "dear", 8, 0),
            compare("none", "dearest", 10, 0),
            compare("cheap", "dear", 5, 0),
            compare("cheap", "dearest", 7, 0),
            compare("dear", "dearest", 7, 0),
        ];
        mark_pareto(&mut plans);
        mark_front_at_confidence(&mut plans, &comparisons);
        assert!(plans.iter().all(|p| p.pareto));
        let front: Vec<&str> = plans.iter().filter(|p| p.front_at_confidence).map(|p| p.plan.as_str()).collect();
        assert_eq!(front, ["none", "dearest"]);
        assert!(comparisons[3].p_value > 0.05 && comparisons[4].p_value < 0.05);
    }
}
