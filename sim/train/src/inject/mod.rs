//! Faults on a training run's clock: a bit of a named site, struck at (training step, cycle
//! within the step).
//!
//! A [`StepFault`] is written `KIND:SITE@step=S,cycle=C` (a stuck-at adds `,for=N`, its cycles),
//! e.g. `flip:mxu.pe[31][0].psum[30]@step=5,cycle=400`. The step's program schedule says which
//! instructions the site's unit runs during the fault's cycles `[C, C + N)` (a flip: cycle `C`
//! alone) and [`faultline_hw::isa::fault_time`] which fold or vector of each the fault starts
//! in; those instructions run at cycle level with the fault (in each, from where it starts to
//! the instruction's end), and its effect is reported ([`InjectionReport`]): on the first of
//! them whose outputs it corrupts, else on the first. A fault whose cycles the site's unit
//! spends idle (the MXU while a VPU instruction runs, or before a GEMM's first fold) is masked:
//! every GEMM and VPU instruction loads its operand registers afresh, so an idle register's
//! upset is overwritten before use; a stuck-at that lasts into the unit's next instruction
//! forces the bit there too.
//!
//! Memory-word, weight-buffer and DMA-register faults change the buffer words the program
//! placed there ([`memory`]), and sequencer faults the fold loops of the GEMMs running then
//! ([`sequencer`]); a stuck-at does so in every read, transfer or GEMM its cycles overlap.
//!
//! # The fault path
//!
//! A unified-buffer word flip in a training campaign, from the trial to its outcome:
//! `Campaign::trial` → `Campaign::upset` (`Space::anchor`, `FaultModel::upset`) →
//! `Campaign::judge` → [`crate::Trainer::step_with_upset_from`] → [`run_upset`] → [`resolve_upset`] →
//! [`resolve`] → `resolve_memory` → [`memory::hits`] → [`Injection::Words`] →
//! [`crate::Executor::step_with_fault_from`] (from the first instruction that reads a changed
//! word, the golden step's buffers before it: [`crate::golden`]) → `exec::run` (the changed words applied as each
//! instruction reads them, [`memory::compose`]; a GEMM reading one fold by fold through
//! [`gemm_fold::run`]) → [`complete_on`] → (a protected word: the code's decoder,
//! `campaign::decode_upset`) → `Thresholds::classify`. A register fault takes
//! `resolve` → [`Injection::Registers`], its instructions run at cycle level
//! ([`faultline_hw::isa::execute_faulty`]); a sequencer fault `resolve_sequencer` →
//! [`Injection::Sequencer`], whose words [`sequencer::words`] finds when the step runs.

pub mod gemm_fold;
pub mod injection;
pub mod memory;
pub mod sequencer;
pub mod space;
pub mod traffic;

pub use injection::Injection;

use crate::error::{Result, TrainError};
use crate::exec::{Effect, Placed, StepOutput};
use faultline_graph::{Phase, StepSchedule};
use faultline_hw::fault::{ActiveFault, FaultTime};
use faultline_hw::isa::{self, ExecUnit, Instr};
use faultline_hw::{FaultEvent, FaultSchedule, FaultSite, Unit};
use faultline_num::BitFault;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The text form of a [`StepFault`], with examples, as quoted in parse errors.
pub const STEP_FAULT_FORM: &str = "KIND:SITE@step=S,cycle=C[,for=N] with KIND flip, stuck0 or stuck1 and \
    for=N (cycles, >= 1) for stuck-ats only, e.g. flip:mxu.pe[31][0].psum[30]@step=5,cycle=400 or \
    stuck1:vpu.lane[3].out[30]@step=2,cycle=1000,for=50";

/// One fault in a training run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepFault {
    /// Flip or stuck-at.
    pub kind: BitFault,
    /// The bit.
    pub site: FaultSite,
    /// Training step (1-based) it strikes in.
    pub step: u64,
    /// Cycle within that step, from the step's first instruction.
    pub cycle: u64,
    /// Cycles a stuck-at stays active (>= 1; 1 for a flip).
    pub duration: u64,
}

