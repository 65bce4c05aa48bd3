//! The op set: exact semantics, shapes, and the phase tag of a node.
//!
//! # Conventions
//! * Tensors are dense, row-major (last index fastest). Values are real numbers; the reference
//!   interpreter ([`crate::reference`]) computes them in f64, the executor in machine formats.
//! * Images are **NHWC**: `[batch, height, width, channels]`. This makes im2col + GEMM produce
//!   NHWC output directly, with no transpose.
//! * "Row vector" broadcasting (`BiasAdd`, `RowScale`): the second operand's shape is a suffix of
//!   the first's and is repeated over the leading dimensions.
//! * Losses are scalars of shape `[1]`, averaged over the batch. Loss-gradient ops take no
//!   upstream gradient: the seed `dL/dL = 1` is built in.
//! * Ops with two outputs do not exist: LayerNorm is `LayerNorm` (normalise) + `RowScale` (gamma) +
//!   `BiasAdd` (beta); momentum and Adam write their state with separate nodes.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Which part of a training step a node belongs to. Reports group outcomes by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Phase {
    /// Placeholders, the model's forward pass and the loss.
    Forward,
    /// Gradients (reverse-mode autodiff), including the loss gradient.
    Backward,
    /// Optimizer updates of parameters and optimizer state.
    Update,
}

impl Phase {
    /// All phases in execution order.
    pub const ALL: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Update];

    /// Lower-case name used in reports: `forward`, `backward`, `update`.
    pub const fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Update => "update",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

pub use faultline_hw::isa::Window;

/// What a program or an evaluation of the graph runs: a training step, or inference (the test
/// metric, inference campaigns). One op behaves differently: [`Op::BatchNorm`] normalises with
/// the batch's statistics in training and the running ones in inference, as PyTorch's
/// `train()` and `eval()` do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Mode {
    /// A training step.
    #[default]
    Train,
    /// Inference.
    Eval,
}

