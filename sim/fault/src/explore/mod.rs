//! Exploring protection placement: `faultline explore configs/explore-*.ron` runs every
//! protection plan against each of a set of campaigns, on the same trials (trial `t` draws the
//! same random numbers under every plan, so outcomes are paired), measures each plan's false
//! positives on a held-out fault-free run and each GEMM's ABFT overhead beside its arithmetic
//! intensity, and writes `explore.json` ([`ExploreResult`]), which the report crate renders
//! as a Pareto report (residual failure FIT against check bits and cycle overhead).

use crate::campaign::{Campaign, Progress, RunOptions, Shard, TrialMode};
use crate::error::{FaultError, Result};
use crate::outcome::Outcome;
use crate::protect;
use crate::protect::ProtectionPlan;
use crate::record::Summary;
use crate::spec::{check_dir_name, num, read_ron, relative_to, CampaignSpec, MAX_FIT_PER_BIT};
use crate::stats::paired::PairedCounts;
use crate::stats::Estimate;
pub use crate::stats::Interval;
use faultline_graph::op::{Op, Phase};
use faultline_hw::budget::HostMemory;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

mod front;
mod pairing;

use front::{compare_plans, mark_front_at_confidence, mark_pareto};
use pairing::pair_with_baseline;

/// `explore.json`: the results of one exploration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExploreResult {
    /// The exploration's name.
    pub name: String,
    /// Raw failure rate per bit (FIT) the residual rates are scaled by.
    pub fit_per_bit: f64,
    /// One entry per campaign, in the spec's order.
    pub campaigns: Vec<CampaignResult>,
}

/// Every plan's results on one campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CampaignResult {
    /// Campaign name.
    pub campaign: String,
    /// Model name.
    pub model: String,
    /// Machine config name.
    pub hw: String,
    /// Trials per plan (the same trial ids under every plan).
    pub trials: u64,
    /// Cycles of the unprotected step.
    pub base_cycles: u64,
    /// The plans, the unprotected baseline (`none`) first.
    pub plans: Vec<PlanResult>,
    /// Each forward GEMM's ABFT cost beside its arithmetic intensity.
    pub layers: Vec<LayerAbft>,
    /// Every pair of plans (the baseline's too), compared on the trials that are the same
    /// faults under both, in plan order (`(0, 1)`, `(0, 2)`, ... `(1, 2)`, ...).
    #[serde(default)]
    pub comparisons: Vec<PlanComparison>,
    /// The rounds run, for an exploration of more than one ([`ExploreSpec::rounds`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<RoundsRun>,
}

/// The rounds a campaign of an exploration ran, and why they stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundsRun {
    /// Rounds run.
    pub run: u32,
    /// Rounds allowed ([`ExploreSpec::rounds`]).
    pub max: u32,
    /// Trials per plan in each round.
    pub trials_per_round: u64,
    /// The level each look tests at: `(1 - CONFIDENCE) / max`, so that over every look the
    /// chance of telling apart plans that fail alike stays within `1 - CONFIDENCE`
    /// (Bonferroni).
    pub alpha: f64,
    /// Why no further round ran.
    pub stopped: Stopped,
}

/// Why an exploration's rounds stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stopped {
    /// Every pair whose order could change the front at confidence was told apart.
    Separated,
    /// Such pairs were left, each needing more paired trials than the allowed rounds give.
    Futile,
    /// The allowed rounds ran.
    Budget,
}

/// Confidence at which plans are told apart: McNemar's exact test at level `1 -` this, and
/// the differences' intervals.
pub const CONFIDENCE: f64 = 0.95;

/// Power the trials needed to separate two plans are sized for.
pub const POWER: f64 = 0.8;

/// Most rounds an exploration may run per campaign.
pub const MAX_ROUNDS: u32 = 100;

/// Two plans compared on the same faults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanComparison {
    /// The first plan's name.
    pub first: String,
    /// The second plan's name.
    pub second: String,
    /// The trials paired under both (the very same fault, or one register fault moved to the
    /// same point of the same instruction), by which plan failed.
    pub counts: PairedCounts,
    /// The first plan's failure share minus the second's over the paired trials, per class
    /// (Newcombe's interval) and combined by class bits as `failure` is (MOVER): what the
    /// paired classes add to the combined difference, at [`CONFIDENCE`].
    pub difference: Interval,
    /// McNemar's exact test of the discordant trials: the chance of a split at least this
    /// uneven if the plans fail alike.
    pub p_value: f64,
    /// Whether the test tells the plans apart at [`CONFIDENCE`].
    pub separated: bool,
    /// Paired trials that would tell them apart with [`POWER`] at their observed discordance
    /// and difference (Connor 1987; where they show no difference, against the largest
    /// their interval allows); `None` without paired trials.
    pub trials_needed: Option<u64>,
}

