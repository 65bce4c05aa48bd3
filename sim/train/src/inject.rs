//! Faults on a training run's clock: a bit of a named site, struck at (training step, cycle
//! within the step).
//!
//! A [`StepFault`] is written `KIND:SITE@step=S,cycle=C` (a stuck-at adds `,for=N`, its cycles),
//! e.g. `flip:mxu.pe[31][0].psum[30]@step=5,cycle=400`. The step's program schedule says which
//! instruction the site's unit runs at that cycle ([`faultline_graph::StepSchedule::locate`]) and
//! [`faultline_hw::isa::fault_time`] which fold or vector of it; that instruction runs at cycle
//! level with the fault, and its effect on the instruction's outputs is reported
//! ([`InjectionReport`]). A fault on a unit that is idle at that cycle (the MXU while a VPU
//! instruction runs, or before a GEMM's first fold) is masked: every GEMM and VPU instruction
//! loads its operand registers afresh, so an idle register's upset is overwritten before use.
//!
//! A register fault's stuck-at acts within the instruction it starts in. Memory-word,
//! weight-buffer and DMA-register faults change the buffer words the program placed there
//! ([`memfault`]); sequencer faults change the fold loop of the GEMM running then
//! ([`seqfault`]).

use crate::error::{Result, TrainError};
use crate::exec::{Effect, Executor, Injection};
use crate::memfault;
use crate::seqfault;
use faultline_graph::{Phase, StepSchedule};
use faultline_hw::fault::{ActiveFault, FaultTime};
use faultline_hw::isa::{self, ExecUnit};
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

