//! The campaign's files, and the one place their schema lives:
//! * `campaign.json` ([`CampaignInfo`]): the spec, the sampled space, the golden run;
//! * `records.jsonl` ([`TrialRecord`]): one line per trial, in trial order, each carrying the
//!   identity of the campaign that wrote it ([`CampaignInfo::identity`]), so that records of
//!   another campaign (another seed, spec, machine or plan) are refused wherever they are read;
//! * `summary.json` ([`Summary`]): outcome counts per class with Wilson 95% intervals and the
//!   vulnerability estimates, computed from the two files above alone, so a merge of shards
//!   writes the same bytes as one run;
//! * `timing.jsonl`: wall time per trial (kept apart: it differs from run to run).
//!
//! Floats that can be non-finite (losses and loss deltas, a faulted instruction's errors, a
//! protection plan's thresholds and bounds) are written as the strings `"NaN"`, `"Infinity"`
//! and `"-Infinity"`, finite ones as plain numbers ([`faultline_num::json`]); the `null` older
//! files hold there reads as NaN.

use crate::outcome::Outcome;
use crate::spec::{CampaignSpec, Sampling};
use crate::stats::{stratified, Estimate};
use faultline_graph::Phase;
use faultline_hw::fault::SiteKind;
use faultline_train::InjectionReport;
use serde::{Deserialize, Serialize};

/// Version of the record and summary schema; bumped on any change to their fields.
pub const SCHEMA: u32 = 3;

/// Most bits in one element of a class (masks of a word's bits are `u128`).
pub const MAX_CLASS_WIDTH: u32 = 128;

/// Most elements in one class: the largest DRAM a config may have, in bytes.
pub const MAX_CLASS_ELEMENTS: u64 = 1 << 33;

/// Most classes in one campaign (reports index them with `u16`).
pub const MAX_CLASSES: usize = u16::MAX as usize;

/// The code version recorded in `campaign.json`: the crate version and the commit it was
/// built from.
pub const CODE_VERSION: &str =
    concat!("faultline ", env!("CARGO_PKG_VERSION"), " (git ", env!("FAULTLINE_COMMIT"), ")");

/// One selected class in `campaign.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassInfo {
    /// Class pattern, e.g. `mxu.pe[*][*].psum`.
    pub class: String,
    /// Bits in the class.
    pub bits: u64,
    /// Bits per element.
    pub width: u32,
    /// Unit (`mxu`, `vpu`, `ub`, `acc`, `wbuf`, `dram`, `seq`, `dma`).
    pub unit: String,
    /// Register within the unit (`psum`, `a`, `word`, ...).
    pub register: String,
    /// Flip-flop or SRAM cell (FIT rates differ per kind).
    pub kind: SiteKind,
    /// Extent of the element indices (PE rows x columns; words or lanes x 1).
    pub dims: [u32; 2],
    /// Number format of the values (`bf16`, `fp32`, `int8`, `int32`), absent for strobes,
    /// counters and addresses: how a bit position reads (sign, exponent, mantissa).
    pub format: Option<String>,
    /// Its share of the sampled space (bits over all selected bits).
    pub weight: f64,
    /// (bit, cycle) pairs of one step that may be live; the rest are provably dead.
    pub live_bit_cycles: u128,
    /// Under `Adaptive`: the share of the class's faults its trials are drawn from, those
    /// whose upset may be live; the rest are provably dead and count as masked, so the class's
    /// rates are this share of its trials' rates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_share: Option<f64>,
}

/// The fault-free run trials are compared with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Golden {
    /// Test accuracy after the last step.
    pub test_accuracy: f64,
    /// Loss of every step, 1-based step `s` at index `s - 1`.
    #[serde(with = "faultline_num::json")]
    pub losses: Vec<f64>,
    /// Test accuracy at the end of each injection step's follow-up window: `(step, accuracy)`.
    pub window_accuracy: Vec<(u64, f64)>,
    /// Training-state checksum after the last step (identifies the run).
    pub final_checksum: String,
}

