//! One trial of a campaign replayed at cycle level: golden and faulty register (or memory
//! word) values cycle by cycle, side by side, as `faultline vcd` writes them
//! (`faultline_report::vcd` reads the campaign's files and writes the waveform).
//!
//! # How a trial is replayed
//!
//! The caller prepares the campaign again ([`Campaign::prepare_with`]) from the spec it ran
//! and checks its golden run against the recorded one; [`trial`] then draws the trial's fault
//! again (its text must equal the record's). The fault is resolved on the injection step's
//! program as the campaign resolved it ([`inject::resolve_upset`]), and the instruction the
//! record reports on gets its operands from a fault-free run of the step up to it
//! ([`Trainer::buffers_before`]): the golden run's state before the step and the step's
//! batch. That instruction is then stepped at cycle level twice, fault-free and with the
//! fault, in lockstep (one state of each per cycle; no history is kept beyond the signals
//! kept). The replay checks itself: the fault-free run must equal the functional model bit
//! for bit, the faulty one the executor's own injected run of the instruction, and its count
//! of corrupted output words the record's (`registers.rs`).
//!
//! A memory-word fault (unified buffer, accumulators, weight buffer, DRAM) is not stepped:
//! [`memory`] finds the element living in the word and the reads that see the change, and
//! the word's golden and faulty values follow from the buffers before its first reader
//! (`word.rs`). Sequencer and DMA address-register faults act on a whole fold loop or transfer
//! and are not replayed (an error says so).

mod registers;
mod word;

use crate::spec::Mode;
use crate::{Campaign, FaultError, Result};
use faultline_graph::StepSchedule;
use faultline_hw::{FaultSite, HwConfig, Register, Unit};
use faultline_num::NumFormat;
use faultline_train::inject::{self, memory};
use faultline_train::{Executor, ModelState, Trainer};

/// What the trial's record says, as the replay checks it.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded<'a> {
    /// The trial.
    pub trial: u64,
    /// The fault, as the record writes it.
    pub fault: &'a str,
    /// Injection step (an inference campaign's test batch).
    pub step: u64,
    /// The campaign skipped the trial as provably dead.
    pub skipped: bool,
    /// The outcome the campaign recorded.
    pub outcome: &'a str,
    /// The injection report's instruction and corrupted count (`None` for a skipped trial).
    pub reported: Option<(usize, usize)>,
}

/// What to show.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// More registers to show: globs over register names, as `faultline sites` writes sites
    /// without the bit (`mxu.pe[0][*].psum`, `vpu.lane[*].out`), of the unit the fault is in.
    pub sites: Vec<String>,
    /// Most cycles to keep (at least 1): a longer instruction is cut to this many, an eighth
    /// of them before the fault.
    pub window: u64,
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

/// The outputs of a replayed instruction (every destination's words, in
/// [`faultline_hw::isa::Instr::dests`] order), as the replay and the executor computed them.
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

/// What a replay found, and the values it kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// What it found.
    pub summary: Summary,
    /// The values, cycle by cycle.
    pub wave: Wave,
}

/// What a replay found: the instruction, where the fault lands, how far it spread.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
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
    /// Step cycles kept, `[first, last]`.
    pub window: (u64, u64),
    /// Whether the instruction was cut to the window.
    pub cut: bool,
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
    /// The machine's clock, MHz.
    pub clock_mhz: f64,
    /// Further remarks (a stuck-at reaching more instructions, elements not shown).
    pub notes: Vec<String>,
}

/// A register (or memory word) shown golden and faulty.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// Its site, bit 0.
    pub site: FaultSite,
    /// `mxu.pe[3][5].psum`.
    pub name: String,
    /// Scopes of its name, indices joined with `_` (a VCD identifier cannot hold `[`):
    /// `["mxu", "pe_3_5"]`.
    pub path: Vec<String>,
    /// The last part of its name: `psum`.
    pub var: String,
    /// Bits.
    pub width: u32,
    /// Number format of its bits, for messages (`None`: control bits).
    pub format: Option<NumFormat>,
}

