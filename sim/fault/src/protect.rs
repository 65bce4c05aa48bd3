//! Protection plans (`configs/protect-*.ron`): which mechanisms guard what, applied to a
//! campaign's step graph and machine, with thresholds calibrated on its golden run.
//!
//! Mechanisms:
//! * `Ecc(code: Parity | Secded, on: [class globs])`: a check code on every word or register
//!   of the site classes (SRAM words, PE or VPU registers, DMA and sequencer registers). Its
//!   decoder ([`faultline_hw::protect::ecc`]) runs on each read of a word whose bits an upset changed:
//!   SECDED corrects single errors and detects double ones, parity detects odd-weight errors.
//!   Cost: the check bits, `words x check_bits(width)`. They are fault sites too: a campaign
//!   samples them as one more stratum per coded class (`ub.word[*].check`), whose upsets the
//!   decoder judges on the next read of their word.
//! * `Abft(nodes: [globs], phases: [..], tile: Global | PerTile | ByIntensity(threshold))`:
//!   Huang & Abraham checksums of the rank-2 `MatMul` nodes ([`faultline_graph::checks`]),
//!   computed by real MXU and VPU instructions; the threshold is the accumulation bound
//!   ([`faultline_graph::checks::abft_bound`]) at its largest over the golden run.
//!   `ByIntensity` is Kosaian & Rashmi's rule: global ABFT for a GEMM of arithmetic intensity
//!   `MNK / (MK + KN + MN)` at least `threshold`, per-tile below it.
//! * `Range(nodes: [globs], bound: Learned(margin) | NonFinite)`: `max |x|` of each node's
//!   value, against `margin x` its largest golden value (Ranger's bounds), or checked for
//!   NaN/Inf only (accumulator outputs).
//! * `MomentBound(limit)`: He et al.'s `|m| < limit` (20 in their paper) on every Adam
//!   first-moment update (Adam runs only).
//! * `NonFiniteLoss`: the host's check of the step's loss (He et al.); free.
//! * `Duplicate(nodes: [globs])`: each node's op run twice on its unit and compared (DMR).
//! * `Restrict(nodes: [globs], margin)`: Ranger (Chen et al., DSN 2021): each node's value
//!   clamped into `[-b, b]` on the VPU before anything reads it
//!   ([`faultline_graph::TrainGraph::add_clamp`]), `b = margin x` its largest `|x|` over the
//!   golden run (rounded up to fp32, so every golden value passes unchanged). It restricts,
//!   silently: no check, no detection, no recovery; a fault it bounds shows up as a milder
//!   outcome. Bounds are learned on a first pass of the golden run with the clamps wide open
//!   ([`calibrate_clamps`]); the golden run proper then runs with them and trains to the same
//!   bits.
//!
//! * `GradNormSpike(factor, window)` and `UpdateNormOutlier(factor, window)`: the LLM-training
//!   detectors (Altenbernd et al. 2026): the squared global gradient norm, or the squared norm
//!   of the step's parameter update, computed on the VPU every step
//!   ([`faultline_graph::TrainGraph::add_grad_norm_check`]; with clipping the gradient norm is
//!   the clipping's own, and the check adds no instruction), flagged when the norm exceeds
//!   `factor` times the root mean square of the previous `window` steps' norms (a running
//!   statistic over the run's own history; the first step has none and is not judged). With
//!   `Reexecute`, a flagged update is thrown away and the step recomputed, as the study
//!   proposes.
//!
//! `recovery: Reexecute(attempts)` re-runs a step in which a check fired from the state before
//! it (He et al.'s re-execution from the last good state); `None` stops at the detection.

use crate::error::{FaultError, Result};
use crate::spec::num;
use faultline_graph::checks::{abft_bound, CheckKind, Side};
use faultline_graph::op::{Op, Phase};
use faultline_graph::TrainGraph;
use faultline_hw::fault::glob_match;
use faultline_hw::protect::ecc::Code;
use faultline_hw::{HwConfig, SiteClass};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Largest margin (`Range`'s `Learned`, `Restrict`) and `MomentBound` limit: fp32's largest
/// value. The values guarded are fp32: a margin past it bounds nothing whose golden maximum is
/// 1 or more, and up to it `margin x` any fp32 golden maximum is finite in f64, so a learned
/// threshold is always a number. Whether it is finite in fp32 depends on the golden run:
/// [`calibrate`] and [`calibrate_clamps`] refuse one that is not.
pub const MAX_MARGIN: f64 = f32::MAX as f64;

/// A protection plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProtectionPlan {
    /// Name, shown in reports: 1 to 200 characters, no control characters (a plan an
    /// exploration runs names a directory: 1 to 100 of `A-Z a-z 0-9 _ . + -`).
    pub name: String,
    /// The mechanisms, each with where it sits (an empty list guards nothing).
    pub mechanisms: Vec<Mechanism>,
    /// What a detection triggers.
    #[serde(default)]
    pub recovery: Recovery,
}