/// `campaign.json`: what was run, identical for every shard of a campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CampaignInfo {
    /// Schema version.
    pub schema: u32,
    /// The spec as parsed (defaults filled in).
    pub spec: CampaignSpec,
    /// The spec file, absolute (its relative paths are relative to its directory): what
    /// `faultline vcd` reloads to replay a trial.
    pub spec_file: String,
    /// The code that ran the campaign: crate version and git commit ([`CODE_VERSION`]).
    pub code: String,
    /// Machine config name.
    pub hw: String,
    /// Cycles of one training step.
    pub cycles_per_step: u64,
    /// Instructions of one training step.
    pub instructions_per_step: usize,
    /// Trials the plan runs.
    pub trials: u64,
    /// The selected classes.
    pub classes: Vec<ClassInfo>,
    /// The golden run.
    pub golden: Golden,
    /// The protection plan the campaign ran with, applied and calibrated (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protection: Option<crate::protect::Applied>,
    /// Where the trials' faults come from when they are not drawn from this campaign's space
    /// ([`crate::Campaign::with_faults`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults_from: Option<String>,
}

impl CampaignInfo {
    /// The campaign's identity: the first 16 hex digits of the SHA-256 of `campaign.json`
    /// without `code` and `spec_file`, i.e. of everything that decides what the records hold
    /// (spec, machine, sampled space, golden run, protection), and nothing that does not (the
    /// commit that ran it, where its spec file lies). Every record carries it.
    pub fn identity(&self) -> String {
        use sha2::{Digest, Sha256};
        let what = CampaignInfo { code: String::new(), spec_file: String::new(), ..self.clone() };
        let digest = Sha256::digest(serde_json::to_vec(&what).expect("campaign files serialise"));
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Checks every size a reader allocates by (trials, classes, each class's width and
    /// extent) against what a campaign can have, so a hand-edited file is refused, never
    /// allocated: the reason, naming the field.
    pub fn check_sizes(&self) -> std::result::Result<(), String> {
        use crate::spec::MAX_TRIALS;
        use faultline_hw::config::MAX_ARRAY_DIM;
        if self.trials > MAX_TRIALS {
            return Err(format!("`trials` = {}: more than a campaign may have ({MAX_TRIALS})", self.trials));
        }
        if self.classes.is_empty() || self.classes.len() > MAX_CLASSES {
            return Err(format!("`classes` has {} entries: allowed 1 to {MAX_CLASSES}", self.classes.len()));
        }
        for (i, c) in self.classes.iter().enumerate() {
            let bad = |field: &str, value: String, allowed: String| {
                Err(format!("`classes[{i}].{field}` = {value} (class `{}`): allowed {allowed}", c.class))
            };
            if !(1..=MAX_CLASS_WIDTH).contains(&c.width) {
                return bad("width", c.width.to_string(), format!("1 to {MAX_CLASS_WIDTH} bits"));
            }
            let [rows, cols] = c.dims.map(u64::from);
            let elements = rows * cols;
            if rows == 0 || cols == 0 || elements > MAX_CLASS_ELEMENTS {
                return bad("dims", format!("{:?}", c.dims), format!("1 to {MAX_CLASS_ELEMENTS} elements in all"));
            }
            if cols > 1 && (rows > MAX_ARRAY_DIM as u64 || cols > MAX_ARRAY_DIM as u64) {
                return bad(
                    "dims",
                    format!("{:?}", c.dims),
                    format!("a PE array of at most {MAX_ARRAY_DIM}x{MAX_ARRAY_DIM}"),
                );
            }
            if c.bits != elements * u64::from(c.width) {
                return bad("bits", c.bits.to_string(), format!("dims x width = {}", elements * u64::from(c.width)));
            }
            if !(c.weight.is_finite() && (0.0..=1.0).contains(&c.weight)) {
                return bad("weight", c.weight.to_string(), "0 to 1".into());
            }
        }
        Ok(())
    }
}

/// One trial: the fault, where it landed, what it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// Schema version.
    pub schema: u32,
    /// The identity of the campaign that ran it ([`CampaignInfo::identity`]): readers refuse a
    /// record whose identity is not that of the `campaign.json` beside it.
    pub campaign: String,
    /// Trial id (its sample is a function of the campaign seed and this).
    pub trial: u64,
    /// The fault: every bit struck, `KIND:SITE@step=S,cycle=C`, `+`-joined.
    pub fault: String,
    /// Its class pattern.
    pub class: String,
    /// Flip, stuck-at or multi-bit, as the spec's fault model names it.
    pub model: String,
    /// The anchor bit (within the element's register or word).
    pub bit: u32,
    /// The anchor element (PE, lane, word) as `faultline sites` numbers them.
    pub element: u64,
    /// Training step (inference: test batch).
    pub step: u64,
    /// Cycle within the step.
    pub cycle: u64,
    /// Provably dead and not run (counted as `HwMasked`).
    pub skipped: bool,
    /// Provably dead, run anyway to check that it is masked.
    pub verified_dead: bool,
    /// What it did to training.
    pub outcome: Outcome,
    /// Where it landed and what it did to the faulted instruction's outputs (absent when
    /// skipped).
    pub injection: Option<InjectionRecord>,
    /// Loss minus golden loss, from the injection step through the follow-up window (empty
    /// when the state after the injection step equals golden; stops at a non-finite loss,
    /// whose delta is `"NaN"`, `"Infinity"` or `"-Infinity"`).
    #[serde(with = "faultline_num::json")]
    pub loss_delta: Vec<f64>,
    /// Test accuracy minus golden at the end of the window (absent unless the window ran to
    /// its end).
    pub test_accuracy_delta: Option<f64>,
    /// Cycles of the faulted instructions, run at register level (0 for memory and sequencer
    /// faults, whose effect is computed from the schedule).
    pub register_level_cycles: u64,
    /// Inference: samples of the batch whose top-1 prediction changed.
    pub changed_predictions: Option<u64>,
    /// With a protection plan: the check or code that caught the fault (`fc1.matmul.abft`,
    /// `loss`, `ecc:ub.word[*]`), absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected_by: Option<String>,
}

/// Where a trial's fault landed and what it did to the instruction it hit: the record's copy
/// of [`InjectionReport`], so that the file format changes only here, never with `train`'s
/// types. Fields, order and number formats are those records have always had.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InjectionRecord {
    /// The fault, in its text form (`KIND:SITE@step=S,cycle=C`).
    pub fault: String,
    /// Index of the instruction reported on, in the step's program.
    pub instr: u64,
    /// That instruction's name (`gemm`, or the VPU op).
    pub op: String,
    /// The graph node it computes (part of), with `(tile k/n)` for a tile of a cut instruction.
    pub node: String,
    /// The node's phase.
    pub phase: PhaseRecord,
    /// The node's layer.
    pub layer: String,
    /// Whether the faulted site's unit was running that instruction.
    pub unit_busy: bool,
    /// The fold (GEMM) or vector (VPU) the fault starts in, or the first that reads a changed
    /// memory word or whose loop a sequencer fault changes.
    pub tile: Option<u64>,
    /// Cycle from that tile's origin.
    pub tile_cycle: Option<u64>,
    /// Output words of the instruction (for a memory fault: word reads).
    pub elements: u64,
    /// Of which differ from the fault-free run (0: masked inside the hardware).
    pub corrupted: u64,
    /// Largest absolute error among them (`"Infinity"` where a value is not finite).
    #[serde(with = "faultline_num::json")]
    pub max_abs_error: f64,
    /// Largest relative error among them (`"Infinity"` against a golden 0).
    #[serde(with = "faultline_num::json")]
    pub max_rel_error: f64,
    /// The buffer (tensor) the instruction writes.
    pub buffer: String,
}

