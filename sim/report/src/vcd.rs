//! `faultline vcd`: one trial of a recorded campaign replayed at cycle level and written as a
//! VCD waveform (GTKWave, Surfer), golden and faulty side by side.
//!
//! # How a trial is replayed
//!
//! The replay reads `campaign.json` and the trial's line of `records.jsonl`, reloads the
//! campaign's spec (`spec_file`; it must still equal the spec `campaign.json` records) and runs
//! its golden run again, whose final checksum must equal the recorded one (same model, machine,
//! data and arithmetic), and draws the trial's fault again (its text must equal the record's).
//! The fault is resolved on the injection step's program as the campaign resolved it
//! ([`inject::resolve_upset`]), and the instruction the record reports on gets its operands
//! from a fault-free run of the step up to it ([`Trainer::buffers_before`]): the golden run's
//! state before the step and the step's batch. That instruction is then stepped at cycle level
//! twice, fault-free and with the fault, in lockstep (one state of each per cycle; no history
//! is kept beyond the signals written). The replay checks itself: the fault-free run must equal
//! the functional model bit for bit, the faulty one the executor's own injected run of the
//! instruction, and its count of corrupted output words the record's.
//!
//! A memory-word fault (unified buffer, accumulators, weight buffer, DRAM) is not stepped:
//! [`memory`] finds the element living in the word and the reads that see the change, and
//! the word's golden and faulty values follow from the buffers before its first reader.
//! Sequencer and DMA address-register faults act on a whole fold loop or transfer and are not
//! replayed (an error says so).
//!
//! # What the file holds
//!
//! * `golden.*` and `faulty.*`: the same hierarchy twice, e.g. `golden.mxu.pe_3_5.psum` and
//!   `faulty.mxu.pe_3_5.psum`. A PE register fault shows every register of the PEs in the
//!   faulted PE's row and column, a lane fault the lane's registers, a memory-word fault the
//!   word (`golden.ub.word_0x1f40`, `x` before the fault: which buffer element lived there
//!   earlier is not tracked). `--sites` adds registers of the same unit.
//! * `trial.fault`: 1 at the commits the fault acts on (a flip's cycle, a stuck-at's duration).
//! * `trial.diverged`: 1 while any shown golden/faulty pair differs.
//! * `trial.diff_regs`: registers of the whole unit (array or lanes) that differ then.
//! * `trial.fold` (GEMM) or `trial.vector` (VPU): the tile fault times count from.
//! * `trial.reader` (memory words): 1 while an instruction that reads the changed word runs.
//!
//! Time is the injection step's clock, one unit per cycle counted from the step's first cycle,
//! as the record's `cycle` counts: `$timescale 1 ns`, with the machine's real clock in the
//! header's comment (a cycle at 940 MHz is no whole number of any VCD unit, and whole cycles
//! are what the records and schedules speak of). The value at time `t` is a register after the
//! commit of cycle `t`, faults applied (`faultline_hw::fault`): a flip at cycle `t` shows at `t`.

use crate::error::{ReportError, Result};
use faultline_fault::spec::Mode;
use faultline_fault::{Campaign, CampaignSpec};
use faultline_graph::StepSchedule;
use faultline_hw::budget::HostMemory;
use faultline_hw::fault::glob_match;
use faultline_hw::isa::{self, Instr};
use faultline_hw::mxu::{self, PeArrayState};
use faultline_hw::vpu::{self, LaneState};
use faultline_hw::{FaultSchedule, FaultSite, HwConfig, Register, SiteClass, Unit};
use faultline_num::NumFormat;
use faultline_train::exec::Injection;
use faultline_train::inject::{self, memory};
use faultline_train::{Executor, ModelState, StepFault, Trainer};
use serde::Deserialize;
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use vcd::{SimulationCommand, TimescaleUnit, Value, VarType};

/// Most cycles written by default: a whole GEMM of the shipped models fits; a longer
/// instruction is cut to this many cycles around the fault.
pub const DEFAULT_WINDOW: u64 = 4096;

/// Cycles of a memory word shown before the fault (as `x`: the word's earlier contents are
/// not tracked), so that a viewer shows the fault arriving.
const WORD_LEAD: u64 = 16;

/// Most (signal, cycle) values one file may hold (about 1 GB of text); more is refused with a
/// hint to narrow `--sites` or `--window`.
const MAX_VALUES: u64 = 50_000_000;

/// Registers named in a divergence message, at most.
const NAMED: usize = 8;

/// What to replay, and where to write it.
#[derive(Debug, Clone, PartialEq)]
pub struct VcdRequest {
    /// The campaign's directory (`campaign.json`, `records.jsonl`).
    pub campaign: PathBuf,
    /// The trial (its `trial` field in `records.jsonl`).
    pub trial: u64,
    /// The VCD file to write.
    pub out: PathBuf,
    /// More registers to show: globs over register names, as `faultline sites` writes sites
    /// without the bit (`mxu.pe[0][*].psum`, `vpu.lane[*].out`), of the unit the fault is in.
    pub sites: Vec<String>,
    /// The campaign's spec file, when it moved since the campaign ran (default: the
    /// `spec_file` of `campaign.json`).
    pub spec: Option<PathBuf>,
    /// Most cycles to write ([`DEFAULT_WINDOW`]): a longer instruction is cut to this many,
    /// an eighth of them before the fault.
    pub window: u64,
}

impl VcdRequest {
    /// Trial `trial` of the campaign in `campaign`, written to `out`, with the defaults.
    pub fn new(campaign: impl Into<PathBuf>, trial: u64, out: impl Into<PathBuf>) -> VcdRequest {
        VcdRequest {
            campaign: campaign.into(),
            trial,
            out: out.into(),
            sites: Vec::new(),
            spec: None,
            window: DEFAULT_WINDOW,
        }
    }
}

/// The first cycle golden and faulty differ.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    /// Step cycle.
    pub cycle: u64,
    /// Registers (words) differing then, e.g. `mxu.pe[3][5].psum` (at most a few).
    pub registers: Vec<String>,
    /// How many differ then.
    pub count: usize,
    /// The first one's golden value, e.g. `0x3f080000 (0.53125)`.
    pub golden: String,
    /// The first one's faulty value.
    pub faulty: String,
    /// The bits in which the first one's two values differ.
    pub bits: Vec<u32>,
}

/// The outputs of a replayed instruction (every destination's words, in [`Instr::dests`]
/// order), as the replay and the executor computed them.
#[derive(Debug, Clone, PartialEq)]
pub struct Outputs {
    /// The fault-free cycle-level replay.
    pub golden: Vec<u32>,
    /// The faulty cycle-level replay.
    pub faulty: Vec<u32>,
    /// The functional model's (fault-free) result.
    pub functional: Vec<u32>,
    /// The executor's injected run of the instruction on the same operands: what the
    /// campaign's trial computed there.
    pub executor: Vec<u32>,
}