impl StepFault {
    /// The fault on its step's own clock (times counted from the step's first cycle), as the
    /// memory, DMA and sequencer models take it.
    pub fn on_step_clock(&self) -> ActiveFault {
        let at = FaultTime { tile: 0, cycle: self.cycle };
        FaultEvent { site: self.site, kind: self.kind, at, duration: self.duration }.activate(0)
    }
}

impl fmt::Display for StepFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}@step={},cycle={}", self.kind, self.site, self.step, self.cycle)?;
        if self.kind != BitFault::Flip {
            write!(f, ",for={}", self.duration)?;
        }
        Ok(())
    }
}

/// The text form of a fault in one op's run (`faultline op --fault`), as quoted in parse errors.
pub const OP_FAULT_FORM: &str = "KIND:SITE@cycle=C[,for=N] with KIND flip, stuck0 or stuck1, C the cycle of the op's \
    run and for=N (cycles, >= 1) for stuck-ats only, e.g. flip:ub.word[0x40][7]@cycle=150";

impl FromStr for StepFault {
    type Err = TrainError;
    fn from_str(s: &str) -> Result<StepFault> {
        StepFault::parse(s, false)
    }
}

impl StepFault {
    /// A fault in a run of one op ([`crate::kernel::Kernel`]), written as [`OP_FAULT_FORM`]
    /// says: a [`StepFault`] without `step` (the op is one step, step 1).
    pub fn parse_on_op(s: &str) -> Result<StepFault> {
        StepFault::parse(s, true)
    }

    /// Parses the text form, with `step` (a training run) or without (one op: step 1).
    fn parse(s: &str, op: bool) -> Result<StepFault> {
        let form = if op { OP_FAULT_FORM } else { STEP_FAULT_FORM };
        let bad = |why: String| TrainError::Config(format!("bad fault `{s}`: {why}; expected {form}"));
        let (what, when) = s.split_once('@').ok_or_else(|| bad("no `@`".into()))?;
        let (kind, site) = what.split_once(':').ok_or_else(|| bad("no `:` after the kind".into()))?;
        let kind: BitFault = kind.parse().map_err(|e: faultline_num::FaultKindParseError| bad(e.to_string()))?;
        let site: FaultSite = site.parse().map_err(|e: faultline_hw::HwError| bad(e.to_string()))?;
        let (mut step, mut cycle, mut duration) = (None, None, None);
        for part in when.split(',') {
            let (key, value) = part.split_once('=').ok_or_else(|| bad(format!("`{part}` is not key=value")))?;
            let v: u64 = value.parse().map_err(|_| bad(format!("`{value}` is not a plain decimal number")))?;
            let slot = match key {
                "step" if !op => &mut step,
                "cycle" => &mut cycle,
                "for" => &mut duration,
                _ if op => return Err(bad(format!("unknown key `{key}` (cycle, for)"))),
                _ => return Err(bad(format!("unknown key `{key}` (step, cycle, for)"))),
            };
            if slot.replace(v).is_some() {
                return Err(bad(format!("`{key}` given twice")));
            }
        }
        let step = if op { Some(1) } else { step.filter(|&s| s >= 1) };
        let step = step.ok_or_else(|| bad("`step` (>= 1) is required".into()))?;
        let cycle = cycle.ok_or_else(|| bad("`cycle` is required".into()))?;
        let duration = match (kind, duration) {
            (BitFault::Flip, None) => 1,
            (BitFault::Flip, Some(_)) => return Err(bad("a flip acts once and takes no `for`".into())),
            (_, Some(d)) if d >= 1 => d,
            (_, _) => return Err(bad("a stuck-at needs `for=N` cycles, N >= 1".into())),
        };
        Ok(StepFault { kind, site, step, cycle, duration })
    }
}

