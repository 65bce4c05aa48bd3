//! How many trials, and where: the trials a stated margin needs over a finite fault population
//! (Leveugle et al., DATE 2009), the fewest a stratified design needs and how it spreads them
//! (Neyman 1934), and the next round of an adaptive design that moves trials to the strata
//! whose estimates are least certain.

/// A stratum of a design: its share of the fault population, its outcome's standard deviation
/// (`sqrt(p (1 - p))`, from a pilot or the worst case 0.5) and its size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stratum {
    /// Share of the population, summing to 1 over the strata.
    pub weight: f64,
    /// Standard deviation of the outcome in it.
    pub sd: f64,
    /// Faults in it (trials beyond this draw faults again).
    pub population: f64,
}

impl Stratum {
    /// A stratum of weight `weight` whose outcome's deviation is taken at the centre of the
    /// Wilson interval of its estimate `e` so far (so a stratum without a hit still draws
    /// trials), over an unbounded population: what an adaptive round is planned from.
    pub fn at_wilson_centre(weight: f64, e: &super::Estimate) -> Stratum {
        let c = (e.lo + e.hi) / 2.0;
        Stratum { weight, sd: (c * (1.0 - c)).sqrt(), population: f64::INFINITY }
    }
}

/// Trials of a simple random sample that estimate a rate near `p` to within `margin` at
/// normal quantile `z`, over `population` faults (Leveugle et al. 2009, eq. 2:
/// `N / (1 + e^2 (N - 1) / (z^2 p (1 - p)))`); infinite populations give `z^2 p (1 - p) / e^2`.
pub fn trials_for_margin(population: f64, margin: f64, z: f64, p: f64) -> f64 {
    let n0 = z * z * p * (1.0 - p) / (margin * margin);
    if !population.is_finite() {
        return n0;
    }
    population / (1.0 + (population - 1.0) / n0)
}

/// Trials that would estimate the rate behind `e` (`k` of `n`) to within `relative` of itself
/// at quantile `z`, at its Jeffreys estimate `(k + 1/2) / (n + 1)` (so a rate never seen still
/// gets a size), over an infinite population: `z^2 (1 - p) / (relative^2 p)`.
pub fn trials_for_relative(k: u64, n: u64, relative: f64, z: f64) -> u64 {
    let p = (k as f64 + 0.5) / (n as f64 + 1.0);
    (z * z * (1.0 - p) / (relative * relative * p)).ceil() as u64
}

/// Trials of a stratified sample under Neyman allocation that estimate the combined rate to
/// within `margin` at quantile `z`: `(sum W S)^2 / ((e / z)^2 + sum W S^2 / N)` (Cochran 1977,
/// 5.26), `N` the whole population.
pub fn neyman_trials(strata: &[Stratum], margin: f64, z: f64) -> f64 {
    let total: f64 = strata.iter().map(|s| s.population).sum();
    let ws: f64 = strata.iter().map(|s| s.weight * s.sd).sum();
    let fpc: f64 = strata.iter().map(|s| s.weight * s.sd * s.sd).sum::<f64>() / total;
    ws * ws / ((margin / z).powi(2) + fpc)
}

/// `total` trials spread over `strata` by Neyman allocation (in proportion to `weight x sd`),
/// each stratum first given `floor` (so none goes unseen) and none more than its population;
/// whole trials by largest remainders, ties to the earlier stratum, so the result is a pure
/// function of its arguments.
pub fn neyman_allocation(strata: &[Stratum], total: u64, floor: u64) -> Vec<u64> {
    let cap = |s: &Stratum| if s.population.is_finite() { s.population.min(u64::MAX as f64) as u64 } else { u64::MAX };
    let mut alloc: Vec<u64> = strata.iter().map(|s| floor.min(cap(s))).collect();
    let mut left = total.saturating_sub(alloc.iter().sum());
    // Water-filling: share what is left among the strata below their cap, until it is gone
    // or every stratum is full.
    while left > 0 {
        let open: Vec<usize> = (0..strata.len()).filter(|&i| alloc[i] < cap(&strata[i])).collect();
        if open.is_empty() {
            break;
        }
        let key = |i: usize| (strata[i].weight * strata[i].sd).max(0.0);
        let sum: f64 = open.iter().map(|&i| key(i)).sum();
        let share = |i: usize| if sum > 0.0 { key(i) / sum } else { 1.0 / open.len() as f64 };
        let ideal: Vec<f64> = open.iter().map(|&i| left as f64 * share(i)).collect();
        let mut give: Vec<u64> = ideal.iter().map(|x| x.floor() as u64).collect();
        // Fewer than `open.len()` trials remain after the whole parts.
        let rest = left - give.iter().sum::<u64>();
        let mut order: Vec<usize> = (0..open.len()).collect();
        order.sort_by(|&a, &b| (ideal[b] - ideal[b].floor()).total_cmp(&(ideal[a] - ideal[a].floor())).then(a.cmp(&b)));
        for &j in order.iter().take(rest as usize) {
            give[j] += 1;
        }
        for (j, &i) in open.iter().enumerate() {
            let g = give[j].min(cap(&strata[i]) - alloc[i]);
            alloc[i] += g;
            left -= g;
        }
    }
    alloc
}