impl Outputs {
    /// Output words whose bits the fault changed.
    pub fn corrupted(&self) -> usize {
        self.golden.iter().zip(&self.faulty).filter(|(g, f)| g != f).count()
    }
}

/// What a replay found and wrote; its `Display` is the summary `faultline vcd` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// Campaign name.
    pub campaign: String,
    /// The trial.
    pub trial: u64,
    /// The fault, as the record writes it.
    pub fault: String,
    /// The outcome the campaign recorded.
    pub outcome: String,
    /// The campaign skipped the trial as provably dead (and recorded it hardware-masked).
    pub skipped: bool,
    /// Injection step (an inference campaign's test batch).
    pub step: u64,
    /// Whether the campaign is an inference campaign.
    pub inference: bool,
    /// The instruction replayed (the first reader, for a memory word).
    pub instr: usize,
    /// How the program names it, e.g. `gemm of fc1.matmul (forward phase, layer fc1)`.
    pub instr_name: String,
    /// Step cycles the instruction spans, `[start, end)`.
    pub span: (u64, u64),
    /// Step cycles the fault acts on in that instruction (at the word), `[start, end)`.
    pub fault_cycles: (u64, u64),
    /// Where the fault lands: `fold 1, cycle 29` (GEMM), `vector 3, cycle 1` (VPU), or the
    /// buffer element living in the word.
    pub lands: String,
    /// Step cycles written, `[first, last]`.
    pub window: (u64, u64),
    /// Whether the instruction was cut to the window.
    pub cut: bool,
    /// The registers (words) shown golden and faulty, e.g. `mxu.pe[3][5].psum`.
    pub shown: Vec<String>,
    /// The marker signals of the `trial` scope.
    pub markers: Vec<String>,
    /// Signals written: the golden and faulty copies counted apart, markers included.
    pub signals: usize,
    /// The first cycle golden and faulty differ anywhere in the unit (at the word).
    pub first_divergence: Option<Divergence>,
    /// The last cycle any register of the unit differs (`None`: never, or a word, whose
    /// change lasts until it is next written).
    pub last_divergence: Option<u64>,
    /// Most registers differing at once.
    pub peak: usize,
    /// PEs (lanes) any of whose registers ever differed.
    pub touched: usize,
    /// What the unit is called in messages: `array` (MXU), `lanes` (VPU), `word`.
    pub unit: String,
    /// The instruction's outputs (register faults).
    pub outputs: Option<Outputs>,
    /// Output words of the instruction; for a memory word, the reads that see the fault.
    pub elements: usize,
    /// Output words corrupted; for a memory word, reads that see a changed value.
    pub corrupted: usize,
    /// What the record says was corrupted (`None` when the campaign skipped the trial).
    pub recorded_corrupted: Option<usize>,
    /// The machine's clock, MHz.
    pub clock_mhz: f64,
    /// The VCD written.
    pub out: PathBuf,
    /// Further remarks (a stuck-at reaching more instructions, elements not shown).
    pub notes: Vec<String>,
}

/// The fields of a record the replay needs (the rest of a line, floats included, is not
/// decoded).
#[derive(Debug, Clone, Deserialize)]
struct RecordLine {
    trial: u64,
    fault: String,
    step: u64,
    skipped: bool,
    outcome: String,
    injection: Option<ReportLine>,
}

/// The injection report's fields the replay checks against.
#[derive(Debug, Clone, Deserialize)]
struct ReportLine {
    instr: usize,
    corrupted: usize,
}

/// A [`ReportError::Replay`] with `what` as its message.
fn fail(what: impl Into<String>) -> ReportError {
    ReportError::Replay(what.into())
}

