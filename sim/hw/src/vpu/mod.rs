//! The vector unit: `L` fp32 lanes with per-lane operand, accumulator and result registers,
//! stepped one clock at a time, plus its bit-exact functional twin.
//!
//! Every non-matmul op of training (elementwise, reductions, optimizer updates) runs here. Data
//! are raw fp32 bits (`u32`); [`run_f32`] is a convenience wrapper for `f32` slices.
//!
//! # Registers (fault sites)
//!
//! Each lane `l` has operand registers `a`, `b`, `c`, `d` (`vpu.lane[l].a[bit]` ...; input `i`
//! of the op goes to operand register `i`), a reduction accumulator `acc` and a result register
//! `out`. The ALU between operands and `out` is `D = vpu.pipeline_depth` cycles deep; its
//! internal stages are not fault sites.
//!
//! # Cycle model (the schedule is the same in every mode)
//!
//! Element `e` of an elementwise op goes to lane `e % L` of vector `v = e / L`; there are
//! `V = ceil(n / L)` vectors. An op with `k` outputs (1; Momentum 2; Adam 3) issues one vector
//! every `k` cycles (one result register, one write-back per cycle):
//!
//! ```text
//! t_v = v * k                         operand registers latch vector v (end of cycle t_v)
//! t_v + 1 + j                         ALU reads the operands for output j (0 <= j < k)
//! t_v + j + D                         `out` latches output j (end of cycle)
//! t_v + j + D + 1                     write-back reads `out`
//! cycles = V * k + D + 1
//! ```
//!
//! So a fault in an operand register at cycle `c` (D/Q commit semantics, see [`crate::fault`])
//! reaches every output of its vector whose read cycle is `> c`; a fault in `out` at cycle `c`
//! corrupts the value written back at `c + 1`.
//!
//! **Reductions** view the input as a row-major matrix with `cols` columns, reduced with `⊕`
//! (`+` or [`max_f32`]).
//! * [`Axis::Col`] (one result per column): column group `g` (columns `gL..gL+L`) streams its
//!   rows as vectors, one per cycle; lane accumulators load the first row and then
//!   `acc = acc ⊕ a` (latched the cycle after the operand). `out` latches `acc` one cycle after
//!   the group's last vector; the next group's first vector issues right behind (ii = 1).
//!   `cycles = rows * groups + 3`.
//! * [`Axis::Row`] (one result per row): row `r` streams `nv = ceil(cols/L)` vectors; lane `l`
//!   accumulates columns `l, l+L, ...`; then a tree of `S = ceil(log2(min(cols, L)))` stages
//!   (stage `s`: `acc[l] = acc[l] ⊕ acc[l + 2^s]` for `l % 2^(s+1) == 0`, both lanes holding
//!   data), then lane 0's `out` latches `acc[0]`. The next row issues `nv + S` cycles after the
//!   previous one: `cycles = rows * (nv + S) + 3`.
//!
//! Fault times: `FaultTime { tile: v, cycle }` is cycle `cycle` after the issue cycle of vector
//! `v` (vectors numbered in issue order).
//!
//! # Arithmetic (bit-exact, identical in both modes)
//!
//! Plain IEEE-754 binary32 operations with round-to-nearest-even (no fused multiply-add: Rust
//! never contracts `a * b + c`). `recip(x) = 1 / x` and `rsqrt(x) = 1 / sqrt(x)` are correctly
//! rounded IEEE operations (rsqrt rounds twice). `exp` is the host libm's `f32::exp`; both
//! paths call the same [`lane_op`] function, so they agree bit for bit on one host (results may
//! differ across libms in the last ulp). Every result is stored with NaN canonicalised
//! ([`faultline_num::canonical_f32_bits`]).

use crate::config::HwConfig;
use crate::error::HwError;
use crate::fault::{ActiveFault, FaultSchedule, FaultWindow};
use crate::fault::{FaultSite, Register, Unit};
use crate::ExecMode;
use faultline_num::canonical_f32_bits;
use serde::{Deserialize, Serialize};

/// A comparison used by [`VpuOp::Compare`] and [`VpuOp::CmpSelect`]. NaN compares false
/// (except [`Cmp::Ne`], true), as in IEEE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Cmp {
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
}

impl Cmp {
    /// Evaluates the comparison.
    #[inline]
    pub fn eval(self, a: f32, b: f32) -> bool {
        match self {
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
        }
    }
}

/// Reduction axis of a row-major `rows x cols` input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Axis {
    /// Reduce each row over its columns: the output has one element per row.
    Row,
    /// Reduce each column over the rows: the output has one element per column.
    Col,
}

/// A vector-unit instruction. Inputs are given in the order listed; all inputs of one op have
/// the same length `n` (broadcasting is the caller's job). Outputs are listed likewise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum VpuOp {
    /// `(x) -> x` (a move through the lanes).
    Copy,
    /// `(a, b) -> a + b`
    Add,
    /// `(a, b) -> a - b`
    Sub,
    /// `(a, b) -> a * b`
    Mul,
    /// `(a, b) -> max(a, b)` ([`max_f32`]: NaN propagates, `max(-0, +0) = +0`).
    Max,
    /// `(a, b) -> min(a, b)` ([`min_f32`]).
    Min,
    /// `(x) -> x + s`
    AddScalar(f32),
    /// `(x) -> x * s`
    MulScalar(f32),
    /// `(x) -> min(max(x, -b), b)` with `b > 0` (Ranger's range restriction): exact, so a value
    /// in `[-b, b]` comes back bit for bit (`-0` too); infinities clamp to `-b` or `b`; NaN
    /// stays NaN (canonical), as [`max_f32`] and [`min_f32`] propagate it: a NaN is not a
    /// value in range, and replacing it would hide it from every later check.
    Clamp(f32),
    /// `(x) -> -x` (sign flip, exact).
    Neg,
    /// `(x) -> x if x > 0, NaN if x is NaN, else +0`
    Relu,
    /// `(x, dy) -> dy if x > 0 else +0` (the ReLU derivative applied to an upstream gradient).
    ReluGrad,
    /// `(x) -> exp(x)` (host libm `f32::exp`, same on both paths).
    Exp,
    /// `(x) -> 1 / x` (correctly rounded).
    Recip,
    /// `(x) -> 1 / sqrt(x)` (two correct roundings).
    Rsqrt,
    /// `(x) -> ln(x)` (host libm `f32::ln`, same on both paths).
    Ln,
    /// `(t) -> 1 / (1 - beta^t)`: Adam's bias correction for step `t`, computed by the scalar
    /// function unit in double precision and rounded once to fp32.
    BiasCorrection {
        /// The decay factor.
        beta: f64,
    },
    /// `(a, b) -> 1.0 if cmp(a, b) else 0.0`
    Compare(Cmp),
    /// `(a, b, x, y) -> x if cmp(a, b) else y`
    CmpSelect(Cmp),
    /// `(x) -> sums` of the row-major `n / cols x cols` input along `axis`.
    ReduceSum {
        /// Columns of the input matrix (`n % cols == 0`).
        cols: usize,
        /// Reduce each row (`Row`) or each column (`Col`).
        axis: Axis,
    },
    /// `(x) -> maxima` ([`max_f32`]) of the row-major input along `axis`.
    ReduceMax {
        /// Columns of the input matrix (`n % cols == 0`).
        cols: usize,
        /// Reduce each row (`Row`) or each column (`Col`).
        axis: Axis,
    },
    /// `(p, g) -> (p - lr * g)`
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `(p, g, v) -> (p', v')` with `v' = mu * v + g`, `p' = p - lr * v'`.
    Momentum {
        /// Learning rate.
        lr: f32,
        /// Momentum coefficient.
        mu: f32,
    },
    /// `(p, g, m, v) -> (p', m', v')` with `m' = b1*m + (1-b1)*g`, `v' = b2*v + (1-b2)*(g*g)`,
    /// `p' = p - lr * (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps)` (`b^t` by `powi`).
    Adam {
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        b1: f32,
        /// Second-moment decay.
        b2: f32,
        /// Denominator epsilon.
        eps: f32,
        /// 1-based step number (for bias correction).
        t: u32,
    },
}