/// One plan on one campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanResult {
    /// Plan name (`none` for the baseline).
    pub plan: String,
    /// Plan file, as the spec names it (absent for the baseline).
    pub file: Option<String>,
    /// Cycles of the protected step.
    pub cycles: u64,
    /// `cycles / base_cycles - 1`.
    pub cycle_overhead: f64,
    /// Check bits the plan adds (codes).
    pub area_bits: u64,
    /// Combined training-failure share of the sampled classes (silent failures only),
    /// stratified by class bits, per unit of training work (see `paired_trials`).
    pub failure: Interval,
    /// Residual failure rate: `fit_per_bit x` the sampled classes' bits `x` `failure` (its
    /// interval scaled alike). Check bits add nothing under single-bit
    /// flips: the decoders correct (SECDED) or detect (parity) every one, exhaustively tested.
    pub failure_fit: Interval,
    /// Trials a check caught (`DetectedRecovered` + `Detected`).
    pub detected: Estimate,
    /// Trials a code corrected.
    pub corrected: Estimate,
    /// Trials that stopped at a detection (`Detected`): the detected-unrecoverable share.
    pub unrecovered: Estimate,
    /// Trials that are the baseline's very faults, so that outcomes pair trial by trial: all
    /// of them under a plan that leaves the program alone (codes); under one that adds
    /// instructions, the register faults, moved to the same point of the same instruction
    /// of the longer step (memory words hold other buffers there: those trials are drawn
    /// afresh over the longer step, and their rates scaled to the unprotected step's time).
    #[serde(default)]
    pub paired_trials: u64,
    /// Of the paired trials: failed without the plan and not with it.
    pub failures_removed: u64,
    /// Of the paired trials: failed with the plan and not without it.
    pub failures_added: u64,
    /// Of the plan's own trials that a check caught or that failed silently, the share caught
    /// (detected or corrected): how much of what matters the plan covers.
    pub coverage: Estimate,
    /// Fault-free steps of a held-out run (another training seed) in which a check fired.
    pub false_positives: Estimate,
    /// Whether no other plan on this campaign has lower-or-equal residual FIT, area and
    /// cycle overhead with one of them strictly lower.
    pub pareto: bool,
    /// Whether the plan stays on the front when failure rates the paired test cannot tell
    /// apart ([`PlanComparison::separated`]) count as equal: no other plan has lower-or-equal
    /// area and cycle overhead and either fails less, told apart, or costs strictly less at a
    /// failure rate not told apart. So a plan on it fails demonstrably less than every cheaper
    /// plan: what the campaign supports paying for.
    #[serde(default)]
    pub front_at_confidence: bool,
}

/// The ABFT cost of one forward GEMM, each variant added alone to the unprotected step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerAbft {
    /// The guarded node.
    pub node: String,
    /// Its layer.
    pub layer: String,
    /// `[M, K, N]`.
    pub gemm: [usize; 3],
    /// Arithmetic intensity, `MNK / (MK + KN + MN)` MACs per word.
    pub intensity: f64,
    /// Step cycle overhead of global ABFT on it (cheaper side).
    pub global_overhead: f64,
    /// Step cycle overhead of per-tile ABFT on it (cheaper side; global where the array's
    /// tile does not divide the GEMM).
    pub tile_overhead: f64,
    /// What Kosaian & Rashmi's intensity rule picks at the spec's threshold.
    pub rule_picks: String,
}

/// An exploration (`configs/explore-*.ron`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExploreSpec {
    /// Name, shown in the report.
    pub name: String,
    /// Campaign specs (relative to this file), each run unprotected and under every plan. At
    /// least one; each without a `protection` of its own (a training campaign when there are
    /// plans) and named as a directory (1 to 100 of `A-Z a-z 0-9 _ . + -`), no two names alike
    /// (case aside).
    pub campaigns: Vec<PathBuf>,
    /// Protection plans (relative to this file), each named as a directory, no two names
    /// alike (case aside) and none `none` (the unprotected baseline's name).
    pub plans: Vec<PathBuf>,
    /// Raw FIT per bit (failures per 10^9 device-hours) the residual failure rates are scaled
    /// by: positive, at most 1e9.
    #[serde(default = "one_fit")]
    pub fit_per_bit: f64,
    /// Arithmetic intensity (MACs per word) at and above which Kosaian & Rashmi's rule picks
    /// global ABFT for a layer, in the per-layer table: positive and finite.
    #[serde(default = "kr_threshold")]
    pub intensity_threshold: f64,
    /// Training seed of the held-out fault-free run false positives are counted on; any `u64`.
    #[serde(default = "held_out_seed")]
    pub held_out_seed: u64,
    /// Rounds each campaign may run, 1 to 100. Round `r` (from 0) runs the campaign with its
    /// seed plus `r`, unprotected and under every plan; after each, the plans are compared on
    /// every round's trials, and another round runs while some pair is not told apart whose
    /// order could change the front at 95% (one plan costs no more, the other fails no more)
    /// and could be told apart within the rounds allowed. Each look tests at
    /// `(1 - 0.95) / rounds` so that the 95% holds over all of them. 1 runs each campaign once.
    #[serde(default = "one_round")]
    pub rounds: u32,
}