/// Replays trial `req.trial` of the campaign in `req.campaign` and writes its VCD to `req.out`
/// (see the module docs); `golden_step` is called after each step of the golden run the
/// replay re-runs (for a progress bar). Host memory is checked against `mem` as a campaign
/// checks it.
pub fn replay(req: &VcdRequest, mem: &HostMemory, golden_step: impl FnMut(u64)) -> Result<Replay> {
    let info_path = req.campaign.join("campaign.json");
    let faultline_fault::store::InfoFile { info, id, .. } = faultline_fault::store::read_info(&req.campaign)?;
    if req.trial >= info.trials {
        return Err(fail(format!(
            "trial {} is out of range: campaign `{}` ({}) has {} trials, 0..{}",
            req.trial,
            info.spec.name,
            info_path.display(),
            info.trials,
            info.trials
        )));
    }
    let rec = find_record(&req.campaign.join("records.jsonl"), req.trial, &id)?;
    if req.window == 0 {
        return Err(fail("--window must be at least 1 cycle"));
    }
    let spec_path = match &req.spec {
        Some(p) => p.clone(),
        None => PathBuf::from(&info.spec_file),
    };
    if let Err(e) = faultline_hw::files::check_regular(&spec_path) {
        return Err(fail(match (&req.spec, e.kind()) {
            (Some(p), _) => format!("--spec {}: {e}", p.display()),
            (None, std::io::ErrorKind::NotFound) => format!(
                "{}: its spec_file {} does not exist (moved?); pass --spec FILE",
                info_path.display(),
                spec_path.display()
            ),
            (None, _) => format!("{}: its spec_file {}: {e}", info_path.display(), spec_path.display()),
        }));
    }
    let mut spec = CampaignSpec::load(&spec_path).map_err(|e| fail(e.to_string()))?;
    // A plan given with `campaign --protect` overrides the spec file's; campaign.json records
    // the one that ran (its contents are checked by the golden run's checksum below).
    if info.spec.protection.is_some() {
        spec.protection.clone_from(&info.spec.protection);
    }
    if spec != info.spec {
        return Err(fail(format!(
            "{} differs from the spec {} records: the campaign's inputs changed since it ran",
            spec_path.display(),
            info_path.display()
        )));
    }
    let inference = spec.mode == Mode::Inference;
    let c = Campaign::prepare_with(spec, &spec_path, mem, golden_step).map_err(|e| fail(e.to_string()))?;
    if c.info.golden.final_checksum != info.golden.final_checksum {
        return Err(fail(format!(
            "the campaign's inputs changed since it ran: the golden run's final checksum is {}, {} records {} \
             (model, machine, data or code differ)",
            c.info.golden.final_checksum,
            info_path.display(),
            info.golden.final_checksum
        )));
    }
    let (anchor, upset) = c.upset(req.trial);
    let text = upset.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(" + ");
    if text != rec.fault {
        return Err(fail(format!(
            "the campaign's inputs changed since it ran: trial {} now draws `{text}`, records.jsonl has `{}`",
            req.trial, rec.fault
        )));
    }
    let site = upset[0].site;
    if anchor.check_bits > 0 {
        return Err(fail(format!(
            "trial {} struck the check bits of a code ({}): they hold no value the machine computes with, so              there is no waveform to show; its record says what the code did",
            req.trial,
            anchor.pattern()
        )));
    }
    if matches!(site.unit, Unit::Seq | Unit::Dma) {
        let (what, acts) = match site.unit {
            Unit::Seq => ("sequencer register", "changes a GEMM's fold loop"),
            _ => ("DMA address register", "misdirects a whole transfer"),
        };
        return Err(fail(format!(
            "trial {}: `{site}` is a {what}; VCD replay covers PE, lane and memory-word sites (such a fault {acts}, \
             which the campaign computes from the schedule rather than by stepping registers; the record's \
             injection report says what it did)",
            req.trial
        )));
    }
    let src = if inference {
        let (exec, sched, state, x) = c
            .inference_batch(rec.step)
            .ok_or_else(|| fail(format!("trial {}: test batch {} is not one faults strike", req.trial, rec.step)))?;
        Source::Infer { exec, sched, state, x }
    } else {
        let before = c
            .golden_before(rec.step)
            .ok_or_else(|| fail(format!("trial {}: step {} is not an injection step", req.trial, rec.step)))?;
        let mut tr = c.trainer();
        tr.restore_snapshot(before);
        Source::Train(Box::new(tr))
    };
    let (inj, _) = inject::resolve_upset(src.exec(), src.sched(), &upset).map_err(|e| fail(e.to_string()))?;
    let Some(inj) = inj else {
        let why = match site.unit {
            Unit::Mxu | Unit::Vpu => format!(
                "it strikes the {} while it holds no operand (between instructions, or before a GEMM's first fold): \
                 the next instruction loads its registers afresh",
                site.unit.name().to_uppercase()
            ),
            _ => "no instruction reads the word after the fault: it holds nothing live".into(),
        };
        return Err(fail(format!(
            "trial {}: `{}` has nothing to show: {why} (recorded {}{})",
            req.trial,
            rec.fault,
            rec.outcome,
            if rec.skipped { ", skipped as provably dead" } else { "" }
        )));
    };
    let base = Replay {
        campaign: info.spec.name.clone(),
        trial: req.trial,
        fault: rec.fault.clone(),
        outcome: rec.outcome.clone(),
        skipped: rec.skipped,
        step: rec.step,
        inference,
        instr: 0,
        instr_name: String::new(),
        span: (0, 0),
        fault_cycles: (0, 0),
        lands: String::new(),
        window: (0, 0),
        cut: false,
        shown: Vec::new(),
        markers: Vec::new(),
        signals: 0,
        first_divergence: None,
        last_divergence: None,
        peak: 0,
        touched: 0,
        unit: String::new(),
        outputs: None,
        elements: 0,
        corrupted: 0,
        recorded_corrupted: rec.injection.as_ref().map(|r| r.corrupted),
        clock_mhz: src.exec().hw.clock_mhz,
        out: req.out.clone(),
        notes: Vec::new(),
    };
    let (replay, wave) = match site.unit {
        Unit::Mxu | Unit::Vpu => registers(req, &src, &upset, &inj, &rec, base)?,
        _ => word(req, &src, &upset, &inj, base)?,
    };
    let comment = format!(
        "faultline vcd: trial {} of campaign `{}`: {}. Time: one unit per cycle of {} {} from its first cycle \
         (the machine's clock is {} MHz); values after each cycle's commit. Scopes golden and faulty hold the same \
         registers from the fault-free and the faulty run.",
        replay.trial,
        replay.campaign,
        replay.fault,
        if inference { "the forward pass of test batch" } else { "training step" },
        replay.step,
        replay.clock_mhz
    );
    let signals = write_vcd(&req.out, &wave, &comment)?;
    Ok(Replay { signals, ..replay })
}

/// The record of trial `trial` in `path` (`records.jsonl`), streamed, every line up to it
/// checked to be of campaign `id`.
fn find_record(path: &Path, trial: u64, id: &str) -> Result<RecordLine> {
    let mut lines = faultline_hw::files::JsonLines::open(path).map_err(ReportError::io(path))?;
    let bad = |line: u64, e: serde_json::Error| ReportError::Trace {
        path: path.into(),
        line: Some(line),
        why: format!("not a trial record: {e}"),
    };
    #[derive(Deserialize)]
    struct Id {
        campaign: String,
        trial: u64,
    }
    let (mut count, mut lo, mut hi) = (0u64, u64::MAX, 0u64);
    while let Some(line) = lines.next_line().map_err(ReportError::io(path))? {
        if line.text.trim().is_empty() || !line.complete {
            continue;
        }
        let n = line.number;
        let head: Id = serde_json::from_str(line.text).map_err(|e| bad(n, e))?;
        faultline_fault::store::check_identity(path, n, &head.campaign, id)?;
        if head.trial == trial {
            return serde_json::from_str(line.text).map_err(|e| bad(n, e));
        }
        (count, lo, hi) = (count + 1, lo.min(head.trial), hi.max(head.trial));
    }
    let held = if count == 0 { "no records".to_string() } else { format!("{count} records, trials {lo}..={hi}") };
    Err(ReportError::Trace {
        path: path.into(),
        line: None,
        why: format!("no record of trial {trial} ({held}; a shard holds only its own trials)"),
    })
}

/// Where a replay's program, schedule and operands come from.
enum Source<'a> {
    /// A training campaign: a trainer at the golden state before the injection step.
    Train(Box<Trainer>),
    /// An inference campaign: its forward program on one test batch.
    Infer { exec: &'a Executor, sched: &'a StepSchedule, state: &'a ModelState, x: &'a [f32] },
}

impl Source<'_> {
    fn exec(&self) -> &Executor {
        match self {
            Source::Train(t) => &t.exec,
            Source::Infer { exec, .. } => exec,
        }
    }

    fn sched(&self) -> &StepSchedule {
        match self {
            Source::Train(t) => &t.schedule,
            Source::Infer { sched, .. } => sched,
        }
    }

    /// The buffers as instruction `i` finds them in the fault-free run.
    fn buffers_before(&self, i: usize) -> Result<Vec<Vec<u32>>> {
        match self {
            Source::Train(t) => t.buffers_before(i),
            Source::Infer { exec, state, x, .. } => exec.buffers_before(state, x, None, i),
        }
        .map_err(|e| fail(format!("running the step up to instruction {i}: {e}")))
    }

    /// `gemm of fc1.matmul (forward phase, layer fc1)`.
    fn describe(&self, i: usize) -> String {
        let exec = self.exec();
        let p = exec.program();
        let tag = &p.tags[i];
        format!(
            "{} of {}{} ({} phase, layer {})",
            p.instrs[i].name(),
            exec.tg.graph.node(tag.node).name,
            tag.tile_suffix(),
            tag.phase,
            tag.layer
        )
    }
}

/// A register (or memory word) shown golden and faulty.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    /// Its site, bit 0.
    site: FaultSite,
    /// `mxu.pe[3][5].psum`.
    name: String,
    /// VCD scopes below `golden` / `faulty`: `["mxu", "pe_3_5"]`.
    path: Vec<String>,
    /// VCD variable: `psum`.
    var: String,
    /// Bits.
    width: u32,
    /// Number format of its bits, for messages (`None`: control bits).
    format: Option<NumFormat>,
}