/// One protection mechanism and where it sits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Mechanism {
    /// A check code on every word or register of the classes matching `on`.
    Ecc {
        /// Parity or SECDED.
        code: Code,
        /// Globs over the site classes `faultline sites` prints, e.g. `ub.word[*]`,
        /// `mxu.pe[*][*].*`. At least one, and together they must select a class of the machine.
        on: Vec<String>,
    },
    /// ABFT checksums of the rank-2 `MatMul` nodes matching `nodes` in `phases`.
    Abft {
        /// Globs over node names (`faultline program` shows them), e.g. `*.matmul`. At least
        /// one, and together they must select a rank-2 `MatMul` node in `phases`.
        nodes: Vec<String>,
        /// Phases whose GEMMs are guarded: at least one of `Forward`, `Backward`, `Update`.
        #[serde(default = "forward")]
        phases: Vec<Phase>,
        /// Checksum granularity.
        tile: AbftTile,
        /// The checksummed side; absent: whichever makes the step shorter, GEMM by GEMM.
        #[serde(default)]
        side: Option<Side>,
    },
    /// Range checks of the values of the nodes matching `nodes`.
    Range {
        /// Globs over node names; at least one, and they must select a node.
        nodes: Vec<String>,
        /// The bound.
        bound: RangeBound,
    },
    /// `|m| < limit` on Adam's first moments (Adam runs only): the limit, positive and at most
    /// `f32::MAX` (He et al. use 20).
    MomentBound(f64),
    /// The host checks that the step's loss is finite (free: no instructions added).
    NonFiniteLoss,
    /// The ops of the nodes matching `nodes`, run twice and compared.
    Duplicate {
        /// Globs over node names; at least one, and they must select a node.
        nodes: Vec<String>,
    },
    /// The global gradient norm (its square summed on the VPU; with clipping, the clipping's
    /// own), flagged above `factor` times the RMS of the previous `window` steps' norms.
    GradNormSpike {
        /// How many times the recent RMS norm fires it: more than 1, at most 1e6.
        factor: f64,
        /// Previous steps in the running statistic: 1 to 1000.
        window: u32,
    },
    /// The norm of the step's parameter update (its square summed on the VPU), flagged above
    /// `factor` times the RMS of the previous `window` steps' update norms; with re-execution,
    /// the step is recomputed.
    UpdateNormOutlier {
        /// How many times the recent RMS norm fires it: more than 1, at most 1e6.
        factor: f64,
        /// Previous steps in the running statistic: 1 to 1000.
        window: u32,
    },
    /// The values of the nodes matching `nodes`, clamped into `margin x` their golden range.
    Restrict {
        /// Globs over node names; at least one, and they must select a node.
        nodes: Vec<String>,
        /// The bound's margin over the largest golden `|x|`: a factor, 1..=`f32::MAX`
        /// (about 3.4e38).
        margin: f64,
    },
}

fn forward() -> Vec<Phase> {
    vec![Phase::Forward]
}

/// ABFT checksum granularity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum AbftTile {
    /// One checksum column per GEMM.
    Global,
    /// One checksum column per tile of output columns the array computes (its width).
    PerTile,
    /// Global at arithmetic intensity `>=` the threshold, else per-tile. The threshold: MACs
    /// per word, positive and finite.
    ByIntensity(f64),
}

/// A range check's bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum RangeBound {
    /// `margin x` the largest `|x|` of the golden run. The margin: a factor, 1..=`f32::MAX`
    /// (about 3.4e38).
    Learned(f64),
    /// Only NaN and infinities.
    NonFinite,
}

/// What a detection triggers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Recovery {
    /// Nothing: the run stops at the detection (a detected unrecoverable error).
    None,
    /// Re-run the step from the state before it, up to this many times: 1..=16.
    Reexecute(u32),
    /// `Reexecute(1)`.
    #[default]
    Once,
}

impl Recovery {
    /// Re-executions allowed per detected step.
    pub fn attempts(self) -> u32 {
        match self {
            Recovery::None => 0,
            Recovery::Reexecute(n) => n,
            Recovery::Once => 1,
        }
    }
}

/// How a check's residual is judged.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Rule {
    /// ABFT: the accumulation bound, at its largest over the golden run.
    AbftBound,
    /// `margin x` the largest golden residual.
    Learned(f64),
    /// A fixed limit.
    Limit(f64),
    /// Only non-finite residuals fire.
    NonFinite,
    /// Any nonzero residual fires (duplication is bit-exact).
    Exact,
    /// A squared norm fires above `factor^2` times the mean of the previous `window` steps'
    /// (the norm above `factor` times their RMS).
    Spike {
        /// The factor on the norm.
        factor: f64,
        /// Previous steps in the running statistic.
        window: u32,
    },
}

impl Rule {
    /// A check's threshold under this rule, given its largest residual and (ABFT) its largest
    /// accumulation bound over the golden run.
    fn threshold(self, golden_max: f64, bound: f64) -> f64 {
        match self {
            Rule::AbftBound => bound,
            Rule::Learned(m) => m * golden_max,
            Rule::Limit(l) => l,
            Rule::NonFinite => f64::MAX,
            Rule::Exact => 0.0,
            Rule::Spike { factor, .. } => factor,
        }
    }
}