/// Where a [`StepFault`] landed in its step, and what it did to the instruction it hit (with
/// the site's unit idle: the instruction running on the other unit, or starting next). A fault
/// that reaches several instructions (a stuck-at outlasting one) is reported on the first
/// whose outputs it corrupts, else on the first: masked means the whole step was fault-free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InjectionReport {
    /// The fault, in its text form.
    pub fault: String,
    /// Index of the instruction reported on: the one the fault struck (for a register or
    /// sequencer fault reaching several, the one whose effect is reported), or the first
    /// reader of a changed word.
    pub instr: usize,
    /// That instruction's name (`gemm`, or the VPU op).
    pub op: String,
    /// The graph node it computes (part of), with `(tile k/n)` for a tile of a cut instruction.
    pub node: String,
    /// The node's phase.
    pub phase: Phase,
    /// The node's layer.
    pub layer: String,
    /// Whether the faulted site's unit is running that instruction (else the fault is masked).
    pub unit_busy: bool,
    /// The fold (GEMM) or vector (VPU) the fault starts in there, when the unit is busy; for a
    /// sequencer fault, the first fold slot whose loop it changes; for a memory word a GEMM
    /// reads fold by fold (a VPU op element by element), the first fold (vector) that reads
    /// the changed word.
    pub tile: Option<usize>,
    /// Cycle from that tile's origin (0 for a sequencer fault that strikes before the slot).
    pub tile_cycle: Option<u64>,
    /// Output words of the instruction.
    pub elements: usize,
    /// Output words whose bits differ from the fault-free run (0: masked inside the hardware).
    pub corrupted: usize,
    /// Largest absolute error among them (infinite where either value is not finite; JSON
    /// spells it `"Infinity"`, [`faultline_num::json`]).
    #[serde(with = "faultline_num::json")]
    pub max_abs_error: f64,
    /// Largest relative error among them (infinite against a golden 0).
    #[serde(with = "faultline_num::json")]
    pub max_rel_error: f64,
    /// The buffer (tensor) the instruction writes: the first one the fault can corrupt.
    pub buffer: String,
}

impl InjectionReport {
    /// The fault never left the hardware.
    pub fn masked(&self) -> bool {
        self.corrupted == 0
    }

    /// The report of `f` placed on instruction `instr`, before anything is measured: no tile,
    /// nothing corrupted, the instruction's outputs and the first buffer it writes.
    fn placed(exec: &dyn Placed, fault: String, instr: usize) -> InjectionReport {
        let p = exec.program();
        let (ins, tag) = (&p.instrs[instr], &p.tags[instr]);
        InjectionReport {
            fault,
            instr,
            op: ins.name().to_string(),
            node: format!("{}{}", exec.graph().node(tag.node).name, tag.tile_suffix()),
            phase: tag.phase,
            layer: tag.layer.clone(),
            unit_busy: false,
            tile: None,
            tile_cycle: None,
            elements: ins.out_len() * ins.writes().len(),
            corrupted: 0,
            max_abs_error: 0.0,
            max_rel_error: 0.0,
            buffer: p.buffers[ins.writes()[0].index()].name.clone(),
        }
    }

    /// Whether the fault is on a memory word or a DMA register (counted in word reads, not
    /// instruction outputs).
    fn memory_site(&self) -> bool {
        self.site().is_some_and(|s| ExecUnit::of(s.unit).is_none() && s.unit != Unit::Seq)
    }

    /// The faulted site, from the fault's text form.
    fn site(&self) -> Option<FaultSite> {
        let site = self.fault.split_once(':').and_then(|(_, r)| r.split_once('@')).map(|(s, _)| s);
        site.and_then(|s| FaultSite::from_str(s).ok())
    }
}

impl fmt::Display for InjectionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = match (self.tile, self.tile_cycle) {
            (Some(t), _) if self.memory_site() && self.op == "gemm" => format!("memory word read, first by fold {t}"),
            (Some(t), _) if self.memory_site() => format!("memory word read, first by vector {t}"),
            (Some(t), Some(c)) => format!("tile {t}, cycle {c}"),
            _ if self.unit_busy => "memory word read".into(),
            _ if self.memory_site() => "no live word".into(),
            _ if self.site().is_some_and(|s| s.unit == Unit::Seq) => "register not in use".into(),
            _ => "its unit idle".into(),
        };
        write!(
            f,
            "{} -> instruction {} ({} of {}, {} phase, layer {}; {at}): ",
            self.fault, self.instr, self.op, self.node, self.phase, self.layer
        )?;
        if self.masked() && self.memory_site() && self.elements == 0 {
            write!(f, "masked in hardware (no value is read from the word after the fault)")
        } else if self.masked() {
            write!(f, "masked in hardware ({} outputs bit-identical)", self.elements)
        } else if self.memory_site() {
            write!(
                f,
                "{} of {} word reads see a changed word of `{}`, max abs error {:.3e}, max rel error {:.3e}",
                self.corrupted, self.elements, self.buffer, self.max_abs_error, self.max_rel_error
            )
        } else {
            write!(
                f,
                "{} of {} outputs of `{}` corrupted, max abs error {:.3e}, max rel error {:.3e}",
                self.corrupted, self.elements, self.buffer, self.max_abs_error, self.max_rel_error
            )
        }
    }
}

