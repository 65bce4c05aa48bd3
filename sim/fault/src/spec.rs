//! A campaign's definition: `configs/campaign-*.ron`, parsed with unknown fields refused and
//! checked field by field, so a bad spec is reported as `file:line:col` (syntax, unknown or
//! missing field) or `file: field ... = value: allowed values`.

use crate::error::{FaultError, Result};
use crate::outcome::Thresholds;
use faultline_hw::files;
use faultline_train::{MxuFormat, OptimizerKind, MAX_STEPS};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Largest number of trials one campaign may plan (its records stay a few GB at most).
pub const MAX_TRIALS: u64 = 10_000_000;

/// Largest raw failure rate per bit, in FIT: one failure per bit per hour, 10^12 times a
/// typical SRAM rate (about 10^-3), so beam-test rates fit. It keeps every rate scaled from it
/// (`fit x bits x share`, at most 2^64 bits) a finite number in `summary.json` and
/// `explore.json`, which would otherwise hold `null`.
pub const MAX_FIT_PER_BIT: f64 = 1e9;

/// A fault-injection campaign during training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CampaignSpec {
    /// Name, shown in summaries and reports: 1 to 200 characters, no control characters (a
    /// campaign an exploration runs names a directory: 1 to 100 of `A-Z a-z 0-9 _ . + -`).
    pub name: String,
    /// Whether faults strike training steps or inference on the test split.
    #[serde(default)]
    pub mode: Mode,
    /// Model definition (RON); a relative path is relative to the spec file's directory, so a
    /// campaign runs the same from any working directory (a Slurm job's, say).
    pub model: PathBuf,
    /// Hardware config (RON), relative as `model` is.
    pub hw: PathBuf,
    /// Training settings, as `faultline train` takes them.
    #[serde(default)]
    pub train: TrainSettings,
    /// Steps the golden (fault-free) run trains; every injection step plus the follow-up
    /// window must fit in it. Steps, 1..=16777216 (2^24).
    pub golden_steps: u64,
    /// Training steps (1-based) faults strike in; a trial picks one. For `Inference`: the
    /// test-split batches (1-based, in order of the split) whose forward pass faults strike.
    /// At least one step; the last plus `follow_up` at most `golden_steps`.
    pub inject_steps: Steps,
    /// Site classes to inject into: globs over the class patterns `faultline sites` prints,
    /// e.g. `mxu.pe[*][*].psum`, `mxu.*`, `ub.word[*]`. At least one.
    pub sites: Vec<String>,
    /// What one fault does.
    pub fault: FaultModel,
    /// How trials are drawn from the (bit, cycle) space.
    pub sampling: Sampling,
    /// Count (bit, cycle) pairs the program proves dead as hardware-masked without running them.
    #[serde(default = "yes")]
    pub skip_dead: bool,
    /// Run one in this many skipped trials anyway and check it is hardware-masked (0: none).
    /// Trials, any `u64`.
    #[serde(default = "verify_every")]
    pub verify_dead_every: u64,
    /// Steps trained after the injection step (functionally) before classifying: at least 1
    /// for `Training`; 0 (or absent) for `Inference`.
    #[serde(default)]
    pub follow_up: u64,
    /// Outcome thresholds.
    #[serde(default)]
    pub thresholds: Thresholds,
    /// Seed of trial sampling (training keeps its own `train.seed`); any `u64`.
    pub seed: u64,
    /// Raw failure rate per bit (FIT: failures per 10^9 device-hours), for reports: 0..=1e9,
    /// or `None`.
    #[serde(default)]
    pub fit_per_bit: Option<f64>,
    /// A protection plan (`configs/protect-*.ron`, relative as `model` is) the machine and
    /// the step run with ([`crate::protect`]); training campaigns only (`None` for
    /// `Inference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protection: Option<PathBuf>,
}

fn yes() -> bool {
    true
}

fn verify_every() -> u64 {
    50
}

/// What a campaign's faults strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Mode {
    /// Training steps: each trial is judged by what it does to training (He et al.'s outcomes).
    #[default]
    Training,
    /// Forward passes of the model trained for `golden_steps`, on batches of the test split:
    /// each trial is judged by the predictions it changes (`SdcBenign`, `SdcCritical`, `Due`).
    Inference,
}