fn one_round() -> u32 {
    1
}

fn one_fit() -> f64 {
    1.0
}

fn kr_threshold() -> f64 {
    8.0
}

fn held_out_seed() -> u64 {
    1_000_001
}

impl ExploreSpec {
    /// Reads and checks a spec and what it runs (its campaign specs and plans, each loaded and
    /// checked, under each plan too), before any golden run; errors name `file:line:col` or the
    /// file and field.
    pub fn load(path: &Path) -> Result<ExploreSpec> {
        let spec: ExploreSpec = read_ron(path)?;
        let bad = |field: &str, value: String, allowed: &str| {
            Err(FaultError::Invalid { file: path.into(), field: field.into(), value, allowed: allowed.into() })
        };
        if spec.campaigns.is_empty() {
            return bad("campaigns", "[]".into(), "at least one campaign spec");
        }
        if !(spec.fit_per_bit > 0.0 && spec.fit_per_bit <= MAX_FIT_PER_BIT) {
            return bad("fit_per_bit", num(spec.fit_per_bit), "a positive FIT per bit, at most 1e9");
        }
        if !(1..=MAX_ROUNDS).contains(&spec.rounds) {
            return bad("rounds", spec.rounds.to_string(), "1 to 100 rounds per campaign");
        }
        if !(spec.intensity_threshold.is_finite() && spec.intensity_threshold > 0.0) {
            return bad(
                "intensity_threshold",
                spec.intensity_threshold.to_string(),
                "a positive number of MACs per word",
            );
        }
        spec.runs(path)?;
        Ok(spec)
    }

    /// The campaigns and plans of the spec read from `file`, each loaded and checked: their
    /// names are directories under `--out` ([`check_dir_name`]), one each, and every
    /// campaign's spec under every plan passes [`CampaignSpec::validate`], as `faultline
    /// campaign --protect` checks it.
    fn runs(&self, file: &Path) -> Result<Runs> {
        let dup = |field: String, value: &Path, name: &str, other: String| FaultError::Invalid {
            file: file.into(),
            field,
            value: format!("{value:?}"),
            allowed: format!(
                "files whose names differ (case aside), each one directory under --out: its name {name:?} is also \
                 {other}'s"
            ),
        };
        let mut seen = Dirs::default();
        let mut campaigns = Vec::new();
        for (i, c) in self.campaigns.iter().enumerate() {
            let cfile = relative_to(file, c);
            let spec = CampaignSpec::load(&cfile)?;
            if spec.protection.is_some() {
                return Err(FaultError::Invalid {
                    file: cfile.clone(),
                    field: "protection".into(),
                    value: format!("{:?}", spec.protection),
                    allowed: "None: an exploration runs the campaign unprotected and under each of its plans".into(),
                });
            }
            if matches!(spec.sampling, crate::spec::Sampling::Adaptive { .. }) {
                return Err(FaultError::Invalid {
                    file: cfile.clone(),
                    field: "sampling".into(),
                    value: "Adaptive".into(),
                    allowed: "Exhaustive, Uniform or Stratified: an exploration pairs every plan's trials with the \
                              baseline's, so their set is fixed"
                        .into(),
                });
            }
            if self.rounds > 1 && matches!(spec.sampling, crate::spec::Sampling::Exhaustive) {
                return Err(FaultError::Invalid {
                    file: cfile.clone(),
                    field: "sampling".into(),
                    value: "Exhaustive".into(),
                    allowed: format!(
                        "Uniform or Stratified when the exploration runs rounds ({} in {}): every round of an \
                         exhaustive campaign would run the same trials",
                        self.rounds,
                        file.display()
                    ),
                });
            }
            check_dir_name(&spec.name, &cfile, "name")?;
            if let Some(other) = seen.claim(&spec.name, format!("campaigns[{i}]")) {
                return Err(dup(format!("campaigns[{i}]"), c, &spec.name, other));
            }
            campaigns.push((cfile, spec));
        }
        // The unprotected baseline's records go to `<campaign>/none`.
        let mut seen = Dirs::default();
        seen.claim("none", "the unprotected baseline".into());
        let mut plans = Vec::new();
        for (j, p) in self.plans.iter().enumerate() {
            let written = relative_to(file, p);
            let plan = ProtectionPlan::load(&written)?;
            check_dir_name(&plan.name, &written, "name")?;
            if let Some(other) = seen.claim(&plan.name, format!("plans[{j}]")) {
                return Err(dup(format!("plans[{j}]"), p, &plan.name, other));
            }
            let absolute = std::path::absolute(&written).map_err(FaultError::io(&written))?;
            plans.push(PlanFile { written, absolute });
        }
        for (cfile, spec) in &campaigns {
            for p in &plans {
                CampaignSpec { protection: Some(p.absolute.clone()), ..spec.clone() }.validate(cfile)?;
            }
        }
        Ok(Runs { campaigns, plans })
    }
}