impl InjectionRecord {
    /// The fault never left the hardware.
    pub fn masked(&self) -> bool {
        self.corrupted == 0
    }
}

impl From<InjectionReport> for InjectionRecord {
    fn from(r: InjectionReport) -> InjectionRecord {
        // Counts and indices are `usize` in memory, `u64` in the file (the same JSON).
        let n = |v: usize| v as u64;
        InjectionRecord {
            fault: r.fault,
            instr: n(r.instr),
            op: r.op,
            node: r.node,
            phase: r.phase.into(),
            layer: r.layer,
            unit_busy: r.unit_busy,
            tile: r.tile.map(n),
            tile_cycle: r.tile_cycle,
            elements: n(r.elements),
            corrupted: n(r.corrupted),
            max_abs_error: r.max_abs_error,
            max_rel_error: r.max_rel_error,
            buffer: r.buffer,
        }
    }
}

/// The training phase of the node a fault landed in, as records spell it (`"Forward"`,
/// `"Backward"`, `"Update"`): the record's copy of [`Phase`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PhaseRecord {
    /// Placeholders, the model's forward pass and the loss.
    Forward,
    /// Gradients, including the loss gradient.
    Backward,
    /// Optimizer updates of parameters and optimizer state.
    Update,
}

impl PhaseRecord {
    /// All phases in execution order.
    pub const ALL: [PhaseRecord; 3] = [PhaseRecord::Forward, PhaseRecord::Backward, PhaseRecord::Update];