impl Shown {
    fn new(hw: &HwConfig, site: FaultSite) -> Shown {
        let site = FaultSite { bit: 0, ..site };
        let text = site.to_string();
        let name = text[..text.rfind('[').unwrap_or(text.len())].to_string();
        // VCD identifiers: `pe[3][5]` would read as a bit select, so indices join with `_`.
        let ident = |s: &str| s.replace("][", "_").replace('[', "_").replace(']', "");
        let mut path: Vec<String> = name.split('.').map(ident).collect();
        let var = path.pop().unwrap_or_default();
        let format = match site.register {
            Register::Act | Register::Weight | Register::WeightShadow => Some(hw.mxu.input_format),
            Register::Psum => Some(hw.mxu.acc_format),
            Register::Valid | Register::Swap | Register::WeightValid => None,
            Register::Word if site.unit == Unit::Wbuf => Some(hw.mxu.input_format),
            _ => Some(NumFormat::Fp32),
        };
        Shown { site, name, path, var, width: site.class().width(hw), format }
    }

    /// `0x3f080000 (0.53125)`.
    fn show(&self, bits: u32) -> String {
        let hex = format!("{:#0w$x}", bits, w = 2 + self.width.div_ceil(4) as usize);
        match self.format {
            Some(f) => format!("{hex} ({})", number(f.bits_to_f64(bits))),
            None => hex,
        }
    }
}

/// A register's value for people: the shortest decimal that reads back to the same fp32
/// (bf16 and fp32 values are fp32 values), plain for ordinary magnitudes, else scientific.
fn number(v: f64) -> String {
    let x = v as f32;
    if x == 0.0 || !x.is_finite() || (1e-4..1e6).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

/// `1 word`, `7 words`.
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// What one replay writes: per cycle, the shown pairs and the markers.
struct Wave {
    /// Step cycle of the first sample.
    first: u64,
    /// Samples (cycles).
    len: usize,
    /// The pairs.
    shown: Vec<Shown>,
    /// `len x shown` golden values (`None`: unknown, written `x`).
    golden: Vec<Option<u32>>,
    /// `len x shown` faulty values.
    faulty: Vec<Option<u32>>,
    /// The `trial` scope's signals: name, width, one value per sample.
    markers: Vec<(String, u32, Vec<Option<u32>>)>,
}

impl Wave {
    /// `trial.diverged`: 1 where any shown pair differs.
    fn diverged(&self) -> Vec<Option<u32>> {
        let n = self.shown.len();
        (0..self.len)
            .map(|k| {
                let (g, f) = (&self.golden[k * n..(k + 1) * n], &self.faulty[k * n..(k + 1) * n]);
                Some(g.iter().zip(f).any(|(a, b)| a.is_some() && b.is_some() && a != b) as u32)
            })
            .collect()
    }
}

/// A unit's register state, stepped in a replay.
trait Regs: Clone + Send {
    /// The register `site` names (bit ignored).
    fn read(&self, site: &FaultSite) -> u32;
    /// Calls `hit` with the element index (PE `row * cols + col`, lane) and site (bit 0) of
    /// every register that differs from `other`'s.
    fn diffs(&self, other: &Self, hit: &mut dyn FnMut(usize, FaultSite));
    /// Elements (PEs, lanes).
    fn elements(&self) -> usize;
}

/// Calls `hit(i)` for every `i` with `a[i] != b[i]`.
fn diff_at<T: PartialEq>(a: &[T], b: &[T], mut hit: impl FnMut(usize)) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            hit(i);
        }
    }
}

impl Regs for PeArrayState {
    fn read(&self, site: &FaultSite) -> u32 {
        PeArrayState::read(self, site)
    }

    fn diffs(&self, o: &Self, hit: &mut dyn FnMut(usize, FaultSite)) {
        let c = self.cols;
        let mut on = |r: Register, i: usize| hit(i, FaultSite::pe(i / c, i % c, r, 0));
        // Registers a dataflow lacks stay zero in both runs: comparing them finds nothing.
        diff_at(&self.act, &o.act, |i| on(Register::Act, i));
        diff_at(&self.valid, &o.valid, |i| on(Register::Valid, i));
        diff_at(&self.swap, &o.swap, |i| on(Register::Swap, i));
        diff_at(&self.weight, &o.weight, |i| on(Register::Weight, i));
        diff_at(&self.shadow, &o.shadow, |i| on(Register::WeightShadow, i));
        diff_at(&self.wvalid, &o.wvalid, |i| on(Register::WeightValid, i));
        diff_at(&self.psum, &o.psum, |i| on(Register::Psum, i));
    }

    fn elements(&self) -> usize {
        self.rows * self.cols
    }
}

impl Regs for LaneState {
    fn read(&self, site: &FaultSite) -> u32 {
        LaneState::read(self, site)
    }

    fn diffs(&self, o: &Self, hit: &mut dyn FnMut(usize, FaultSite)) {
        let regs = [Register::OpA, Register::OpB, Register::OpC, Register::OpD];
        for (k, r) in regs.into_iter().enumerate() {
            diff_at(&self.opnd[k], &o.opnd[k], |l| hit(l, FaultSite::lane(l, r, 0)));
        }
        diff_at(&self.acc, &o.acc, |l| hit(l, FaultSite::lane(l, Register::LaneAcc, 0)));
        diff_at(&self.out, &o.out, |l| hit(l, FaultSite::lane(l, Register::LaneOut, 0)));
    }

    fn elements(&self) -> usize {
        self.out.len()
    }
}

/// Runs `run` twice, fault-free (on a second thread) and with `faults`, in lockstep: `both`
/// gets each cycle's golden and faulty state. Only a few states are in flight at a time, so a
/// long instruction on a large array needs no history. Returns both runs' results.
fn lockstep<S, O>(
    run: impl Fn(&FaultSchedule, &mut dyn FnMut(u64, &S)) -> Result<O> + Sync,
    faults: &FaultSchedule,
    mut both: impl FnMut(u64, &S, &S),
) -> Result<(O, O)>
where
    S: Clone + Send,
    O: Send,
{
    let none = FaultSchedule::none();
    let (run, none) = (&run, &none);
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, S)>(64);
        let golden = scope.spawn(move || {
            // A send fails only once the faulty run has stopped listening (an error there).
            run(none, &mut |t, st: &S| {
                let _ = tx.send((t, st.clone()));
            })
        });
        let mut lost = None;
        let faulty = run(faults, &mut |t, st: &S| match rx.recv() {
            Ok((u, g)) if u == t => both(t, &g, st),
            _ => {
                lost.get_or_insert(t);
            }
        });
        // Unblocks the golden run if the faulty one stopped early.
        drop(rx);
        let golden = golden.join().map_err(|_| fail("the fault-free replay panicked"))??;
        let faulty = faulty?;
        if let Some(t) = lost {
            return Err(fail(format!("the fault-free and faulty replays lost step at cycle {t}")));
        }
        Ok((golden, faulty))
    })
}