/// What an exploration runs, loaded and checked ([`ExploreSpec::runs`]).
struct Runs {
    /// Each campaign's file and (unprotected) spec.
    campaigns: Vec<(PathBuf, CampaignSpec)>,
    /// The plans.
    plans: Vec<PlanFile>,
}

/// A plan file of an exploration.
struct PlanFile {
    /// As the spec names it (relative to the spec's directory).
    written: PathBuf,
    /// Absolute, so that a campaign's directory does not re-anchor it.
    absolute: PathBuf,
}

/// Directory names taken under one directory, lower-cased (two names that differ only in case
/// are one directory on a case-insensitive file system), each with whose it is.
#[derive(Default)]
struct Dirs(BTreeMap<String, String>);

impl Dirs {
    /// Takes `name` for `whose`; if it was taken, whose it is (and it stays theirs).
    fn claim(&mut self, name: &str, whose: String) -> Option<String> {
        match self.0.entry(name.to_ascii_lowercase()) {
            std::collections::btree_map::Entry::Occupied(e) => Some(e.get().clone()),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(whose);
                None
            }
        }
    }
}

/// What [`run`] reports as it goes.
pub enum ExploreProgress<'a> {
    /// A campaign under a plan is prepared (its golden run done) and about to run.
    Plan {
        /// Campaign name.
        campaign: &'a str,
        /// Plan name.
        plan: &'a str,
        /// Round, from 1.
        round: u32,
    },
    /// A campaign's progress.
    Campaign(Progress<'a>),
}

/// Runs the exploration `spec` (read from `file`) into `out`: each campaign unprotected
/// (`out/<campaign>/none`) and under each plan (`out/<campaign>/<plan>`), in rounds when the
/// spec asks (later rounds in `round-<r>` beneath), resuming whatever
/// records are there, then writes `out/explore.json` and returns it. Everything
/// [`ExploreSpec::load`] checks is checked again first, before any golden run or file.
pub fn run(
    spec: &ExploreSpec,
    file: &Path,
    out: &Path,
    threads: usize,
    mem: &HostMemory,
    progress: impl Fn(ExploreProgress) + Sync,
) -> Result<ExploreResult> {
    let runs = spec.runs(file)?;
    let mut campaigns = Vec::new();
    for (cfile, base) in &runs.campaigns {
        let ctx = Context { spec, out, threads, mem, progress: &progress };
        campaigns.push(explore_campaign(&ctx, cfile, base, &runs.plans)?);
    }
    let result = ExploreResult { name: spec.name.clone(), fit_per_bit: spec.fit_per_bit, campaigns };
    let path = out.join("explore.json");
    let text = serde_json::to_string_pretty(&result).expect("results serialise") + "\n";
    fs::write(&path, text).map_err(FaultError::io(&path))?;
    Ok(result)
}

/// What every campaign of an exploration runs with.
struct Context<'a, P> {
    spec: &'a ExploreSpec,
    out: &'a Path,
    threads: usize,
    mem: &'a HostMemory,
    progress: &'a P,
}

/// Which trials of a campaign under a plan are the baseline's very faults (compared with it
/// trial by trial), and the classes whose faults were translated from it.
struct Pairing {
    paired: Vec<bool>,
    translated: HashSet<String>,
}

/// One plan's trials, pooled over the rounds run so far.
struct Pooled {
    /// The plan's costs and held-out false positives (its rates are refilled from the pool).
    result: PlanResult,
    /// Per class: its weight in the combined rate and its failures over every round.
    strata: Vec<(f64, Estimate)>,
    /// The sampled classes' bits.
    bits: f64,
    /// The outcome of each of the baseline's trials, round after round: trial `t` of a round
    /// is the baseline's `t` where `paired` says so.
    outcomes: Vec<Outcome>,
    /// Which of them are the baseline's very faults.
    paired: Vec<bool>,
    /// Outcomes of the trials past the baseline's in each round (a code's check-bit strata):
    /// they count in the plan's rates, and pair with nothing.
    extra: Vec<Outcome>,
}