impl VpuOp {
    /// Number of inputs the op reads.
    pub fn inputs(&self) -> usize {
        use VpuOp::*;
        match self {
            Copy
            | AddScalar(_)
            | MulScalar(_)
            | Clamp(_)
            | Neg
            | Relu
            | Exp
            | Recip
            | Rsqrt
            | Ln
            | BiasCorrection { .. } => 1,
            ReduceSum { .. } | ReduceMax { .. } => 1,
            Add | Sub | Mul | Max | Min | ReluGrad | Compare(_) | Sgd { .. } => 2,
            Momentum { .. } => 3,
            CmpSelect(_) | Adam { .. } => 4,
        }
    }

    /// Number of outputs the op writes.
    pub fn outputs(&self) -> usize {
        match self {
            VpuOp::Momentum { .. } => 2,
            VpuOp::Adam { .. } => 3,
            _ => 1,
        }
    }

    /// Short lower-case name (for messages and the CLI).
    pub fn name(&self) -> &'static str {
        use VpuOp::*;
        match self {
            Copy => "copy",
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Max => "max",
            Min => "min",
            AddScalar(_) => "add_scalar",
            MulScalar(_) => "mul_scalar",
            Clamp(_) => "clamp",
            Neg => "neg",
            Relu => "relu",
            ReluGrad => "relu_grad",
            Exp => "exp",
            Recip => "recip",
            Rsqrt => "rsqrt",
            Ln => "ln",
            BiasCorrection { .. } => "bias_correction",
            Compare(_) => "compare",
            CmpSelect(_) => "cmp_select",
            ReduceSum { .. } => "reduce_sum",
            ReduceMax { .. } => "reduce_max",
            Sgd { .. } => "sgd",
            Momentum { .. } => "momentum",
            Adam { .. } => "adam",
        }
    }

    fn reduction(&self) -> Option<(usize, Axis, bool)> {
        match *self {
            VpuOp::ReduceSum { cols, axis } => Some((cols, axis, false)),
            VpuOp::ReduceMax { cols, axis } => Some((cols, axis, true)),
            _ => None,
        }
    }
}

/// Cycle and work counts of one VPU op, identical in every execution mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VpuStats {
    /// Cycles from the first operand latch to the last write-back, + 1.
    pub cycles: u64,
    /// Vector instructions issued.
    pub vectors: u64,
    /// Elements read per input (`n`).
    pub elements: u64,
    /// `elements * outputs / (cycles * lanes)`: fraction of lane-cycles producing a result.
    pub utilization: f64,
}

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

/// `max` as the VPU computes it: NaN if either is NaN, `max(-0, +0) = +0`.
#[inline]
pub fn max_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a > b {
        a
    } else if b > a {
        b
    } else {
        f32::from_bits(a.to_bits() & b.to_bits())
    }
}

/// `min` as the VPU computes it: NaN if either is NaN, `min(-0, +0) = -0`.
#[inline]
pub fn min_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a < b {
        a
    } else if b < a {
        b
    } else {
        f32::from_bits(a.to_bits() | b.to_bits())
    }
}

/// Output `j` of an elementwise/optimizer op on one lane's operands (fp32 bits in, canonical
/// fp32 bits out). Both execution modes call exactly this function.
#[inline(always)]
pub fn lane_op(op: &VpuOp, j: usize, x: [u32; 4]) -> u32 {
    let [a, b, c, d] = x.map(f32::from_bits);
    let r = match *op {
        VpuOp::Copy => a,
        VpuOp::Add => a + b,
        VpuOp::Sub => a - b,
        VpuOp::Mul => a * b,
        VpuOp::Max => max_f32(a, b),
        VpuOp::Min => min_f32(a, b),
        VpuOp::AddScalar(s) => a + s,
        VpuOp::MulScalar(s) => a * s,
        VpuOp::Clamp(b) => min_f32(max_f32(a, -b), b),
        VpuOp::Neg => -a,
        VpuOp::Relu => {
            if a.is_nan() {
                f32::NAN
            } else if a > 0.0 {
                a
            } else {
                0.0
            }
        }
        VpuOp::ReluGrad => {
            if a > 0.0 {
                b
            } else {
                0.0
            }
        }
        VpuOp::Exp => a.exp(),
        VpuOp::Recip => 1.0 / a,
        VpuOp::Rsqrt => 1.0 / a.sqrt(),
        VpuOp::Ln => a.ln(),
        VpuOp::BiasCorrection { beta } => (1.0 / (1.0 - beta.powf(a as f64))) as f32,
        VpuOp::Compare(cmp) => {
            if cmp.eval(a, b) {
                1.0
            } else {
                0.0
            }
        }
        VpuOp::CmpSelect(cmp) => {
            if cmp.eval(a, b) {
                c
            } else {
                d
            }
        }
        VpuOp::ReduceSum { .. } | VpuOp::ReduceMax { .. } => a,
        VpuOp::Sgd { lr } => a - lr * b,
        VpuOp::Momentum { lr, mu } => {
            // (p, g, v)
            let v2 = mu * c + b;
            if j == 0 {
                a - lr * v2
            } else {
                v2
            }
        }
        VpuOp::Adam { lr, b1, b2, eps, t } => {
            // (p, g, m, v)
            let m2 = b1 * c + (1.0 - b1) * b;
            let v2 = b2 * d + (1.0 - b2) * (b * b);
            match j {
                0 => {
                    let t = t.min(i32::MAX as u32) as i32;
                    let bc1 = 1.0 - b1.powi(t);
                    let bc2 = 1.0 - b2.powi(t);
                    a - lr * (m2 / bc1) / ((v2 / bc2).sqrt() + eps)
                }
                1 => m2,
                _ => v2,
            }
        }
    };
    canonical_f32_bits(r)
}