/// Every register of `unit` on `hw`, bit 0 (what `--sites` globs choose from).
fn unit_registers(hw: &HwConfig, unit: Unit) -> Vec<FaultSite> {
    SiteClass::all(hw)
        .into_iter()
        .filter(|c| c.unit == unit)
        .flat_map(|c| (0..c.elements(hw)).filter_map(move |e| c.site_at(hw, e * c.width(hw) as u64)))
        .collect()
}

/// The registers a register fault's replay shows: the faulted PEs' rows and columns (every
/// register kind), or the faulted lanes, and whatever `globs` name; sorted, so that each PE's
/// registers sit in one scope.
fn chosen(hw: &HwConfig, unit: Unit, upset: &[StepFault], globs: &[String]) -> Result<Vec<Shown>> {
    let all = unit_registers(hw, unit);
    let mut sites: Vec<FaultSite> = all
        .iter()
        .copied()
        .filter(|s| {
            upset.iter().any(|f| match unit {
                Unit::Mxu => s.instance[0] == f.site.instance[0] || s.instance[1] == f.site.instance[1],
                _ => s.instance[0] == f.site.instance[0],
            })
        })
        .collect();
    for g in globs {
        let before = sites.len();
        sites.extend(all.iter().copied().filter(|s| glob_match(g, &Shown::new(hw, *s).name)));
        if sites.len() == before {
            let forms = if unit == Unit::Mxu { "mxu.pe[ROW][COL].REG" } else { "vpu.lane[LANE].REG" };
            return Err(fail(format!(
                "--sites `{g}` names no register of the {} (the unit this trial's fault is in), whose registers \
                 are named {forms}, e.g. {}",
                unit.name().to_uppercase(),
                Shown::new(hw, all[all.len() / 2]).name
            )));
        }
    }
    sites.sort();
    sites.dedup();
    Ok(sites.into_iter().map(|s| Shown::new(hw, s)).collect())
}

/// The outputs of `ins` in `bufs` (every destination's words, [`Instr::dests`] order).
fn dest_words(ins: &Instr, bufs: &[Vec<u32>]) -> Vec<u32> {
    let len = ins.out_len();
    ins.dests().iter().flat_map(|d| bufs[d.buf.index()][d.offset..d.offset + len].iter().copied()).collect()
}

/// What the lockstep runs gather about a register replay.
struct Gather<'a> {
    hw: &'a HwConfig,
    shown: &'a [Shown],
    /// Local cycles written, `[from, to)`.
    from: u64,
    to: u64,
    /// The instruction's first cycle on the step clock.
    start: u64,
    golden: Vec<Option<u32>>,
    faulty: Vec<Option<u32>>,
    diff: Vec<Option<u32>>,
    first: Option<Divergence>,
    last: Option<u64>,
    peak: usize,
    touched: Vec<bool>,
}

impl Gather<'_> {
    fn cycle<S: Regs>(&mut self, t: u64, g: &S, f: &S) {
        if self.touched.is_empty() {
            self.touched = vec![false; g.elements()];
        }
        let (mut count, mut named) = (0usize, Vec::new());
        let touched = &mut self.touched;
        f.diffs(g, &mut |e, s| {
            count += 1;
            touched[e] = true;
            if named.len() < NAMED {
                named.push(s);
            }
        });
        if count > 0 {
            self.peak = self.peak.max(count);
            self.last = Some(self.start + t);
            if self.first.is_none() {
                let first = Shown::new(self.hw, named[0]);
                let (gv, fv) = (g.read(&first.site), f.read(&first.site));
                self.first = Some(Divergence {
                    cycle: self.start + t,
                    registers: named.iter().map(|s| Shown::new(self.hw, *s).name).collect(),
                    count,
                    golden: first.show(gv),
                    faulty: first.show(fv),
                    bits: (0..32).filter(|b| (gv ^ fv) >> b & 1 == 1).collect(),
                });
            }
        }
        if (self.from..self.to).contains(&t) {
            for s in self.shown {
                self.golden.push(Some(g.read(&s.site)));
                self.faulty.push(Some(f.read(&s.site)));
            }
            self.diff.push(Some(count as u32));
        }
    }
}

/// The fold (GEMM) or vector (VPU) at a cycle of an instruction.
type TileAt = Box<dyn Fn(u64) -> Option<u32>>;

