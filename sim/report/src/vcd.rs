//! `faultline vcd`: one trial of a recorded campaign replayed at cycle level and written as a
//! VCD waveform (GTKWave, Surfer), golden and faulty side by side.
//!
//! This module reads the campaign's files and writes the waveform; the replay itself is
//! [`faultline_fault::replay`]. It reads `campaign.json` and the trial's line of
//! `records.jsonl`, reloads the campaign's spec (`spec_file`; it must still equal the spec
//! `campaign.json` records) and runs its golden run again, whose final checksum must equal the
//! recorded one (same model, machine, data and arithmetic); [`faultline_fault::replay::trial`]
//! then draws the trial's fault again, checks it against the record and steps the instruction
//! the record reports on.
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
use faultline_fault::replay::{self, Options, Recorded, Summary, Trace, Wave};
use faultline_fault::{Campaign, CampaignSpec};
use faultline_hw::budget::HostMemory;
use serde::Deserialize;
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use vcd::{SimulationCommand, TimescaleUnit, Value, VarType};

pub use faultline_fault::replay::{Divergence, Outputs};

/// Most cycles written by default: a whole GEMM of the shipped models fits; a longer
/// instruction is cut to this many cycles around the fault.
pub const DEFAULT_WINDOW: u64 = 4096;

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
    /// What the replay found ([`faultline_fault::replay`]).
    pub trace: Summary,
    /// The registers (words) shown golden and faulty, e.g. `mxu.pe[3][5].psum`.
    pub shown: Vec<String>,
    /// The marker signals of the `trial` scope.
    pub markers: Vec<String>,
    /// Signals written: the golden and faulty copies counted apart, markers included.
    pub signals: usize,
    /// What the record says was corrupted (`None` when the campaign skipped the trial).
    pub recorded_corrupted: Option<usize>,
    /// The VCD written.
    pub out: PathBuf,
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
    let recorded = Recorded {
        trial: rec.trial,
        fault: &rec.fault,
        step: rec.step,
        skipped: rec.skipped,
        outcome: &rec.outcome,
        reported: rec.injection.as_ref().map(|r| (r.instr, r.corrupted)),
    };
    let opts = Options { sites: req.sites.clone(), window: req.window };
    let trace = replay::trial(&c, &recorded, &opts).map_err(|e| fail(e.to_string()))?;
    let comment = format!(
        "faultline vcd: trial {} of campaign `{}`: {}. Time: one unit per cycle of {} {} from its first cycle \
         (the machine's clock is {} MHz); values after each cycle's commit. Scopes golden and faulty hold the same \
         registers from the fault-free and the faulty run.",
        req.trial,
        info.spec.name,
        rec.fault,
        if trace.summary.inference { "the forward pass of test batch" } else { "training step" },
        rec.step,
        trace.summary.clock_mhz
    );
    let signals = write_vcd(&req.out, &trace.wave, &comment)?;
    Ok(Replay::new(&info.spec.name, req, rec, trace, signals))
}