#[inline(always)]
fn combine(is_max: bool, acc: u32, x: u32) -> u32 {
    let (p, q) = (f32::from_bits(acc), f32::from_bits(x));
    canonical_f32_bits(if is_max { max_f32(p, q) } else { p + q })
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

/// Closed-form cycle counts of `op` on `n` elements (see the module docs); an
/// [`HwError::Shape`] error if the cycle count does not fit 64 bits. Allocates nothing.
pub fn try_timing(cfg: &HwConfig, op: &VpuOp, n: usize) -> Result<VpuStats, HwError> {
    Ok(VpuSchedule::new(cfg, op, n.max(1))?.stats(cfg, op, n))
}

/// [`try_timing`] for sizes known to fit; one whose cycle count does not fit 64 bits gets
/// `u64::MAX` cycles (never a wrapped, plausible-looking number) and utilization 0.
pub fn timing(cfg: &HwConfig, op: &VpuOp, n: usize) -> VpuStats {
    try_timing(cfg, op, n).unwrap_or(VpuStats {
        cycles: u64::MAX,
        vectors: n.div_ceil(cfg.vpu.lanes.max(1)) as u64,
        elements: n as u64,
        utilization: 0.0,
    })
}

/// The vector of `op` on `n` elements a fault at `cycle` (from the op's first issue) is
/// reported against: the last one issued at or before it, with its issue cycle (the fault's
/// origin). `None` past the op's end.
pub fn vector_at(cfg: &HwConfig, op: &VpuOp, n: usize, cycle: u64) -> Result<Option<(u64, u64)>, HwError> {
    let s = VpuSchedule::new(cfg, op, n.max(1))?;
    if cycle >= s.cycles {
        return Ok(None);
    }
    let stride = s.stride.max(1);
    let v = (cycle / stride).saturating_mul(s.group).saturating_add((cycle % stride).min(s.group - 1));
    let v = v.min(s.vectors.saturating_sub(1));
    Ok(Some((v, s.issue(v))))
}

/// For an elementwise/optimizer op on `n` elements: the cycle (from the op's first issue) at
/// which element `e`'s operands are read into the operand registers (its vector's issue cycle
/// `t_v`), and the cycle at which output `j` of element `e` is written back (`t_v + j + D + 1`).
/// `None` for reductions (their operands are read per the schedule in the module docs).
pub fn element_cycles(cfg: &HwConfig, op: &VpuOp, n: usize) -> Option<(Vec<u64>, Vec<Vec<u64>>)> {
    let read: Vec<u64> = (0..n).map(|e| element_cycle(cfg, op, e, None)).collect::<Option<_>>()?;
    let write =
        (0..op.outputs()).map(|j| (0..n).map(|e| element_cycle(cfg, op, e, Some(j)).unwrap_or(0)).collect()).collect();
    Some((read, write))
}

/// One entry of [`element_cycles`], without building the whole table: the cycle element `e`'s
/// operands are read (`output` `None`) or its output `j` is written back (`Some(j)`); `None`
/// for reductions.
pub fn element_cycle(cfg: &HwConfig, op: &VpuOp, e: usize, output: Option<usize>) -> Option<u64> {
    if op.reduction().is_some() {
        return None;
    }
    let read = (e / cfg.vpu.lanes) as u64 * op.outputs() as u64;
    Some(output.map_or(read, |j| read + j as u64 + cfg.vpu.pipeline_depth + 1))
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

/// The issue schedule of one op, in closed form (nothing proportional to the op is stored, so
/// costing a huge op allocates nothing): vector `v` issues at
/// `(v / group) * stride + v % group` (elementwise: `group = 1`, `stride = k`; column
/// reductions: `1, 1`; row reductions: `nv`, `nv + S`).
#[derive(Debug, Clone)]
struct VpuSchedule {
    /// Vector instructions issued.
    vectors: u64,
    /// Vectors issued back to back, one per cycle.
    group: u64,
    /// Cycles from one group's first issue to the next's.
    stride: u64,
    /// Total cycles.
    cycles: u64,
    /// Tree stages per row (Axis::Row reductions).
    stages: u32,
}

impl VpuSchedule {
    /// The cycle and work counts of this schedule for `op` on `n` elements.
    fn stats(&self, cfg: &HwConfig, op: &VpuOp, n: usize) -> VpuStats {
        // In floating point, as `n * outputs` may not fit `usize`; for `n` below 2^53 (every real
        // op) it equals converting the integer product.
        let useful = n as f64 * op.outputs() as f64;
        VpuStats {
            cycles: self.cycles,
            vectors: self.vectors,
            elements: n as u64,
            utilization: useful / (self.cycles as f64 * cfg.vpu.lanes as f64),
        }
    }

    /// Issue cycle of vector `v` (`v < vectors`, so it is below `cycles`: no overflow).
    fn issue(&self, v: u64) -> u64 {
        (v / self.group) * self.stride + v % self.group
    }

    /// The schedule of `op` on `n` elements; an [`HwError::Shape`] error if its cycle count does
    /// not fit 64 bits.
    fn new(cfg: &HwConfig, op: &VpuOp, n: usize) -> Result<VpuSchedule, HwError> {
        let l = cfg.vpu.lanes.max(1);
        let d = cfg.vpu.pipeline_depth;
        let err = || HwError::Shape {
            op: format!("vpu.{}", op.name()),
            detail: format!("{n} elements: the cycle count does not fit 64 bits"),
        };
        let lin = |v: u64, k: u64, tail: u64| v.checked_mul(k).and_then(|x| x.checked_add(tail)).ok_or_else(err);
        Ok(match op.reduction() {
            None => {
                let k = op.outputs() as u64;
                let v = n.div_ceil(l) as u64;
                let tail = d.checked_add(1).ok_or_else(err)?;
                VpuSchedule { vectors: v, group: 1, stride: k, cycles: lin(v, k, tail)?, stages: 0 }
            }
            Some((cols, Axis::Col, _)) => {
                let rows = (n / cols.max(1)) as u64;
                let v = rows.checked_mul(cols.div_ceil(l) as u64).ok_or_else(err)?;
                VpuSchedule { vectors: v, group: 1, stride: 1, cycles: lin(v, 1, 3)?, stages: 0 }
            }
            Some((cols, Axis::Row, _)) => {
                let rows = (n / cols.max(1)) as u64;
                let nv = cols.div_ceil(l) as u64;
                let stages = tree_stages(cols.min(l));
                let per = nv + stages as u64;
                let vectors = rows.checked_mul(nv).ok_or_else(err)?;
                VpuSchedule { vectors, group: nv.max(1), stride: per, cycles: lin(rows, per, 3)?, stages }
            }
        })
    }
}

/// `ceil(log2(k))` for `k >= 1`.
fn tree_stages(k: usize) -> u32 {
    usize::BITS - k.saturating_sub(1).leading_zeros()
}

/// The functional twin: the same per-element operation sequence, without registers or clocks.
fn functional(cfg: &HwConfig, op: &VpuOp, inputs: &[&[u32]], n: usize) -> Vec<Vec<u32>> {
    let l = cfg.vpu.lanes;
    match op.reduction() {
        None => elementwise(op, inputs, n),
        Some((cols, Axis::Col, is_max)) => {
            let x = &inputs[0][..n];
            let mut out = x[..cols].iter().map(|&v| lane_op(op, 0, [v, 0, 0, 0])).collect::<Vec<_>>();
            if is_max {
                column_sums::<true>(&mut out, &x[cols..]);
            } else {
                column_sums::<false>(&mut out, &x[cols..]);
            }
            vec![out]
        }
        Some((cols, Axis::Row, is_max)) => {
            let x = &inputs[0][..n];
            vec![if is_max { row_sums::<true>(x, cols, l) } else { row_sums::<false>(x, cols, l) }]
        }
    }
}

/// Folds the rows of `x` (row-major, `out.len()` columns) into `out`, each column in row
/// order ([`combine`]). Column by column the sequence is the lanes'; across columns it runs
/// in vectors (the op is a constant, so the loop has no branch).
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn column_sums<const MAX: bool>(out: &mut [u32], x: &[u32]) {
    for row in x.chunks_exact(out.len()) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o = combine(MAX, *o, v);
        }
    }
}