/// Replays a PE or lane register fault on the instruction the record reports on.
fn registers(
    req: &VcdRequest,
    src: &Source,
    upset: &[StepFault],
    inj: &Injection,
    rec: &RecordLine,
    base: Replay,
) -> Result<(Replay, Wave)> {
    let (exec, sched) = (src.exec(), src.sched());
    let hw = &exec.hw;
    let p = exec.program();
    // The record reports on the first faulted instruction whose outputs changed (else the
    // first): every faulted instruction before it left its outputs exact, so its operands are
    // the fault-free run's.
    let instr =
        rec.injection.as_ref().map(|r| r.instr).filter(|&i| inj.register_faults(i).is_some()).unwrap_or(inj.instr());
    let faults = inj.register_faults(instr).cloned().unwrap_or_default();
    let ins = &p.instrs[instr];
    let cost = &sched.instrs[instr];
    let (start, total) = (cost.start, cost.cycles);
    let unit = upset[0].site.unit;
    let mut notes = Vec::new();
    let others: Vec<String> = inj.instrs().filter(|&i| i != instr).map(|i| i.to_string()).collect();
    if !others.is_empty() {
        notes.push(format!(
            "the fault also reaches instruction{} {} (not shown: one instruction per file)",
            if others.len() > 1 { "s" } else { "" },
            others.join(", ")
        ));
    }
    let shown = chosen(hw, unit, upset, &req.sites)?;
    // Where the fault acts, on the instruction's own clock.
    let (acts, lands, tile_of): (Vec<(u64, u64)>, String, TileAt) = match ins {
        Instr::Gemm { m, k, n, .. } => {
            let s = mxu::Schedule::new(&hw.mxu, *m, *k, *n).map_err(|e| fail(e.to_string()))?;
            let acts = s.active(&faults).iter().map(|a| (a.start, a.end)).collect();
            let at = faults.events.first().map(|e| e.at);
            let lands = at.map_or(String::new(), |t| format!("fold {}, cycle {}", t.tile, t.cycle));
            let starts: Vec<u64> = s.folds.iter().map(|f| f.start).collect();
            let tile = move |t: u64| starts.partition_point(|&s| s <= t).checked_sub(1).map(|f| f as u32);
            (acts, lands, Box::new(tile))
        }
        Instr::Vpu { op, .. } => {
            // A lane fault starts where it strikes (VPU faults never wait for a tile).
            let from = upset[0].cycle.max(start) - start;
            let acts = faults.events.iter().map(|e| (from, from + e.active_cycles())).collect();
            let at = faults.events.first().map(|e| e.at);
            let lands = at.map_or(String::new(), |t| format!("vector {}, cycle {}", t.tile, t.cycle));
            let (hw, op, n) = (hw.clone(), *op, ins.lane_elements());
            let tile = move |t: u64| vpu::vector_at(&hw, &op, n, t).ok().flatten().map(|(v, _)| v as u32);
            (acts, lands, Box::new(tile))
        }
        Instr::Dma { .. } => return Err(fail(format!("instruction {instr} is a DMA transfer, not stepped"))),
    };
    let first_act = acts.iter().map(|a| a.0).min().unwrap_or(0);
    let (from, to, cut) = window(total, first_act, req.window);
    let values = (to - from) * (2 * shown.len() as u64 + 4);
    if values > MAX_VALUES {
        return Err(fail(format!(
            "{} registers over {} cycles is too much to write ({values} values); narrow --sites or --window",
            shown.len(),
            to - from
        )));
    }
    let bufs = src.buffers_before(instr)?;
    // The executor's own injected run on the same operands, and the functional result it
    // compares against.
    let mut exec_bufs = bufs.clone();
    let (_, functional) =
        isa::execute_faulty(hw, ins, &mut exec_bufs, &faults).map_err(|e| fail(format!("instruction {instr}: {e}")))?;
    let executor = dest_words(ins, &exec_bufs);
    let functional: Vec<u32> = functional.concat();
    let mut gather = Gather {
        hw,
        shown: &shown,
        from,
        to,
        start,
        golden: Vec::new(),
        faulty: Vec::new(),
        diff: Vec::new(),
        first: None,
        last: None,
        peak: 0,
        touched: Vec::new(),
    };
    let hw_err = |e: faultline_hw::HwError| fail(format!("instruction {instr}: {e}"));
    let (golden, faulty) = match ins {
        Instr::Gemm { .. } => {
            let (a, w) = isa::gemm_operands(hw, ins, &bufs)
                .map_err(hw_err)?
                .ok_or_else(|| fail(format!("instruction {instr} has no GEMM operands")))?;
            let acc = isa::accumulators(ins, &bufs).map_err(hw_err)?;
            let run = |f: &FaultSchedule, obs: &mut dyn FnMut(u64, &PeArrayState)| {
                mxu::gemm_observed(hw, &a, &w, acc.as_ref(), f, obs).map(|(m, _)| m.data).map_err(hw_err)
            };
            lockstep(run, &faults, |t, g: &PeArrayState, f: &PeArrayState| gather.cycle(t, g, f))?
        }
        _ => {
            // The operands as the lanes read them (views gathered, an accumulating reduction's
            // output words first), taken from a functional run of the instruction.
            let mut inputs = Vec::new();
            let Instr::Vpu { op, .. } = ins else { unreachable!("DMA refused above") };
            isa::execute_vpu_edited(
                hw,
                ins,
                &mut bufs.clone(),
                faultline_hw::ExecMode::Functional,
                &FaultSchedule::none(),
                &mut |x: &mut [Vec<u32>]| inputs = x.to_vec(),
            )
            .map_err(hw_err)?;
            let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
            let len = ins.out_len();
            let run = |f: &FaultSchedule, obs: &mut dyn FnMut(u64, &LaneState)| {
                let out = vpu::run_observed(hw, *op, &refs, f, obs).map_err(hw_err)?;
                Ok(out.out.iter().flat_map(|o| o[..len].iter().copied()).collect::<Vec<u32>>())
            };
            lockstep(run, &faults, |t, g: &LaneState, f: &LaneState| gather.cycle(t, g, f))?
        }
    };
    let Gather { golden: gv, faulty: fv, diff, first, last, peak, touched, .. } = gather;
    let outputs = Outputs { golden, faulty, functional, executor };
    // The replay checks itself against the functional model, the executor and the record.
    let mismatch = |a: &[u32], b: &[u32]| a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len());
    let bad = mismatch(&outputs.golden, &outputs.functional);
    if bad > 0 {
        return Err(fail(format!(
            "instruction {instr}: the fault-free cycle-level replay differs from the functional model in {bad} words \
             (the bit-exact twins disagree: a simulator bug)"
        )));
    }
    let bad = mismatch(&outputs.faulty, &outputs.executor);
    if bad > 0 {
        return Err(fail(format!(
            "instruction {instr}: the faulty cycle-level replay differs from the executor's injected run in {bad} \
             words (a simulator bug)"
        )));
    }
    let corrupted = outputs.corrupted();
    if let Some(r) = rec.injection.as_ref().filter(|r| r.instr == instr && r.corrupted != corrupted) {
        return Err(fail(format!(
            "trial {}: the replay corrupts {corrupted} output words of instruction {instr}, records.jsonl says {}: \
             the campaign's inputs or code changed since it ran",
            rec.trial, r.corrupted
        )));
    }
    let fault_cycles =
        (start + acts.iter().map(|a| a.0).min().unwrap_or(0), start + acts.iter().map(|a| a.1).max().unwrap_or(0));
    let len = (to - from) as usize;
    let mut fault = vec![Some(0); len];
    for &(a, b) in &acts {
        for t in a.max(from)..b.min(to) {
            fault[(t - from) as usize] = Some(1);
        }
    }
    let tile_name = if matches!(ins, Instr::Gemm { .. }) { "fold" } else { "vector" };
    let tiles: Vec<Option<u32>> = (from..to).map(&tile_of).collect();
    let mut wave = Wave { first: start + from, len, shown, golden: gv, faulty: fv, markers: Vec::new() };
    let diverged = wave.diverged();
    wave.markers = vec![
        ("fault".into(), 1, fault),
        ("diverged".into(), 1, diverged),
        ("diff_regs".into(), 32, diff),
        (tile_name.into(), 32, tiles),
    ];
    let replay = Replay {
        instr,
        instr_name: src.describe(instr),
        span: (start, start + total),
        fault_cycles,
        lands,
        window: (start + from, start + to - 1),
        cut,
        shown: wave.shown.iter().map(|s| s.name.clone()).collect(),
        markers: wave.markers.iter().map(|m| format!("trial.{}", m.0)).collect(),
        first_divergence: first,
        last_divergence: last,
        peak,
        touched: touched.iter().filter(|&&t| t).count(),
        unit: if unit == Unit::Mxu { "array" } else { "lanes" }.into(),
        elements: outputs.golden.len(),
        corrupted,
        outputs: Some(outputs),
        notes,
        ..base
    };
    Ok((replay, wave))
}

/// The local cycles `[from, to)` of an instruction of `total` cycles to write, at most `max`
/// of them, an eighth before the fault at `fault` when it must be cut; and whether it was.
fn window(total: u64, fault: u64, max: u64) -> (u64, u64, bool) {
    if total <= max {
        return (0, total, false);
    }
    let from = fault.saturating_sub(max / 8).min(total - max);
    (from, from + max, true)
}

