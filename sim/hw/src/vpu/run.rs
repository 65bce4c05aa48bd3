//! The VPU's entry points: checked ops ([`run`], [`run_observed`], [`run_f32`]) dispatched to
//! the functional twin or the stepped lanes by mode.

use super::cycle::cycle_level;
use super::functional::{functional, functional_into, unary_in_place};
use super::schedule::VpuSchedule;
use super::{LaneState, VpuOp, VpuStats};
use crate::config::HwConfig;
use crate::error::HwError;
use crate::fault::{FaultSchedule, FaultSite, FaultWindow, Unit};
use crate::ExecMode;

/// Result of a VPU op.
#[derive(Debug, Clone, PartialEq)]
pub struct VpuOutput {
    /// One vector of fp32 bits per output of the op (see [`VpuOp`]); NaNs canonical.
    pub out: Vec<Vec<u32>>,
    /// Cycle and work counts.
    pub stats: VpuStats,
}

impl VpuOutput {
    /// The first (for most ops, the only) output.
    pub fn into_first(self) -> Vec<u32> {
        self.out.into_iter().next().unwrap_or_default()
    }
}

/// Checks the op's inputs and returns `n`.
fn check(op: &VpuOp, inputs: &[&[u32]]) -> Result<usize, HwError> {
    let shape = |detail: String| HwError::Shape { op: format!("vpu.{}", op.name()), detail };
    if inputs.len() != op.inputs() {
        return Err(shape(format!("takes {} inputs, got {}", op.inputs(), inputs.len())));
    }
    let n = inputs[0].len();
    if let Some((i, x)) = inputs.iter().enumerate().find(|(_, x)| x.len() != n) {
        return Err(shape(format!("input 0 has {n} elements but input {i} has {}", x.len())));
    }
    if n == 0 {
        return Err(shape("empty input".into()));
    }
    if let Some((cols, _, _)) = op.reduction() {
        if cols == 0 || !n.is_multiple_of(cols) {
            return Err(shape(format!("{n} elements do not form rows of cols = {cols}")));
        }
    }
    Ok(n)
}