/// Campaign `base` (read from `cfile`) unprotected, then under each of `plan_files`, in
/// rounds ([`ExploreSpec::rounds`]): round `r` (from 0) runs the campaign with its seed plus
/// `r` into `out/<campaign>/<plan>` (round 0) or `out/<campaign>/<plan>/round-<r + 1>`; after
/// each, the plans pooled over the rounds are compared pair by pair and marked Pareto, and
/// another round runs while [`next_round`] says so.
fn explore_campaign<P: Fn(ExploreProgress) + Sync>(
    ctx: &Context<P>,
    cfile: &Path,
    base: &CampaignSpec,
    plan_files: &[PlanFile],
) -> Result<CampaignResult> {
    let max = ctx.spec.rounds;
    let alpha = (1.0 - CONFIDENCE) / max as f64;
    let mut pooled: Vec<Pooled> = Vec::new();
    let (mut class_of, mut weights, mut layers) = (Vec::new(), Vec::new(), Vec::new());
    let (mut model, mut hw, mut per_round) = (String::new(), String::new(), 0);
    for round in 0..max {
        let spec = CampaignSpec { seed: base.seed.wrapping_add(round as u64), ..base.clone() };
        let b = run_round(ctx, cfile, &spec, plan_files, round, &mut pooled)?;
        if round == 0 {
            layers = layer_costs(&b, ctx.spec.intensity_threshold)?;
            (model, hw, per_round) = (b.model().to_string(), b.info.hw.clone(), b.info.trials);
            let total: f64 = b.info.classes.iter().map(|k| k.bits as f64).sum();
            weights = b.info.classes.iter().map(|k| k.bits as f64 / total).collect();
        }
        // Each baseline trial's class, as an index into the classes.
        class_of.extend((0..b.info.trials).map(|t| {
            let name = b.upset(t).0.pattern();
            b.info.classes.iter().position(|k| k.class == name).expect("a trial's stratum is a class of its campaign")
        }));
        let (plans, comparisons) = decide(ctx.spec.fit_per_bit, &pooled, &weights, &class_of, alpha);
        let stop = next_round(&plans, &comparisons, round + 1, max);
        if let Some(stopped) = stop {
            let rounds =
                (max > 1).then_some(RoundsRun { run: round + 1, max, trials_per_round: per_round, alpha, stopped });
            return Ok(CampaignResult {
                campaign: base.name.clone(),
                model,
                hw,
                trials: pooled[0].outcomes.len() as u64,
                base_cycles: plans[0].cycles,
                plans,
                layers,
                comparisons,
                rounds,
            });
        }
    }
    unreachable!("the last round stops")
}

/// Runs round `round` of campaign `spec` (read from `cfile`) unprotected, then under each of
/// `plan_files`, adding each plan's results to `pooled` (made on round 0); returns the
/// unprotected campaign.
fn run_round<P: Fn(ExploreProgress) + Sync>(
    ctx: &Context<P>,
    cfile: &Path,
    spec: &CampaignSpec,
    plan_files: &[PlanFile],
    round: u32,
    pooled: &mut Vec<Pooled>,
) -> Result<Campaign> {
    let (mem, threads) = (ctx.mem, ctx.threads);
    let plans: Vec<Option<&PlanFile>> = std::iter::once(None).chain(plan_files.iter().map(Some)).collect();
    let mut baseline: Option<Campaign> = None;
    for (i, &plan) in plans.iter().enumerate() {
        let cspec = CampaignSpec { protection: plan.map(|p| p.absolute.clone()), ..spec.clone() };
        let c = Campaign::prepare(cspec, cfile, mem)?;
        let pname = c.info.protection.as_ref().map_or("none".to_string(), |p| p.plan.name.clone());
        (ctx.progress)(ExploreProgress::Plan { campaign: &spec.name, plan: &pname, round: round + 1 });
        // The baseline campaign stays alive beside each plan's, with what it keeps whole.
        let alive = baseline.as_ref().map_or(0, Campaign::kept_bytes);
        let need = c.host_bytes(threads).and_then(|b| b.checked_add(alive));
        mem.check(&format!("campaign `{}` on {threads} threads", spec.name), need)?;
        let (c, pairing) = pair_with_baseline(c, baseline.as_ref(), spec, &pname, mem)?;
        let mut dir = ctx.out.join(&spec.name).join(&pname);
        if round > 0 {
            dir = dir.join(format!("round-{}", round + 1));
        }
        fs::create_dir_all(&dir).map_err(FaultError::io(&dir))?;
        let opts = RunOptions { threads, shard: Shard::ALL, resume: true, mode: TrialMode::Hybrid };
        let summary = c.run(&dir, opts, |p| (ctx.progress)(ExploreProgress::Campaign(p)))?;
        let mut outcomes: Vec<Outcome> = crate::store::outcomes(&dir)?;
        let (mut paired, trials) = (pairing.paired, baseline.as_ref().map_or(c.info.trials, |b| b.info.trials));
        let extra = outcomes.split_off(trials as usize);
        paired.truncate(trials as usize);
        let base_cycles = baseline.as_ref().map_or(c.info.cycles_per_step, |b| b.info.cycles_per_step);
        let strata = class_strata(&c, &summary, &pairing.translated, base_cycles);
        if round == 0 {
            // False positives are a property of the plan: counted once, on the first round.
            let result = plan_result(ctx.spec, &c, plan, base_cycles)?;
            let bits = summary.classes.iter().map(|k| k.bits as f64).sum();
            pooled.push(Pooled { result, strata, bits, outcomes, paired, extra });
        } else {
            let p = &mut pooled[i];
            for ((_, into), (_, e)) in p.strata.iter_mut().zip(strata) {
                *into = Estimate::of(into.k + e.k, into.n + e.n);
            }
            p.outcomes.extend(outcomes);
            p.paired.extend(paired);
            p.extra.extend(extra);
        }
        if plan.is_none() {
            baseline = Some(c);
        }
    }
    Ok(baseline.expect("the baseline runs first"))
}