/// The next round of an adaptive design: `round` more trials, given `have` trials already run
/// per stratum, that bring each stratum as close as they can to its Neyman share of all the
/// trials run after it (the strata short of it get the round, in proportion to how short they
/// are). `floor` is the least every stratum has after the round. A pure function of its
/// arguments, so every process that computes a round computes the same one.
pub fn next_round(strata: &[Stratum], have: &[u64], round: u64, floor: u64) -> Vec<u64> {
    let after: u64 = have.iter().sum::<u64>() + round;
    let target = neyman_allocation(strata, after, floor);
    let short: Vec<Stratum> = (strata.iter().zip(&target).zip(have))
        .map(|((s, &t), &h)| Stratum {
            weight: t.saturating_sub(h) as f64,
            sd: 1.0,
            population: s.population - h as f64,
        })
        .collect();
    // Floors first: a stratum below `floor` gets up to it from this round.
    let mut add: Vec<u64> =
        have.iter().zip(strata).map(|(&h, s)| floor.saturating_sub(h).min(cap_left(s, h))).collect();
    let left = round.saturating_sub(add.iter().sum());
    let more = neyman_allocation(&short, left, 0);
    for (a, m) in add.iter_mut().zip(more) {
        *a += m;
    }
    add
}

/// Faults of stratum `s` not yet drawn after `have` trials.
fn cap_left(s: &Stratum, have: u64) -> u64 {
    if s.population.is_finite() {
        (s.population - have as f64).max(0.0) as u64
    } else {
        u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{stratified, Estimate, Z95};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn leveugle_sizes() {
        // Leveugle et al.'s table 1 (e = 1%, 95%, p = 0.5): 9,604 trials for an infinite
        // population, fewer for a small one.
        assert_eq!(trials_for_margin(f64::INFINITY, 0.01, Z95, 0.5).ceil(), 9604.0);
        let n = trials_for_margin(1e4, 0.01, Z95, 0.5).ceil();
        assert_eq!(n, 4900.0);
        assert!(trials_for_margin(1e12, 0.01, Z95, 0.5).ceil() == 9604.0);
    }

    #[test]
    fn relative_sizes() {
        // 8 of 300 (2.7%): 529 trials for +-50%; 0 of 300 plans at 0.17%.
        assert_eq!(trials_for_relative(8, 300, 0.5, Z95), 529);
        assert_eq!(trials_for_relative(0, 300, 0.5, Z95), 9235);
        assert!(trials_for_relative(30, 300, 0.5, Z95) < 300);
    }

    #[test]
    fn neyman_spends_where_the_variance_is() {
        let s = |weight, p: f64| Stratum { weight, sd: (p * (1.0 - p)).sqrt(), population: f64::INFINITY };
        let strata = [s(0.9, 0.0001), s(0.1, 0.3)];
        let a = neyman_allocation(&strata, 1000, 10);
        assert_eq!(a.iter().sum::<u64>(), 1000);
        assert!(a[1] > a[0] && a[0] >= 10, "{a:?}");
        // Fewer trials than proportional allocation for the same margin.
        let prop: f64 = strata.iter().map(|x| x.weight * x.sd * x.sd).sum::<f64>() * (Z95 / 0.005f64).powi(2);
        assert!(neyman_trials(&strata, 0.005, Z95) < prop / 2.0);
        // Capped strata give their share to the rest.
        let small = [Stratum { population: 5.0, ..strata[1] }, strata[0]];
        assert_eq!(neyman_allocation(&small, 100, 0), vec![5, 95]);
        // Determinism and ties: equal strata split evenly, the odd trial to the first.
        let even = [s(0.5, 0.1), s(0.5, 0.1)];
        assert_eq!(neyman_allocation(&even, 7, 0), vec![4, 3]);
    }

    #[test]
    fn rounds_top_up_the_short_strata() {
        let s = |weight, p: f64| Stratum { weight, sd: (p * (1.0 - p)).sqrt(), population: f64::INFINITY };
        let strata = [s(0.5, 0.01), s(0.5, 0.2)];
        let r = next_round(&strata, &[100, 100], 200, 20);
        assert_eq!(r.iter().sum::<u64>(), 200);
        assert!(r[1] > r[0], "{r:?}");
        assert_eq!(next_round(&strata, &[0, 0], 50, 20).iter().sum::<u64>(), 50);
        assert!(next_round(&strata, &[0, 0], 50, 20).iter().all(|&x| x >= 20));
    }

    /// Campaigns with known per-stratum rates run adaptively: a pilot round, then rounds
    /// allocated by [`next_round`] from the estimates so far, until the combined interval's
    /// half-width reaches the target or 40,000 trials have run. The final 95% interval covers
    /// the true combined rate in at least 94% of 1,000 simulated campaigns, for rare failures
    /// spread thin, concentrated in one small stratum, in one of several equal strata, spread
    /// over 20 strata, and in strata shaped like `campaign-mlp-adaptive`'s and
    /// `resnet-mxu`'s (class x bit field, failures in exponent fields). (The MOVER sum of the
    /// strata's Wilson intervals covers 92.4% on the 20-strata case and needs up to twice the
    /// trials elsewhere.)
    #[test]
    fn adaptive_intervals_cover_the_true_rate() {
        let mut rng = ChaCha8Rng::seed_from_u64(2009);
        // MXU classes (act, weight, shadow: bf16; psum: fp32; two strobes) x fields, 35% live.
        let resnet_w: Vec<f64> = [(0.195, vec![1.0, 8.0, 7.0]), (0.195, vec![1.0, 8.0, 7.0])]
            .into_iter()
            .chain([
                (0.195, vec![1.0, 8.0, 7.0]),
                (0.39, vec![1.0, 8.0, 23.0]),
                (0.0122, vec![1.0]),
                (0.0122, vec![1.0]),
            ])
            .flat_map(|(w, f): (f64, Vec<f64>)| {
                let all: f64 = f.iter().sum();
                f.into_iter().map(move |b| w * 0.352 * b / all)
            })
            .collect();
        let resnet_p = [0.0, 0.012, 0.0, 0.0, 0.012, 0.0, 0.0, 0.0, 0.0, 0.0, 0.012, 0.0, 0.0, 0.0];
        // Two SRAMs' sign, exponent and mantissa fields (3% and 0.7% live), small classes.
        let (ub, acc) = (0.0147, 0.0036);
        let mlp_w = [
            ub / 32.0,
            ub / 4.0,
            ub * 23.0 / 32.0,
            acc / 32.0,
            acc / 4.0,
            acc * 23.0 / 32.0,
            5e-4,
            5e-4,
            2e-4,
            1e-5,
            1e-5,
        ];
        let mlp_p = [0.0, 0.06, 0.002, 0.0, 0.03, 0.0, 0.0, 0.01, 0.002, 0.3, 0.4];
        let cases: [(&[f64], &[f64], f64); 10] = [
            (&[0.6, 0.25, 0.1, 0.04, 0.01], &[0.0005, 0.002, 0.01, 0.05, 0.3], 0.002),
            (&[0.97, 0.02, 0.01], &[0.0, 0.01, 0.4], 0.001),
            (&[0.5, 0.5], &[0.001, 0.003], 0.001),
            (&[0.3, 0.3, 0.3, 0.09, 0.01], &[0.0, 0.0, 0.0, 0.002, 0.05], 0.0005),
            (&resnet_w, &resnet_p, 0.0005),
            (&mlp_w, &mlp_p, 0.0001),
            (&[0.2; 5], &[0.001, 0.0, 0.0, 0.0, 0.0], 0.0005),
            (&[0.05; 20], &[0.0002; 20], 0.0001),
            (&[0.1; 10], &[0.0005, 0.0, 0.0005, 0.0, 0.0005, 0.0, 0.0005, 0.0, 0.0005, 0.0], 0.0002),
            (&[0.4, 0.4, 0.1, 0.1], &[0.0001, 0.0003, 0.001, 0.0], 0.0001),
        ];
        for (weights, rates, target) in cases {
            let truth: f64 = weights.iter().zip(rates).map(|(w, p)| w * p).sum();
            let sims = 1000;
            let mut covered = 0;
            for _ in 0..sims {
                let mut fails = vec![0u64; weights.len()];
                let mut have = vec![0u64; weights.len()];
                loop {
                    let est: Vec<(f64, Estimate)> =
                        (0..weights.len()).map(|h| (weights[h], Estimate::of(fails[h], have[h]))).collect();
                    let (_, lo, hi) = stratified(&est);
                    let spent: u64 = have.iter().sum();
                    if spent > 0 && ((hi - lo) / 2.0 <= target || spent >= 40_000) {
                        covered += (lo <= truth && truth <= hi) as u32;
                        break;
                    }
                    let strata: Vec<Stratum> = est.iter().map(|(w, e)| Stratum::at_wilson_centre(*w, e)).collect();
                    let round = next_round(&strata, &have, 500, 30);
                    for h in 0..weights.len() {
                        fails[h] += (0..round[h]).filter(|_| rng.gen::<f64>() < rates[h]).count() as u64;
                        have[h] += round[h];
                    }
                }
            }
            let c = covered as f64 / sims as f64;
            assert!(c >= 0.94, "rates {rates:?}: coverage {c}");
        }
    }
}