impl Shown {
    /// The register `site` names (its bit ignored) on `hw`.
    pub fn new(hw: &HwConfig, site: FaultSite) -> Shown {
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
    pub fn show(&self, bits: u32) -> String {
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

/// What one replay keeps: per cycle, the shown pairs and the markers.
#[derive(Debug, Clone, PartialEq)]
pub struct Wave {
    /// Step cycle of the first sample.
    pub first: u64,
    /// Samples (cycles).
    pub len: usize,
    /// The pairs.
    pub shown: Vec<Shown>,
    /// `len x shown` golden values (`None`: unknown).
    pub golden: Vec<Option<u32>>,
    /// `len x shown` faulty values.
    pub faulty: Vec<Option<u32>>,
    /// The `trial` scope's signals: name, width, one value per sample.
    pub markers: Vec<(String, u32, Vec<Option<u32>>)>,
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

/// A [`FaultError::Replay`] with `what` as its message.
fn fail(what: impl Into<String>) -> FaultError {
    FaultError::Replay(what.into())
}

/// Replays trial `rec.trial` of `c` (see the module docs): refuses a fault whose text is no
/// longer what the campaign draws, one on check bits, sequencer and DMA registers, and one
/// that reaches no instruction; else steps the instruction (or follows the word) the record
/// reports on.
pub fn trial(c: &Campaign, rec: &Recorded, opts: &Options) -> Result<Trace> {
    if matches!(c.info.spec.sampling, crate::spec::Sampling::Adaptive { .. }) {
        return Err(fail(
            "the campaign samples Adaptive: its trials' faults depend on rounds planned from its records, which a \
             replay does not re-plan yet; replay a trial of a Uniform or Stratified campaign",
        ));
    }
    let (anchor, upset) = c.upset(rec.trial);
    let text = upset.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(" + ");
    if text != rec.fault {
        return Err(fail(format!(
            "the campaign's inputs changed since it ran: trial {} now draws `{text}`, records.jsonl has `{}`",
            rec.trial, rec.fault
        )));
    }
    let site = upset[0].site;
    if anchor.check_bits > 0 {
        return Err(fail(format!(
            "trial {} struck the check bits of a code ({}): they hold no value the machine computes with, so              there is no waveform to show; its record says what the code did",
            rec.trial,
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
            rec.trial
        )));
    }
    let inference = c.spec().mode == Mode::Inference;
    let src = Source::of(c, rec, inference)?;
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
            rec.trial,
            rec.fault,
            rec.outcome,
            if rec.skipped { ", skipped as provably dead" } else { "" }
        )));
    };
    let mut trace = match site.unit {
        Unit::Mxu | Unit::Vpu => registers::replay(opts, &src, &upset, &inj, rec)?,
        _ => word::replay(opts, &src, &upset, &inj)?,
    };
    trace.summary.inference = inference;
    Ok(trace)
}

/// Where a replay's program, schedule and operands come from.
enum Source<'a> {
    /// A training campaign: a trainer at the golden state before the injection step.
    Train(Box<Trainer>),
    /// An inference campaign: its forward program on one test batch.
    Infer { exec: &'a Executor, sched: &'a StepSchedule, state: &'a ModelState, x: &'a [f32] },
}

impl<'a> Source<'a> {
    /// The program, schedule and state of `c` at the injection step (test batch) of `rec`.
    fn of(c: &'a Campaign, rec: &Recorded, inference: bool) -> Result<Source<'a>> {
        Ok(if inference {
            let (exec, sched, state, x) = c.inference_batch(rec.step).ok_or_else(|| {
                fail(format!("trial {}: test batch {} is not one faults strike", rec.trial, rec.step))
            })?;
            Source::Infer { exec, sched, state, x }
        } else {
            let before = c
                .golden_before(rec.step)
                .ok_or_else(|| fail(format!("trial {}: step {} is not an injection step", rec.trial, rec.step)))?;
            let mut tr = c.trainer();
            tr.restore_snapshot(before);
            Source::Train(Box::new(tr))
        })
    }

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
