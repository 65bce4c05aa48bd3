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
}

/// Confidence at which plans are told apart: McNemar's exact test at level `1 -` this, and
/// the differences' intervals.
pub const CONFIDENCE: f64 = 0.95;

/// Power the trials needed to separate two plans are sized for.
pub const POWER: f64 = 0.8;

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
    },
    /// A campaign's progress.
    Campaign(Progress<'a>),
}

/// Runs the exploration `spec` (read from `file`) into `out`: each campaign unprotected
/// (`out/<campaign>/none`) and under each plan (`out/<campaign>/<plan>`), resuming whatever
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

/// Campaign `base` (read from `cfile`) unprotected, then under each of `plan_files`, each run
/// into `out/<campaign>/<plan>`; the plans compared with the baseline and marked Pareto.
fn explore_campaign<P: Fn(ExploreProgress) + Sync>(
    ctx: &Context<P>,
    cfile: &Path,
    base: &CampaignSpec,
    plan_files: &[PlanFile],
) -> Result<CampaignResult> {
    let (mem, threads) = (ctx.mem, ctx.threads);
    let plans: Vec<Option<&PlanFile>> = std::iter::once(None).chain(plan_files.iter().map(Some)).collect();
    let mut results: Vec<(PlanResult, Vec<Outcome>, Vec<bool>)> = Vec::new();
    let mut layers = Vec::new();
    let mut baseline: Option<Campaign> = None;
    for &plan in &plans {
        let cspec = CampaignSpec { protection: plan.map(|p| p.absolute.clone()), ..base.clone() };
        let c = Campaign::prepare(cspec, cfile, mem)?;
        let pname = c.info.protection.as_ref().map_or("none".to_string(), |p| p.plan.name.clone());
        (ctx.progress)(ExploreProgress::Plan { campaign: &base.name, plan: &pname });
        // The baseline campaign stays alive beside each plan's, with what it keeps whole.
        let alive = baseline.as_ref().map_or(0, Campaign::kept_bytes);
        let need = c.host_bytes(threads).and_then(|b| b.checked_add(alive));
        mem.check(&format!("campaign `{}` on {threads} threads", base.name), need)?;
        let (c, pairing) = pair_with_baseline(c, baseline.as_ref(), base, &pname, mem)?;
        let dir = ctx.out.join(&base.name).join(&pname);
        fs::create_dir_all(&dir).map_err(FaultError::io(&dir))?;
        let opts = RunOptions { threads, shard: Shard::ALL, resume: true, mode: TrialMode::Hybrid };
        let summary = c.run(&dir, opts, |p| (ctx.progress)(ExploreProgress::Campaign(p)))?;
        let outcomes: Vec<Outcome> = crate::store::outcomes(&dir)?;
        let base_cycles = baseline.as_ref().map_or(c.info.cycles_per_step, |b| b.info.cycles_per_step);
        if plan.is_none() {
            layers = layer_costs(&c, ctx.spec.intensity_threshold)?;
        }
        let r = plan_result(ctx.spec, &c, plan, &summary, &outcomes, &pairing, base_cycles)?;
        results.push((r, outcomes, pairing.paired));
        if plan.is_none() {
            baseline = Some(c);
        }
    }
    // Paired with the baseline, trial by trial, where the trials are the same faults.
    let base_outcomes = results[0].1.clone();
    for (r, outcomes, paired) in &mut results {
        let pairs = || base_outcomes.iter().zip(outcomes.iter()).zip(paired.iter()).filter(|(_, &p)| p).map(|(x, _)| x);
        r.failures_removed = pairs().filter(|(b, p)| b.failure() && !p.failure()).count() as u64;
        r.failures_added = pairs().filter(|(b, p)| !b.failure() && p.failure()).count() as u64;
    }
    let b = baseline.as_ref().expect("the baseline runs first");
    let comparisons = compare_plans(b, &results);
    let mut plans: Vec<PlanResult> = results.into_iter().map(|(r, _, _)| r).collect();
    mark_pareto(&mut plans);
    mark_front_at_confidence(&mut plans, &comparisons);
    Ok(CampaignResult {
        campaign: base.name.clone(),
        model: b.model().to_string(),
        hw: b.info.hw.clone(),
        trials: base_outcomes.len() as u64,
        base_cycles: plans[0].cycles,
        plans,
        layers,
        comparisons,
    })
}

/// The result of campaign `c` under `plan` (`None`: unprotected), whose run summed up to
/// `summary` with `outcomes`, against an unprotected step of `base_cycles`; its paired
/// comparison with the baseline (`failures_removed`, `failures_added`) is left at 0.
fn plan_result(
    spec: &ExploreSpec,
    c: &Campaign,
    plan: Option<&PlanFile>,
    summary: &Summary,
    outcomes: &[Outcome],
    pairing: &Pairing,
    base_cycles: u64,
) -> Result<PlanResult> {
    // Rates per unit of training work (the unprotected step): a translated class's share
    // already is; a class drawn over the longer step scales by its length.
    let longer = c.info.cycles_per_step as f64 / base_cycles as f64;
    let total_bits: f64 = summary.classes.iter().map(|k| k.bits as f64).sum();
    let strata: Vec<(f64, Estimate)> = summary
        .classes
        .iter()
        .map(|k| {
            let drawn = c.info.faults_from.is_some() && !pairing.translated.contains(&k.class);
            (k.bits as f64 / total_bits * if drawn { longer } else { 1.0 }, k.failure)
        })
        .collect();
    let (fp_, flo, fhi) = crate::stats::stratified(&strata);
    let scale = spec.fit_per_bit * total_bits;
    let fp = c.held_out_false_positives(spec.held_out_seed)?.unwrap_or(Estimate::of(0, 0));
    let p = c.info.protection.as_ref();
    let count =
        |f: fn(Outcome) -> bool| Estimate::of(outcomes.iter().filter(|o| f(**o)).count() as u64, outcomes.len() as u64);
    Ok(PlanResult {
        plan: p.map_or("none".to_string(), |p| p.plan.name.clone()),
        file: plan.map(|p| p.written.display().to_string()),
        cycles: c.info.cycles_per_step,
        cycle_overhead: c.info.cycles_per_step as f64 / base_cycles as f64 - 1.0,
        area_bits: p.map_or(0, |p| p.area_bits),
        failure: Interval { p: fp_, lo: flo, hi: fhi },
        failure_fit: Interval { p: scale * fp_, lo: scale * flo, hi: scale * fhi },
        detected: count(|o| matches!(o, Outcome::DetectedRecovered | Outcome::Detected)),
        corrected: count(|o| o == Outcome::Corrected),
        unrecovered: count(|o| o == Outcome::Detected),
        paired_trials: pairing.paired.iter().filter(|&&x| x).count() as u64,
        failures_removed: 0,
        failures_added: 0,
        coverage: {
            let caught = outcomes.iter().filter(|o| o.detected() || **o == Outcome::Corrected).count();
            let failed = outcomes.iter().filter(|o| o.failure()).count();
            Estimate::of(caught as u64, (caught + failed) as u64)
        },
        false_positives: fp,
        pareto: false,
        front_at_confidence: false,
    })
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