/// Resolves `f` against the step program of `exec` (with schedule `sched`): the injection to
/// run, or `None` when the site's unit is idle at that cycle, plus the report's placement part
/// (effect fields zero until [`complete`] fills them).
pub fn resolve(exec: &dyn Placed, sched: &StepSchedule, f: &StepFault) -> Result<(Option<Injection>, InjectionReport)> {
    let bad = |why: String| TrainError::Config(format!("fault `{f}`: {why}"));
    f.site.validate(exec.hw())?;
    if f.cycle >= sched.total_cycles {
        return Err(bad(format!("cycle {} is after the step ends at cycle {}", f.cycle, sched.total_cycles)));
    }
    let Some(unit) = ExecUnit::of(f.site.unit) else {
        return if f.site.unit == Unit::Seq {
            resolve_sequencer(exec, sched, f)
        } else {
            resolve_memory(exec, sched, f)
        };
    };
    let p = exec.program();
    let struck = register_faults(exec, sched, unit, f)?;
    // The report names the first instruction the fault reaches; with none, the instruction
    // the site's unit runs then (idle: the one the other unit runs, or the next to start).
    let instr = match struck.first() {
        Some(&(i, _)) => i,
        None => sched.locate(unit, f.cycle).map(|(i, _)| i).unwrap_or_else(|| {
            let other = if unit == ExecUnit::Mxu { ExecUnit::Vpu } else { ExecUnit::Mxu };
            sched
                .locate(other, f.cycle)
                .map(|(i, _)| i)
                .or_else(|| sched.instrs.iter().position(|c| c.start > f.cycle))
                .unwrap_or(p.instrs.len() - 1)
        }),
    };
    let time = struck.first().map(|(_, s)| s.events[0].at);
    let report = InjectionReport {
        unit_busy: time.is_some(),
        tile: time.map(|t| t.tile),
        tile_cycle: time.map(|t| t.cycle),
        ..InjectionReport::placed(exec, f.to_string(), instr)
    };
    Ok((Injection::registers(struck), report))
}

/// The instructions register fault `f` on `unit` reaches, each with the fault on its own
/// clock, in program order: every instruction of the unit whose span overlaps the fault's
/// cycles. In each the fault starts at the first of those cycles that has a fold or vector
/// ([`isa::fault_time`]) and stops at the instruction's end: the next instruction loads its
/// registers afresh, and the stuck-at goes on forcing the bit there.
fn register_faults(
    exec: &dyn Placed,
    sched: &StepSchedule,
    unit: ExecUnit,
    f: &StepFault,
) -> Result<Vec<(usize, FaultSchedule)>> {
    let active = f.on_step_clock();
    let mut struck = Vec::new();
    for (i, c) in sched.instrs.iter().enumerate() {
        let end = c.start.saturating_add(c.cycles);
        if c.unit != unit || !active.acts_between(c.start, end) {
            continue;
        }
        let (from, to) = (active.start.max(c.start) - c.start, active.end.min(end) - c.start);
        let Some((local, at)) = first_fault_time(exec, &exec.program().instrs[i], from, to)? else { continue };
        let event = FaultEvent { site: f.site, kind: f.kind, at, duration: to - local };
        struck.push((i, FaultSchedule::one(event)));
    }
    Ok(struck)
}

