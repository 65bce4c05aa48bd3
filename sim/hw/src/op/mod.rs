//! Whole operations through the memory path: DRAM -> DMA -> SRAM -> MXU/VPU -> SRAM -> DMA -> DRAM.
//!
//! [`run`] in [`ExecMode::Functional`] computes the result directly ([`crate::mxu::gemm`] or
//! [`crate::vpu::run`] on whole operands, no memories). In [`ExecMode::CycleLevel`] every value
//! moves through the memories at the cycles of the op's schedule ([`crate::timing`]), the VPU is
//! stepped register by register, the MXU where a fault can matter (its fold sums come from the
//! functional twin otherwise, the same bits; see below), and faults on any site (MXU, VPU,
//! SRAM/DRAM words, sequencer and DMA registers) are injected. [`run_hybrid`] simulates the
//! memory path but steps only the VPU chunks a VPU fault lands in (the MXU as in cycle-level
//! execution). All give identical bits without faults, and the same
//! [`OpTiming`] always (it comes from the shapes alone). [`timing()`] gives the timing alone.
//! Errors (shapes, tiles that do not fit an SRAM, sites the op does not use) are
//! [`HwError`]s naming the op; nothing panics on user input.
//!
//! One concern per file: `kind.rs` (the vocabulary, [`OpKind`] and [`ConvShape`]), `plan.rs`
//! (the tiling and its costs from the shapes alone: [`timing()`], [`host_bytes`]), `machine.rs`
//! (cycle-level execution, values moving through real memory arrays) and this file (the entry
//! points [`run`] and [`run_hybrid`], and the functional twin).
//!
//! # Layouts (word addresses; one element per word)
//!
//! * DRAM: the inputs one after another from address 0, then the outputs.
//! * Matmul/conv2d: the UB holds the whole activation input (matmul `A[M][K]` row-major;
//!   conv2d the NHWC input, read through an im2col address generator, padding reads no word).
//!   The weight buffer holds `B` tile slots (WS: `R x C` words, OS: `K x C`), tile element
//!   `(i, j)` at `slot * slot_words + i * C + j`. The accumulator holds the whole `M x N` output,
//!   `(m, n)` at `m * N + n`.
//! * VPU ops: the input is cut into chunks (whole rows for softmax) that fit `B` UB slots of
//!   `(inputs + outputs) * chunk` words each.
//!
//! # Tiles and timing
//!
//! Matmul/conv2d tiles are the MXU folds of [`crate::mxu::Schedule`]; tile 0 loads the
//! activations and its weights, tile `f` loads its weight tile, occupancy = the schedule's fold
//! period, latency = fold start to its last accumulator write + 1 (WS: `M + R + nc`, OS: the
//! period), release (weight slot reusable) = WS `R + C - 1`, OS `K + C - 1`. An output tile is
//! stored from the accumulator once complete (WS: after the last K fold of an N tile; OS: after
//! each fold). VPU tiles are chunks: load the inputs, run ([`crate::vpu::timing`]; softmax is
//! `ReduceMax, Sub, Exp, ReduceSum, Recip, Mul` back to back), store the outputs. See
//! [`crate::timing`] for the pipeline and [`crate::memory::dma`] for transfer costs.
//!
//! # When values move (cycle-approximate, exact for fault timing)
//!
//! * DMA word `i` moves at [`crate::memory::dma::word_cycle`], through `dma.src_addr`/`dma.dst_addr`
//!   (loaded when the transfer's data phase starts, `start + overhead`).
//! * WS fold at compute start `s`: UB word of `A[m][k0+i]` is read at `s + 1 + m + i`, weight
//!   `(i, j)` at `s + i + j`; output row `m` is written to the accumulator at `s + m + R + nc`
//!   (read-modify-write when the fold adds). OS: `A[m0+i][k]` at `s + k + i`, `W[k][j]` at
//!   `s + k + j`, row `i` written at `s + period - 1 - i` (rows drain bottom first).
//! * `seq.acc_addr` is loaded with a fold's first row address when that row is written, then
//!   advanced by `+N` (WS) / `-N` (OS) per row; every word of a row goes to `acc_addr + j`.
//! * `seq.tile` is read at each fold slot's compute start and incremented; the MXU executes the
//!   fold it names (its geometry, weight slot `tile % B`); a value `>= folds` ends the loop.
//!   The DMA's descriptors and the schedule are not affected (timing stays golden).
//! * VPU chunks of relu/adam read each vector's operands from the UB at its issue cycle and
//!   write each result at its write-back cycle ([`crate::vpu::element_cycles`], from the
//!   chunk's compute start); softmax chunks read at compute start and write at `ready - 1`.
//!
//! Fault times: MXU sites count from the fold's start in the array's own schedule
//! ([`crate::mxu::Schedule`], as `gemm` and training count them), VPU sites from the chunk's
//! first vector issue (as in [`crate::vpu`], with softmax's sub-ops back to back); all other
//! sites use [`crate::timing::TileTiming::origin`] (the tile's first load).
//!
//! The op layer does the accumulator adds between K folds in the accumulator SRAM (same
//! `MacFormat::add`, same order, so bit-identical to the whole GEMM); each fold's partial sums
//! come from the array. Without MXU faults they are the fold's own small GEMM. With MXU faults
//! the array runs the op's folds as one continuously pipelined GEMM from the first tile's
//! compute start ([`crate::mxu::fold_psums`]): fold `f + 1`'s weights enter the shadow
//! registers while fold `f` computes, and a fault there reaches fold `f + 1`, exactly as in
//! `faultline gemm` and in training, so a fault string means the same thing in all three. The
//! array keeps its own clock: where DMA stalls space the op's tiles further apart than the
//! array's fold period, the timeline shows the stalls, the array's fault times do not. MXU
//! faults and faults elsewhere are not combined in one run (an error says so).