    /// Lower-case name used in reports: `forward`, `backward`, `update`.
    pub const fn name(self) -> &'static str {
        match self {
            PhaseRecord::Forward => "forward",
            PhaseRecord::Backward => "backward",
            PhaseRecord::Update => "update",
        }
    }
}

impl From<Phase> for PhaseRecord {
    fn from(p: Phase) -> PhaseRecord {
        match p {
            Phase::Forward => PhaseRecord::Forward,
            Phase::Backward => PhaseRecord::Backward,
            Phase::Update => PhaseRecord::Update,
        }
    }
}

/// The fields of a record the summary needs (the rest of a line, floats included, is not
/// decoded).
#[derive(Debug, Clone, Deserialize)]
pub struct RecordKey {
    /// Trial id.
    pub trial: u64,
    /// Class pattern.
    pub class: String,
    /// Anchor bit.
    pub bit: u32,
    /// Skipped as dead.
    pub skipped: bool,
    /// Dead, and run to check.
    pub verified_dead: bool,
    /// Outcome.
    pub outcome: Outcome,
}

/// Count and fraction of one outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutcomeShare {
    /// The outcome.
    pub outcome: Outcome,
    /// Its share of the trials, with the 95% interval.
    pub share: Estimate,
}

/// Vulnerability of one bit position of a class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BitSummary {
    /// Bit within the register or word.
    pub bit: u32,
    /// Trials anchored there that changed the training state.
    pub unmasked: Estimate,
}

/// One class's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassSummary {
    /// Class pattern.
    pub class: String,
    /// Bits in the class.
    pub bits: u64,
    /// Its weight in combined estimates.
    pub weight: f64,
    /// Trials in it.
    pub trials: u64,
    /// Trials skipped as provably dead.
    pub skipped_dead: u64,
    /// Each outcome's share (every outcome listed, in [`Outcome::ALL`] order; protection's
    /// only with a protection plan).
    pub outcomes: Vec<OutcomeShare>,
    /// Vulnerability (AVF) of the class: the share of trials that changed the training state
    /// (under `Adaptive`, its bit fields' shares weighted by their bits; `k` and `n` stay the
    /// counts).
    pub unmasked: Estimate,
    /// Share of trials in which training failed (non-finite or degraded), weighted as
    /// `unmasked` is.
    pub failure: Estimate,
    /// `fit_per_bit x bits x failure share`: the class's contribution to the training-failure
    /// rate, when the spec gives a raw FIT per bit.
    pub failure_fit: Option<f64>,
    /// Vulnerability per bit position.
    pub per_bit: Vec<BitSummary>,
}