/// Training settings of the golden run and every trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSettings {
    /// Minibatch size. Examples, 1..=16777216 (2^24).
    pub batch: usize,
    /// Optimizer: `sgd`, `momentum` or `adam`.
    pub optimizer: OptimizerKind,
    /// Learning rate: a positive finite number, or `None` for the optimizer's default (sgd
    /// 0.5, momentum 0.05, adam 0.01).
    pub lr: Option<f64>,
    /// MXU input format, `bf16` or `fp32` (`None`: the config's).
    pub precision: Option<MxuFormat>,
    /// Seed of initialisation, data split and batch order; any `u64`.
    pub seed: u64,
    /// Data directory as `faultline train --data` takes it, relative as `model` is (`None`:
    /// the shipped dataset).
    pub data: Option<PathBuf>,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings { batch: 32, optimizer: OptimizerKind::Sgd, lr: None, precision: None, seed: 1, data: None }
    }
}

/// Training steps, as a list or an inclusive range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Steps {
    /// These steps (1-based; order and repeats do not matter).
    List(Vec<u64>),
    /// `first..=last`.
    Range {
        /// First step (1-based).
        first: u64,
        /// Last step, at least `first`.
        last: u64,
    },
}

impl Steps {
    /// The first and last step (`None` for an empty list or a reversed range), found without
    /// listing a range: an unchecked range may span 2^64 steps.
    pub fn span(&self) -> Option<(u64, u64)> {
        match self {
            Steps::List(v) => Some((*v.iter().min()?, *v.iter().max()?)),
            Steps::Range { first, last } => (first <= last).then_some((*first, *last)),
        }
    }

    /// How many distinct steps there are, without listing a range.
    pub fn count(&self) -> u64 {
        match self {
            Steps::List(_) => self.steps().len() as u64,
            Steps::Range { first, last } => last.checked_sub(*first).map_or(0, |d| d.saturating_add(1)),
        }
    }

    /// The steps, ascending, without repeats. A range is listed in full: call it on a
    /// validated spec ([`CampaignSpec::validate`] bounds it by `golden_steps`).
    pub fn steps(&self) -> Vec<u64> {
        let mut v = match self {
            Steps::List(v) => v.clone(),
            Steps::Range { first, last } => (*first..=*last).collect(),
        };
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// What one injected fault does to its bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum FaultModel {
    /// A single-bit transient: the bit flips for one cycle.
    Flip,
    /// A multi-bit upset at one cycle: `bits` adjacent bits of one register or word
    /// (`along: Bits`), or the same bit of `bits` adjacent elements (PEs along a row, lanes,
    /// words; `along: Elements`).
    MultiBit {
        /// Bits flipped, 2..=32 (a single bit is `Flip`).
        bits: u32,
        /// Which neighbours.
        along: Along,
    },
    /// The bit held at `value`: every instruction that uses it while it is stuck sees it.
    StuckAt {
        /// The value the bit is held at: 0 or 1.
        value: u8,
        /// For how long.
        lasts: Lasts,
    },
}

/// How long a stuck-at lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Lasts {
    /// This many cycles (>= 1) from the sampled cycle.
    Cycles(u64),
    /// The whole injection step (no cycle is sampled).
    Step,
    /// From the injection step's first cycle on, through every later step of the window (a
    /// hard fault; no cycle is sampled).
    Permanent,
}

/// The neighbours a multi-bit upset spreads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Along {
    /// Adjacent bits of the same register or word.
    Bits,
    /// The same bit of adjacent elements.
    Elements,
}

/// How trials are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Sampling {
    /// Every (bit, cycle, step) of the selected classes (small spaces only).
    Exhaustive,
    /// `n` trials uniform over (bit, cycle, step) of the selected classes: the fraction of
    /// unmasked outcomes estimates their per-bit vulnerability without bias.
    Uniform {
        /// Trials, 1..=10000000.
        n: u64,
    },
    /// `per_class` uniform trials in each selected class; class estimates combine with each
    /// class's share of the space as its weight.
    Stratified {
        /// Trials per class, 1..=10000000.
        per_class: u64,
    },
    /// Rounds of trials over strata (each class's bit fields: sign, exponent and mantissa of a
    /// number format, else the high and low halves of the register), drawn only where a fault
    /// may be live (the provably dead rest counts as masked; with `skip_dead: false`,
    /// everywhere), the first giving each stratum `floor` trials, each later one `round`
    /// trials spread by Neyman allocation from the earlier rounds' estimates, until the
    /// combined failure rate's 95% interval is as narrow as `target` or `budget` trials have
    /// run. Strata combine by their share of the space, so the estimate is unbiased; rounds
    /// depend only on earlier records, so threads and `--resume` give the same trials; shards
    /// run it round by round, merged between rounds (`--after`).
    Adaptive {
        /// Half-width of the combined failure rate's 95% interval to stop at.
        target: Target,
        /// Most trials in all, 1..=10000000, at least `floor` per stratum.
        budget: u64,
        /// Trials per round after the first, 1..=budget.
        round: u64,
        /// Trials every stratum gets in the first round, 1..=10000.
        floor: u64,
    },
}

