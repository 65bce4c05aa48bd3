//! The replay of a PE or lane register fault: the instruction the record reports on, stepped
//! at cycle level fault-free and faulty in lockstep, in named steps: [`pick`] the instruction,
//! find where the fault acts there ([`acts`]), [`frame`] the cycles to keep, run it through
//! the executor ([`executor_run`]) and in lockstep ([`step`]), [`check`] the replay against
//! the functional model, the executor and the record, and lay out the markers ([`markers`]).

use super::{fail, Divergence, Options, Outputs, Recorded, Shown, Source, Summary, Trace, Wave};
use crate::Result;
use faultline_hw::fault::glob_match;
use faultline_hw::isa::{self, Instr};
use faultline_hw::mxu::{self, PeArrayState};
use faultline_hw::vpu::{self, LaneState};
use faultline_hw::{FaultSchedule, FaultSite, HwConfig, Register, SiteClass, Unit};
use faultline_train::{Injection, StepFault};

/// Most (signal, cycle) values one replay may keep (about 1 GB of VCD text); more is refused
/// with a hint to narrow `--sites` or `--window`.
const MAX_VALUES: u64 = 50_000_000;

/// Registers named in a divergence message, at most.
const NAMED: usize = 8;

/// The fold (GEMM) or vector (VPU) at a cycle of an instruction.
type TileAt = Box<dyn Fn(u64) -> Option<u32>>;

/// Where a fault acts on an instruction, on its own clock.
struct Acts {
    /// The cycles `[start, end)` of each event.
    spans: Vec<(u64, u64)>,
    /// Where the first lands: `fold 1, cycle 29`, `vector 3, cycle 1`.
    lands: String,
    /// The tile at each cycle.
    tile_of: TileAt,
}

/// Replays a PE or lane register fault on the instruction the record reports on.
pub(super) fn replay(
    opts: &Options,
    src: &Source,
    upset: &[StepFault],
    inj: &Injection,
    rec: &Recorded,
) -> Result<Trace> {
    let (exec, sched) = (src.exec(), src.sched());
    let hw = &exec.hw;
    let (instr, faults, notes) = pick(inj, rec);
    let ins = &exec.program().instrs[instr];
    let cost = &sched.instrs[instr];
    let (start, total) = (cost.start, cost.cycles);
    let unit = upset[0].site.unit;
    let shown = chosen(hw, unit, upset, &opts.sites)?;
    let Acts { spans: acts, lands, tile_of } = acts(hw, ins, instr, &faults, upset[0].cycle.max(start) - start)?;
    let (from, to, cut) = frame(total, &acts, opts.window, shown.len())?;
    let bufs = src.buffers_before(instr)?;
    let (executor, functional) = executor_run(hw, ins, instr, &bufs, &faults)?;
    let mut gather = Gather::new(hw, &shown, (from, to), start);
    let (golden, faulty) = step(hw, ins, instr, &bufs, &faults, &mut gather)?;
    let Gather { golden: gv, faulty: fv, diff, first, last, peak, touched, .. } = gather;
    let outputs = Outputs { golden, faulty, functional, executor };
    let corrupted = check(&outputs, instr, rec)?;
    let fault_cycles =
        (start + acts.iter().map(|a| a.0).min().unwrap_or(0), start + acts.iter().map(|a| a.1).max().unwrap_or(0));
    let len = (to - from) as usize;
    let mut wave = Wave { first: start + from, len, shown, golden: gv, faulty: fv, markers: Vec::new() };
    wave.markers = markers(&wave, ins, &acts, (from, to), diff, &tile_of);
    Ok(Trace {
        wave,
        summary: Summary {
            inference: false,
            instr,
            instr_name: src.describe(instr),
            span: (start, start + total),
            fault_cycles,
            lands,
            window: (start + from, start + to - 1),
            cut,
            first_divergence: first,
            last_divergence: last,
            peak,
            touched: touched.iter().filter(|&&t| t).count(),
            unit: if unit == Unit::Mxu { "array" } else { "lanes" }.into(),
            elements: outputs.golden.len(),
            corrupted,
            outputs: Some(outputs),
            clock_mhz: hw.clock_mhz,
            notes,
        },
    })
}