/// Runs `op` on the vector unit of `cfg`.
///
/// `inputs` are fp32 bit vectors, one per input of the op ([`VpuOp::inputs`]), all of the same
/// length. In [`ExecMode::CycleLevel`] every lane register is stepped and `faults` (VPU sites
/// only) are injected; in [`ExecMode::Functional`] `faults` must be empty. A fault's time counts
/// from its vector's issue cycle and must fall before the op ends. Both modes give the same bits
/// and the same cycle count when there is no fault.
pub fn run(
    cfg: &HwConfig,
    op: VpuOp,
    inputs: &[&[u32]],
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<VpuOutput, HwError> {
    let (n, sched) = checked(cfg, &op, inputs, mode, faults)?;
    let out = match mode {
        ExecMode::Functional => functional(cfg, &op, inputs, n),
        ExecMode::CycleLevel => cycle_level(cfg, &op, inputs, n, &sched, faults, |_, _| {}),
    };
    Ok(VpuOutput { out, stats: sched.stats(cfg, &op, n) })
}

/// [`run`] in [`ExecMode::Functional`] without faults, writing output `j` into `outs[j]`
/// (its first [`VpuOp::out_len`] words; what they held is overwritten) instead of new vectors:
/// the same bits, without allocating or copying a result. Returns the op's counts.
pub fn run_into(cfg: &HwConfig, op: VpuOp, inputs: &[&[u32]], outs: &mut [&mut [u32]]) -> Result<VpuStats, HwError> {
    let (n, sched) = checked(cfg, &op, inputs, ExecMode::Functional, &FaultSchedule::none())?;
    check_outs(&op, op.out_len(n), outs)?;
    functional_into(cfg, &op, inputs, n, outs);
    Ok(sched.stats(cfg, &op, n))
}

/// Checks that `outs` are the op's outputs, each of at least `len` words.
fn check_outs(op: &VpuOp, len: usize, outs: &[&mut [u32]]) -> Result<(), HwError> {
    if outs.len() != op.outputs() || outs.iter().any(|o| o.len() < len) {
        let have: Vec<usize> = outs.iter().map(|o| o.len()).collect();
        return Err(HwError::Shape {
            op: format!("vpu.{}", op.name()),
            detail: format!("writes {} outputs of {len} words; given {have:?}", op.outputs()),
        });
    }
    Ok(())
}

/// An input of [`run_into_gathered`].
pub enum Chunked<'a> {
    /// The input's words.
    Words(&'a [u32]),
    /// `gather(start, out)` writes the input's elements `start .. start + out.len()`.
    Gathered(&'a dyn Fn(usize, &mut [u32])),
}

/// Elements of each input gathered at a time by [`run_into_gathered`]: the chunks of a
/// two-input op and its result stay in the first-level cache.
const CHUNK: usize = 2048;

/// [`run_into`] of an elementwise op over `n` elements whose inputs are read a chunk at a
/// time ([`Chunked`]): an input read through a view (a broadcast, a col2im tap) is gathered
/// into a small buffer instead of a whole-length copy. The same bits and counts as
/// [`run_into`] on the gathered inputs.
pub fn run_into_gathered(
    cfg: &HwConfig,
    op: VpuOp,
    n: usize,
    inputs: &[Chunked<'_>],
    outs: &mut [&mut [u32]],
) -> Result<VpuStats, HwError> {
    let shape = |detail: String| HwError::Shape { op: format!("vpu.{}", op.name()), detail };
    if op.reduction().is_some() {
        return Err(shape("runs chunk by chunk only as an elementwise op".into()));
    }
    if inputs.len() != op.inputs() || inputs.iter().any(|x| matches!(x, Chunked::Words(w) if w.len() < n)) {
        return Err(shape(format!("takes {} inputs of {n} elements", op.inputs())));
    }
    if n == 0 {
        return Err(shape("empty input".into()));
    }
    check_outs(&op, n, outs)?;
    let sched = VpuSchedule::new(cfg, &op, n)?;
    let step = CHUNK.min(n);
    let mut scratch = vec![0u32; step * inputs.len()];
    let mut start = 0;
    while start < n {
        let len = step.min(n - start);
        let mut bufs = scratch.chunks_mut(step);
        let ins: Vec<&[u32]> = inputs
            .iter()
            .map(|x| {
                let buf = bufs.next().expect("one scratch chunk per input");
                match x {
                    Chunked::Words(w) => &w[start..start + len],
                    Chunked::Gathered(gather) => {
                        gather(start, &mut buf[..len]);
                        &buf[..len]
                    }
                }
            })
            .collect();
        let mut parts: Vec<&mut [u32]> = outs.iter_mut().map(|o| &mut o[start..start + len]).collect();
        functional_into(cfg, &op, &ins, len, &mut parts);
        start += len;
    }
    Ok(sched.stats(cfg, &op, n))
}

/// [`run`] of a one-input elementwise op in [`ExecMode::Functional`] without faults, on `data`
/// in place (its input, then its output): for an input gathered straight into where the
/// output goes. Returns the op's counts.
pub fn run_in_place(cfg: &HwConfig, op: VpuOp, data: &mut [u32]) -> Result<VpuStats, HwError> {
    if op.inputs() != 1 || op.outputs() != 1 || op.reduction().is_some() {
        let detail = "runs in place only as a one-input elementwise op".into();
        return Err(HwError::Shape { op: format!("vpu.{}", op.name()), detail });
    }
    let (n, sched) = checked(cfg, &op, &[data], ExecMode::Functional, &FaultSchedule::none())?;
    unary_in_place(&op, data);
    Ok(sched.stats(cfg, &op, n))
}

/// [`run`] at cycle level with `observe` called after every commit (faults applied) with the
/// cycle (from the op's first issue, the clock fault times count on) and the lanes' registers:
/// the hook for waveform (VCD) export. The same checks and bits as [`run`] in
/// [`ExecMode::CycleLevel`].
pub fn run_observed(
    cfg: &HwConfig,
    op: VpuOp,
    inputs: &[&[u32]],
    faults: &FaultSchedule,
    observe: impl FnMut(u64, &LaneState),
) -> Result<VpuOutput, HwError> {
    let (n, sched) = checked(cfg, &op, inputs, ExecMode::CycleLevel, faults)?;
    let out = cycle_level(cfg, &op, inputs, n, &sched, faults, observe);
    Ok(VpuOutput { out, stats: sched.stats(cfg, &op, n) })
}

/// Checks the inputs of `op` and that `faults` can be placed in it (VPU sites, in a vector,
/// before the op ends); returns `n` and the op's schedule.
fn checked(
    cfg: &HwConfig,
    op: &VpuOp,
    inputs: &[&[u32]],
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<(usize, VpuSchedule), HwError> {
    let n = check(op, inputs)?;
    let sched = VpuSchedule::new(cfg, op, n)?;
    if !faults.is_empty() {
        let origin = |v: usize, _: &FaultSite| sched.issue(v as u64);
        let window = FaultWindow {
            op: format!("{} instruction", op.name()),
            tile_name: "vector",
            tiles: usize::try_from(sched.vectors).unwrap_or(usize::MAX),
            end: sched.cycles,
            origin: &origin,
        };
        faults.check(cfg, mode, &[Unit::Vpu], &window)?;
    }
    Ok((n, sched))
}

/// [`run`] on `f32` slices, returning `f32` outputs (bits preserved exactly).
pub fn run_f32(
    cfg: &HwConfig,
    op: VpuOp,
    inputs: &[&[f32]],
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<(Vec<Vec<f32>>, VpuStats), HwError> {
    let bits: Vec<Vec<u32>> = inputs.iter().map(|x| x.iter().map(|v| v.to_bits()).collect()).collect();
    let refs: Vec<&[u32]> = bits.iter().map(|v| v.as_slice()).collect();
    let o = run(cfg, op, &refs, mode, faults)?;
    Ok((o.out.into_iter().map(|v| v.into_iter().map(f32::from_bits).collect()).collect(), o.stats))
}