impl Replay {
    /// The summary of `trace`, trial `req.trial` of campaign `campaign` (record `rec`),
    /// written to `req.out` as `signals` signals.
    fn new(campaign: &str, req: &VcdRequest, rec: RecordLine, trace: Trace, signals: usize) -> Replay {
        Replay {
            campaign: campaign.to_string(),
            trial: req.trial,
            fault: rec.fault,
            outcome: rec.outcome,
            skipped: rec.skipped,
            step: rec.step,
            shown: trace.wave.shown.iter().map(|s| s.name.clone()).collect(),
            markers: trace.wave.markers.iter().map(|m| format!("trial.{}", m.0)).collect(),
            signals,
            recorded_corrupted: rec.injection.as_ref().map(|r| r.corrupted),
            out: req.out.clone(),
            trace: trace.summary,
        }
    }
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

/// `1 word`, `7 words`.
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
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
        let clock = if self.trace.inference { format!("batch {}", self.step) } else { format!("step {}", self.step) };
        writeln!(f, "trial {} of campaign {}: {}", self.trial, self.campaign, self.fault)?;
        write!(f, "  recorded outcome: {}", self.outcome)?;
        match self.recorded_corrupted {
            _ if self.skipped => {
                writeln!(f, " (skipped as provably dead, without running; the replay runs it to show what happens)")?
            }
            Some(c) => {
                writeln!(f, ", {} corrupted", count(c, if self.trace.unit == "word" { "read" } else { "output word" }))?
            }
            None => writeln!(f)?,
        }
        writeln!(
            f,
            "  {}instruction {}: {}, cycles {}..{} of {clock}",
            if self.trace.unit == "word" { "first read by " } else { "" },
            self.trace.instr,
            self.trace.instr_name,
            self.trace.span.0,
            self.trace.span.1 - 1
        )?;
        let when = if self.trace.fault_cycles.1 - self.trace.fault_cycles.0 > 1 {
            format!("cycles {}..{}", self.trace.fault_cycles.0, self.trace.fault_cycles.1 - 1)
        } else {
            format!("cycle {}", self.trace.fault_cycles.0)
        };
        writeln!(f, "  the fault acts at {when} ({})", self.trace.lands)?;
        if self.trace.outputs.is_some() {
            writeln!(
                f,
                "  replayed at cycle level twice, fault-free and faulty: the fault-free run equals the functional \
                 model bit for bit, the faulty one the campaign's executor"
            )?;
        }
        match &self.trace.first_divergence {
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
                    if d.cycle == self.trace.fault_cycles.0 { " (the injected cycle)" } else { "" },
                    d.golden,
                    d.faulty
                )?;
            }
            None => writeln!(f, "  golden and faulty never differ: the fault does not change the {}", self.trace.unit)?,
        }
        if let (Some(last), Some(_)) = (self.trace.last_divergence, &self.trace.first_divergence) {
            let elements = if self.trace.unit == "array" { "PE" } else { "lane" };
            let elements = count(self.trace.touched, elements);
            write!(
                f,
                "  the error spreads to {elements} (at most {} wrong at once); ",
                count(self.trace.peak, "register")
            )?;
            let (is, differs) = if self.trace.unit == "array" { ("is", "differs") } else { ("are", "differ") };
            if last + 1 < self.trace.span.1 {
                writeln!(f, "the {} {is} fault-free again from cycle {}", self.trace.unit, last + 1)?;
            } else {
                writeln!(
                    f,
                    "the {} still {differs} when the instruction ends (the next one starts afresh)",
                    self.trace.unit
                )?;
            }
        }
        if self.trace.unit == "word" {
            writeln!(
                f,
                "  reads that see a changed word: {} of {}{}",
                self.trace.corrupted,
                self.trace.elements,
                self.recorded_corrupted.map_or(String::new(), |c| format!(" (the campaign recorded {c})"))
            )?;
        } else {
            let masked = if self.trace.corrupted == 0 { ": masked inside the hardware" } else { "" };
            writeln!(
                f,
                "  output words corrupted: {} of {}{}{masked}",
                self.trace.corrupted,
                self.trace.elements,
                self.recorded_corrupted.map_or(String::new(), |c| format!(" (the campaign recorded {c})"))
            )?;
        }
        for n in &self.trace.notes {
            writeln!(f, "  {n}")?;
        }
        writeln!(
            f,
            "wrote {}: {} signals (golden and faulty copies of {} {}, and {}), cycles {}..{} ({} cycles{})",
            self.out.display(),
            self.signals,
            self.shown.len(),
            if self.trace.unit == "word" { "word" } else { "registers" },
            self.markers.join(", "),
            self.trace.window.0,
            self.trace.window.1,
            self.trace.window.1 - self.trace.window.0 + 1,
            if self.trace.cut { ", cut to --window" } else { "" }
        )?;
        writeln!(
            f,
            "time axis: 1 unit = 1 cycle of {clock}, from its first cycle (the header says 1 ns; the clock is {} MHz, \
             {:.3} ns a cycle)",
            self.trace.clock_mhz,
            1e3 / self.trace.clock_mhz
        )?;
        if let Some(d) = &self.trace.first_divergence {
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