/// The instruction to replay, its fault events, and a note naming the other instructions
/// the fault reaches. The record reports on the first faulted instruction whose outputs
/// changed (else the first): every faulted instruction before it left its outputs exact, so
/// its operands are the fault-free run's.
fn pick(inj: &Injection, rec: &Recorded) -> (usize, FaultSchedule, Vec<String>) {
    let instr = rec.reported.map(|(i, _)| i).filter(|&i| inj.register_faults(i).is_some()).unwrap_or(inj.instr());
    let faults = inj.register_faults(instr).cloned().unwrap_or_default();
    let mut notes = Vec::new();
    let others: Vec<String> = inj.instrs().filter(|&i| i != instr).map(|i| i.to_string()).collect();
    if !others.is_empty() {
        notes.push(format!(
            "the fault also reaches instruction{} {} (not shown: one instruction per file)",
            if others.len() > 1 { "s" } else { "" },
            others.join(", ")
        ));
    }
    (instr, faults, notes)
}

/// Where `faults` act on `ins` (instruction `instr`), on its own clock. A lane fault starts where it strikes (`lane_from`, on the
/// instruction's clock): VPU faults never wait for a tile.
fn acts(hw: &HwConfig, ins: &Instr, instr: usize, faults: &FaultSchedule, lane_from: u64) -> Result<Acts> {
    let at = faults.events.first().map(|e| e.at);
    let (spans, lands, tile_of): (_, _, TileAt) = match ins {
        Instr::Gemm { m, k, n, .. } => {
            let s = mxu::Schedule::new(&hw.mxu, *m, *k, *n).map_err(|e| fail(e.to_string()))?;
            let acts = s.active(faults).iter().map(|a| (a.start, a.end)).collect();
            let lands = at.map_or(String::new(), |t| format!("fold {}, cycle {}", t.tile, t.cycle));
            let starts: Vec<u64> = s.folds.iter().map(|f| f.start).collect();
            let tile = move |t: u64| starts.partition_point(|&s| s <= t).checked_sub(1).map(|f| f as u32);
            (acts, lands, Box::new(tile))
        }
        Instr::Vpu { op, .. } => {
            let acts = faults.events.iter().map(|e| (lane_from, lane_from + e.active_cycles())).collect();
            let lands = at.map_or(String::new(), |t| format!("vector {}, cycle {}", t.tile, t.cycle));
            let (hw, op, n) = (hw.clone(), *op, ins.lane_elements());
            let tile = move |t: u64| vpu::vector_at(&hw, &op, n, t).ok().flatten().map(|(v, _)| v as u32);
            (acts, lands, Box::new(tile))
        }
        Instr::Dma { .. } => return Err(fail(format!("instruction {instr} is a DMA transfer, not stepped"))),
    };
    Ok(Acts { spans, lands, tile_of })
}