/// When an adaptive campaign has run enough.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Target {
    /// The interval's half-width, as a fraction: in (0, 0.5] (0.002: 0.2 percentage points).
    Absolute(f64),
    /// The half-width over the estimate: in (0, 1] (0.5: the rate to within half of itself).
    Relative(f64),
}

impl Target {
    /// Whether an interval `[lo, hi]` around `p` meets the target.
    pub fn met(self, p: f64, lo: f64, hi: f64) -> bool {
        let half = (hi - lo) / 2.0;
        match self {
            Target::Absolute(e) => half <= e,
            Target::Relative(r) => p > 0.0 && half <= r * p,
        }
    }
}

/// Parses RON text of any of this crate's files (campaigns, protection plans, explorations)
/// ([`faultline_hw::files::parse_ron`]); `file` names it in errors.
pub fn parse_ron<T: DeserializeOwned>(text: &str, file: &Path) -> Result<T> {
    Ok(files::parse_ron(text, file)?)
}

/// Reads a RON file of this crate ([`faultline_hw::files::read_ron`]).
pub fn read_ron<T: DeserializeOwned>(path: &Path) -> Result<T> {
    files::read_ron(path, FaultError::io(path))
}

/// Longest name that becomes a directory name ([`check_dir_name`]).
pub const MAX_DIR_NAME: usize = 100;

/// Checks that `name`, field `field` of `file`, can be one directory under an output
/// directory: 1 to [`MAX_DIR_NAME`] ASCII letters, digits and `_ . + -`, not `.` or `..`, so
/// that joining it to `--out` never leaves `--out` (no separator, no parent, not absolute)
/// and names the same directory on every file system.
pub fn check_dir_name(name: &str, file: &Path, field: &str) -> Result<()> {
    let token = name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b));
    if token && (1..=MAX_DIR_NAME).contains(&name.len()) && name != "." && name != ".." {
        return Ok(());
    }
    Err(FaultError::Invalid {
        file: file.into(),
        field: field.into(),
        value: format!("{name:?}"),
        allowed: format!(
            "a name that is one directory under --out: 1 to {MAX_DIR_NAME} of A-Z a-z 0-9 _ . + -, not \".\" or \"..\""
        ),
    })
}

/// A number as a spec would write it, for errors: plainly, or in exponent form when that is
/// shorter to read (`1e38`, not 39 digits).
pub(crate) fn num(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e16).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

/// `path` as written in the file `file`: relative paths are relative to its directory.
pub fn relative_to(file: &Path, path: &Path) -> PathBuf {
    match file.parent() {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_path_buf(),
    }
}

impl CampaignSpec {
    /// Reads and parses a spec file and checks the fields that need no model or machine.
    pub fn load(path: &Path) -> Result<CampaignSpec> {
        let spec: CampaignSpec = read_ron(path)?;
        spec.validate(path)?;
        Ok(spec)
    }

    /// Parses RON text; `file` names it in errors.
    pub fn from_ron(text: &str, file: &Path) -> Result<CampaignSpec> {
        let spec: CampaignSpec = parse_ron(text, file)?;
        spec.validate(file)?;
        Ok(spec)
    }

    /// `path` as written in the spec file `file`: relative paths are relative to its directory.
    pub fn resolve(&self, file: &Path, path: &Path) -> PathBuf {
        relative_to(file, path)
    }