impl FromStr for StepFault {
    type Err = TrainError;
    fn from_str(s: &str) -> Result<StepFault> {
        let bad = |why: String| TrainError::Config(format!("bad fault `{s}`: {why}; expected {STEP_FAULT_FORM}"));
        let (what, when) = s.split_once('@').ok_or_else(|| bad("no `@`".into()))?;
        let (kind, site) = what.split_once(':').ok_or_else(|| bad("no `:` after the kind".into()))?;
        let kind: BitFault = kind.parse().map_err(|e: faultline_num::FaultKindParseError| bad(e.to_string()))?;
        let site: FaultSite = site.parse().map_err(|e: faultline_hw::HwError| bad(e.to_string()))?;
        let (mut step, mut cycle, mut duration) = (None, None, None);
        for part in when.split(',') {
            let (key, value) = part.split_once('=').ok_or_else(|| bad(format!("`{part}` is not key=value")))?;
            let v: u64 = value.parse().map_err(|_| bad(format!("`{value}` is not a plain decimal number")))?;
            let slot = match key {
                "step" => &mut step,
                "cycle" => &mut cycle,
                "for" => &mut duration,
                _ => return Err(bad(format!("unknown key `{key}` (step, cycle, for)"))),
            };
            if slot.replace(v).is_some() {
                return Err(bad(format!("`{key}` given twice")));
            }
        }
        let step = step.filter(|&s| s >= 1).ok_or_else(|| bad("`step` (>= 1) is required".into()))?;
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
/// the site's unit idle: the instruction running on the other unit, or starting next).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InjectionReport {
    /// The fault, in its text form.
    pub fault: String,
    /// Index of the instruction issuing at the fault's cycle.
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
    /// The fold (GEMM) or vector (VPU) the cycle falls in, when the unit is busy; for a
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
    /// Largest absolute error among them.
    pub max_abs_error: f64,
    /// Largest relative error among them.
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
    fn placed(exec: &Executor, f: &StepFault, instr: usize) -> InjectionReport {
        let p = exec.program();
        let (ins, tag) = (&p.instrs[instr], &p.tags[instr]);
        InjectionReport {
            fault: f.to_string(),
            instr,
            op: ins.name().to_string(),
            node: format!("{}{}", exec.tg.graph.node(tag.node).name, tag.tile_suffix()),
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
pub fn resolve(exec: &Executor, sched: &StepSchedule, f: &StepFault) -> Result<(Option<Injection>, InjectionReport)> {
    let bad = |why: String| TrainError::Config(format!("fault `{f}`: {why}"));
    f.site.validate(&exec.hw)?;
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
    // The instruction the site's unit runs then; with the unit idle, the one the other unit
    // runs (or the next to start), for the report.
    let (instr, local, busy) = match sched.locate(unit, f.cycle) {
        Some((i, local)) => (i, local, true),
        None => {
            let other = if unit == ExecUnit::Mxu { ExecUnit::Vpu } else { ExecUnit::Mxu };
            let i = sched
                .locate(other, f.cycle)
                .map(|(i, _)| i)
                .or_else(|| sched.instrs.iter().position(|c| c.start > f.cycle))
                .unwrap_or(sched.instrs.len() - 1);
            (i, 0, false)
        }
    };
    let ins = &p.instrs[instr];
    let time = if busy { isa::fault_time(&exec.hw, ins, local)? } else { None };
    let report = InjectionReport {
        unit_busy: time.is_some(),
        tile: time.map(|t| t.tile),
        tile_cycle: time.map(|t| t.cycle),
        ..InjectionReport::placed(exec, f, instr)
    };
    let injection = time.map(|at| {
        // A stuck-at acts within the instruction it starts in.
        let left = sched.instrs[instr].cycles - local;
        let event = FaultEvent { site: f.site, kind: f.kind, at, duration: f.duration.min(left).max(1) };
        Injection::register(instr, FaultSchedule::one(event))
    });
    Ok((injection, report))
}

/// Resolves an upset of several bits struck together: bits of one register or word, or the
/// same bit of neighbouring elements, all with one kind, step, cycle and duration on one unit.
/// Register bits join one instruction's fault schedule; memory and DMA bits join their word
/// hits (two bits of one word compose, as the hits apply in turn). The report names every bit
/// (`+`-joined) and places the upset where its first effective bit lands.
pub fn resolve_upset(
    exec: &Executor,
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
                acc.faults.events.extend(inj.faults.events);
                acc.words.extend(inj.words);
                if sched.instrs[inj.instr].start < sched.instrs[acc.instr].start && acc.faults.is_empty() {
                    acc.instr = inj.instr;
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

/// [`resolve`] for a memory or DMA site: the words the fault changes ([`memfault`]), reported
/// against the DMA transfer it struck or the first instruction that reads a changed word (the
/// instruction running then if none does: the fault is masked).
fn resolve_memory(
    exec: &Executor,
    sched: &StepSchedule,
    f: &StepFault,
) -> Result<(Option<Injection>, InjectionReport)> {
    let p = exec.program();
    let map = memfault::StepMap::new(p, sched, &exec.hw)?;
    let (dma, words) = memfault::hits(&map, f.on_step_clock())?;
    let first_reader = words.iter().filter_map(|h| h.instr).min_by_key(|&i| (sched.instrs[i].start, i));
    let instr = dma.or(first_reader).or(running(sched, f.cycle)).unwrap_or(0);
    let buffer = words.first().map_or_else(|| "(none)".to_string(), |h| p.buffers[h.buf.index()].name.clone());
    // A GEMM reading the word fold by fold, or a VPU op element by element (parts `operand *
    // n + element`): the first fold or vector that sees the change.
    let parts = words.iter().filter(|h| h.instr == Some(instr)).filter_map(|h| h.part);
    let fold = match &p.instrs[instr] {
        faultline_hw::isa::Instr::Vpu { n, .. } => parts.map(|q| (q % n) / exec.hw.vpu.lanes).min(),
        _ => parts.min(),
    };
    let report = InjectionReport {
        unit_busy: !words.is_empty(),
        tile: fold,
        elements: words.len(),
        buffer,
        ..InjectionReport::placed(exec, f, instr)
    };
    let injection = (!words.is_empty()).then(|| Injection::words(instr, words));
    Ok((injection, report))
}

/// [`resolve`] for a sequencer site: the GEMM running at the fault's cycle, if the fault
/// changes its fold loop ([`seqfault::strikes`]); else masked, reported against the
/// instruction running then.
fn resolve_sequencer(
    exec: &Executor,
    sched: &StepSchedule,
    f: &StepFault,
) -> Result<(Option<Injection>, InjectionReport)> {
    let p = exec.program();
    let active = f.on_step_clock();
    let map = memfault::StepMap::new(p, sched, &exec.hw)?;
    let gemm = sched.locate(ExecUnit::Mxu, f.cycle).map(|(g, _)| g);
    let struck = match gemm {
        Some(g) => seqfault::strikes(&map, g, active)?.map(|at| (g, at)),
        None => None,
    };
    let instr = gemm.or(running(sched, f.cycle)).unwrap_or(0);
    let report = InjectionReport {
        unit_busy: struck.is_some(),
        tile: struck.map(|(_, (slot, _))| slot),
        tile_cycle: struck.map(|(_, (_, c))| c),
        ..InjectionReport::placed(exec, f, instr)
    };
    Ok((struck.map(|(g, _)| Injection::sequencer(g, active)), report))
}

/// The first instruction (in program order) running at `cycle` of the step, on any unit.
fn running(sched: &StepSchedule, cycle: u64) -> Option<usize> {
    ExecUnit::ALL.iter().filter_map(|&u| sched.locate(u, cycle)).map(|(i, _)| i).min()
}

/// Fills the effect fields of a report from what the executor measured.
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
