//! Reading a campaign's trace directory (`campaign.json`, `records.jsonl`) into compact
//! per-trial rows. Only the fields a report uses are decoded; a loss curve is decoded only for
//! the few trials a report draws.

use crate::error::{ReportError, Result};
use faultline_fault::record::{CampaignInfo, PhaseRecord, RecordKey};
use faultline_fault::store::InfoFile;
use faultline_fault::Outcome;
use faultline_hw::budget::HostMemory;
use faultline_hw::files::JsonLines;
use faultline_num::json::Spelled;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Faulty loss curves kept per outcome for the curves figure.
pub const CURVES_PER_OUTCOME: usize = 5;

/// One trial, as a report needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// Trial id.
    pub trial: u64,
    /// Index into [`CampaignInfo::classes`].
    pub class: u16,
    /// Anchor bit within the register or word.
    pub bit: u32,
    /// Anchor element (PE `row * cols + col`, lane, word).
    pub element: u64,
    /// Training step (inference: test batch).
    pub step: u64,
    /// Cycle within the step.
    pub cycle: u64,
    /// Provably dead, not simulated.
    pub skipped: bool,
    /// Provably dead, simulated anyway to check it is masked.
    pub verified_dead: bool,
    /// Outcome.
    pub outcome: Outcome,
    /// Where the fault landed, for simulated trials.
    pub landed: Option<Landed>,
    /// Test accuracy minus golden at the end of the follow-up window.
    pub test_accuracy_delta: Option<f64>,
}

/// The instruction a simulated trial's fault landed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    /// Training phase of the instruction's graph node.
    pub phase: PhaseRecord,
    /// Index into [`Trace::layers`].
    pub layer: u16,
    /// Index into [`Trace::ops`] (the instruction kind: `gemm` or the VPU op).
    pub op: u16,
    /// Output words the fault corrupted (0: masked inside the hardware).
    pub corrupted: u64,
}

/// A faulty loss curve: loss minus golden from the injection step on.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Trial id.
    pub trial: u64,
    /// Injection step (the first delta's step).
    pub step: u64,
    /// Its outcome.
    pub outcome: Outcome,
    /// Loss minus golden loss per step, NaN or infinite as recorded (a `null` of an older
    /// record reads as NaN).
    pub loss_delta: Vec<f64>,
}

/// A loaded trace directory.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The directory.
    pub dir: PathBuf,
    /// `campaign.json`.
    pub info: CampaignInfo,
    /// Every recorded trial, in file order.
    pub trials: Vec<Trial>,
    /// Layer names [`Landed::layer`] indexes.
    pub layers: Vec<String>,
    /// Instruction kinds [`Landed::op`] indexes.
    pub ops: Vec<String>,
    /// The first [`CURVES_PER_OUTCOME`] unmasked trials of each outcome with a loss curve.
    pub curves: Vec<Curve>,
    /// A half-written last line was ignored (the campaign is running or was killed).
    pub partial_last_line: bool,
}

impl Trace {
    /// The fields of each trial that `faultline_fault::record::summarize` reads.
    pub fn keys(&self) -> impl Iterator<Item = RecordKey> + '_ {
        self.trials.iter().map(|t| RecordKey {
            trial: t.trial,
            class: self.info.classes[t.class as usize].class.clone(),
            bit: t.bit,
            skipped: t.skipped,
            verified_dead: t.verified_dead,
            outcome: t.outcome,
        })
    }
}

/// The decoded part of a `records.jsonl` line (unknown fields are skipped).
#[derive(Deserialize)]
struct Line<'a> {
    schema: u32,
    #[serde(borrow)]
    campaign: Cow<'a, str>,
    trial: u64,
    #[serde(borrow)]
    class: Cow<'a, str>,
    bit: u32,
    element: u64,
    step: u64,
    cycle: u64,
    skipped: bool,
    verified_dead: bool,
    outcome: Outcome,
    #[serde(borrow)]
    injection: Option<InjectionLine<'a>>,
    #[serde(borrow)]
    loss_delta: &'a RawValue,
    test_accuracy_delta: Option<f64>,
}

/// The decoded part of a record's injection ([`faultline_fault::record::InjectionRecord`]).
#[derive(Deserialize)]
struct InjectionLine<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    phase: PhaseRecord,
    #[serde(borrow)]
    layer: Cow<'a, str>,
    corrupted: u64,
}

/// Index of `name` in `names`, appending it if new; `None` once `u16` indices run out (no
/// real step has that many layers or instruction kinds: a hand-made file).
fn intern(names: &mut Vec<String>, index: &mut HashMap<String, u16>, name: &str) -> Option<u16> {
    if let Some(&i) = index.get(name) {
        return Some(i);
    }
    let i = u16::try_from(names.len()).ok()?;
    names.push(name.to_string());
    index.insert(name.to_string(), i);
    Some(i)
}