/// The first cycle in `[from, to)` of `ins` (from its issue) at which a register fault has a
/// fold or vector to count from, with that time; `None` if no cycle there has one.
fn first_fault_time(exec: &dyn Placed, ins: &Instr, from: u64, to: u64) -> Result<Option<(u64, FaultTime)>> {
    if from >= to {
        return Ok(None);
    }
    if let Some(t) = isa::fault_time(exec.hw(), ins, from)? {
        return Ok(Some((from, t)));
    }
    // Before a GEMM's first fold (or past its end) nothing holds the register: the fault
    // waits for the next fold to start.
    if let Instr::Gemm { m, k, n, .. } = ins {
        let s = faultline_hw::mxu::Schedule::new(&exec.hw().mxu, *m, *k, *n)?;
        if let Some(c) = s.folds.iter().map(|fo| fo.start).find(|&c| c > from && c < to) {
            return Ok(isa::fault_time(exec.hw(), ins, c)?.map(|t| (c, t)));
        }
    }
    Ok(None)
}

/// Resolves an upset of several bits struck together: bits of one register or word, or the
/// same bit of neighbouring elements, all with one kind, step, cycle and duration on one unit.
/// Register bits join the fault schedules of the instructions they reach; memory and DMA bits
/// join their word hits (two bits of one word compose, as the hits apply in turn). The report
/// names every bit (`+`-joined) and places the upset where its first effective bit lands.
pub fn resolve_upset(
    exec: &dyn Placed,
    sched: &StepSchedule,
    faults: &[StepFault],
) -> Result<(Option<Injection>, InjectionReport)> {
    let Some((first, rest)) = faults.split_first() else {
        return Err(TrainError::Config("an upset needs at least one bit".into()));
    };
    let same = |f: &StepFault| {
        (f.kind, f.step, f.cycle, f.duration, f.site.unit)
            == (first.kind, first.step, first.cycle, first.duration, first.site.unit)
    };
    if let Some(f) = rest.iter().find(|f| !same(f)) {
        return Err(TrainError::Config(format!(
            "upset `{first}` + `{f}`: the bits of one upset strike one unit with one kind at one step and cycle"
        )));
    }
    if !rest.is_empty() && first.site.unit == Unit::Seq {
        return Err(TrainError::Config(format!("upset at `{first}`: sequencer faults are single-bit")));
    }
    let (mut injection, mut report) = resolve(exec, sched, first)?;
    for f in rest {
        let (inj, rep) = resolve(exec, sched, f)?;
        let Some(inj) = inj else { continue };
        match injection.as_mut() {
            None => (injection, report) = (Some(inj), rep),
            Some(acc) => {
                let placed = inj.instr();
                let earlier = sched.instrs[placed].start < sched.instrs[acc.instr()].start;
                // Register bits of one unit and time reach the same instructions at the same
                // times: their events join there. Word hits join, the injection placed on the
                // earliest instruction any bit reaches (register faults already are).
                if acc.join(inj).is_err() {
                    return Err(TrainError::Config(format!("upset at `{first}`: its bits resolve to different kinds")));
                }
                if let (true, Injection::Words { first: on, .. }) = (earlier, &mut *acc) {
                    *on = placed;
                }
                if earlier && acc.instr() == placed {
                    (report.instr, report.op, report.node) = (rep.instr, rep.op, rep.node);
                    (report.phase, report.layer) = (rep.phase, rep.layer);
                }
                report.tile = match (report.tile, rep.tile) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                if report.memory_site() {
                    report.elements += rep.elements;
                }
            }
        }
    }
    report.fault = faults.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(" + ");
    Ok((injection, report))
}