/// The plans' results from their `pooled` trials, compared pair by pair (each test at level
/// `alpha`) and marked Pareto, on classes of `weights` (by bits) with the baseline's trials
/// in classes `class_of`.
fn decide(
    fit_per_bit: f64,
    pooled: &[Pooled],
    weights: &[f64],
    class_of: &[usize],
    alpha: f64,
) -> (Vec<PlanResult>, Vec<PlanComparison>) {
    let mut plans: Vec<PlanResult> = pooled.iter().map(|p| with_rates(fit_per_bit, p)).collect();
    // Paired with the baseline, trial by trial, where the trials are the same faults.
    let base = &pooled[0].outcomes;
    for (r, p) in plans.iter_mut().zip(pooled) {
        let pairs = || base.iter().zip(&p.outcomes).zip(&p.paired).filter(|(_, &q)| q).map(|(x, _)| x);
        r.failures_removed = pairs().filter(|(b, q)| b.failure() && !q.failure()).count() as u64;
        r.failures_added = pairs().filter(|(b, q)| !b.failure() && q.failure()).count() as u64;
    }
    let runs: Vec<(&str, &[Outcome], &[bool])> =
        plans.iter().zip(pooled).map(|(r, p)| (r.plan.as_str(), &p.outcomes[..], &p.paired[..])).collect();
    let comparisons = compare_plans(weights, class_of, &runs, alpha);
    mark_pareto(&mut plans);
    mark_front_at_confidence(&mut plans, &comparisons);
    (plans, comparisons)
}

/// Why an exploration's rounds stop after `run` of at most `max`, or `None` to run another.
/// A pair of plans is open while the paired trials do not tell it apart and telling it apart
/// could change the front at confidence: one plan costs no more on either axis and the other
/// fails no more on point estimates (so it may yet prove better). The rounds stop when no
/// pair is open, when the last round has run, or when no open pair could be told apart
/// within the rounds allowed (each needs more paired trials, at the power and level its
/// comparison was sized with, than `max` rounds would pair).
fn next_round(plans: &[PlanResult], comparisons: &[PlanComparison], run: u32, max: u32) -> Option<Stopped> {
    let plan = |name: &str| plans.iter().find(|p| p.plan == name).expect("a compared plan is a plan");
    // `b` could prove to fail less than `a`, which costs no more.
    let could = |a: &PlanResult, b: &PlanResult| {
        a.area_bits <= b.area_bits && a.cycle_overhead <= b.cycle_overhead && b.failure_fit.p <= a.failure_fit.p
    };
    let open: Vec<&PlanComparison> = (comparisons.iter())
        .filter(|c| !c.separated)
        .filter(|c| {
            let (a, b) = (plan(&c.first), plan(&c.second));
            could(a, b) || could(b, a)
        })
        .collect();
    if open.is_empty() {
        return Some(Stopped::Separated);
    }
    if run >= max {
        return Some(Stopped::Budget);
    }
    let within = |c: &&PlanComparison| {
        let at_most = c.counts.n().div_ceil(run as u64) * max as u64;
        c.trials_needed.is_some_and(|n| n <= at_most)
    };
    if !open.iter().any(within) {
        return Some(Stopped::Futile);
    }
    None
}

/// Campaign `c`'s classes as strata of the combined failure rate: each its share of the
/// sampled bits and its failures, per unit of training work (the unprotected step of
/// `base_cycles`): a translated class's share already is; a class drawn over the longer
/// step scales by its length.
fn class_strata(
    c: &Campaign,
    summary: &Summary,
    translated: &HashSet<String>,
    base_cycles: u64,
) -> Vec<(f64, Estimate)> {
    let longer = c.info.cycles_per_step as f64 / base_cycles as f64;
    let total_bits: f64 = summary.classes.iter().map(|k| k.bits as f64).sum();
    (summary.classes.iter())
        .map(|k| {
            let drawn = c.info.faults_from.is_some() && !translated.contains(&k.class);
            (k.bits as f64 / total_bits * if drawn { longer } else { 1.0 }, k.failure)
        })
        .collect()
}