/// Reduces each row of `x` (`cols` wide) as the lanes do: lane `i` folds elements `i, i + l,
/// i + 2l, ...` in order, then the tree combines the lanes. All lanes' folds run as one vector
/// loop per group of `l` elements (each lane's sequence unchanged).
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn row_sums<const MAX: bool>(x: &[u32], cols: usize, l: usize) -> Vec<u32> {
    let valid = cols.min(l);
    let stages = tree_stages(valid);
    let mut acc = vec![0u32; valid];
    let mut out = vec![0u32; x.len() / cols];
    for (row, o) in x.chunks_exact(cols).zip(&mut out) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a = canonical_f32_bits(f32::from_bits(v));
        }
        for group in row[valid..].chunks(l) {
            for (a, &v) in acc.iter_mut().zip(group) {
                *a = combine(MAX, *a, v);
            }
        }
        tree(&mut acc, valid, stages, MAX);
        *o = acc[0];
    }
    out
}

/// The functional twin of an elementwise/optimizer op: [`lane_op`] on every element. The op is
/// matched once and each common op gets a loop with [`lane_op`] inlined on a literal op, so it
/// compiles to a branch-free, vectorised loop (same function, same bits; several times faster
/// than dispatching per element). Compiled for AVX2 as well and picked at run time.
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn elementwise(op: &VpuOp, inputs: &[&[u32]], n: usize) -> Vec<Vec<u32>> {
    // Plain loops, not `map().collect()`: `collect` is compiled without AVX2 and could not
    // inline a closure that has it, so it would call the closure once per element.
    #[inline(always)]
    fn map1(a: &[u32], f: impl Fn(u32) -> u32) -> Vec<Vec<u32>> {
        let mut out = vec![0; a.len()];
        for (o, &x) in out.iter_mut().zip(a) {
            *o = f(x);
        }
        vec![out]
    }
    #[inline(always)]
    fn map2(a: &[u32], b: &[u32], f: impl Fn(u32, u32) -> u32) -> Vec<Vec<u32>> {
        let mut out = vec![0; a.len().min(b.len())];
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
        vec![out]
    }
    let get = |i: usize| inputs.get(i).map_or(&[][..], |v| &v[..n.min(v.len())]);
    let (a, b, c, d) = (get(0), get(1), get(2), get(3));
    use VpuOp::*;
    match *op {
        Copy => map1(a, |x| lane_op(&Copy, 0, [x, 0, 0, 0])),
        Relu => map1(a, |x| lane_op(&Relu, 0, [x, 0, 0, 0])),
        Neg => map1(a, |x| lane_op(&Neg, 0, [x, 0, 0, 0])),
        Exp => map1(a, |x| lane_op(&Exp, 0, [x, 0, 0, 0])),
        Recip => map1(a, |x| lane_op(&Recip, 0, [x, 0, 0, 0])),
        Rsqrt => map1(a, |x| lane_op(&Rsqrt, 0, [x, 0, 0, 0])),
        AddScalar(s) => map1(a, |x| lane_op(&AddScalar(s), 0, [x, 0, 0, 0])),
        MulScalar(s) => map1(a, |x| lane_op(&MulScalar(s), 0, [x, 0, 0, 0])),
        Clamp(b) => map1(a, |x| lane_op(&Clamp(b), 0, [x, 0, 0, 0])),
        Add => map2(a, b, |x, y| lane_op(&Add, 0, [x, y, 0, 0])),
        Sub => map2(a, b, |x, y| lane_op(&Sub, 0, [x, y, 0, 0])),
        Mul => map2(a, b, |x, y| lane_op(&Mul, 0, [x, y, 0, 0])),
        Max => map2(a, b, |x, y| lane_op(&Max, 0, [x, y, 0, 0])),
        Min => map2(a, b, |x, y| lane_op(&Min, 0, [x, y, 0, 0])),
        ReluGrad => map2(a, b, |x, y| lane_op(&ReluGrad, 0, [x, y, 0, 0])),
        Sgd { lr } => map2(a, b, |x, y| lane_op(&Sgd { lr }, 0, [x, y, 0, 0])),
        _ => {
            let at = |v: &[u32], e: usize| v.get(e).copied().unwrap_or(0);
            (0..op.outputs())
                .map(|j| (0..n).map(|e| lane_op(op, j, [a[e], at(b, e), at(c, e), at(d, e)])).collect())
                .collect()
        }
    }
}