/// One check of an applied plan, in the graph's check order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckInfo {
    /// The check's name (`fc1.matmul.abft`).
    pub name: String,
    /// The mechanism (`abft`, `abft-tile`, `range`, `moment-bound`, `duplicate`).
    pub mechanism: String,
    /// The node it guards.
    pub node: String,
    /// Its layer.
    pub layer: String,
    /// Its phase.
    pub phase: Phase,
    /// For ABFT: `[M, K, N]` of the guarded GEMM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm: Option<[usize; 3]>,
    /// For ABFT: the checksummed side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<Side>,
    /// For ABFT: output columns (`Rows`) or rows (`Cols`) per checksum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tile: Option<usize>,
    /// How its residual is judged.
    pub rule: Rule,
    /// The threshold a residual must exceed to fire (after calibration; infinite when a
    /// learned one is, JSON `"Infinity"`); for `Spike`, the factor on the recent RMS norm.
    #[serde(with = "faultline_num::json")]
    pub threshold: f64,
    /// The largest residual of the golden run (infinite if one was); for `Spike`, the largest
    /// ratio of a golden step's norm to the recent RMS norm.
    #[serde(with = "faultline_num::json")]
    pub golden_max: f64,
    /// Golden steps in which it fired (false positives).
    pub false_positives: u64,
}

impl CheckInfo {
    /// Whether residual `r` fires the check; `recent` holds the check's residuals of the
    /// steps before, oldest first (read by `Spike` only).
    pub fn fires(&self, r: f32, recent: impl DoubleEndedIterator<Item = f32>) -> bool {
        let r = r as f64;
        if !r.is_finite() {
            return true;
        }
        match self.rule {
            Rule::Spike { window, .. } => spike_ratio(r, recent, window).is_some_and(|q| q > self.threshold),
            _ => r > self.threshold,
        }
    }
}

/// The norm of squared norm `r` over the RMS of the last `window` of `recent` (oldest first):
/// `None` without history (or a zero one, when `r` is zero too).
fn spike_ratio(r: f64, recent: impl DoubleEndedIterator<Item = f32>, window: u32) -> Option<f64> {
    let prev: Vec<f64> = recent.rev().take(window as usize).map(f64::from).collect();
    if prev.is_empty() {
        return None;
    }
    let mean = prev.iter().sum::<f64>() / prev.len() as f64;
    match (r / mean).sqrt() {
        q if q.is_nan() => (r > 0.0 || mean.is_nan()).then_some(f64::INFINITY),
        q => Some(q),
    }
}

/// One clamp of an applied plan (`Restrict`), in the order they were added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClampInfo {
    /// The clamp's name (`relu1.relu.clamp`).
    pub name: String,
    /// The node it restricts.
    pub node: String,
    /// Its layer.
    pub layer: String,
    /// Its phase.
    pub phase: Phase,
    /// The bound's margin over the golden run's largest `|x|`.
    pub margin: f64,
    /// The bound (fp32): `margin x golden_max` rounded up, after calibration; `f32::MAX`
    /// (identity on finite values) before; infinite past `f32::MAX` (JSON `"Infinity"`).
    #[serde(with = "faultline_num::json")]
    pub bound: f64,
    /// The largest `|x|` of the node over the golden run (infinite if one was).
    #[serde(with = "faultline_num::json")]
    pub golden_max: f64,
}

/// A site class under a check code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EccInfo {
    /// The class pattern.
    pub class: String,
    /// The code.
    pub code: Code,
    /// Data bits per word or register.
    pub width: u32,
    /// Check bits per word or register.
    pub check_bits: u32,
    /// Check bits in all (the code's area).
    pub area_bits: u64,
}

/// A plan applied to one campaign: its checks and codes, with their costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    /// The plan as parsed.
    pub plan: ProtectionPlan,
    /// The checks, in the graph's check order.
    pub checks: Vec<CheckInfo>,
    /// The codes, one per protected class.
    pub ecc: Vec<EccInfo>,
    /// The clamps (`Restrict`), in the order they were added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clamps: Vec<ClampInfo>,
    /// Whether the host checks the loss.
    pub loss_check: bool,
    /// Cycles of the unprotected step.
    pub base_cycles: u64,
    /// Cycles of the protected step (checks included).
    pub cycles: u64,
    /// Check bits in all.
    pub area_bits: u64,
    /// The golden run's residuals, step by step (`[s - 1]` for step `s`): the history a
    /// `Spike` check's running statistic starts from (empty without one).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "faultline_num::json")]
    pub golden_residuals: Vec<Vec<f32>>,
}

impl Applied {
    /// The code guarding site class `class`, if any.
    pub fn code_of(&self, class: &str) -> Option<&EccInfo> {
        self.ecc.iter().find(|e| e.class == class)
    }

    /// The step's cycle overhead, as a fraction of the unprotected step.
    pub fn cycle_overhead(&self) -> f64 {
        self.cycles as f64 / self.base_cycles.max(1) as f64 - 1.0
    }

    /// The first check residuals `r` (in check order) fire, with the loss check: its name.
    /// `history` holds the residuals of the steps before, oldest first (a running statistic's).
    pub fn detect(&self, loss: f64, r: &[f32], history: &[&[f32]]) -> Option<String> {
        if self.loss_check && !loss.is_finite() {
            return Some("loss".into());
        }
        let fired = |(k, (c, &r)): &(usize, (&CheckInfo, &f32))| c.fires(r, history.iter().map(|h| h[*k]));
        self.checks.iter().zip(r).enumerate().find(fired).map(|(_, (c, _))| c.name.clone())
    }

