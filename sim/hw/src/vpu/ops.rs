//! What the VPU can be asked to do: [`VpuOp`], with its comparisons ([`Cmp`]) and reduction
//! axes ([`Axis`]).

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
    /// `(a, b) -> max(a, b)` ([`max_f32`](super::max_f32): NaN propagates, `max(-0, +0) = +0`).
    Max,
    /// `(a, b) -> min(a, b)` ([`min_f32`](super::min_f32)).
    Min,
    /// `(x) -> x + s`
    AddScalar(f32),
    /// `(x) -> x * s`
    MulScalar(f32),
    /// `(x) -> min(max(x, -b), b)` with `b > 0` (Ranger's range restriction): exact, so a value
    /// in `[-b, b]` comes back bit for bit (`-0` too); infinities clamp to `-b` or `b`; NaN
    /// stays NaN (canonical), as [`max_f32`](super::max_f32) and [`min_f32`](super::min_f32) propagate it: a NaN is not a
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
    /// `(x) -> maxima` ([`max_f32`](super::max_f32)) of the row-major input along `axis`.
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

    /// Words each output holds for `n` input elements: one per row (row reductions) or column
    /// (column reductions), else `n`.
    pub fn out_len(&self, n: usize) -> usize {
        match self.reduction() {
            Some((cols, Axis::Row, _)) => n / cols.max(1),
            Some((cols, Axis::Col, _)) => cols,
            None => n,
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

    pub(crate) fn reduction(&self) -> Option<(usize, Axis, bool)> {
        match *self {
            VpuOp::ReduceSum { cols, axis } => Some((cols, axis, false)),
            VpuOp::ReduceMax { cols, axis } => Some((cols, axis, true)),
            _ => None,
        }
    }
}