/// The costs and held-out false positives of campaign `c` under `plan` (`None`:
/// unprotected) against an unprotected step of `base_cycles`; its rates are left empty
/// ([`with_rates`] fills them).
fn plan_result(spec: &ExploreSpec, c: &Campaign, plan: Option<&PlanFile>, base_cycles: u64) -> Result<PlanResult> {
    let fp = c.held_out_false_positives(spec.held_out_seed)?.unwrap_or(Estimate::of(0, 0));
    let p = c.info.protection.as_ref();
    Ok(PlanResult {
        file: plan.map(|p| p.written.display().to_string()),
        cycles: c.info.cycles_per_step,
        cycle_overhead: c.info.cycles_per_step as f64 / base_cycles as f64 - 1.0,
        area_bits: p.map_or(0, |p| p.area_bits),
        false_positives: fp,
        ..PlanResult::blank(p.map_or("none".to_string(), |p| p.plan.name.clone()))
    })
}

impl PlanResult {
    /// Plan `plan` with no costs, no trials and no marks.
    fn blank(plan: String) -> PlanResult {
        let (e, i) = (Estimate::of(0, 0), Interval { p: 0.0, lo: 0.0, hi: 0.0 });
        PlanResult {
            plan,
            file: None,
            cycles: 0,
            cycle_overhead: 0.0,
            area_bits: 0,
            failure: i,
            failure_fit: i,
            detected: e,
            corrected: e,
            unrecovered: e,
            paired_trials: 0,
            failures_removed: 0,
            failures_added: 0,
            coverage: e,
            false_positives: e,
            pareto: false,
            front_at_confidence: false,
        }
    }
}

/// A plan's result with its rates from its pooled trials `p`; its paired comparison with the
/// baseline (`failures_removed`, `failures_added`) is left at 0.
fn with_rates(fit_per_bit: f64, p: &Pooled) -> PlanResult {
    let (fp_, flo, fhi) = crate::stats::stratified(&p.strata);
    let scale = fit_per_bit * p.bits;
    let outcomes = || p.outcomes.iter().chain(&p.extra);
    let n = (p.outcomes.len() + p.extra.len()) as u64;
    let count = |f: fn(Outcome) -> bool| Estimate::of(outcomes().filter(|o| f(**o)).count() as u64, n);
    PlanResult {
        failure: Interval { p: fp_, lo: flo, hi: fhi },
        failure_fit: Interval { p: scale * fp_, lo: scale * flo, hi: scale * fhi },
        detected: count(|o| matches!(o, Outcome::DetectedRecovered | Outcome::Detected)),
        corrected: count(|o| o == Outcome::Corrected),
        unrecovered: count(|o| o == Outcome::Detected),
        paired_trials: p.paired.iter().filter(|&&x| x).count() as u64,
        coverage: {
            let caught = outcomes().filter(|o| o.detected() || **o == Outcome::Corrected).count();
            let failed = outcomes().filter(|o| o.failure()).count();
            Estimate::of(caught as u64, (caught + failed) as u64)
        },
        ..p.result.clone()
    }
}