/// Replays a memory-word fault: the word's golden and faulty value from the fault through its
/// first reader.
fn word(req: &VcdRequest, src: &Source, upset: &[StepFault], inj: &Injection, base: Replay) -> Result<(Replay, Wave)> {
    if !req.sites.is_empty() {
        return Err(fail(format!(
            "--sites adds PE or lane registers; this trial's fault is in a memory word ({}), whose replay shows \
             the word",
            upset[0].site
        )));
    }
    let (exec, sched) = (src.exec(), src.sched());
    let (hw, p) = (&exec.hw, exec.program());
    let site = upset[0].site;
    let hits = inj.hits();
    let h0 = *hits.iter().find(|h| h.instr == Some(inj.instr())).unwrap_or(&hits[0]);
    let reader = h0.instr;
    let bufs = src.buffers_before(reader.unwrap_or(p.instrs.len()))?;
    let fmt = hw.mxu.input_format;
    // The first read of the element, every bit of the upset composed.
    let same = hits
        .iter()
        .enumerate()
        .filter(|(_, h)| (h.instr, h.buf, h.elem, h.part) == (h0.instr, h0.buf, h0.elem, h0.part));
    let Some(&(_, _, old, new)) = memory::compose(same, &bufs, fmt).first() else {
        return Err(fail(format!(
            "buffer {} holds no element {} when it is read",
            p.buffers[h0.buf.index()].name,
            h0.elem
        )));
    };
    let shown = Shown::new(hw, site);
    // The word holds what its format stores: the weight buffer, converted MXU inputs.
    let (gw, fw) = if site.unit == Unit::Wbuf && fmt == NumFormat::Bf16 {
        (faultline_num::f32_to_bf16_bits(f32::from_bits(old)), new >> 16)
    } else {
        (old, new)
    };
    let mask = if shown.width >= 32 { u32::MAX } else { (1 << shown.width) - 1 };
    let (gw, fw) = (gw & mask, fw & mask);
    let f = upset[0].on_step_clock();
    let step_end = sched.total_cycles;
    let span = |i: usize| (sched.instrs[i].start, sched.instrs[i].start + sched.instrs[i].cycles);
    let mut readers: Vec<usize> = hits.iter().filter_map(|h| h.instr).collect();
    readers.sort_unstable();
    readers.dedup();
    let end = reader.map_or(step_end, |r| span(r).1).max(f.start + 1);
    let from = f.start.saturating_sub(WORD_LEAD);
    let to = end.min(from + req.window.max(WORD_LEAD + 1));
    let len = (to - from) as usize;
    let known = |t: u64| t >= f.start;
    let golden: Vec<Option<u32>> = (from..to).map(|t| known(t).then_some(gw)).collect();
    let faulty: Vec<Option<u32>> = (from..to).map(|t| known(t).then_some(fw)).collect();
    let fault = (from..to).map(|t| Some(f.acts_at(t) as u32)).collect();
    let reading =
        (from..to).map(|t| Some(readers.iter().any(|&r| (span(r).0..span(r).1).contains(&t)) as u32)).collect();
    let mut wave = Wave { first: from, len, shown: vec![shown.clone()], golden, faulty, markers: Vec::new() };
    let diverged = wave.diverged();
    wave.markers = vec![("fault".into(), 1, fault), ("diverged".into(), 1, diverged), ("reader".into(), 1, reading)];
    // Every read the fault changes, with the values the buffers hold before the first reader
    // (a read word keeps its element's value until the element is written again).
    let all = memory::compose(hits.iter().enumerate(), &bufs, fmt);
    let corrupted = all.iter().filter(|(_, _, o, n)| o != n).count();
    let elements: std::collections::BTreeSet<(u32, usize)> = hits.iter().map(|h| (h.buf.0, h.elem)).collect();
    let mut notes = Vec::new();
    if elements.len() > 1 {
        notes.push(format!(
            "the fault lasts while {} buffer elements live in the word; the file shows the first",
            elements.len()
        ));
    }
    let instr = reader.unwrap_or(inj.instr());
    let more: Vec<String> =
        readers.iter().filter(|&&r| r != instr).map(|&r| format!("{r}: {}", src.describe(r))).collect();
    if !more.is_empty() {
        notes.push(format!("read again by instruction{} {}", if more.len() > 1 { "s" } else { "" }, more.join("; ")));
    }
    if hits.iter().any(|h| h.instr.is_none()) {
        notes.push("read by the host after the step (a value the step keeps)".into());
    }
    let first = (gw != fw).then(|| Divergence {
        cycle: f.start,
        registers: vec![shown.name.clone()],
        count: 1,
        golden: shown.show(gw),
        faulty: shown.show(fw),
        bits: (0..32).filter(|b| (gw ^ fw) >> b & 1 == 1).collect(),
    });
    let replay = Replay {
        instr,
        instr_name: src.describe(instr),
        span: span(instr),
        fault_cycles: (f.start, f.end.min(step_end)),
        lands: format!("the word holds element {} of buffer `{}`", h0.elem, p.buffers[h0.buf.index()].name),
        window: (from, to - 1),
        cut: to < end,
        shown: vec![shown.name.clone()],
        markers: wave.markers.iter().map(|m| format!("trial.{}", m.0)).collect(),
        first_divergence: first,
        last_divergence: None,
        peak: 1,
        touched: 1,
        unit: "word".into(),
        outputs: None,
        elements: hits.len(),
        corrupted,
        notes,
        ..base
    };
    Ok((replay, wave))
}