/// The cross-lane reduction tree on lane accumulators `acc[..valid]`.
fn tree(acc: &mut [u32], valid: usize, stages: u32, is_max: bool) {
    for s in 0..stages {
        tree_stage(acc, valid, s, is_max);
    }
}

fn tree_stage(acc: &mut [u32], valid: usize, s: u32, is_max: bool) {
    let h = 1usize << s;
    for l in (0..valid).step_by(2 * h) {
        if l + h < valid {
            acc[l] = combine(is_max, acc[l], acc[l + h]);
        }
    }
}

/// Register state of the lanes, one array per register class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneState {
    /// Operand registers `a, b, c, d`, each `lanes` long.
    pub opnd: [Vec<u32>; 4],
    /// Reduction accumulators.
    pub acc: Vec<u32>,
    /// Result registers.
    pub out: Vec<u32>,
}

impl LaneState {
    /// The reset state: every register zero.
    pub fn new(lanes: usize) -> LaneState {
        LaneState { opnd: std::array::from_fn(|_| vec![0; lanes]), acc: vec![0; lanes], out: vec![0; lanes] }
    }

    /// Current bits of a VPU site's register (the whole register, not just the site's bit);
    /// 0 for a site that is not a lane register.
    pub fn read(&self, site: &FaultSite) -> u32 {
        let l = site.instance[0] as usize;
        let r = match site.register {
            Register::OpA => &self.opnd[0],
            Register::OpB => &self.opnd[1],
            Register::OpC => &self.opnd[2],
            Register::OpD => &self.opnd[3],
            Register::LaneAcc => &self.acc,
            Register::LaneOut => &self.out,
            _ => return 0,
        };
        r.get(l).copied().unwrap_or(0)
    }

    fn apply(&mut self, f: &ActiveFault) {
        let l = f.event.site.instance[0] as usize;
        let r = match f.event.site.register {
            Register::OpA => &mut self.opnd[0][l],
            Register::OpB => &mut self.opnd[1][l],
            Register::OpC => &mut self.opnd[2][l],
            Register::OpD => &mut self.opnd[3][l],
            Register::LaneAcc => &mut self.acc[l],
            Register::LaneOut => &mut self.out[l],
            _ => return,
        };
        *r = f.apply(*r);
    }
}

/// Steps the lanes cycle by cycle, calling `observe` after each commit (faults applied).
fn cycle_level(
    cfg: &HwConfig,
    op: &VpuOp,
    inputs: &[&[u32]],
    n: usize,
    s: &VpuSchedule,
    faults: &FaultSchedule,
    mut observe: impl FnMut(u64, &LaneState),
) -> Vec<Vec<u32>> {
    let active: Vec<ActiveFault> = faults.events.iter().map(|e| e.activate(s.issue(e.at.tile as u64))).collect();
    let mut st = LaneState::new(cfg.vpu.lanes);
    let mut run_faults = |st: &mut LaneState, t: u64| {
        for f in active.iter().filter(|f| f.acts_at(t)) {
            st.apply(f);
        }
        observe(t, st);
    };
    match op.reduction() {
        None => elementwise_cycles(cfg, op, inputs, n, s, &mut st, &mut run_faults),
        Some((cols, axis, is_max)) => {
            reduce_cycles(cfg, op, inputs[0], n, cols, axis, is_max, s, &mut st, &mut run_faults)
        }
    }
}