/// One operation. Inputs are listed in order in each variant's doc (`x`, `dy`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    // ---- placeholders (no inputs; the executor binds a value by node name) ----
    /// Model input (features). Shape `[batch, ...input]`.
    Input,
    /// Labels: one-hot (or a probability distribution per row) `[batch, classes]` for
    /// `SoftmaxCrossEntropy`; the target `[batch, outputs]` for `Mse`.
    Label,
    /// The 1-based step counter `t`, shape `[1]` (only Adam graphs have one).
    Step,
    /// The step's learning rate, shape `[1]` (graphs with a schedule or AdamW): the optimizer's
    /// rate times the schedule's factor, written by the host before each step.
    LearningRate,
    /// A trainable parameter (weights persist across steps).
    Param,
    /// Optimizer state of a parameter (momentum velocity, Adam m or v) or a running
    /// statistic; starts at its initial value.
    OptState,
    /// A constant the program reads from memory like any other tensor, filled from the graph
    /// (never trained, so faults in its words act like faults in data): a causal mask.
    Const {
        /// The values, row-major.
        values: Vec<f64>,
    },

    // ---- linear algebra (MXU) ----
    /// `C = op(A) * op(B)` where `op(X) = X^T` if the flag is set. Inputs `a`, `b`.
    /// Rank 2: `op(A)` is `[M, K]`, `op(B)` is `[K, N]`, `C` is `[M, N]`.
    /// Rank 3 (both inputs): a batch of independent products, `[G, M, K] x [G, K, N] -> [G, M, N]`,
    /// transposes apply to the last two dimensions. Lowered to `G` GEMMs of `M x K x N`.
    MatMul {
        /// Use `A^T`.
        trans_a: bool,
        /// Use `B^T`.
        trans_b: bool,
    },
    /// im2col: `x [N, H, W, C] -> [N*OH*OW, KH*KW*C]`. Row `(n*OH + oh)*OW + ow`, column
    /// `(i*KW + j)*C + c` holds `x[n][oh*s + i - p][ow*s + j - p][c]`, or 0 in the padding.
    /// A convolution is `Im2Col`, a `MatMul` with weights `[KH*KW*C, F]`, and a `Reshape` to
    /// `[N, OH, OW, F]`.
    Im2Col {
        /// Kernel window.
        window: Window,
    },
    /// col2im, the adjoint of `Im2Col`: `cols [N*OH*OW, KH*KW*C] -> [N, H, W, C]`, each input
    /// element the sum of every column entry `Im2Col` copied from it (padding entries dropped).
    Col2Im {
        /// Kernel window.
        window: Window,
        /// Shape of the image, `[N, H, W, C]`.
        image: Vec<usize>,
    },

    // ---- shape (free: a view of the same row-major data) ----
    /// Same data, new shape (same element count). Input `x`.
    Reshape {
        /// Output shape.
        shape: Vec<usize>,
    },

    /// One-hot rows of token ids: `ids [..]` (values `0..C` held as floats) and `classes [C]`
    /// (the constant `0, 1, .., C-1`) give `[.., C]`, 1 where `ids[i] == classes[c]`, else 0 (a
    /// VPU comparison). An embedding lookup is this times the table on the MXU, as TPUs look up
    /// small vocabularies; a flipped id bit selects another row, or none. Not differentiated.
    /// Inputs `ids`, `classes`.
    OneHot,
    /// `x [.., A, B, C] -> [.., B, A, C]`: the first two of the last three axes swapped (a
    /// copy through the VPU). Splits attention heads (`[N, T, H, dh] -> [N, H, T, dh]`) and
    /// merges them back. Input `x`.
    SwapAxes,

    // ---- elementwise and reductions (VPU) ----
    /// `y = x + b`, `b`'s shape a suffix of `x`'s, broadcast over the leading dims. Inputs `x`, `b`.
    BiasAdd,
    /// `y = x * g` elementwise, `g` broadcast like `BiasAdd`. Inputs `x`, `g`.
    RowScale,
    /// `y = a + b`, same shapes. Inputs `a`, `b`.
    Add,
    /// `y = a * b` elementwise, same shapes. Inputs `a`, `b`.
    Mul,
    /// `y = factor * x`. Input `x`.
    Scale {
        /// The constant.
        factor: f64,
    },
    /// `y[s] = sum over leading index l of x[l, s]` down to `shape` (a suffix of `x`'s shape);
    /// the adjoint of broadcasting. Input `x`.
    SumToShape {
        /// Output shape.
        shape: Vec<usize>,
    },
    /// `y = max(x, 0)`. Input `x`.
    Relu,
    /// `dx = dy` where `x > 0`, else 0. Inputs `x`, `dy`.
    ReluGrad,
    /// GELU, tanh form: `y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`. Input `x`.
    Gelu,
    /// `dx = dy * GELU'(x)` (exact derivative of the tanh form). Inputs `x`, `dy`.
    GeluGrad,
    /// SiLU (swish): `y = x * sigmoid(x) = x / (1 + exp(-x))`. Input `x`.
    Silu,
    /// `dx = dy * s * (1 + x (1 - s))`, `s = sigmoid(x)`. Inputs `x`, `dy`.
    SiluGrad,
    /// Softmax over the last dimension, computed as `exp(x - max) / sum`. Input `x`.
    Softmax,
    /// `dx = y * (dy - sum_last(dy * y))` with `y` the softmax output. Inputs `y`, `dy`.
    SoftmaxGrad,
    /// Normalisation over the last dimension `D`: `y = (x - mean) / sqrt(var + eps)` with the
    /// population variance `var = mean((x - mean)^2)`. Input `x`.
    LayerNorm {
        /// Added to the variance.
        eps: f64,
    },
    /// `dx = (dy - mean(dy) - y * mean(dy * y)) / sqrt(var + eps)`, `y` the normalised `x`, means
    /// over the last dimension. Inputs `x`, `dy`.
    LayerNormGrad {
        /// Same as the forward op.
        eps: f64,
    },
    /// RMS normalisation over the last dimension `D`: `y = x / sqrt(mean(x^2) + eps)` (no
    /// centring). Input `x`.
    RmsNorm {
        /// Added to the mean square.
        eps: f64,
    },
    /// `dx = (dy - y * mean(dy * y)) / sqrt(mean(x^2) + eps)`, `y` the normalised `x`, means
    /// over the last dimension. Inputs `x`, `dy`.
    RmsNormGrad {
        /// Same as the forward op.
        eps: f64,
    },
    /// Mean over dimension 1: `[N, T, D] -> [N, D]`. Input `x`.
    MeanPool,
    /// `dx[n][t][d] = dy[n][d] / T`: `[N, D] -> [N, T, D]`. Input `dy`.
    MeanPoolGrad {
        /// `T`.
        len: usize,
    },
    /// Max pooling of an NHWC image, `x [N, H, W, C] -> [N, OH, OW, C]`: the largest element of
    /// each kernel window per channel (NaN if any is NaN). No padding. Input `x`.
    MaxPool {
        /// Kernel window (`padding` 0).
        window: Window,
    },
    /// `dx [N, H, W, C]`: each window's `dy` goes to the first element, in kernel-offset order,
    /// that equals the window's maximum `y` (PyTorch's and JAX's choice among ties), summed
    /// where windows overlap; none if no element equals `y`. Inputs `x`, `y`, `dy`.
    MaxPoolGrad {
        /// Kernel window, as in the forward op.
        window: Window,
    },
    /// Average pooling, `x [N, H, W, C] -> [N, OH, OW, C]`: each window's sum over `KH*KW`,
    /// padding counted as zeros (PyTorch's `count_include_pad`). Input `x`.
    AvgPool {
        /// Kernel window.
        window: Window,
    },
    /// `dx [N, H, W, C]`: `dy / (KH*KW)` added to every element of its window. Input `dy`.
    AvgPoolGrad {
        /// Kernel window, as in the forward op.
        window: Window,
        /// Shape of `x`, `[N, H, W, C]`.
        image: Vec<usize>,
    },

    /// Each column's mean over the rows, `x [R, C] -> [C]`: a batch statistic. Not
    /// differentiated (the gradient of [`Op::BatchNorm`] accounts for it). Input `x`.
    BatchMean,
    /// Each column's population variance over the rows, `mean((x - mean)^2)`, `[C]`. Not
    /// differentiated, like [`Op::BatchMean`]. Inputs `x [R, C]`, `mean [C]`.
    BatchVar,
    /// Batch normalisation of the columns of `x [R, C]` with its affine parameters:
    /// `gamma * (x - m) / sqrt(v + eps) + beta`, with `m`, `v` the batch's `mean` and `var` in
    /// [`Mode::Train`] and the running estimates in [`Mode::Eval`]. Inputs `x`, `mean [C]`,
    /// `var [C]`, `running_mean [C]`, `running_var [C]`, `gamma [C]`, `beta [C]`.
    BatchNorm {
        /// Added to the variance.
        eps: f64,
    },
    /// The training-mode gradient with respect to `x`, through the batch statistics too:
    /// `dx = gamma / sqrt(var + eps) * (dy - dbeta / R - y * dgamma / R)`, `y` the normalised
    /// `x` (before `gamma`, `beta`), `dgamma` and `dbeta` the parameters' gradients (which hold
    /// the two column sums the formula needs). Inputs `x`, `mean`, `var`, `gamma`, `dy`,
    /// `dgamma`, `dbeta`.
    BatchNormGrad {
        /// Same as the forward op.
        eps: f64,
    },
    /// `dgamma [C]`: each column's sum of `dy * y`, `y` the normalised `x`. Inputs `x`,
    /// `mean`, `var`, `dy`.
    BatchNormGammaGrad {
        /// Same as the forward op.
        eps: f64,
    },
    /// Each column's sum over the rows, `x [R, C] -> [C]` (BatchNorm's `dbeta`). Not
    /// differentiated. Input `x`.
    ColSum,

    // ---- losses (scalar `[1]`) ----
    /// `L = -(1/N) sum_n sum_c y[n][c] * log_softmax(z)[n][c]`. Inputs `z [N, C]`, `y [N, C]`.
    SoftmaxCrossEntropy,
    /// `dz = (softmax(z) * sum_c y - y) / N` (= `(p - y) / N` for one-hot `y`). Inputs `z`, `y`.
    SoftmaxCrossEntropyGrad,
    /// `L = mean over all elements of (p - t)^2`. Inputs `p`, `t` (same shape).
    Mse,
    /// `dp = 2 (p - t) / numel`. Inputs `p`, `t`.
    MseGrad,

    // ---- optimizer updates ----
    /// `w' = w - lr * g`. Inputs `w`, `g` (for momentum, `g` is the new velocity).
    SgdUpdate {
        /// Learning rate.
        lr: f64,
    },
    /// Heavy-ball velocity `v' = momentum * v + g`. Inputs `v`, `g`.
    MomentumVelocity {
        /// Momentum coefficient.
        momentum: f64,
    },
    /// First moment `m' = beta * m + (1 - beta) * g`. Inputs `m`, `g`.
    AdamMoment {
        /// `beta1`.
        beta: f64,
    },
    /// Second moment `v' = beta * v + (1 - beta) * g * g`. Inputs `v`, `g`.
    AdamSecondMoment {
        /// `beta2`.
        beta: f64,
    },
    /// `w' = w - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)`, with `m`, `v` the
    /// *updated* moments and `t` the step (`[1]`, 1-based). Inputs `w`, `m`, `v`, `t`.
    AdamUpdate {
        /// Learning rate.
        lr: f64,
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
    },
    /// AdamW (Loshchilov and Hutter; PyTorch's order): `w' = w (1 - lr wd) - lr (m / (1 -
    /// beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)`, the learning rate read from memory (a
    /// schedule's value for the step). With `weight_decay` 0 it is Adam with a data rate.
    /// Inputs `w`, `m`, `v` (the updated moments), `t` (`[1]`), `lr` (`[1]`).
    AdamWUpdate {
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
        /// Decoupled weight decay (0: none).
        weight_decay: f64,
    },
    /// `x * s`, `s` one word read from memory (`[1]`): a scheduled learning rate, or the
    /// clipping factor applied to a gradient. Inputs `x`, `s`.
    ScaleBy,
    /// `sum x^2` of the whole tensor, `[1]`: one gradient's share of the global norm. Input `x`.
    SumSquares,
    /// `sum (a - b)^2` over two tensors of one shape, `[1]`: one parameter's share of the
    /// update's norm. Inputs `a`, `b`.
    SumSquaredDiff,
    /// Global-norm clipping's factor `min(1, max_norm / (sqrt(s) + 1e-6))` of the gradients'
    /// summed squares `s` (`[1]`), as PyTorch's `clip_grad_norm_`. Input `s`.
    ClipCoef {
        /// The norm the gradients are clipped to.
        max_norm: f64,
    },

    // ---- checks (protection: computed beside training, never differentiated) ----
    /// Sums of tiles of a matrix `x [R, C]`: with `rows` false, of each run of `tile`
    /// consecutive columns of each row (`[R, C / tile]`); with `rows` true, of each run of
    /// `tile` consecutive rows (`[R / tile, C]`). ABFT's checksums. Input `x`.
    TileSum {
        /// Elements per tile along the summed dimension (divides it).
        tile: usize,
        /// Sum runs of rows (else runs of columns).
        rows: bool,
    },
    /// `max |x|` over every element (NaN if any is NaN), shape `[1]`: a range check's
    /// residual. Input `x`.
    MaxAbs,
    /// `max |a - b|` over every element (NaN if any difference is NaN), shape `[1]`: an ABFT
    /// or duplication check's residual. Inputs `a`, `b` (same shape).
    MaxAbsDiff,

    // ---- restriction (protection that feeds training) ----
    /// `y = min(max(x, -bound), bound)` elementwise, `bound > 0`; NaN stays NaN (Ranger's range
    /// restriction, [`crate::checks`]). Exact: a value in `[-bound, bound]` passes unchanged.
    /// Not differentiated: gradients pass it straight through. Input `x`.
    Clamp {
        /// The bound (fp32, as the VPU holds it).
        bound: f32,
    },
}