/// The local cycles `[from, to)` of an instruction of `total` cycles to keep around the
/// fault's first cycle (see [`window`]), and whether it was cut; refuses more than
/// [`MAX_VALUES`] values for `shown` registers.
fn frame(total: u64, acts: &[(u64, u64)], max: u64, shown: usize) -> Result<(u64, u64, bool)> {
    let first_act = acts.iter().map(|a| a.0).min().unwrap_or(0);
    let (from, to, cut) = window(total, first_act, max);
    let values = (to - from) * (2 * shown as u64 + 4);
    if values > MAX_VALUES {
        return Err(fail(format!(
            "{shown} registers over {} cycles is too much to write ({values} values); narrow --sites or --window",
            to - from
        )));
    }
    Ok((from, to, cut))
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

/// The executor's own injected run of `ins` on `bufs` (what the campaign's trial computed
/// there), and the functional result it compares against.
fn executor_run(
    hw: &HwConfig,
    ins: &Instr,
    instr: usize,
    bufs: &[Vec<u32>],
    faults: &FaultSchedule,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let mut exec_bufs = bufs.to_vec();
    let (_, functional) =
        isa::execute_faulty(hw, ins, &mut exec_bufs, faults).map_err(|e| fail(format!("instruction {instr}: {e}")))?;
    Ok((dest_words(ins, &exec_bufs), functional.concat()))
}

/// The outputs of `ins` in `bufs` (every destination's words, [`Instr::dests`] order).
fn dest_words(ins: &Instr, bufs: &[Vec<u32>]) -> Vec<u32> {
    let len = ins.out_len();
    ins.dests().iter().flat_map(|d| bufs[d.buf.index()][d.offset..d.offset + len].iter().copied()).collect()
}

/// Steps `ins` at cycle level fault-free and with `faults` in lockstep, every cycle's states
/// to `gather`; returns both runs' outputs.
fn step(
    hw: &HwConfig,
    ins: &Instr,
    instr: usize,
    bufs: &[Vec<u32>],
    faults: &FaultSchedule,
    gather: &mut Gather,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let hw_err = |e: faultline_hw::HwError| fail(format!("instruction {instr}: {e}"));
    match ins {
        Instr::Gemm { .. } => {
            let (a, w) = isa::gemm_operands(hw, ins, bufs)
                .map_err(hw_err)?
                .ok_or_else(|| fail(format!("instruction {instr} has no GEMM operands")))?;
            let acc = isa::accumulators(ins, bufs).map_err(hw_err)?;
            let run = |f: &FaultSchedule, obs: &mut dyn FnMut(u64, &PeArrayState)| {
                mxu::gemm_observed(hw, &a, &w, acc.as_ref(), f, obs).map(|(m, _)| m.data).map_err(hw_err)
            };
            lockstep(run, faults, |t, g: &PeArrayState, f: &PeArrayState| gather.cycle(t, g, f))
        }
        _ => {
            // The operands as the lanes read them (views gathered, an accumulating reduction's
            // output words first), taken from a functional run of the instruction.
            let mut inputs = Vec::new();
            let Instr::Vpu { op, .. } = ins else { unreachable!("DMA refused by `acts`") };
            isa::execute_vpu_edited(
                hw,
                ins,
                &mut bufs.to_vec(),
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
            lockstep(run, faults, |t, g: &LaneState, f: &LaneState| gather.cycle(t, g, f))
        }
    }
}

/// The replay checks itself against the functional model, the executor and the record;
/// returns the output words it corrupts.
fn check(outputs: &Outputs, instr: usize, rec: &Recorded) -> Result<usize> {
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
    if let Some((_, recorded)) = rec.reported.filter(|&(i, c)| i == instr && c != corrupted) {
        return Err(fail(format!(
            "trial {}: the replay corrupts {corrupted} output words of instruction {instr}, records.jsonl says \
             {recorded}: the campaign's inputs or code changed since it ran",
            rec.trial
        )));
    }
    Ok(corrupted)
}

/// The `trial` scope's signals over local cycles `[from, to)`: `fault` (1 where one of `acts`
/// acts), `diverged`, `diff_regs` (`diff`) and the tile (`fold` or `vector`) at each cycle.
fn markers(
    wave: &Wave,
    ins: &Instr,
    acts: &[(u64, u64)],
    (from, to): (u64, u64),
    diff: Vec<Option<u32>>,
    tile_of: &TileAt,
) -> Vec<(String, u32, Vec<Option<u32>>)> {
    let mut fault = vec![Some(0); (to - from) as usize];
    for &(a, b) in acts {
        for t in a.max(from)..b.min(to) {
            fault[(t - from) as usize] = Some(1);
        }
    }
    let tile_name = if matches!(ins, Instr::Gemm { .. }) { "fold" } else { "vector" };
    let tiles: Vec<Option<u32>> = (from..to).map(tile_of).collect();
    vec![
        ("fault".into(), 1, fault),
        ("diverged".into(), 1, wave.diverged()),
        ("diff_regs".into(), 32, diff),
        (tile_name.into(), 32, tiles),
    ]
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

/// What the lockstep runs gather about a register replay.
struct Gather<'a> {
    hw: &'a HwConfig,
    shown: &'a [Shown],
    /// Local cycles kept, `[from, to)`.
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

impl<'a> Gather<'a> {
    /// Nothing gathered yet, keeping `shown` over local cycles `[from, to)` of an instruction
    /// starting at step cycle `start`.
    fn new(hw: &'a HwConfig, shown: &'a [Shown], (from, to): (u64, u64), start: u64) -> Gather<'a> {
        Gather {
            hw,
            shown,
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
        }
    }

    /// Takes local cycle `t`'s golden (`g`) and faulty (`f`) states.
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