    /// The golden run's residuals before step `s` (1-based), oldest first: the history of a
    /// trial's injection step.
    pub fn golden_history(&self, s: u64) -> Vec<&[f32]> {
        let n = (s.saturating_sub(1) as usize).min(self.golden_residuals.len());
        self.golden_residuals[..n].iter().map(Vec::as_slice).collect()
    }
}

impl ProtectionPlan {
    /// Reads and parses a plan; errors name `file:line:col` or the field.
    pub fn load(path: &Path) -> Result<ProtectionPlan> {
        let plan: ProtectionPlan = crate::spec::read_ron(path)?;
        plan.validate(path)?;
        Ok(plan)
    }

    /// Value checks the types cannot express.
    pub fn validate(&self, file: &Path) -> Result<()> {
        let bad = |field: String, value: String, allowed: &str| {
            Err(FaultError::Invalid { file: file.into(), field, value, allowed: allowed.into() })
        };
        if self.name.is_empty() || self.name.chars().any(char::is_control) || self.name.len() > 200 {
            return bad("name".into(), format!("{:?}", self.name), "1 to 200 characters, no control characters");
        }
        if let Recovery::Reexecute(n) = self.recovery {
            if !(1..=16).contains(&n) {
                return bad("recovery".into(), format!("Reexecute({n})"), "Reexecute(1..=16), Once or None");
            }
        }
        for (i, m) in self.mechanisms.iter().enumerate() {
            let field = |f: &str| format!("mechanisms[{i}].{f}");
            let globs = match m {
                Mechanism::Ecc { on, .. } => Some(("on", on)),
                Mechanism::Abft { nodes, .. }
                | Mechanism::Range { nodes, .. }
                | Mechanism::Duplicate { nodes }
                | Mechanism::Restrict { nodes, .. } => Some(("nodes", nodes)),
                _ => None,
            };
            if let Some((f, g)) = globs.filter(|(_, g)| g.is_empty()) {
                return bad(field(f), format!("{g:?}"), "at least one glob");
            }
            match *m {
                Mechanism::Abft { tile: AbftTile::ByIntensity(t), .. } if !(t.is_finite() && t > 0.0) => {
                    return bad(
                        field("tile"),
                        format!("ByIntensity({t})"),
                        "a positive arithmetic intensity (MACs per word)",
                    );
                }
                Mechanism::Abft { ref phases, .. } if phases.is_empty() => {
                    return bad(field("phases"), "[]".into(), "at least one of Forward, Backward, Update");
                }
                Mechanism::Range { bound: RangeBound::Learned(m), .. } if !(1.0..=MAX_MARGIN).contains(&m) => {
                    return bad(
                        field("bound"),
                        format!("Learned({})", num(m)),
                        &format!("Learned(margin) with margin >= 1 and <= {:e}, or NonFinite", f32::MAX),
                    );
                }
                Mechanism::Restrict { margin: m, .. } if !(1.0..=MAX_MARGIN).contains(&m) => {
                    return bad(
                        field("margin"),
                        num(m),
                        &format!("a margin >= 1 and <= {:e} over the golden run's largest |x|", f32::MAX),
                    );
                }
                Mechanism::GradNormSpike { factor, window } | Mechanism::UpdateNormOutlier { factor, window }
                    if !(factor > 1.0 && factor <= 1e6 && (1..=1000).contains(&window)) =>
                {
                    let (f, v) = if (1..=1000).contains(&window) {
                        ("factor", num(factor))
                    } else {
                        ("window", window.to_string())
                    };
                    return bad(
                        field(f),
                        v,
                        "factor: more than 1 and at most 1e6 (times the recent RMS norm); window: 1 to 1000 steps",
                    );
                }
                Mechanism::MomentBound(l) if !(l > 0.0 && l <= MAX_MARGIN) => {
                    return bad(
                        format!("mechanisms[{i}]"),
                        format!("MomentBound({})", num(l)),
                        &format!("a positive limit <= {:e} (He et al. use 20)", f32::MAX),
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The field of the mechanism that added check `c` (the first that could have: any that
    /// could holds the same value) and its value as written, for errors about the check.
    fn origin_of_check(&self, c: &CheckInfo) -> (String, String) {
        let on = |nodes: &[String]| nodes.iter().any(|g| glob_match(g, &c.node));
        for (i, m) in self.mechanisms.iter().enumerate() {
            match (m, c.rule) {
                (Mechanism::Range { nodes, bound: RangeBound::Learned(x) }, Rule::Learned(y))
                    if *x == y && on(nodes) =>
                {
                    return (format!("mechanisms[{i}].bound"), format!("Learned({})", num(*x)));
                }
                (Mechanism::Range { nodes, bound: RangeBound::NonFinite }, Rule::NonFinite) if on(nodes) => {
                    return (format!("mechanisms[{i}].bound"), "NonFinite".into());
                }
                (Mechanism::MomentBound(x), Rule::Limit(y)) if *x == y => {
                    return (format!("mechanisms[{i}]"), format!("MomentBound({})", num(*x)));
                }
                (Mechanism::Abft { nodes, phases, .. }, Rule::AbftBound) if phases.contains(&c.phase) && on(nodes) => {
                    return (format!("mechanisms[{i}].nodes"), format!("{nodes:?}"));
                }
                (Mechanism::Duplicate { nodes }, Rule::Exact) if on(nodes) => {
                    return (format!("mechanisms[{i}].nodes"), format!("{nodes:?}"));
                }
                (
                    Mechanism::GradNormSpike { factor, window } | Mechanism::UpdateNormOutlier { factor, window },
                    Rule::Spike { factor: f, window: w },
                ) if (*factor, *window) == (f, w) && c.mechanism == spike_name(m) => {
                    return (format!("mechanisms[{i}].factor"), num(*factor));
                }
                _ => {}
            }
        }
        ("mechanisms".into(), format!("{:?}", c.rule))
    }

    /// Adds the plan's checks to `tg` (for machine `hw`) and resolves its codes against the
    /// machine's site classes; thresholds are set by [`calibrate`] from the golden run.
    /// Errors name `file` and the mechanism's field when a glob selects nothing it can guard.
    pub fn apply(&self, tg: &mut TrainGraph, hw: &HwConfig, file: &Path) -> Result<Applied> {
        let base_cycles = schedule_cycles(tg, hw)?;
        let (mut checks, mut ecc, mut clamps, mut loss_check) = (Vec::new(), Vec::new(), Vec::new(), false);
        let names: Vec<(String, Op, Phase)> =
            tg.graph.indices().map(|i| tg.graph.node(i)).map(|n| (n.name.clone(), n.op.clone(), n.phase)).collect();
        let rank2s: Vec<bool> = tg.graph.indices().map(|i| tg.graph.node(i).shape.len() == 2).collect();
        let model = tg.model.clone();
        let g_err = |i: usize, f: &str, g: &[String], what: &str, have: Vec<&str>| FaultError::Invalid {
            file: file.into(),
            field: format!("mechanisms[{i}].{f}"),
            value: format!("{g:?}"),
            allowed: format!("globs selecting {what} of `{model}`: {}", have.join(", ")),
        };
        for (mi, m) in self.mechanisms.iter().enumerate() {
            let select = |globs: &[String], ok: &dyn Fn(&Op, Phase) -> bool| -> Vec<usize> {
                (0..names.len())
                    .filter(|&i| ok(&names[i].1, names[i].2) && globs.iter().any(|g| glob_match(g, &names[i].0)))
                    .collect()
            };
            let rank2 = |i: usize| rank2s[i];
            match m {
                Mechanism::Ecc { code, on } => {
                    let all = SiteClass::all(hw);
                    let picked: Vec<_> =
                        all.iter().filter(|c| on.iter().any(|g| glob_match(g, &c.pattern()))).collect();
                    if picked.is_empty() {
                        let have: Vec<String> = all.iter().map(|c| c.pattern()).collect();
                        return Err(g_err(mi, "on", on, "site classes", have.iter().map(|s| s.as_str()).collect()));
                    }
                    for c in picked {
                        let width = c.width(hw);
                        let check_bits = code.check_bits(width);
                        let words = c.elements(hw);
                        let info = EccInfo {
                            class: c.pattern(),
                            code: *code,
                            width,
                            check_bits,
                            area_bits: words * check_bits as u64,
                        };
                        ecc.retain(|e: &EccInfo| e.class != info.class);
                        ecc.push(info);
                    }
                }
                Mechanism::Abft { nodes, phases, tile, side } => {
                    let ok = |op: &Op, p: Phase| matches!(op, Op::MatMul { .. }) && phases.contains(&p);
                    let picked: Vec<usize> = select(nodes, &ok).into_iter().filter(|&i| rank2(i)).collect();
                    if picked.is_empty() {
                        let have = names.iter().enumerate().filter(|(i, n)| ok(&n.1, n.2) && rank2(*i));
                        return Err(g_err(
                            mi,
                            "nodes",
                            nodes,
                            "rank-2 MatMul nodes in the given phases",
                            have.map(|(_, n)| n.0.as_str()).collect(),
                        ));
                    }
                    for i in picked {
                        let idx = faultline_graph::NodeIndex::new(i);
                        let [m_, k, n] = gemm_dims(tg, idx);
                        let per_tile = match tile {
                            AbftTile::Global => false,
                            AbftTile::PerTile => true,
                            AbftTile::ByIntensity(t) => intensity(m_, k, n) < *t,
                        };
                        let (k_, tiled) = add_abft_on(tg, hw, idx, per_tile, *side)?;
                        checks.push(info(tg, k_, if tiled { "abft-tile" } else { "abft" }, Rule::AbftBound));
                    }
                }
                Mechanism::Range { nodes, bound } => {
                    let ok = |op: &Op, _: Phase| !op.is_placeholder() && !is_check(op);
                    let picked = select(nodes, &ok);
                    if picked.is_empty() {
                        let have = names.iter().filter(|n| ok(&n.1, n.2)).map(|n| n.0.as_str()).collect();
                        return Err(g_err(mi, "nodes", nodes, "computed nodes", have));
                    }
                    let rule = match bound {
                        RangeBound::Learned(m) => Rule::Learned(*m),
                        RangeBound::NonFinite => Rule::NonFinite,
                    };
                    for i in picked {
                        let k_ = tg.add_range_check(faultline_graph::NodeIndex::new(i)).map_err(FaultError::from)?;
                        checks.push(info(tg, k_, "range", rule));
                    }
                }
                Mechanism::MomentBound(limit) => {
                    let picked = select(&["*".into()], &|op, _| matches!(op, Op::AdamMoment { .. }));
                    if picked.is_empty() {
                        return Err(FaultError::Invalid {
                            file: file.into(),
                            field: format!("mechanisms[{mi}]"),
                            value: format!("MomentBound({limit})"),
                            allowed: "a campaign that trains with Adam (train.optimizer: adam): the bound is on its first moment".into(),
                        });
                    }
                    for i in picked {
                        let k_ = tg.add_range_check(faultline_graph::NodeIndex::new(i)).map_err(FaultError::from)?;
                        checks.push(info(tg, k_, "moment-bound", Rule::Limit(*limit)));
                    }
                }
                Mechanism::NonFiniteLoss => loss_check = true,
                Mechanism::GradNormSpike { factor, window } | Mechanism::UpdateNormOutlier { factor, window } => {
                    let k_ = if matches!(m, Mechanism::GradNormSpike { .. }) {
                        tg.add_grad_norm_check()
                    } else {
                        tg.add_update_norm_check()
                    };
                    let k_ = k_.map_err(|e| FaultError::Invalid {
                        file: file.into(),
                        field: format!("mechanisms[{mi}]"),
                        value: spike_name(m).into(),
                        allowed: format!("one such detector per plan ({e})"),
                    })?;
                    checks.push(info(tg, k_, spike_name(m), Rule::Spike { factor: *factor, window: *window }));
                }
                Mechanism::Duplicate { nodes } => {
                    let ok =
                        |op: &Op, _: Phase| !op.is_placeholder() && !is_check(op) && !matches!(op, Op::Reshape { .. });
                    let picked = select(nodes, &ok);
                    if picked.is_empty() {
                        let have = names.iter().filter(|n| ok(&n.1, n.2)).map(|n| n.0.as_str()).collect();
                        return Err(g_err(mi, "nodes", nodes, "computed nodes", have));
                    }
                    for i in picked {
                        let k_ = tg.add_duplicate(faultline_graph::NodeIndex::new(i)).map_err(FaultError::from)?;
                        checks.push(info(tg, k_, "duplicate", Rule::Exact));
                    }
                }
                Mechanism::Restrict { nodes, margin } => {
                    let ok = |op: &Op, _: Phase| !op.is_placeholder() && !is_check(op);
                    let check_nodes: Vec<usize> =
                        tg.checks().iter().flat_map(|c| c.nodes.iter().map(|n| n.index())).collect();
                    let clamped: Vec<usize> = tg.clamps().iter().map(|c| c.guarded.index()).collect();
                    let free = |i: &usize| !check_nodes.contains(i) && !clamped.contains(i);
                    let picked: Vec<usize> = select(nodes, &ok).into_iter().filter(free).collect();
                    if picked.is_empty() {
                        let have = (0..names.len()).filter(|i| ok(&names[*i].1, names[*i].2) && free(i));
                        let have = have.map(|i| names[i].0.as_str()).collect();
                        return Err(g_err(mi, "nodes", nodes, "computed nodes not yet restricted", have));
                    }
                    for i in picked {
                        let c = tg.add_clamp(faultline_graph::NodeIndex::new(i), f32::MAX).map_err(FaultError::from)?;
                        let node = tg.graph.node(faultline_graph::NodeIndex::new(i));
                        clamps.push(ClampInfo {
                            name: tg.graph.node(c).name.clone(),
                            node: node.name.clone(),
                            layer: node.layer.clone(),
                            phase: node.phase,
                            margin: *margin,
                            bound: f64::from(f32::MAX),
                            golden_max: 0.0,
                        });
                    }
                }
            }
        }
        let cycles = schedule_cycles(tg, hw)?;
        let area_bits = ecc.iter().map(|e| e.area_bits).sum();
        Ok(Applied {
            plan: self.clone(),
            checks,
            ecc,
            clamps,
            loss_check,
            base_cycles,
            cycles,
            area_bits,
            // Set by calibration, and only for a running statistic.
            golden_residuals: Vec::new(),
        })
    }
}

/// The checksum tile of ABFT on `side` of an `[M, K, N]` GEMM: per-tile ABFT takes the
/// array's width (`Rows`) or height (`Cols`); global ABFT, or a tile that does not divide
/// the dimension, takes none (one checksum).
fn abft_tile(hw: &HwConfig, [m, _, n]: [usize; 3], side: Side, per_tile: bool) -> Option<usize> {
    let (dim, t) = if side == Side::Rows { (n, hw.mxu.cols) } else { (m, hw.mxu.rows) };
    (per_tile && dim > t && dim % t == 0).then_some(t)
}

/// Step cycles of `tg` on `hw` with global (`per_tile` false) or per-tile ABFT on GEMM node
/// `c` alone, on its cheaper side: what one layer's ABFT costs.
pub fn abft_cycles(tg: &TrainGraph, hw: &HwConfig, c: faultline_graph::NodeIndex, per_tile: bool) -> Result<u64> {
    let mut trial = tg.clone();
    add_abft_on(&mut trial, hw, c, per_tile, None)?;
    schedule_cycles(&trial, hw)
}

/// Adds global (`per_tile` false) or per-tile ABFT to GEMM node `c` of `tg`, on `side`, or
/// (`None`) on the side that makes the step on `hw` shorter; returns the check's index and
/// whether it is tiled (per-tile ABFT where the GEMM allows it, else global).
fn add_abft_on(
    tg: &mut TrainGraph,
    hw: &HwConfig,
    c: faultline_graph::NodeIndex,
    per_tile: bool,
    side: Option<Side>,
) -> Result<(usize, bool)> {
    let dims = gemm_dims(tg, c);
    let tile_of = |s: Side| abft_tile(hw, dims, s, per_tile);
    let side = match side {
        Some(s) => s,
        None => cheaper_side(tg, hw, c, tile_of)?,
    };
    let k = tg.add_abft(c, side, tile_of(side)).map_err(FaultError::from)?;
    Ok((k, tile_of(side).is_some()))
}

/// The ABFT side of GEMM node `c` (tiles from `tile_of`) that makes `tg`'s step shorter
/// on `hw` (`Rows` on a tie), among the sides that can be tiled if any can (per-tile ABFT
/// stays per-tile where the GEMM allows it).
fn cheaper_side(
    tg: &TrainGraph,
    hw: &HwConfig,
    c: faultline_graph::NodeIndex,
    tile_of: impl Fn(Side) -> Option<usize>,
) -> Result<Side> {
    let tiled: Vec<Side> = [Side::Rows, Side::Cols].into_iter().filter(|&s| tile_of(s).is_some()).collect();
    let sides = if tiled.is_empty() { vec![Side::Rows, Side::Cols] } else { tiled };
    let mut best = (u64::MAX, Side::Rows);
    for s in sides {
        let mut trial = tg.clone();
        trial.add_abft(c, s, tile_of(s)).map_err(FaultError::from)?;
        best = best.min((schedule_cycles(&trial, hw)?, s));
    }
    Ok(best.1)
}

/// The mechanism name of a spike detector's check.
fn spike_name(m: &Mechanism) -> &'static str {
    match m {
        Mechanism::GradNormSpike { .. } => "grad-norm-spike",
        _ => "update-norm-outlier",
    }
}

/// Whether `op` only exists in checks and clamps (never guarded itself).
fn is_check(op: &Op) -> bool {
    matches!(op, Op::TileSum { .. } | Op::MaxAbs | Op::MaxAbsDiff | Op::Clamp { .. })
}

/// `[M, K, N]` of the rank-2 `MatMul` node `c`.
pub fn gemm_dims(tg: &TrainGraph, c: faultline_graph::NodeIndex) -> [usize; 3] {
    let node = tg.graph.node(c);
    let a = &tg.graph.node(node.inputs[0]).shape;
    [node.shape[0], a[0] * a[1] / node.shape[0].max(1), node.shape[1]]
}

/// Arithmetic intensity of an `M x K x N` GEMM: MACs per word of its operands and result.
pub fn intensity(m: usize, k: usize, n: usize) -> f64 {
    (m * k * n) as f64 / (m * k + k * n + m * n) as f64
}

fn info(tg: &TrainGraph, k: usize, mechanism: &str, rule: Rule) -> CheckInfo {
    let c = &tg.checks()[k];
    let node = tg.graph.node(c.guarded);
    let (gemm, side, tile) = match c.kind {
        CheckKind::Abft { side, tile } => (Some(gemm_dims(tg, c.guarded)), Some(side), Some(tile)),
        _ => (None, None, None),
    };
    // Until calibration, as if the golden run had all-zero residuals and bounds.
    let threshold = rule.threshold(0.0, 0.0);
    CheckInfo {
        name: c.name.clone(),
        mechanism: mechanism.into(),
        node: node.name.clone(),
        layer: node.layer.clone(),
        phase: node.phase,
        gemm,
        side,
        tile,
        rule,
        threshold,
        golden_max: 0.0,
        false_positives: 0,
    }
}

/// Cycles of `tg`'s step on `hw` (as the executor runs it).
pub fn schedule_cycles(tg: &TrainGraph, hw: &HwConfig) -> Result<u64> {
    Ok(faultline_graph::program::schedule(tg, hw).map_err(FaultError::from)?.total_cycles)
}

/// What calibration needs of one golden step: the check residuals, and for each ABFT check
/// its accumulation bound on that step.
pub fn step_bounds(
    tg: &TrainGraph,
    program: &faultline_graph::Program,
    bufs: &[Vec<u32>],
    input_unit: f64,
) -> Vec<Option<f64>> {
    tg.checks()
        .iter()
        .map(|c| {
            let CheckKind::Abft { side, tile } = c.kind else { return None };
            let node = tg.graph.node(c.guarded);
            let Op::MatMul { trans_a, trans_b } = node.op else { return None };
            let value = |i: faultline_graph::NodeIndex| -> Vec<f32> {
                bufs[program.buffer_of(i).expect("operands have buffers").index()]
                    .iter()
                    .map(|&b| f32::from_bits(b))
                    .collect()
            };
            let (a, b) = (value(node.inputs[0]), value(node.inputs[1]));
            Some(abft_bound(&a, &b, trans_a, trans_b, gemm_dims(tg, c.guarded), side, tile, input_unit))
        })
        .collect()
}

/// Sets each check's threshold from the golden run: `residuals[s][k]` is check `k`'s residual
/// on golden step `s`, `bounds[s][k]` its ABFT bound there (`bounds` empty when no check is
/// ABFT); then counts the golden steps each check fires on (false positives). Refuses, naming
/// the plan file `file` and the mechanism's field, a learned threshold that is not finite in
/// fp32 (it could never fire on an fp32 residual, and as JSON it would not read back) and a
/// check that fires on the fault-free run (it would flag every trial of that step, however
/// its fault ended).
pub fn calibrate(
    applied: &mut Applied,
    residuals: &[Vec<f32>],
    bounds: &[Vec<Option<f64>>],
    file: &Path,
) -> Result<()> {
    let spikes = applied.checks.iter().any(|c| matches!(c.rule, Rule::Spike { .. }));
    for (k, c) in applied.checks.iter_mut().enumerate() {
        let recent = |s: usize| residuals[..s].iter().map(move |r| r[k]);
        c.golden_max = match c.rule {
            Rule::Spike { window, .. } => (0..residuals.len())
                .filter_map(|s| spike_ratio(residuals[s][k] as f64, recent(s), window))
                .fold(0.0, f64::max),
            _ => residuals.iter().map(|r| r[k] as f64).fold(0.0, f64::max),
        };
        let bound = bounds.iter().filter_map(|b| b.get(k).copied().flatten()).fold(0.0, f64::max);
        c.threshold = c.rule.threshold(c.golden_max, bound);
        c.false_positives = (0..residuals.len()).filter(|&s| c.fires(residuals[s][k], recent(s))).count() as u64;
    }
    if spikes {
        applied.golden_residuals = residuals.to_vec();
    }
    for c in &applied.checks {
        let (field, value) = applied.plan.origin_of_check(c);
        let bad = |allowed: String| Err(FaultError::Invalid { file: file.into(), field, value, allowed });
        let learned = matches!(c.rule, Rule::Learned(_) | Rule::AbftBound);
        if learned && !(..=MAX_MARGIN).contains(&c.threshold) {
            return bad(format!(
                "a threshold finite in fp32: check `{}` learned {:e} from the golden run's largest residual {:e}, \
                 past fp32's largest value {:e}",
                c.name,
                c.threshold,
                c.golden_max,
                f32::MAX
            ));
        }
        if let (Rule::Spike { window, .. }, true) = (c.rule, c.false_positives > 0) {
            return bad(format!(
                "a factor the fault-free golden run stays within: check `{}` fired on {} of its {} steps; its norm \
                 reached {:.3} times the RMS of the previous {window} steps' there",
                c.name,
                c.false_positives,
                residuals.len(),
                c.golden_max
            ));
        }
        if c.false_positives > 0 {
            return bad(format!(
                "a threshold the fault-free golden run stays within: check `{}` (threshold {:e}) fired on {} of its \
                 {} steps, and its largest value there is {:e}",
                c.name,
                c.threshold,
                c.false_positives,
                residuals.len(),
                c.golden_max
            ));
        }
    }
    Ok(())
}

/// The largest `|x|` of each clamped node of `tg` (in clamp order) in one step's buffers.
pub fn clamp_maxes(tg: &TrainGraph, program: &faultline_graph::Program, bufs: &[Vec<u32>]) -> Vec<f64> {
    tg.clamps()
        .iter()
        .map(|c| {
            let b = program.buffer_of(c.guarded).expect("clamped nodes have buffers");
            bufs[b.index()].iter().map(|&v| f64::from(f32::from_bits(v).abs())).fold(0.0, f64::max)
        })
        .collect()
}

/// Sets each clamp's bound from its node's largest golden `|x|` (`maxes`, in clamp order):
/// `margin x max`, rounded up to fp32 so that every golden value is in range; writes the
/// bounds into `tg`'s clamp nodes. A bound past fp32's largest value is refused, naming the
/// plan file `file` and the mechanism's margin: the clamp would be no bound, and as JSON it
/// would not read back.
pub fn calibrate_clamps(applied: &mut Applied, tg: &mut TrainGraph, maxes: &[f64], file: &Path) -> Result<()> {
    for ((c, k), &max) in applied.clamps.iter_mut().zip(tg.clamps().to_vec()).zip(maxes) {
        let want = c.margin * max;
        let mut b = want as f32;
        if f64::from(b) < want {
            b = b.next_up();
        }
        c.golden_max = max;
        c.bound = f64::from(b);
        if !b.is_finite() {
            // The first `Restrict` that could have added it: any that could has this margin.
            let on = |nodes: &[String]| nodes.iter().any(|g| glob_match(g, &c.node));
            let i = (applied.plan.mechanisms.iter())
                .position(|m| matches!(m, Mechanism::Restrict { nodes, margin } if *margin == c.margin && on(nodes)));
            return Err(FaultError::Invalid {
                file: file.into(),
                field: i.map_or("mechanisms".into(), |i| format!("mechanisms[{i}].margin")),
                value: num(c.margin),
                allowed: format!(
                    "a margin whose bound is finite in fp32: clamp `{}` learned bound {} = margin x golden max {:e}, \
                     past fp32's largest value {:e} (margins up to {:e} fit this node)",
                    c.name,
                    c.bound,
                    max,
                    f32::MAX,
                    MAX_MARGIN / max
                ),
            });
        }
        tg.set_clamp_bound(k.node, b).map_err(FaultError::from)?;
    }
    Ok(())
}