/// Shape mismatch found by [`Op::output_shape`]: what was expected and what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeMismatch {
    /// What the op needs, e.g. `b: [64, *]`.
    pub expected: String,
    /// What it got.
    pub found: String,
}

fn mismatch(expected: impl Into<String>, found: impl Into<String>) -> ShapeMismatch {
    ShapeMismatch { expected: expected.into(), found: found.into() }
}

fn numel(s: &[usize]) -> usize {
    s.iter().fold(1usize, |a, &d| a.saturating_mul(d))
}

fn is_suffix(short: &[usize], long: &[usize]) -> bool {
    short.len() <= long.len() && long[long.len() - short.len()..] == *short
}

/// The output shape of pooling `x` over `window` (max pooling takes no padding).
fn pooled(window: &Window, x: &[usize], op: &Op) -> Result<Vec<usize>, ShapeMismatch> {
    if matches!(op, Op::MaxPool { .. }) && window.padding != 0 {
        return Err(mismatch("max pooling without padding", format!("padding {}", window.padding)));
    }
    if x.len() != 4 {
        return Err(mismatch("x: [N, H, W, C]", format!("x: {x:?}")));
    }
    let (oh, ow) = window.output_hw(x[1], x[2]).ok_or_else(|| {
        mismatch(format!("x: H, W >= window {}x{} after padding", window.kh, window.kw), format!("x: {x:?}"))
    })?;
    Ok(vec![x[0], oh, ow, x[3]])
}