/// Reads `campaign.json` ([`faultline_fault::store::read_info`]: capped, of this schema, its
/// sizes bounded).
pub fn read_info(dir: &Path) -> Result<CampaignInfo> {
    Ok(faultline_fault::store::read_info(dir)?.info)
}

/// Host bytes a report of `info` holds while it is built: a row per trial, each class's
/// per-bit and per-PE tallies (`None` past 2^64).
pub fn host_bytes(info: &CampaignInfo) -> Option<u64> {
    use faultline_hw::budget::{product, sum};
    // A row, its `seen` flag, and room for the aggregation's per-trial work.
    let per_trial = std::mem::size_of::<Trial>() as u64 + 1 + 16;
    let classes: Vec<Option<u64>> = info
        .classes
        .iter()
        .map(|c| {
            let cells = if c.dims[1] > 1 { product(&[c.dims[0] as usize, c.dims[1] as usize]) } else { Some(0) };
            sum(&[cells?.checked_mul(64), Some(u64::from(c.width) * 64 + 256)])
        })
        .collect();
    sum(&[info.trials.checked_mul(per_trial), sum(&classes)])
}

/// Loads trace directory `dir`, refusing records of another campaign and, before reading
/// them, a campaign whose report would need more host memory than `mem` allows;
/// `progress(bytes_read, total_bytes)` is called as it goes.
pub fn load(dir: &Path, mem: &HostMemory, mut progress: impl FnMut(u64, u64)) -> Result<Trace> {
    let InfoFile { info, id, .. } = faultline_fault::store::read_info(dir)?;
    mem.check(&format!("a report of the {} trials of campaign `{}`", info.trials, info.spec.name), host_bytes(&info))?;
    let path = dir.join("records.jsonl");
    let mut lines = JsonLines::open(&path).map_err(ReportError::io(&path))?;
    let total = lines.total;
    let class_index: HashMap<&str, u16> =
        info.classes.iter().enumerate().map(|(i, c)| (c.class.as_str(), i as u16)).collect();
    let (mut layers, mut layer_index, mut ops, mut op_index) = (Vec::new(), HashMap::new(), Vec::new(), HashMap::new());
    let mut seen = vec![false; info.trials as usize];
    let (mut trials, mut curves) = (Vec::new(), Vec::new());
    let mut curves_of = [0usize; Outcome::ALL.len()];
    let mut partial = false;
    while let Some(line) = lines.next_line().map_err(ReportError::io(&path))? {
        let n = line.number;
        if n.is_multiple_of(65536) {
            progress(line.end, total);
        }
        let bad = |why: String| ReportError::Trace { path: path.clone(), line: Some(n), why };
        // The campaign appends whole lines; a cut last line is a run in progress or killed.
        if !line.complete {
            partial = true;
            break;
        }
        let l: Line = serde_json::from_str(line.text).map_err(|e| bad(format!("not a trial record: {e}")))?;
        if l.schema != info.schema {
            return Err(bad(format!(
                "schema {}, but campaign.json is schema {}: records of different versions mixed",
                l.schema, info.schema
            )));
        }
        faultline_fault::store::check_identity(&path, n, &l.campaign, &id)?;
        let class = *class_index
            .get(l.class.as_ref())
            .ok_or_else(|| bad(format!("class `{}` is not one of the campaign's classes", l.class)))?;
        match seen.get_mut(l.trial as usize) {
            None => return Err(bad(format!("trial {} is past the campaign's {} trials", l.trial, info.trials))),
            Some(true) => return Err(bad(format!("trial {} is recorded twice", l.trial))),
            Some(s) => *s = true,
        }
        let too_many = |what: &str| bad(format!("more than {} distinct {what} names", u16::MAX));
        let landed = match l.injection {
            Some(j) => Some(Landed {
                phase: j.phase,
                layer: intern(&mut layers, &mut layer_index, &j.layer).ok_or_else(|| too_many("layer"))?,
                op: intern(&mut ops, &mut op_index, &j.op).ok_or_else(|| too_many("instruction"))?,
                corrupted: j.corrupted,
            }),
            None => None,
        };
        let o = l.outcome.index();
        if l.outcome.unmasked() && curves_of[o] < CURVES_PER_OUTCOME && l.loss_delta.get() != "[]" {
            let loss_delta = serde_json::from_str::<Spelled<Vec<f64>>>(l.loss_delta.get())
                .map_err(|e| bad(format!("loss_delta is not a list of numbers: {e}")))?
                .0;
            curves_of[o] += 1;
            curves.push(Curve { trial: l.trial, step: l.step, outcome: l.outcome, loss_delta });
        }
        trials.push(Trial {
            trial: l.trial,
            class,
            bit: l.bit,
            element: l.element,
            step: l.step,
            cycle: l.cycle,
            skipped: l.skipped,
            verified_dead: l.verified_dead,
            outcome: l.outcome,
            landed,
            test_accuracy_delta: l.test_accuracy_delta,
        });
    }
    progress(total, total);
    Ok(Trace { dir: dir.to_path_buf(), info, trials, layers, ops, curves, partial_last_line: partial })
}