    /// Value checks the types cannot express.
    pub fn validate(&self, file: &Path) -> Result<()> {
        let bad = |field: &str, value: String, allowed: &str| {
            Err(FaultError::Invalid { file: file.into(), field: field.into(), value, allowed: allowed.into() })
        };
        if self.name.is_empty() || self.name.chars().any(char::is_control) || self.name.len() > 200 {
            return bad("name", format!("{:?}", self.name), "1 to 200 characters, no control characters");
        }
        if !(1..=1 << 24).contains(&self.train.batch) {
            return bad("train.batch", self.train.batch.to_string(), "an integer in 1..=16777216");
        }
        if let Some(lr) = self.train.lr.filter(|lr| !(lr.is_finite() && *lr > 0.0)) {
            return bad("train.lr", lr.to_string(), "a positive finite number, or None for the optimizer's default");
        }
        if !(1..=MAX_STEPS).contains(&self.golden_steps) {
            return bad("golden_steps", self.golden_steps.to_string(), &format!("an integer in 1..={MAX_STEPS}"));
        }
        match self.mode {
            Mode::Training if self.follow_up == 0 => {
                return bad("follow_up", "0".into(), "at least 1 step (training outcomes are judged over it)")
            }
            Mode::Inference if self.follow_up != 0 => {
                return bad("follow_up", self.follow_up.to_string(), "0 or absent for an Inference campaign")
            }
            _ => {}
        }
        // Bounded by `golden_steps` before anything lists the steps.
        if let Steps::Range { first, last } = self.inject_steps {
            if first > last {
                return bad("inject_steps", format!("Range(first: {first}, last: {last})"), "first <= last");
            }
        }
        match self.inject_steps.span() {
            None => return bad("inject_steps", "[]".into(), "at least one step"),
            Some((0, _)) => return bad("inject_steps", "0".into(), "steps count from 1"),
            Some((_, last)) if last.saturating_add(self.follow_up) > self.golden_steps => {
                return bad(
                    "inject_steps",
                    last.to_string(),
                    &format!(
                        "steps whose follow-up ({} steps) ends within golden_steps ({}): at most {}",
                        self.follow_up,
                        self.golden_steps,
                        self.golden_steps.saturating_sub(self.follow_up)
                    ),
                )
            }
            _ => {}
        }
        if self.sites.is_empty() {
            return bad("sites", "[]".into(), "at least one site-class glob, e.g. \"mxu.pe[*][*].psum\"");
        }
        match self.fault {
            FaultModel::MultiBit { bits, .. } if !(2..=32).contains(&bits) => {
                return bad("fault.bits", bits.to_string(), "2..=32 (a single bit is `Flip`)")
            }
            FaultModel::StuckAt { value, .. } if value > 1 => return bad("fault.value", value.to_string(), "0 or 1"),
            FaultModel::StuckAt { lasts: Lasts::Cycles(0), .. } => {
                return bad("fault.lasts", "Cycles(0)".into(), "Cycles(n) with n >= 1, Step or Permanent")
            }
            _ => {}
        }
        match self.sampling {
            Sampling::Uniform { n } if !(1..=MAX_TRIALS).contains(&n) => {
                return bad("sampling.n", n.to_string(), &format!("1..={MAX_TRIALS} trials"))
            }
            Sampling::Stratified { per_class } if !(1..=MAX_TRIALS).contains(&per_class) => {
                return bad("sampling.per_class", per_class.to_string(), &format!("1..={MAX_TRIALS} trials"))
            }
            Sampling::Adaptive { target, budget, round, floor } => {
                if !(1..=MAX_TRIALS).contains(&budget) {
                    return bad("sampling.budget", budget.to_string(), &format!("1..={MAX_TRIALS} trials"));
                }
                if !(1..=budget).contains(&round) {
                    return bad("sampling.round", round.to_string(), &format!("1..={budget} trials (the budget)"));
                }
                if !(1..=10_000).contains(&floor) {
                    return bad("sampling.floor", floor.to_string(), "1..=10000 trials per stratum");
                }
                match target {
                    Target::Absolute(e) if !(e > 0.0 && e <= 0.5) => {
                        return bad(
                            "sampling.target",
                            format!("Absolute({})", num(e)),
                            "Absolute(e) with e in (0, 0.5]",
                        )
                    }
                    Target::Relative(r) if !(r > 0.0 && r <= 1.0) => {
                        return bad("sampling.target", format!("Relative({})", num(r)), "Relative(r) with r in (0, 1]")
                    }
                    _ => {}
                }
                if self.mode == Mode::Inference {
                    return bad(
                        "sampling",
                        "Adaptive".into(),
                        "Exhaustive, Uniform or Stratified for an Inference campaign",
                    );
                }
            }
            _ => {}
        }
        self.thresholds.validate(file)?;
        if self.protection.is_some() && self.mode == Mode::Inference {
            return bad(
                "protection",
                format!("{:?}", self.protection),
                "None for an Inference campaign (plans guard training steps)",
            );
        }
        if let Some(fit) = self.fit_per_bit.filter(|f| !(0.0..=MAX_FIT_PER_BIT).contains(f)) {
            return bad("fit_per_bit", num(fit), "a number in [0, 1e9] (FIT per bit), or None");
        }
        Ok(())
    }
}