/// [`resolve`] for a memory or DMA site: the words the fault changes ([`memory`]), reported
/// against the DMA transfer it struck or the first instruction that reads a changed word (the
/// instruction running then if none does: the fault is masked).
fn resolve_memory(
    exec: &dyn Placed,
    sched: &StepSchedule,
    f: &StepFault,
) -> Result<(Option<Injection>, InjectionReport)> {
    let p = exec.program();
    let map = memory::StepMap::new(p, sched, exec.hw())?;
    let (dma, words) = memory::hits(&map, f.on_step_clock())?;
    let first_reader = words.iter().filter_map(|h| h.instr).min_by_key(|&i| (sched.instrs[i].start, i));
    let instr = dma.or(first_reader).or(running(sched, f.cycle)).unwrap_or(0);
    let buffer = words.first().map_or_else(|| "(none)".to_string(), |h| p.buffers[h.buf.index()].name.clone());
    // A GEMM reading the word fold by fold, or a VPU op element by element (parts `operand *
    // n + element`): the first fold or vector that sees the change.
    let parts = words.iter().filter(|h| h.instr == Some(instr)).filter_map(|h| h.part);
    let fold = match &p.instrs[instr] {
        faultline_hw::isa::Instr::Vpu { n, .. } => parts.map(|q| (q % n) / exec.hw().vpu.lanes).min(),
        _ => parts.min(),
    };
    let report = InjectionReport {
        unit_busy: !words.is_empty(),
        tile: fold,
        elements: words.len(),
        buffer,
        ..InjectionReport::placed(exec, f.to_string(), instr)
    };
    let injection = (!words.is_empty()).then(|| Injection::words(instr, words));
    Ok((injection, report))
}

/// [`resolve`] for a sequencer site: every GEMM whose span the fault overlaps and whose fold
/// loop it changes ([`sequencer::strikes`]), reported against the first; else masked, reported
/// against the GEMM (or, with the MXU idle, the instruction) running at the fault's cycle.
fn resolve_sequencer(
    exec: &dyn Placed,
    sched: &StepSchedule,
    f: &StepFault,
) -> Result<(Option<Injection>, InjectionReport)> {
    let p = exec.program();
    let active = f.on_step_clock();
    let map = memory::StepMap::new(p, sched, exec.hw())?;
    let mut struck = Vec::new();
    for (g, c) in sched.instrs.iter().enumerate() {
        if c.unit == ExecUnit::Mxu && active.acts_between(c.start, c.start.saturating_add(c.cycles)) {
            if let Some(at) = sequencer::strikes(&map, g, active)? {
                struck.push((g, at));
            }
        }
    }
    let first = struck.first().copied();
    let gemm = sched.locate(ExecUnit::Mxu, f.cycle).map(|(g, _)| g);
    let instr = first.map(|(g, _)| g).or(gemm).or(running(sched, f.cycle)).unwrap_or(0);
    let report = InjectionReport {
        unit_busy: first.is_some(),
        tile: first.map(|(_, (slot, _))| slot),
        tile_cycle: first.map(|(_, (_, c))| c),
        ..InjectionReport::placed(exec, f.to_string(), instr)
    };
    Ok((Injection::sequencer_in(struck.iter().map(|&(g, _)| g).collect(), active), report))
}

/// The first instruction (in program order) running at `cycle` of the step, on any unit.
fn running(sched: &StepSchedule, cycle: u64) -> Option<usize> {
    ExecUnit::ALL.iter().filter_map(|&u| sched.locate(u, cycle)).map(|(i, _)| i).min()
}

/// Runs a program of `exec` (schedule `sched`) through `run` with `upset` injected (no bits:
/// fault-free, no report): resolved before ([`resolve_upset`]) and reported after from what
/// `run` measured ([`complete_on`]). Training steps and inference passes share this.
pub fn run_upset(
    exec: &dyn Placed,
    sched: &StepSchedule,
    upset: &[StepFault],
    run: impl FnOnce(Option<&Injection>) -> Result<StepOutput>,
) -> Result<(StepOutput, Option<InjectionReport>)> {
    let (injection, report) = match upset {
        [] => (None, None),
        bits => {
            let (i, r) = resolve_upset(exec, sched, bits)?;
            (i, Some(r))
        }
    };
    let out = run(injection.as_ref())?;
    let report = report.map(|r| complete_on(exec, sched, injection.as_ref(), r, out.effect.as_ref())).transpose()?;
    Ok((out, report))
}