/// The ABFT cost of each forward rank-2 GEMM of the unprotected campaign `c`, alone.
fn layer_costs(c: &Campaign, threshold: f64) -> Result<Vec<LayerAbft>> {
    let t = c.trainer();
    let (tg, hw) = (&t.exec.tg, &t.exec.hw);
    let base = protect::schedule_cycles(tg, hw)? as f64;
    let mut out = Vec::new();
    for i in tg.graph.indices() {
        let node = tg.graph.node(i);
        if !matches!(node.op, Op::MatMul { .. }) || node.phase != Phase::Forward || node.shape.len() != 2 {
            continue;
        }
        let gemm = protect::gemm_dims(tg, i);
        let intensity = protect::intensity(gemm[0], gemm[1], gemm[2]);
        let over = |per_tile| -> Result<f64> { Ok(protect::abft_cycles(tg, hw, i, per_tile)? as f64 / base - 1.0) };
        out.push(LayerAbft {
            node: node.name.clone(),
            layer: node.layer.clone(),
            gemm,
            intensity,
            global_overhead: over(false)?,
            tile_overhead: over(true)?,
            rule_picks: if intensity >= threshold { "global" } else { "per-tile" }.into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::front::tests::plan;
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A plan of `cost` (cycle overhead) with no trials yet.
    fn empty(name: &str, cost: f64) -> Pooled {
        let result = PlanResult { cycle_overhead: cost, ..plan(name, cost, 0.0) };
        let strata = vec![(1.0, Estimate::of(0, 0))];
        Pooled { result, strata, bits: 1.0, outcomes: Vec::new(), paired: Vec::new(), extra: Vec::new() }
    }

    /// Adds `n` trials to both plans: the baseline fails with `p`, the plan with `p` on the
    /// same fault unless it `cures` (then never) or, independently, with `q` when the baseline
    /// did not (so two plans that fail alike see discordant pairs both ways).
    fn add(rng: &mut ChaCha8Rng, pooled: &mut [Pooled], n: usize, p: f64, cures: f64, q: f64) {
        for _ in 0..n {
            let base = rng.gen::<f64>() < p;
            let other = if base { rng.gen::<f64>() >= cures } else { rng.gen::<f64>() < q };
            for (pl, failed) in pooled.iter_mut().zip([base, other]) {
                let o = if failed { Outcome::SlowDegrade } else { Outcome::Masked };
                pl.outcomes.push(o);
                pl.paired.push(true);
                let e = pl.strata[0].1;
                pl.strata[0].1 = Estimate::of(e.k + failed as u64, e.n + 1);
            }
        }
    }

    /// Runs one simulated exploration of at most `max` rounds of `n` trials, testing each look
    /// at `alpha`; returns whether the plans ended told apart, and the rounds run.
    fn simulate(seed: u64, max: u32, alpha: f64, n: usize, (p, cures, q): (f64, f64, f64)) -> (bool, u32, Stopped) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut pooled = vec![empty("none", 0.0), empty("plan", 0.1)];
        for run in 1..=max {
            add(&mut rng, &mut pooled, n, p, cures, q);
            let class_of = vec![0; pooled[0].outcomes.len()];
            let (plans, comparisons) = decide(1.0, &pooled, &[1.0], &class_of, alpha);
            if let Some(stopped) = next_round(&plans, &comparisons, run, max) {
                return (comparisons[0].separated, run, stopped);
            }
        }
        unreachable!("the last round stops")
    }

    /// Rounds that stop once the plans are told apart would, at 5% per look, tell plans that
    /// fail alike apart more often than 5% of the time (optional stopping); at 5% shared out
    /// over the looks (Bonferroni) they do not. Plans that do differ are still told apart,
    /// some at the first look and some later.
    #[test]
    fn rounds_hold_the_false_positive_rate_on_plans_that_fail_alike() {
        let (sims, max, alike) = (2000, 16, (0.2, 0.5, 0.125));
        let rate = |alpha: f64| {
            let told = (0..sims).filter(|&s| simulate(s, max, alpha, 200, alike).0).count();
            told as f64 / sims as f64
        };
        let (naive, shared) = (rate(0.05), rate(0.05 / max as f64));
        assert!(naive > 0.05, "naive looks: {naive}");
        assert!(shared <= 0.05, "Bonferroni looks: {shared}");
        let differ = (0.05, 0.6, 0.0);
        let runs: Vec<(bool, u32, Stopped)> =
            (0..200).map(|s| simulate(s, max, 0.05 / max as f64, 200, differ)).collect();
        let told = runs.iter().filter(|r| r.0).count();
        assert!(told >= 190, "{told} of 200 told apart");
        assert!(runs.iter().all(|r| r.0 == (r.2 == Stopped::Separated)));
        assert!(runs.iter().any(|r| r.1 > 1) && runs.iter().any(|r| r.1 == 1), "{runs:?}");
    }

    /// A pair no round left could tell apart stops the rounds as futile; one that could runs
    /// another; the last round stops whatever is left.
    #[test]
    fn rounds_stop_when_no_tied_pair_could_be_told_apart() {
        let mut plans = vec![plan("none", 0.0, 0.02), plan("plan", 0.1, 0.019)];
        let tied = |first_only, second_only, neither| {
            let counts = crate::stats::paired::PairedCounts { both: 0, first_only, second_only, neither };
            vec![PlanComparison {
                first: "none".into(),
                second: "plan".into(),
                counts,
                difference: counts.difference(crate::stats::Z95),
                p_value: counts.p_value(),
                separated: false,
                trials_needed: counts.trials_to_separate(0.05 / 8.0, POWER),
            }]
        };
        // 3/2 of 200, the dearer plan failing less: thousands of paired trials needed, 8
        // rounds give 1,600.
        assert_eq!(next_round(&plans, &tied(3, 2, 195), 1, 8), Some(Stopped::Futile));
        // 6/1 of 200: within reach.
        assert_eq!(next_round(&plans, &tied(6, 1, 193), 1, 8), None);
        assert_eq!(next_round(&plans, &tied(6, 1, 193), 8, 8), Some(Stopped::Budget));
        // The dearer plan failing more: more trials would not put it on the front.
        plans[1].failure_fit.p = 0.021;
        assert_eq!(next_round(&plans, &tied(6, 1, 193), 1, 8), Some(Stopped::Separated));
        // Failing alike (none failed under either): it may yet fail less.
        plans[1].failure_fit.p = 0.02;
        assert_eq!(next_round(&plans, &tied(0, 0, 200), 1, 8), None);
    }
}