impl Op {
    /// Short lower-case name used in reports and errors, e.g. `matmul`, `relu_grad`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Label => "label",
            Op::Step => "step",
            Op::LearningRate => "learning_rate",
            Op::Param => "param",
            Op::OptState => "opt_state",
            Op::Const { .. } => "const",
            Op::SwapAxes => "swap_axes",
            Op::OneHot => "one_hot",
            Op::MatMul { .. } => "matmul",
            Op::Im2Col { .. } => "im2col",
            Op::Col2Im { .. } => "col2im",
            Op::Reshape { .. } => "reshape",
            Op::BiasAdd => "bias_add",
            Op::RowScale => "row_scale",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Scale { .. } => "scale",
            Op::SumToShape { .. } => "sum_to_shape",
            Op::Relu => "relu",
            Op::ReluGrad => "relu_grad",
            Op::Gelu => "gelu",
            Op::GeluGrad => "gelu_grad",
            Op::Silu => "silu",
            Op::SiluGrad => "silu_grad",
            Op::RmsNorm { .. } => "rms_norm",
            Op::RmsNormGrad { .. } => "rms_norm_grad",
            Op::Softmax => "softmax",
            Op::SoftmaxGrad => "softmax_grad",
            Op::LayerNorm { .. } => "layer_norm",
            Op::LayerNormGrad { .. } => "layer_norm_grad",
            Op::MeanPool => "mean_pool",
            Op::MeanPoolGrad { .. } => "mean_pool_grad",
            Op::MaxPool { .. } => "max_pool",
            Op::MaxPoolGrad { .. } => "max_pool_grad",
            Op::AvgPool { .. } => "avg_pool",
            Op::AvgPoolGrad { .. } => "avg_pool_grad",
            Op::BatchMean => "batch_mean",
            Op::BatchVar => "batch_var",
            Op::BatchNorm { .. } => "batch_norm",
            Op::BatchNormGrad { .. } => "batch_norm_grad",
            Op::BatchNormGammaGrad { .. } => "batch_norm_gamma_grad",
            Op::ColSum => "col_sum",
            Op::SoftmaxCrossEntropy => "softmax_cross_entropy",
            Op::SoftmaxCrossEntropyGrad => "softmax_cross_entropy_grad",
            Op::Mse => "mse",
            Op::MseGrad => "mse_grad",
            Op::SgdUpdate { .. } => "sgd_update",
            Op::MomentumVelocity { .. } => "momentum_velocity",
            Op::AdamMoment { .. } => "adam_moment",
            Op::AdamSecondMoment { .. } => "adam_second_moment",
            Op::AdamUpdate { .. } => "adam_update",
            Op::AdamWUpdate { .. } => "adamw_update",
            Op::ScaleBy => "scale_by",
            Op::SumSquares => "sum_squares",
            Op::SumSquaredDiff => "sum_squared_diff",
            Op::ClipCoef { .. } => "clip_coef",
            Op::TileSum { .. } => "tile_sum",
            Op::MaxAbs => "max_abs",
            Op::MaxAbsDiff => "max_abs_diff",
            Op::Clamp { .. } => "clamp",
        }
    }

    /// The inputs (by position) the op reads in `mode`: all of them, except that batch
    /// normalisation reads the batch's statistics in training and the running ones in
    /// inference.
    pub fn reads(&self, mode: Mode) -> Vec<usize> {
        match (self, mode) {
            (Op::BatchNorm { .. }, Mode::Train) => vec![0, 1, 2, 5, 6],
            (Op::BatchNorm { .. }, Mode::Eval) => vec![0, 3, 4, 5, 6],
            _ => (0..self.arity()).collect(),
        }
    }

    /// Whether the op is a placeholder whose value is bound by the caller.
    pub fn is_placeholder(&self) -> bool {
        matches!(
            self,
            Op::Input | Op::Label | Op::Step | Op::LearningRate | Op::Param | Op::OptState | Op::Const { .. }
        )
    }

    /// Number of inputs the op takes.
    pub fn arity(&self) -> usize {
        match self {
            Op::Input | Op::Label | Op::Step | Op::LearningRate | Op::Param | Op::OptState | Op::Const { .. } => 0,
            Op::Im2Col { .. }
            | Op::Col2Im { .. }
            | Op::Reshape { .. }
            | Op::SwapAxes
            | Op::Scale { .. }
            | Op::SumToShape { .. }
            | Op::Relu
            | Op::Gelu
            | Op::Silu
            | Op::RmsNorm { .. }
            | Op::Softmax
            | Op::LayerNorm { .. }
            | Op::MeanPool
            | Op::MeanPoolGrad { .. }
            | Op::MaxPool { .. }
            | Op::AvgPool { .. }
            | Op::AvgPoolGrad { .. }
            | Op::BatchMean
            | Op::ColSum
            | Op::TileSum { .. }
            | Op::MaxAbs
            | Op::SumSquares
            | Op::ClipCoef { .. }
            | Op::Clamp { .. } => 1,
            Op::AdamUpdate { .. } => 4,
            Op::AdamWUpdate { .. } => 5,
            Op::MaxPoolGrad { .. } => 3,
            Op::BatchNormGammaGrad { .. } => 4,
            Op::BatchNorm { .. } | Op::BatchNormGrad { .. } => 7,
            _ => 2,
        }
    }

    /// Output shape for the given input shapes (placeholders: not defined here, `Err`).
    pub fn output_shape(&self, ins: &[&[usize]]) -> Result<Vec<usize>, ShapeMismatch> {
        if ins.len() != self.arity() || self.is_placeholder() {
            return Err(mismatch(format!("{} inputs", self.arity()), format!("{} inputs", ins.len())));
        }
        let same = |a: &[usize], b: &[usize], what: &str| -> Result<Vec<usize>, ShapeMismatch> {
            if a == b {
                Ok(a.to_vec())
            } else {
                Err(mismatch(format!("{what}: {a:?} (same as the first input)"), format!("{what}: {b:?}")))
            }
        };
        // A one-word input (a step counter, a rate, a factor).
        let scalar = |a: &[usize], what: &str| -> Result<(), ShapeMismatch> {
            match a {
                [1] => Ok(()),
                _ => Err(mismatch(format!("{what}: [1]"), format!("{what}: {a:?}"))),
            }
        };
        match self {
            Op::MatMul { trans_a, trans_b } => {
                let (a, b) = (ins[0], ins[1]);
                let rank = a.len();
                if !(rank == 2 || rank == 3) || b.len() != rank {
                    return Err(mismatch("a, b both of rank 2 or both of rank 3", format!("a: {a:?}, b: {b:?}")));
                }
                if rank == 3 && a[0] != b[0] {
                    return Err(mismatch(format!("b: [{}, ..] (same batch as a)", a[0]), format!("b: {b:?}")));
                }
                let (ar, ac) = (a[rank - 2], a[rank - 1]);
                let (br, bc) = (b[rank - 2], b[rank - 1]);
                let (m, k) = if *trans_a { (ac, ar) } else { (ar, ac) };
                let (k2, n) = if *trans_b { (bc, br) } else { (br, bc) };
                if k != k2 {
                    let want = if *trans_b { format!("[.., *, {k}]") } else { format!("[.., {k}, *]") };
                    return Err(mismatch(format!("b: {want} (K = {k} from a: {a:?})"), format!("b: {b:?}")));
                }
                let mut out = a[..rank - 2].to_vec();
                out.extend([m, n]);
                Ok(out)
            }
            Op::Im2Col { window } => {
                let x = ins[0];
                if x.len() != 4 {
                    return Err(mismatch("x: [N, H, W, C]", format!("x: {x:?}")));
                }
                let (oh, ow) = window.output_hw(x[1], x[2]).ok_or_else(|| {
                    mismatch(
                        format!("x: H, W >= kernel {}x{} after padding", window.kh, window.kw),
                        format!("x: {x:?}"),
                    )
                })?;
                // Saturating: absurd sizes from a model file must give an error later, not a panic.
                Ok(vec![
                    x[0].saturating_mul(oh).saturating_mul(ow),
                    window.kh.saturating_mul(window.kw).saturating_mul(x[3]),
                ])
            }
            Op::Col2Im { window, image } => {
                let c = ins[0];
                if image.len() != 4 {
                    return Err(mismatch("image: [N, H, W, C]", format!("image: {image:?}")));
                }
                let (oh, ow) = window
                    .output_hw(image[1], image[2])
                    .ok_or_else(|| mismatch("image larger than the kernel", format!("image: {image:?}")))?;
                let want = [
                    image[0].saturating_mul(oh).saturating_mul(ow),
                    window.kh.saturating_mul(window.kw).saturating_mul(image[3]),
                ];
                if c != want {
                    return Err(mismatch(format!("cols: {want:?}"), format!("cols: {c:?}")));
                }
                Ok(image.clone())
            }
            Op::Reshape { shape } => {
                if numel(shape) != numel(ins[0]) {
                    return Err(mismatch(
                        format!("x with {} elements (to make {shape:?})", numel(shape)),
                        format!("x: {:?} ({} elements)", ins[0], numel(ins[0])),
                    ));
                }
                Ok(shape.clone())
            }
            Op::OneHot => {
                let (ids, classes) = (ins[0], ins[1]);
                if ids.is_empty() || classes.len() != 1 {
                    return Err(mismatch(
                        "ids of rank >= 1, classes: [C]",
                        format!("ids: {ids:?}, classes: {classes:?}"),
                    ));
                }
                Ok(ids.iter().chain(classes).copied().collect())
            }
            Op::SwapAxes => {
                let x = ins[0];
                if x.len() < 3 {
                    return Err(mismatch("x: [.., A, B, C] (rank >= 3)", format!("x: {x:?}")));
                }
                let mut out = x.to_vec();
                out.swap(x.len() - 3, x.len() - 2);
                Ok(out)
            }
            Op::BiasAdd | Op::RowScale => {
                let (x, b) = (ins[0], ins[1]);
                if b.is_empty() || !is_suffix(b, x) {
                    let tail = &x[x.len().saturating_sub(1)..];
                    return Err(mismatch(format!("second input: a suffix of {x:?}, e.g. {tail:?}"), format!("{b:?}")));
                }
                Ok(x.to_vec())
            }
            Op::Add
            | Op::Mul
            | Op::ReluGrad
            | Op::GeluGrad
            | Op::SiluGrad
            | Op::SoftmaxGrad
            | Op::LayerNormGrad { .. }
            | Op::RmsNormGrad { .. } => same(ins[0], ins[1], "second input"),
            Op::Scale { .. }
            | Op::Relu
            | Op::Gelu
            | Op::Silu
            | Op::Softmax
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Clamp { .. } => {
                if ins[0].is_empty() {
                    return Err(mismatch("x of rank >= 1", "x: []"));
                }
                Ok(ins[0].to_vec())
            }
            Op::SumToShape { shape } => {
                if shape.is_empty() || !is_suffix(shape, ins[0]) {
                    return Err(mismatch(format!("x: [.., {shape:?}]"), format!("x: {:?}", ins[0])));
                }
                Ok(shape.clone())
            }
            Op::MeanPool => {
                let x = ins[0];
                if x.len() != 3 || x[1] == 0 {
                    return Err(mismatch("x: [N, T, D] with T >= 1", format!("x: {x:?}")));
                }
                Ok(vec![x[0], x[2]])
            }
            Op::MeanPoolGrad { len } => {
                let d = ins[0];
                if d.len() != 2 {
                    return Err(mismatch("dy: [N, D]", format!("dy: {d:?}")));
                }
                Ok(vec![d[0], *len, d[1]])
            }
            Op::MaxPool { window } | Op::AvgPool { window } => pooled(window, ins[0], self),
            Op::MaxPoolGrad { window } => {
                let y = pooled(window, ins[0], &Op::MaxPool { window: *window })?;
                same(&y, ins[1], "y")?;
                same(&y, ins[2], "dy")?;
                Ok(ins[0].to_vec())
            }
            Op::AvgPoolGrad { window, image } => {
                let y = pooled(window, image, &Op::AvgPool { window: *window })?;
                same(&y, ins[0], "dy")?;
                Ok(image.clone())
            }
            Op::BatchMean
            | Op::BatchVar
            | Op::BatchNorm { .. }
            | Op::BatchNormGrad { .. }
            | Op::BatchNormGammaGrad { .. }
            | Op::ColSum => {
                let x = ins[0];
                if x.len() != 2 {
                    return Err(mismatch("x: [R, C]", format!("x: {x:?}")));
                }
                let c = [x[1]];
                // Which inputs are `dy` (shaped like `x`); every other one is a `[C]` vector.
                let dy = match self {
                    Op::BatchNormGrad { .. } => Some(4),
                    Op::BatchNormGammaGrad { .. } => Some(3),
                    _ => None,
                };
                for (k, s) in ins.iter().enumerate().skip(1) {
                    let want: &[usize] = if Some(k) == dy { x } else { &c };
                    if *s != want {
                        return Err(mismatch(format!("input {k}: {want:?}"), format!("{s:?}")));
                    }
                }
                Ok(match self {
                    Op::BatchNorm { .. } | Op::BatchNormGrad { .. } => x.to_vec(),
                    _ => c.to_vec(),
                })
            }
            Op::SoftmaxCrossEntropy | Op::SoftmaxCrossEntropyGrad => {
                let (z, y) = (ins[0], ins[1]);
                if z.len() != 2 {
                    return Err(mismatch("logits: [N, C]", format!("logits: {z:?}")));
                }
                same(z, y, "labels")?;
                Ok(if matches!(self, Op::SoftmaxCrossEntropy) { vec![1] } else { z.to_vec() })
            }
            Op::Mse | Op::MseGrad => {
                let s = same(ins[0], ins[1], "target")?;
                Ok(if matches!(self, Op::Mse) { vec![1] } else { s })
            }
            Op::SgdUpdate { .. }
            | Op::MomentumVelocity { .. }
            | Op::AdamMoment { .. }
            | Op::AdamSecondMoment { .. } => same(ins[0], ins[1], "gradient"),
            Op::AdamUpdate { .. } | Op::AdamWUpdate { .. } => {
                same(ins[0], ins[1], "m")?;
                same(ins[0], ins[2], "v")?;
                scalar(ins[3], "t")?;
                // AdamW's fifth input: the rate.
                ins.get(4).map_or(Ok(()), |lr| scalar(lr, "lr"))?;
                Ok(ins[0].to_vec())
            }
            Op::ScaleBy => {
                scalar(ins[1], "s")?;
                Ok(ins[0].to_vec())
            }
            Op::SumSquares => Ok(vec![1]),
            Op::SumSquaredDiff => {
                same(ins[0], ins[1], "b")?;
                Ok(vec![1])
            }
            Op::ClipCoef { .. } => {
                scalar(ins[0], "s")?;
                Ok(vec![1])
            }
            Op::TileSum { tile, rows } => {
                let x = ins[0];
                let along = x.get(*rows as usize ^ 1).copied().unwrap_or(0);
                if x.len() != 2 || *tile == 0 || along % tile != 0 {
                    let dim = if *rows { "R" } else { "C" };
                    return Err(mismatch(format!("x: [R, C] with {dim} a multiple of {tile}"), format!("x: {x:?}")));
                }
                Ok(if *rows { vec![x[0] / tile, x[1]] } else { vec![x[0], x[1] / tile] })
            }
            Op::MaxAbs => Ok(vec![1]),
            Op::MaxAbsDiff => {
                same(ins[0], ins[1], "b")?;
                Ok(vec![1])
            }
            Op::Input | Op::Label | Op::Step | Op::LearningRate | Op::Param | Op::OptState | Op::Const { .. } => {
                unreachable!("checked above")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_op_shapes() {
        let ts = |tile, rows| Op::TileSum { tile, rows };
        assert_eq!(ts(8, false).output_shape(&[&[4, 64]]).unwrap(), vec![4, 8]);
        assert_eq!(ts(2, true).output_shape(&[&[4, 64]]).unwrap(), vec![2, 64]);
        assert!(ts(7, false).output_shape(&[&[4, 64]]).is_err());
        assert!(ts(0, true).output_shape(&[&[4, 64]]).is_err());
        assert_eq!(Op::MaxAbs.output_shape(&[&[3, 5]]).unwrap(), vec![1]);
        assert_eq!(Op::MaxAbsDiff.output_shape(&[&[3, 5], &[3, 5]]).unwrap(), vec![1]);
        assert!(Op::MaxAbsDiff.output_shape(&[&[3, 5], &[5, 3]]).is_err());
    }

    #[test]
    fn matmul_shapes_and_errors() {
        let mm = |ta, tb| Op::MatMul { trans_a: ta, trans_b: tb };
        assert_eq!(mm(false, false).output_shape(&[&[3, 4], &[4, 5]]).unwrap(), vec![3, 5]);
        assert_eq!(mm(true, true).output_shape(&[&[4, 3], &[5, 4]]).unwrap(), vec![3, 5]);
        assert_eq!(mm(false, true).output_shape(&[&[2, 3, 4], &[2, 5, 4]]).unwrap(), vec![2, 3, 5]);
        let e = mm(false, false).output_shape(&[&[3, 4], &[5, 6]]).unwrap_err();
        assert_eq!(e.expected, "b: [.., 4, *] (K = 4 from a: [3, 4])");
        assert_eq!(e.found, "b: [5, 6]");
        assert!(mm(false, false).output_shape(&[&[2, 3, 4], &[4, 5]]).is_err());
        assert!(mm(false, false).output_shape(&[&[2, 3, 4], &[3, 4, 5]]).is_err());
    }

    #[test]
    fn conv_window_shapes() {
        let w = Window { kh: 3, kw: 3, stride: 1, padding: 0 };
        assert_eq!(Op::Im2Col { window: w }.output_shape(&[&[2, 8, 8, 1]]).unwrap(), vec![72, 9]);
        let w2 = Window { kh: 3, kw: 3, stride: 2, padding: 1 };
        assert_eq!(w2.output_hw(8, 8), Some((4, 4)));
        assert_eq!(Window { kh: 9, ..w }.output_hw(8, 8), None);
        assert_eq!(Window { stride: 0, ..w }.output_hw(8, 8), None);
        let back = Op::Col2Im { window: w, image: vec![2, 8, 8, 1] };
        assert_eq!(back.output_shape(&[&[72, 9]]).unwrap(), vec![2, 8, 8, 1]);
        assert!(back.output_shape(&[&[72, 8]]).is_err());
    }

    #[test]
    fn broadcast_and_arity() {
        assert!(Op::BiasAdd.output_shape(&[&[2, 3, 4], &[3, 4]]).is_ok());
        assert!(Op::BiasAdd.output_shape(&[&[2, 3, 4], &[3]]).is_err());
        assert!(Op::Relu.output_shape(&[&[2], &[2]]).is_err());
        assert!(Op::Input.output_shape(&[]).is_err());
        assert_eq!(Op::SoftmaxCrossEntropy.output_shape(&[&[4, 10], &[4, 10]]).unwrap(), vec![1]);
        assert!(Op::AdamUpdate { lr: 1.0, beta1: 0.9, beta2: 0.9, eps: 1e-8 }
            .output_shape(&[&[3], &[3], &[3], &[2]])
            .is_err());
    }
}