/// A combined estimate over classes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Combined {
    /// `pooled` (uniform or exhaustive sampling: the classes' trials pooled), `stratified`
    /// (class estimates weighted by their share of the space) or `adaptive` (every class's
    /// bit-field estimates weighted by their share).
    pub method: String,
    /// The estimate.
    pub p: f64,
    /// Lower end of the 95% interval.
    pub lo: f64,
    /// Upper end of the 95% interval.
    pub hi: f64,
}

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Schema version.
    pub schema: u32,
    /// Campaign name.
    pub campaign: String,
    /// Trials recorded.
    pub trials: u64,
    /// Of which simulated (not skipped).
    pub simulated: u64,
    /// Skipped as provably dead (counted `HwMasked`).
    pub skipped_dead: u64,
    /// Dead trials run anyway, every one found `HwMasked`.
    pub verified_dead: u64,
    /// Each outcome's share over all trials (pooled).
    pub outcomes: Vec<OutcomeShare>,
    /// Vulnerability of the selected classes together.
    pub unmasked: Combined,
    /// Training-failure share of the selected classes together.
    pub failure: Combined,
    /// Per class.
    pub classes: Vec<ClassSummary>,
}

/// The summary of `records` (any order) of the campaign `info`. One pass over the records
/// (a report aggregates millions, streamed); a record of a class the campaign lacks is not
/// counted.
pub fn summarize<K: std::borrow::Borrow<RecordKey>>(
    info: &CampaignInfo,
    records: impl IntoIterator<Item = K>,
) -> Summary {
    use std::collections::HashMap;
    const N: usize = Outcome::ALL.len();
    /// Counts of one class: per outcome, skipped, and (unmasked, failed, trials) per bit.
    #[derive(Clone)]
    struct Tally {
        outcomes: [u64; N],
        skipped: u64,
        bits: Vec<(u64, u64, u64)>,
    }
    let index: HashMap<&str, usize> = info.classes.iter().enumerate().map(|(i, c)| (c.class.as_str(), i)).collect();
    let mut tallies: Vec<Tally> = info
        .classes
        .iter()
        .map(|c| Tally { outcomes: [0; N], skipped: 0, bits: vec![(0, 0, 0); c.width as usize] })
        .collect();
    let (mut all, mut verified) = (Tally { outcomes: [0; N], skipped: 0, bits: Vec::new() }, 0u64);
    for r in records {
        let r = r.borrow();
        let o = r.outcome.index();
        all.outcomes[o] += 1;
        all.skipped += r.skipped as u64;
        verified += r.verified_dead as u64;
        let Some(t) = index.get(r.class.as_str()).map(|&i| &mut tallies[i]) else { continue };
        t.outcomes[o] += 1;
        t.skipped += r.skipped as u64;
        if let Some(b) = t.bits.get_mut(r.bit as usize) {
            b.0 += r.outcome.unmasked() as u64;
            b.1 += r.outcome.failure() as u64;
            b.2 += 1;
        }
    }
    let total = |t: &Tally| t.outcomes.iter().sum::<u64>();
    // Protection's outcomes are listed only by a protected campaign (others cannot record them).
    let protected = info.protection.is_some();
    let shares = |t: &Tally| -> Vec<OutcomeShare> {
        Outcome::ALL
            .iter()
            .filter(|o| protected || !o.protection_only())
            .map(|&o| OutcomeShare { outcome: o, share: Estimate::of(t.outcomes[o.index()], total(t)) })
            .collect()
    };
    let count = |t: &Tally, f: fn(Outcome) -> bool| {
        Estimate::of(Outcome::ALL.iter().filter(|&&o| f(o)).map(|o| t.outcomes[o.index()]).sum(), total(t))
    };
    // Under Adaptive, a class's bit fields were sampled unequally: its rates and the combined
    // ones weight the fields by their bits.
    let adaptive = matches!(info.spec.sampling, Sampling::Adaptive { .. });
    let classes: Vec<ClassSummary> = info
        .classes
        .iter()
        .zip(&tallies)
        .map(|(c, t)| {
            let (mut failure, mut unmasked) = (count(t, Outcome::failure), count(t, Outcome::unmasked));
            if adaptive {
                failure = of_class(&by_fields(c, t.bits.as_slice(), failure, |b| b.1));
                unmasked = of_class(&by_fields(c, t.bits.as_slice(), unmasked, |b| b.0));
            }
            let per_bit = (0..c.width)
                .zip(&t.bits)
                .filter(|(_, &(_, _, n))| n > 0)
                .map(|(bit, &(u, _, n))| BitSummary { bit, unmasked: Estimate::of(u, n) })
                .collect();
            ClassSummary {
                class: c.class.clone(),
                bits: c.bits,
                weight: c.weight,
                trials: total(t),
                skipped_dead: t.skipped,
                outcomes: shares(t),
                unmasked,
                failure,
                failure_fit: info.spec.fit_per_bit.map(|fit| fit * c.bits as f64 * failure.p),
                per_bit,
            }
        })
        .collect();
    let fielded = |f: fn(&(u64, u64, u64)) -> u64, o: fn(Outcome) -> bool| -> Vec<(f64, Estimate)> {
        (info.classes.iter().zip(&tallies))
            .flat_map(|(c, t)| by_fields(c, &t.bits, count(t, o), f).into_iter().map(move |(w, e)| (c.weight * w, e)))
            .collect()
    };
    let combine = |f: fn(&ClassSummary) -> Estimate, pooled: Estimate| match info.spec.sampling {
        Sampling::Stratified { .. } => {
            let strata: Vec<(f64, Estimate)> = classes.iter().map(|c| (c.weight, f(c))).collect();
            let (p, lo, hi) = stratified(&strata);
            Combined { method: "stratified".into(), p, lo, hi }
        }
        _ => Combined { method: "pooled".into(), p: pooled.p, lo: pooled.lo, hi: pooled.hi },
    };
    let combine_fields = |f: fn(&(u64, u64, u64)) -> u64, o: fn(Outcome) -> bool| {
        let (p, lo, hi) = stratified(&fielded(f, o));
        Combined { method: "adaptive".into(), p, lo, hi }
    };
    let n = total(&all);
    Summary {
        schema: SCHEMA,
        campaign: info.spec.name.clone(),
        trials: n,
        simulated: n - all.skipped,
        skipped_dead: all.skipped,
        verified_dead: verified,
        outcomes: shares(&all),
        unmasked: if adaptive {
            combine_fields(|b| b.0, Outcome::unmasked)
        } else {
            combine(|c| c.unmasked, count(&all, Outcome::unmasked))
        },
        failure: if adaptive {
            combine_fields(|b| b.1, Outcome::failure)
        } else {
            combine(|c| c.failure, count(&all, Outcome::failure))
        },
        classes,
    }
}