/// [`complete`] for an injection that may reach several instructions (a stuck-at outlasting
/// one): the report is first moved onto the instruction whose effect the executor measured
/// (the first faulted one whose outputs the fault corrupted, else the first: see
/// [`Effect`]), with the fold or vector the fault starts in there, so that a masked report
/// means the whole step ran fault-free.
pub fn complete_on(
    exec: &dyn Placed,
    sched: &StepSchedule,
    injection: Option<&Injection>,
    mut report: InjectionReport,
    effect: Option<&Effect>,
) -> Result<InjectionReport> {
    if let (Some(inj), Some(e)) = (injection, effect) {
        // Word injections are reported where they were resolved; only register and sequencer
        // faults are placed on instructions one by one.
        let moved = e.instr != report.instr && inj.instrs().any(|i| i == e.instr);
        if moved && !matches!(inj, Injection::Words { .. }) {
            let at = match inj {
                Injection::Sequencer { fault, .. } => {
                    let map = memory::StepMap::new(exec.program(), sched, exec.hw())?;
                    sequencer::strikes(&map, e.instr, *fault)?.map(|(tile, cycle)| FaultTime { tile, cycle })
                }
                _ => inj.register_faults(e.instr).and_then(|s| s.events.first()).map(|ev| ev.at),
            };
            let fault = std::mem::take(&mut report.fault);
            report = InjectionReport {
                unit_busy: report.unit_busy,
                tile: at.map(|t| t.tile),
                tile_cycle: at.map(|t| t.cycle),
                ..InjectionReport::placed(exec, fault, e.instr)
            };
        }
    }
    Ok(complete(report, effect))
}

/// Fills the effect fields of a report from what the executor measured (the report stays on
/// the instruction it was resolved to: see [`complete_on`] for faults reaching several).
pub fn complete(mut report: InjectionReport, effect: Option<&Effect>) -> InjectionReport {
    if let Some(e) = effect {
        report.elements = e.elements;
        report.corrupted = e.corrupted;
        report.max_abs_error = e.max_abs_error;
        report.max_rel_error = e.max_rel_error;
        report.buffer = e.buffer.clone();
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_parses_prints_and_refuses_what_it_should() {
        let f: StepFault = "flip:mxu.pe[31][0].psum[30]@step=5,cycle=400".parse().unwrap();
        assert_eq!((f.kind, f.step, f.cycle, f.duration), (BitFault::Flip, 5, 400, 1));
        assert_eq!(f.to_string(), "flip:mxu.pe[31][0].psum[30]@step=5,cycle=400");
        let g: StepFault = "stuck1:vpu.lane[3].out[30]@cycle=7,step=2,for=50".parse().unwrap();
        assert_eq!(g.to_string(), "stuck1:vpu.lane[3].out[30]@step=2,cycle=7,for=50");
        assert_eq!(g.to_string().parse::<StepFault>().unwrap(), g);
        for (text, why) in [
            ("flip:mxu.pe[0][0].psum[3]", "no `@`"),
            ("flip:mxu.pe[0][0].psum[3]@step=0,cycle=1", "`step` (>= 1)"),
            ("flip:mxu.pe[0][0].psum[3]@step=1", "`cycle` is required"),
            ("flip:mxu.pe[0][0].psum[3]@step=1,cycle=2,for=3", "takes no `for`"),
            ("stuck0:mxu.pe[0][0].psum[3]@step=1,cycle=2", "needs `for=N`"),
            ("stuck0:mxu.pe[0][0].psum[3]@step=1,cycle=2,for=0", "needs `for=N`"),
            ("flip:mxu.pe[0][0].psum[3]@step=1,step=2,cycle=1", "given twice"),
            ("flip:mxu.pe[0][0].psum[3]@step=1,tile=2", "unknown key `tile`"),
            ("flip:mxu.pe[0][0].psum[3]@step=1,cycle=-2", "plain decimal"),
            ("zap:mxu.pe[0][0].psum[3]@step=1,cycle=2", "unknown fault kind"),
            ("flip:mxu.pe[0][0].nope[3]@step=1,cycle=2", "nope"),
        ] {
            let e = text.parse::<StepFault>().unwrap_err().to_string();
            assert!(e.contains(why) && !e.contains('\n'), "{text}: {e}");
        }
    }
}