/// Writes `wave` as a VCD file (see the module docs for its layout); returns the number of
/// signals written.
fn write_vcd(path: &Path, wave: &Wave, comment: &str) -> Result<usize> {
    let io = |e: std::io::Error| ReportError::Io { path: path.to_path_buf(), source: e };
    let file = File::create(path).map_err(io)?;
    let mut w = vcd::Writer::new(BufWriter::new(file));
    w.version(&format!("faultline {}", env!("CARGO_PKG_VERSION"))).map_err(io)?;
    w.comment(comment).map_err(io)?;
    w.timescale(1, TimescaleUnit::NS).map_err(io)?;
    let mut ids = [Vec::new(), Vec::new()];
    for (scope, ids) in ["golden", "faulty"].into_iter().zip(&mut ids) {
        w.add_module(scope).map_err(io)?;
        let mut open: Vec<&str> = Vec::new();
        for s in &wave.shown {
            let common = open.iter().zip(&s.path).take_while(|(a, b)| **a == b.as_str()).count();
            for _ in common..open.len() {
                w.upscope().map_err(io)?;
            }
            open.truncate(common);
            for p in &s.path[common..] {
                w.add_module(p).map_err(io)?;
                open.push(p);
            }
            ids.push(w.add_var(VarType::Reg, s.width, &s.var, None).map_err(io)?);
        }
        for _ in 0..=open.len() {
            w.upscope().map_err(io)?;
        }
    }
    w.add_module("trial").map_err(io)?;
    let marks: Vec<_> = wave
        .markers
        .iter()
        .map(|(name, width, _)| w.add_var(VarType::Wire, *width, name, None))
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    w.upscope().map_err(io)?;
    w.enddefinitions().map_err(io)?;
    let n = wave.shown.len();
    for k in 0..wave.len {
        let mut changes: Vec<(vcd::IdCode, u32, Option<u32>)> = Vec::new();
        for (c, vals) in [&wave.golden, &wave.faulty].into_iter().enumerate() {
            for (j, s) in wave.shown.iter().enumerate() {
                let v = vals[k * n + j];
                if k == 0 || vals[(k - 1) * n + j] != v {
                    changes.push((ids[c][j], s.width, v));
                }
            }
        }
        for (m, (_, width, vals)) in wave.markers.iter().enumerate() {
            if k == 0 || vals[k - 1] != vals[k] {
                changes.push((marks[m], *width, vals[k]));
            }
        }
        if k == 0 {
            w.timestamp(wave.first).map_err(io)?;
            w.begin(SimulationCommand::Dumpvars).map_err(io)?;
        } else if !changes.is_empty() {
            w.timestamp(wave.first + k as u64).map_err(io)?;
        }
        for (id, width, v) in changes {
            put(&mut w, id, width, v).map_err(io)?;
        }
        if k == 0 {
            w.end().map_err(io)?;
        }
    }
    // The last cycle's values hold for that whole cycle.
    w.timestamp(wave.first + wave.len as u64).map_err(io)?;
    w.flush().map_err(io)?;
    Ok(2 * n + wave.markers.len())
}

/// Writes one value change (`x` for an unknown value).
fn put<W: Write>(w: &mut vcd::Writer<W>, id: vcd::IdCode, width: u32, v: Option<u32>) -> std::io::Result<()> {
    let bit = |b: u32| v.map_or(Value::X, |v| if v >> b & 1 == 1 { Value::V1 } else { Value::V0 });
    if width == 1 {
        w.change_scalar(id, bit(0))
    } else {
        w.change_vector(id, (0..width).rev().map(bit))
    }
}

impl fmt::Display for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let clock = if self.inference { format!("batch {}", self.step) } else { format!("step {}", self.step) };
        writeln!(f, "trial {} of campaign {}: {}", self.trial, self.campaign, self.fault)?;
        write!(f, "  recorded outcome: {}", self.outcome)?;
        match self.recorded_corrupted {
            _ if self.skipped => {
                writeln!(f, " (skipped as provably dead, without running; the replay runs it to show what happens)")?
            }
            Some(c) => {
                writeln!(f, ", {} corrupted", count(c, if self.unit == "word" { "read" } else { "output word" }))?
            }
            None => writeln!(f)?,
        }
        writeln!(
            f,
            "  {}instruction {}: {}, cycles {}..{} of {clock}",
            if self.unit == "word" { "first read by " } else { "" },
            self.instr,
            self.instr_name,
            self.span.0,
            self.span.1 - 1
        )?;
        let when = if self.fault_cycles.1 - self.fault_cycles.0 > 1 {
            format!("cycles {}..{}", self.fault_cycles.0, self.fault_cycles.1 - 1)
        } else {
            format!("cycle {}", self.fault_cycles.0)
        };
        writeln!(f, "  the fault acts at {when} ({})", self.lands)?;
        if self.outputs.is_some() {
            writeln!(
                f,
                "  replayed at cycle level twice, fault-free and faulty: the fault-free run equals the functional \
                 model bit for bit, the faulty one the campaign's executor"
            )?;
        }
        match &self.first_divergence {
            Some(d) => {
                let bits: Vec<String> = d.bits.iter().map(|b| b.to_string()).collect();
                let what = if d.bits.len() == 1 {
                    format!("bit {} differs", bits[0])
                } else {
                    format!("bits {} differ", bits.join(", "))
                };
                writeln!(
                    f,
                    "  {} diverges at cycle {}{}: golden {}, faulty {}: {what}",
                    d.registers[0],
                    d.cycle,
                    if d.cycle == self.fault_cycles.0 { " (the injected cycle)" } else { "" },
                    d.golden,
                    d.faulty
                )?;
            }
            None => writeln!(f, "  golden and faulty never differ: the fault does not change the {}", self.unit)?,
        }
        if let (Some(last), Some(_)) = (self.last_divergence, &self.first_divergence) {
            let elements = if self.unit == "array" { "PE" } else { "lane" };
            let elements = count(self.touched, elements);
            write!(f, "  the error spreads to {elements} (at most {} wrong at once); ", count(self.peak, "register"))?;
            let (is, differs) = if self.unit == "array" { ("is", "differs") } else { ("are", "differ") };
            if last + 1 < self.span.1 {
                writeln!(f, "the {} {is} fault-free again from cycle {}", self.unit, last + 1)?;
            } else {
                writeln!(
                    f,
                    "the {} still {differs} when the instruction ends (the next one starts afresh)",
                    self.unit
                )?;
            }
        }
        if self.unit == "word" {
            writeln!(
                f,
                "  reads that see a changed word: {} of {}{}",
                self.corrupted,
                self.elements,
                self.recorded_corrupted.map_or(String::new(), |c| format!(" (the campaign recorded {c})"))
            )?;
        } else {
            let masked = if self.corrupted == 0 { ": masked inside the hardware" } else { "" };
            writeln!(
                f,
                "  output words corrupted: {} of {}{}{masked}",
                self.corrupted,
                self.elements,
                self.recorded_corrupted.map_or(String::new(), |c| format!(" (the campaign recorded {c})"))
            )?;
        }
        for n in &self.notes {
            writeln!(f, "  {n}")?;
        }
        writeln!(
            f,
            "wrote {}: {} signals (golden and faulty copies of {} {}, and {}), cycles {}..{} ({} cycles{})",
            self.out.display(),
            self.signals,
            self.shown.len(),
            if self.unit == "word" { "word" } else { "registers" },
            self.markers.join(", "),
            self.window.0,
            self.window.1,
            self.window.1 - self.window.0 + 1,
            if self.cut { ", cut to --window" } else { "" }
        )?;
        writeln!(
            f,
            "time axis: 1 unit = 1 cycle of {clock}, from its first cycle (the header says 1 ns; the clock is {} MHz, \
             {:.3} ns a cycle)",
            self.clock_mhz,
            1e3 / self.clock_mhz
        )?;
        if let Some(d) = &self.first_divergence {
            let s = &d.registers[0];
            let vcd_name = s.replace("][", "_").replace('[', "_").replace(']', "");
            write!(
                f,
                "open it with: gtkwave {} (or surfer); compare golden.{vcd_name} with faulty.{vcd_name}",
                self.out.display()
            )?;
        } else {
            write!(f, "open it with: gtkwave {} (or surfer)", self.out.display())?;
        }
        Ok(())
    }
}