/// A class's estimate from its fields' weights and estimates ([`by_fields`]): their
/// stratified estimate, with the trials and hits of them all.
fn of_class(parts: &[(f64, Estimate)]) -> Estimate {
    let (p, lo, hi) = stratified(parts);
    let (k, n) = parts.iter().fold((0, 0), |(k, n), (_, e)| (k + e.k, n + e.n));
    Estimate { k, n, p, lo, hi }
}

/// The strata of class `c` under `Adaptive` from its per-bit `(unmasked, failed, trials)`
/// counts `bits`, the `k` of each bit being `f` of its counts: the class's bit fields
/// ([`crate::sample::strata_fields`]), each weighted by its bits'
/// share of the class times the share of the class its trials sample (the rest is provably
/// dead), with its estimate. `whole` (the class's pooled estimate) stands for a one-field
/// class, whose trials need no per-bit counts.
fn by_fields(
    c: &ClassInfo,
    bits: &[(u64, u64, u64)],
    whole: Estimate,
    f: fn(&(u64, u64, u64)) -> u64,
) -> Vec<(f64, Estimate)> {
    let share = c.sampled_share.unwrap_or(1.0);
    let fields = crate::sample::strata_fields(c.format.as_deref(), c.width, c.class.ends_with(".check"));
    let parts: Vec<(f64, Estimate)> = (fields.iter())
        .map(|(_, pos)| {
            let (k, n) = pos.iter().filter_map(|&b| bits.get(b as usize)).fold((0, 0), |(k, n), x| (k + f(x), n + x.2));
            (share * pos.len() as f64 / c.width as f64, Estimate::of(k, n))
        })
        .collect();
    // A code's check bits are recorded past the data bits, outside `bits`: one field, pooled.
    if fields.len() == 1 || parts.iter().all(|(_, e)| e.n == 0) {
        return vec![(share, whole)];
    }
    parts
}