mod kind;
mod machine;
mod plan;

pub use kind::{ConvShape, OpKind};
pub use plan::{host_bytes, timing, timing_host_bytes};

use crate::config::HwConfig;
use crate::error::HwError;
use crate::fault::{FaultEvent, FaultSchedule, FaultTime, FaultWindow};
use crate::fault::{FaultSite, Unit};
use crate::matrix::Matrix;
use crate::mxu;
use crate::timing::OpTiming;
use crate::vpu::{self, VpuOp};
use crate::ExecMode;

use kind::{shape_err, vpu_ops};
use machine::Machine;
use plan::{build_plan, plan_timing, vpu_chunk_cycles};

/// Result of an op.
#[derive(Debug, Clone, PartialEq)]
pub struct OpOutput {
    /// Output bits, one vector per output ([`OpKind::output_lens`]): accumulator format for
    /// matmul/conv2d (row-major `M x N`), fp32 for VPU ops.
    pub out: Vec<Vec<u32>>,
    /// Whole-op timing (identical in every mode).
    pub timing: OpTiming,
}

/// Runs one op. See the module docs for modes, layouts and fault semantics.
pub fn run(
    cfg: &HwConfig,
    kind: &OpKind,
    inputs: &[&[u32]],
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<OpOutput, HwError> {
    run_inner(cfg, kind, inputs, mode, faults, false)
}

/// Hybrid execution: the memory path (DMA, SRAMs, sequencer and DMA registers) and the MXU are
/// simulated as in [`ExecMode::CycleLevel`], but only the VPU chunks that a VPU fault lands in
/// are stepped register by register; the others use the functional twin. The result
/// equals [`run`] in `CycleLevel` bit for bit (Invariant 1) at a fraction of the cost.
pub fn run_hybrid(
    cfg: &HwConfig,
    kind: &OpKind,
    inputs: &[&[u32]],
    faults: &FaultSchedule,
) -> Result<OpOutput, HwError> {
    run_inner(cfg, kind, inputs, ExecMode::CycleLevel, faults, true)
}

fn run_inner(
    cfg: &HwConfig,
    kind: &OpKind,
    inputs: &[&[u32]],
    mode: ExecMode,
    faults: &FaultSchedule,
    hybrid: bool,
) -> Result<OpOutput, HwError> {
    let plan = build_plan(cfg, kind)?;
    let lens = kind.input_lens();
    if inputs.len() != lens.len() {
        return Err(shape_err(kind, format!("takes {} inputs, got {}", lens.len(), inputs.len())));
    }
    for (i, (x, &l)) in inputs.iter().zip(&lens).enumerate() {
        if x.len() != l {
            return Err(shape_err(kind, format!("input {i} has {} elements, expected {l}", x.len())));
        }
    }
    let t = plan_timing(cfg, kind, &plan)?;
    // MXU ops use the array, its accumulator and weight buffer; VPU ops the lanes instead.
    let units: &[Unit] = if kind.gemm_dims().is_some() {
        &[Unit::Mxu, Unit::Ub, Unit::Acc, Unit::Wbuf, Unit::Dram, Unit::Seq, Unit::Dma]
    } else {
        &[Unit::Vpu, Unit::Ub, Unit::Dram, Unit::Seq, Unit::Dma]
    };
    // Each site's fault times count from the origin its path uses (see the module docs).
    let origin = |tile: usize, site: &FaultSite| match (site.unit, &plan.sched) {
        (Unit::Mxu, Some(s)) => t.tiles[0].compute_start.saturating_add(s.folds[tile].start),
        (Unit::Mxu | Unit::Vpu, _) => t.tiles[tile].compute_start,
        _ => t.tiles[tile].origin,
    };
    let window = FaultWindow {
        op: format!("op {}", kind.describe()),
        tile_name: "tile",
        tiles: plan.count,
        end: t.total_cycles,
        origin: &origin,
    };
    faults.check(cfg, mode, units, &window)?;
    let out = match mode {
        ExecMode::Functional => functional(cfg, kind, inputs)?,
        ExecMode::CycleLevel => {
            let mut m = Machine::new(cfg, kind, inputs, &plan, &t, faults)?;
            m.hybrid = hybrid;
            match kind.gemm_dims() {
                Some(_) => m.run_gemm()?,
                None => m.run_vpu()?,
            }
            m.outputs()
        }
    };
    Ok(OpOutput { out, timing: t })
}

/// The functional twin: whole operands, no memories.
fn functional(cfg: &HwConfig, kind: &OpKind, inputs: &[&[u32]]) -> Result<Vec<Vec<u32>>, HwError> {
    Ok(match gemm_operands(kind, inputs) {
        Some((a, w)) => vec![mxu::gemm(cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none())?.out.data],
        None => vpu_compute(cfg, kind, inputs, ExecMode::Functional, &[])?,
    })
}

/// The GEMM operands of a matmul or conv2d (`A`, for conv2d the im2col matrix, and `W`), as
/// the MXU receives them with nothing faulted on the way; `None` for VPU ops.
fn gemm_operands(kind: &OpKind, inputs: &[&[u32]]) -> Option<(Matrix, Matrix)> {
    let (m, k, n) = kind.gemm_dims()?;
    let a = match kind {
        OpKind::Conv2d(c) => c.im2col(inputs[0]),
        _ => Matrix { rows: m, cols: k, data: inputs[0].to_vec() },
    };
    Some((a, Matrix { rows: k, cols: n, data: inputs[1].to_vec() }))
}

/// Runs an op's VPU instruction sequence on one chunk; `faults` are VPU events whose cycle
/// counts from the chunk's compute start.
fn vpu_compute(
    cfg: &HwConfig,
    kind: &OpKind,
    inputs: &[&[u32]],
    mode: ExecMode,
    faults: &[FaultEvent],
) -> Result<Vec<Vec<u32>>, HwError> {
    let len = inputs[0].len();
    let cycles = vpu_chunk_cycles(cfg, kind, len)?;
    let mut offset = 0u64;
    let mut sub_faults = |i: usize| {
        let (lo, hi) = (offset, offset + cycles[i]);
        offset = hi;
        FaultSchedule {
            events: faults
                .iter()
                .filter(|e| (lo..hi).contains(&e.at.cycle))
                .map(|e| FaultEvent { at: FaultTime { tile: 0, cycle: e.at.cycle - lo }, ..*e })
                .collect(),
        }
    };
    let run1 = |op: VpuOp, ins: &[&[u32]], f: &FaultSchedule| vpu::run(cfg, op, ins, mode, f);
    match *kind {
        OpKind::Softmax { cols, .. } => {
            let ops = vpu_ops(kind, cols);
            let x = inputs[0];
            let expand = |v: &[u32]| v.iter().flat_map(|&b| std::iter::repeat_n(b, cols)).collect::<Vec<u32>>();
            let f0 = sub_faults(0);
            let mx = run1(ops[0], &[x], &f0)?.into_first();
            let f1 = sub_faults(1);
            let xs = run1(ops[1], &[x, &expand(&mx)], &f1)?.into_first();
            let f2 = sub_faults(2);
            let e = run1(ops[2], &[&xs], &f2)?.into_first();
            let f3 = sub_faults(3);
            let s = run1(ops[3], &[&e], &f3)?.into_first();
            let f4 = sub_faults(4);
            let inv = run1(ops[4], &[&s], &f4)?.into_first();
            let f5 = sub_faults(5);
            Ok(vec![run1(ops[5], &[&e, &expand(&inv)], &f5)?.into_first()])
        }
        _ => {
            let f = sub_faults(0);
            Ok(run1(vpu_ops(kind, 1)[0], inputs, &f)?.out)
        }
    }
}