fn elementwise_cycles(
    cfg: &HwConfig,
    op: &VpuOp,
    inputs: &[&[u32]],
    n: usize,
    s: &VpuSchedule,
    st: &mut LaneState,
    faults: &mut impl FnMut(&mut LaneState, u64),
) -> Vec<Vec<u32>> {
    let l = cfg.vpu.lanes;
    let d = cfg.vpu.pipeline_depth;
    let k = op.outputs() as u64;
    let nvec = s.vectors;
    let mut out = vec![vec![0u32; n]; k as usize];
    // ALU pipeline: results computed at cycle t latch into `out` at the end of t + D - 1.
    let mut pipe: Vec<Vec<u32>> = vec![vec![0; l]; d as usize];
    let elems = |v: u64| (v as usize * l)..((v as usize + 1) * l).min(n);
    for t in 0..s.cycles {
        // Reads of committed state.
        if t > d {
            let u = t - 1 - d;
            let (v, j) = (u / k, (u % k) as usize);
            if v < nvec {
                for (lane, e) in elems(v).enumerate() {
                    out[j][e] = st.out[lane];
                }
            }
        }
        // The ALU reads the committed operands; its result latches D - 1 cycles later.
        if t >= 1 {
            let u = t - 1;
            let (v, j) = (u / k, (u % k) as usize);
            if v < nvec {
                let p = &mut pipe[(t % d) as usize];
                for (lane, r) in p.iter_mut().enumerate().take(elems(v).len()) {
                    let x = [st.opnd[0][lane], st.opnd[1][lane], st.opnd[2][lane], st.opnd[3][lane]];
                    *r = lane_op(op, j, x);
                }
            }
        }
        // Commit: `out` latches the value computed at t - D + 1 (ring slot (t + 1) % D).
        if t >= d {
            let v = (t - d) / k;
            if v < nvec {
                let cnt = elems(v).len();
                let slot = ((t + 1) % d) as usize;
                st.out[..cnt].copy_from_slice(&pipe[slot][..cnt]);
            }
        }
        if t % k == 0 && t / k < nvec {
            let v = t / k;
            for (lane, e) in elems(v).enumerate() {
                for (i, inp) in inputs.iter().enumerate() {
                    st.opnd[i][lane] = inp[e];
                }
            }
        }
        faults(st, t);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn reduce_cycles(
    cfg: &HwConfig,
    op: &VpuOp,
    x: &[u32],
    n: usize,
    cols: usize,
    axis: Axis,
    is_max: bool,
    s: &VpuSchedule,
    st: &mut LaneState,
    faults: &mut impl FnMut(&mut LaneState, u64),
) -> Vec<Vec<u32>> {
    let l = cfg.vpu.lanes;
    let rows = n / cols;
    let groups = cols.div_ceil(l);
    // Per cycle: what the vector issued at t carries, what the accumulators do at t, what `out`
    // latches at t, and which output element is written back at t.
    #[derive(Clone, Copy)]
    enum AccAct {
        /// Lanes `0..cnt` load (first = true) or combine operand `a`.
        Vec { first: bool, cnt: usize },
        /// Tree stage over `valid` lanes.
        Stage { s: u32, valid: usize },
    }
    let total = s.cycles as usize;
    let mut issue: Vec<Option<(usize, usize)>> = vec![None; total]; // (first element, count)
    let mut acc_act: Vec<Option<AccAct>> = vec![None; total];
    let mut out_latch: Vec<Option<usize>> = vec![None; total]; // lanes to latch
    let mut wb: Vec<Option<(usize, usize, usize)>> = vec![None; total]; // (out index, lanes, stride)
    let mut out = vec![0u32; if axis == Axis::Col { cols } else { rows }];
    match axis {
        Axis::Col => {
            let mut t = 0usize;
            for g in 0..groups {
                let c0 = g * l;
                let cnt = l.min(cols - c0);
                for r in 0..rows {
                    issue[t] = Some((r * cols + c0, cnt));
                    acc_act[t + 1] = Some(AccAct::Vec { first: r == 0, cnt });
                    t += 1;
                }
                // Last vector issued at t-1: acc latched at t, out latches at t+1, written at t+2.
                out_latch[t + 1] = Some(cnt);
                wb[t + 2] = Some((c0, cnt, 1));
            }
        }
        Axis::Row => {
            let nv = cols.div_ceil(l);
            let valid = cols.min(l);
            let per = nv + s.stages as usize;
            for r in 0..rows {
                let t0 = r * per;
                for i in 0..nv {
                    let c0 = i * l;
                    let cnt = l.min(cols - c0);
                    issue[t0 + i] = Some((r * cols + c0, cnt));
                    acc_act[t0 + i + 1] = Some(AccAct::Vec { first: i == 0, cnt });
                }
                for st_i in 0..s.stages {
                    acc_act[t0 + nv + 1 + st_i as usize] = Some(AccAct::Stage { s: st_i, valid });
                }
                let te = t0 + nv + s.stages as usize;
                out_latch[te + 1] = Some(1);
                wb[te + 2] = Some((r, 1, 1));
            }
        }
    }
    for t in 0..total {
        if let Some((o0, cnt, _)) = wb[t] {
            out[o0..o0 + cnt].copy_from_slice(&st.out[..cnt]);
        }
        // Next state from committed state.
        let new_out = out_latch[t].map(|cnt| st.acc[..cnt].to_vec());
        let new_acc = acc_act[t].map(|a| {
            let mut acc = st.acc.clone();
            match a {
                AccAct::Vec { first, cnt } => {
                    for (lane, v) in acc.iter_mut().enumerate().take(cnt) {
                        let a = st.opnd[0][lane];
                        *v = if first { lane_op(op, 0, [a, 0, 0, 0]) } else { combine(is_max, *v, a) };
                    }
                }
                AccAct::Stage { s, valid } => tree_stage(&mut acc, valid, s, is_max),
            }
            acc
        });
        if let Some(v) = new_out {
            st.out[..v.len()].copy_from_slice(&v);
        }
        if let Some(a) = new_acc {
            st.acc = a;
        }
        if let Some((e0, cnt)) = issue[t] {
            st.opnd[0][..cnt].copy_from_slice(&x[e0..e0 + cnt]);
        }
        faults(st, t as u64);
    }
    vec![out]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dataflow;
    use crate::fault::FaultEvent;
    use crate::fault::FaultSite;
    use faultline_num::Precision;
    use proptest::prelude::*;

    fn cfg(lanes: usize, depth: u64) -> HwConfig {
        let mut c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        c.vpu.lanes = lanes;
        c.vpu.pipeline_depth = depth;
        c
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    fn both(c: &HwConfig, op: VpuOp, inputs: &[&[u32]]) -> Vec<Vec<u32>> {
        let f = run(c, op, inputs, ExecMode::Functional, &FaultSchedule::none()).unwrap();
        let s = run(c, op, inputs, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap();
        assert_eq!(f, s, "{op:?}");
        f.out
    }

    #[test]
    fn elementwise_values() {
        let c = cfg(4, 2);
        let a = bits(&[1.0, -2.0, 3.0, 0.0, f32::NAN, 4.0]);
        let b = bits(&[2.0, 2.0, -1.0, -0.0, 1.0, 0.5]);
        let f = |v: &[u32]| v.iter().map(|&x| f32::from_bits(x)).collect::<Vec<_>>();
        assert_eq!(f(&both(&c, VpuOp::Add, &[&a, &b])[0])[..4], [3.0, 0.0, 2.0, 0.0]);
        let r = both(&c, VpuOp::Relu, &[&a])[0].clone();
        assert_eq!(r, vec![1f32.to_bits(), 0, 3f32.to_bits(), 0, faultline_num::CANONICAL_NAN, 4f32.to_bits()]);
        let g = both(&c, VpuOp::ReluGrad, &[&a, &b])[0].clone();
        assert_eq!(f(&g), [2.0, 0.0, -1.0, 0.0, 0.0, 0.5]);
        let m = both(&c, VpuOp::Max, &[&bits(&[0.0]), &bits(&[-0.0])])[0].clone();
        assert_eq!(m, vec![0]);
        let s = both(&c, VpuOp::CmpSelect(Cmp::Gt), &[&a, &b, &bits(&[9.0; 6]), &bits(&[7.0; 6])])[0].clone();
        assert_eq!(f(&s), [7.0, 7.0, 9.0, 7.0, 7.0, 9.0]); // 0 > -0 is false
        let o = both(&c, VpuOp::Momentum { lr: 0.5, mu: 0.9 }, &[&bits(&[1.0]), &bits(&[2.0]), &bits(&[4.0])]);
        let v2 = 0.9f32 * 4.0 + 2.0;
        assert_eq!(f(&o[1]), [v2]);
        assert_eq!(f(&o[0]), [1.0 - 0.5 * v2]);
    }

    /// Clamp: the lanes and the twin agree bit for bit; values in `[-b, b]` (signed zeros,
    /// subnormals, the bounds themselves) come back unchanged, the rest saturate, NaN stays NaN.
    #[test]
    fn clamp_is_exact_in_range_and_the_twins_agree() {
        let c = cfg(3, 2);
        let b = 2.5f32;
        let inside = [0.0, -0.0, 1.0, -2.5, 2.5, 1e-40, -1e-40, 2.4999998, -0.1, f32::from_bits(1)];
        let x = bits(&inside);
        assert_eq!(both(&c, VpuOp::Clamp(b), &[&x])[0], x, "in range: bit for bit");
        let outside = bits(&[3.0, -1e30, f32::INFINITY, f32::NEG_INFINITY, 2.5000002, f32::NAN]);
        let got = both(&c, VpuOp::Clamp(b), &[&outside])[0].clone();
        let want = [b, -b, b, -b, b].map(f32::to_bits);
        assert_eq!(got[..5], want);
        assert_eq!(got[5], faultline_num::CANONICAL_NAN);
        // f32::MAX as the bound: the identity on every finite value.
        let wide = bits(&[f32::MAX, -f32::MAX, 3.4e38, -7.0, 0.0]);
        assert_eq!(both(&c, VpuOp::Clamp(f32::MAX), &[&wide])[0], wide);
        // Many lanes' worth of raw bit patterns: the cycle-level lanes equal the twin.
        let raw: Vec<u32> = (0..97u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let got = both(&c, VpuOp::Clamp(b), &[&raw])[0].clone();
        for (&r, &g) in raw.iter().zip(&got) {
            assert_eq!(g, lane_op(&VpuOp::Clamp(b), 0, [r, 0, 0, 0]));
            let v = f32::from_bits(r);
            if v.abs() <= b {
                assert_eq!(g, r);
            }
        }
    }

    #[test]
    fn reductions_match_a_reference_order() {
        let c = cfg(4, 1);
        // 2 rows x 6 cols.
        let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        let xb = bits(&x);
        let rows = both(&c, VpuOp::ReduceSum { cols: 6, axis: Axis::Row }, &[&xb])[0].clone();
        // Lane partials: l0 = x0 + x4, l1 = x1 + x5, l2 = x2, l3 = x3; tree: (l0+l1) + (l2+l3).
        let r = |o: usize| ((x[o] + x[o + 4]) + (x[o + 1] + x[o + 5])) + (x[o + 2] + x[o + 3]);
        assert_eq!(rows, bits(&[r(0), r(6)]));
        let colsum = both(&c, VpuOp::ReduceSum { cols: 6, axis: Axis::Col }, &[&xb])[0].clone();
        assert_eq!(colsum, bits(&(0..6).map(|j| x[j] + x[6 + j]).collect::<Vec<_>>()));
        let mx = both(&c, VpuOp::ReduceMax { cols: 6, axis: Axis::Row }, &[&xb])[0].clone();
        assert_eq!(mx, bits(&[x[5], x[11]]));
    }

    #[test]
    fn cycle_counts_follow_the_documented_formulas() {
        let c = cfg(4, 3);
        assert_eq!(timing(&c, &VpuOp::Add, 10).cycles, 3 + 3 + 1);
        assert_eq!(timing(&c, &VpuOp::Adam { lr: 1.0, b1: 0.9, b2: 0.99, eps: 1e-8, t: 1 }, 8).cycles, 2 * 3 + 3 + 1);
        // 3 rows x 6 cols: nv = 2, S = 2 -> 3 * 4 + 3.
        assert_eq!(timing(&c, &VpuOp::ReduceSum { cols: 6, axis: Axis::Row }, 18).cycles, 15);
        // Col: 3 rows x 2 groups + 3.
        assert_eq!(timing(&c, &VpuOp::ReduceSum { cols: 6, axis: Axis::Col }, 18).cycles, 9);
    }

    #[test]
    fn operand_flip_hits_only_outputs_read_after_it() {
        let c = cfg(4, 1);
        let adam = VpuOp::Adam { lr: 0.1, b1: 0.9, b2: 0.99, eps: 1e-8, t: 3 };
        let ins: Vec<Vec<u32>> = (0..4).map(|i| bits(&[1.0 + i as f32; 8])).collect();
        let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
        let golden = run(&c, adam, &refs, ExecMode::Functional, &FaultSchedule::none()).unwrap().out;
        // Vector 1 issues at 3; its outputs read operands at 4, 5, 6. Flip g (operand b) of lane
        // 2 at cycle 3 + 1 = 4: outputs 1 and 2 (m', v') of element 6 change, p' does not.
        let e = FaultEvent::flip(FaultSite::lane(2, Register::OpB, 30), 1, 1);
        let got = run(&c, adam, &refs, ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().out;
        let diff: Vec<(usize, usize)> =
            (0..3).flat_map(|j| (0..8).map(move |i| (j, i))).filter(|&(j, i)| got[j][i] != golden[j][i]).collect();
        assert_eq!(diff, vec![(1, 6), (2, 6)]);
        let mut x = [ins[0][6], ins[1][6], ins[2][6], ins[3][6]];
        x[1] ^= 1 << 30;
        assert_eq!(got[1][6], lane_op(&adam, 1, x));
    }

    #[test]
    fn out_flip_corrupts_one_written_value() {
        let c = cfg(4, 2);
        let a = bits(&[1.0; 8]);
        // Vector 1 issues at 1; out latches at 1 + 0 + 2 = 3 and is written back at 4.
        let e = FaultEvent::flip(FaultSite::lane(1, Register::LaneOut, 31), 1, 2);
        let got = run(&c, VpuOp::Copy, &[&a], ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().into_first();
        let mut want = a.clone();
        want[5] ^= 1 << 31;
        assert_eq!(got, want);
        // A flip of an idle register (after its last write-back, at 4) changes nothing.
        let e = FaultEvent::flip(FaultSite::lane(1, Register::LaneOut, 31), 1, 3);
        let got = run(&c, VpuOp::Copy, &[&a], ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().into_first();
        assert_eq!(got, a);
        // One after the op (5 cycles: 2 vectors + D + 1) could only report "nothing changed":
        // an error naming the cycle and the op's length instead.
        let e = FaultEvent::flip(FaultSite::lane(1, Register::LaneOut, 31), 1, 4);
        let err = run(&c, VpuOp::Copy, &[&a], ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap_err().to_string();
        assert!(
            err.contains("cycle 4 of vector 1 (cycle 5 of the copy instruction)") && err.contains("ends at cycle 5"),
            "{err}"
        );
    }

    #[test]
    fn reduction_acc_flip_changes_that_row_only() {
        let c = cfg(4, 1);
        let x = bits(&[1.0; 16]);
        let op = VpuOp::ReduceSum { cols: 8, axis: Axis::Row };
        // Row 1 issues vectors at 4, 5 (per = 2 + 2); acc of lane 3 latches at 5 and 6; flip the
        // exponent MSB at cycle 6 (after the last combine, before the tree's stage 0 at 7).
        let e = FaultEvent::flip(FaultSite::lane(3, Register::LaneAcc, 30), 2, 2);
        let got = run(&c, op, &[&x], ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().into_first();
        let l3 = f32::from_bits(2f32.to_bits() ^ 1 << 30);
        assert_eq!(got, bits(&[8.0, (2.0 + 2.0) + (2.0 + l3)]));
    }

    #[test]
    fn cycle_counts_past_64_bits_are_errors_not_wrapped() {
        let c = cfg(1, 64);
        // Adam issues one vector every 3 cycles: 3 * (2^64 - 1) overflows (it used to wrap).
        let adam = VpuOp::Adam { lr: 1.0, b1: 0.9, b2: 0.99, eps: 1e-8, t: 1 };
        let e = try_timing(&c, &adam, usize::MAX).unwrap_err().to_string();
        assert!(e.contains("vpu.adam") && e.contains("does not fit 64 bits"), "{e}");
        assert_eq!(timing(&c, &adam, usize::MAX).cycles, u64::MAX, "saturates, never wraps");
        assert!(try_timing(&c, &VpuOp::Relu, usize::MAX).is_err(), "2^64 - 1 vectors + D + 1");
        // Costing a huge (valid) op allocates nothing: 2^40 vectors in closed form.
        assert_eq!(try_timing(&c, &VpuOp::Relu, 1 << 40).unwrap().cycles, (1 << 40) + 65);
        let rows = VpuOp::ReduceSum { cols: 1, axis: Axis::Row };
        assert_eq!(try_timing(&c, &rows, 1 << 40).unwrap().cycles, (1 << 40) + 3);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let c = cfg(4, 1);
        assert!(run(&c, VpuOp::Add, &[&[1]], ExecMode::Functional, &FaultSchedule::none()).is_err());
        assert!(run(&c, VpuOp::Add, &[&[1], &[1, 2]], ExecMode::Functional, &FaultSchedule::none()).is_err());
        let e = run(
            &c,
            VpuOp::ReduceSum { cols: 3, axis: Axis::Row },
            &[&[1, 2]],
            ExecMode::Functional,
            &FaultSchedule::none(),
        );
        assert!(e.unwrap_err().to_string().contains("reduce_sum"));
        let f = FaultSchedule::one(FaultEvent::flip(FaultSite::lane(9, Register::OpA, 0), 0, 0));
        assert!(run(&c, VpuOp::Copy, &[&[1]], ExecMode::CycleLevel, &f).is_err());
    }

    /// The observed run is the stepped one: the same bits as `run` at cycle level, one
    /// observation per cycle, the flipped register visible from its cycle on.
    #[test]
    fn an_observed_run_is_the_stepped_run_seen_every_cycle() {
        let c = cfg(4, 2);
        let (a, b) = (bits(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), bits(&[0.5; 6]));
        // Vector 1 issues at cycle 1; flip lane 1's operand b at cycle 1 of it (cycle 2).
        let site = FaultSite::lane(1, Register::OpB, 30);
        let faults = FaultSchedule::one(FaultEvent::flip(site, 1, 1));
        let want = run(&c, VpuOp::Mul, &[&a, &b], ExecMode::CycleLevel, &faults).unwrap();
        let (mut seen, mut reg) = (Vec::new(), Vec::new());
        let got = run_observed(&c, VpuOp::Mul, &[&a, &b], &faults, |t, st| {
            seen.push(t);
            reg.push(st.read(&site));
        })
        .unwrap();
        assert_eq!(got, want);
        assert_eq!(seen, (0..want.stats.cycles).collect::<Vec<_>>());
        let mut clean = Vec::new();
        run_observed(&c, VpuOp::Mul, &[&a, &b], &FaultSchedule::none(), |_, st| clean.push(st.read(&site))).unwrap();
        assert_eq!((reg[1], reg[2] ^ clean[2]), (clean[1], 1 << 30));
    }

    fn any_op() -> impl Strategy<Value = VpuOp> {
        let cmp = prop_oneof![Just(Cmp::Lt), Just(Cmp::Ge), Just(Cmp::Eq), Just(Cmp::Ne)];
        prop_oneof![
            Just(VpuOp::Add),
            Just(VpuOp::Sub),
            Just(VpuOp::Mul),
            Just(VpuOp::Max),
            Just(VpuOp::Relu),
            Just(VpuOp::ReluGrad),
            Just(VpuOp::Exp),
            Just(VpuOp::Recip),
            Just(VpuOp::Rsqrt),
            Just(VpuOp::MulScalar(0.3)),
            Just(VpuOp::Clamp(4.5)),
            cmp.clone().prop_map(VpuOp::Compare),
            cmp.prop_map(VpuOp::CmpSelect),
            (1usize..7, any::<bool>())
                .prop_map(|(cols, r)| VpuOp::ReduceSum { cols, axis: if r { Axis::Row } else { Axis::Col } }),
            (1usize..7, any::<bool>())
                .prop_map(|(cols, r)| VpuOp::ReduceMax { cols, axis: if r { Axis::Row } else { Axis::Col } }),
            Just(VpuOp::Sgd { lr: 0.01 }),
            Just(VpuOp::Momentum { lr: 0.01, mu: 0.9 }),
            Just(VpuOp::Adam { lr: 1e-3, b1: 0.9, b2: 0.999, eps: 1e-8, t: 7 }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn twins_are_bit_identical(op in any_op(), lanes in 1usize..6, depth in 1u64..4, rows in 1usize..5,
                                   seed in proptest::collection::vec(any::<u32>(), 4 * 6 * 4)) {
            let c = cfg(lanes, depth);
            let n = match op.reduction() { Some((cols, _, _)) => cols * rows, None => rows * 5 };
            let ins: Vec<Vec<u32>> = (0..op.inputs()).map(|i| (0..n).map(|e| {
                // Mix of ordinary values and raw bit patterns (NaN, inf, subnormals).
                let r = seed[(i * 24 + e) % seed.len()];
                if r % 3 == 0 { r } else { ((r % 2000) as f32 / 100.0 - 10.0).to_bits() }
            }).collect()).collect();
            let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
            let f = run(&c, op, &refs, ExecMode::Functional, &FaultSchedule::none()).unwrap();
            let s = run(&c, op, &refs, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap();
            prop_assert_eq!(f, s);
        }
    }
}
