//! Model definitions in RON (`models/*.ron`): a named list of layers and a loss.
//!
//! ```ron
//! (
//!     name: "mlp-digits",
//!     input: [64],             // per-example shape; the graph input is [batch, 64]
//!     outputs: 10,             // classes (SoftmaxCrossEntropy) or targets (Mse)
//!     loss: SoftmaxCrossEntropy,
//!     layers: [
//!         (name: "fc1", op: Dense(units: 64)),   // input: the previous layer (or `input`)
//!         (name: "relu1", op: Relu),
//!         (name: "fc2", op: Dense(units: 10)),
//!     ],
//! )
//! ```
//!
//! A layer reads the previous layer unless it lists `inputs: ["name", ...]`; `input` names the
//! model input. The last layer is the model output, fed to the loss.

use crate::error::GraphError;
use faultline_hw::files::{parse_ron, read_ron};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A whole model file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Model name, e.g. `mlp-digits`: non-empty, no spaces or control characters.
    pub name: String,
    /// Free text: the task and dataset the model expects.
    #[serde(default)]
    pub description: String,
    /// Per-example input shape (without the batch dimension). Images are `[H, W, C]`. At least
    /// one dimension, each at least 1.
    pub input: Vec<usize>,
    /// Output width: number of classes, or of regression targets for `Mse`; at least 1, and
    /// the last layer's output must be `[batch, outputs]`.
    pub outputs: usize,
    /// Loss on the last layer's output.
    pub loss: LossSpec,
    /// Layers in order; at least one.
    pub layers: Vec<LayerSpec>,
    /// Global-norm gradient clipping (PyTorch's `clip_grad_norm_`): every gradient is scaled
    /// by `min(1, clip_norm / (||g|| + 1e-6))`, `||g||` the norm of all gradients together,
    /// computed on the VPU each step. A positive number; absent: no clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_norm: Option<f64>,
    /// Learning-rate schedule over steps, scaling the optimizer's learning rate; absent: the
    /// rate is constant. The host writes each step's rate into memory as the step counter is,
    /// so a fault can reach it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// File the spec was loaded from (named in errors); not part of the RON.
    #[serde(skip, default = "inline")]
    pub file: PathBuf,
}

fn inline() -> PathBuf {
    PathBuf::from("<inline>")
}

/// The loss of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum LossSpec {
    /// Softmax + cross-entropy against one-hot labels `[batch, outputs]`.
    SoftmaxCrossEntropy,
    /// Mean squared error against targets `[batch, outputs]`.
    Mse,
    /// A language model's loss: softmax + cross-entropy at every position, averaged over the
    /// batch's tokens. The last layer's output is `[batch, T, outputs]` (`T` the input's first
    /// dimension), one label (the next token) per position.
    TokenCrossEntropy,
}

/// One layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LayerSpec {
    /// Unique layer name; parameters are named `<layer>.weight`, `<layer>.bias`, ... Non-empty,
    /// no spaces or control characters, and not `input`, `loss`, `labels` or `step`.
    pub name: String,
    /// What the layer does.
    pub op: LayerOp,
    /// Names of earlier layers it reads (`input` for the model input); empty: the previous
    /// layer. `Add` and `Mul` take 2 inputs, `Attention` 3 (`[q, k, v]`), every other op 1.
    #[serde(default)]
    pub inputs: Vec<String>,
}

fn one() -> usize {
    1
}

fn true_() -> bool {
    true
}

fn ln_eps() -> f64 {
    1e-5
}

fn bn_momentum() -> f64 {
    0.1
}

/// Layer kinds. Shapes below include the batch dimension `B`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub enum LayerOp {
    /// `[B, .., K] -> [B, .., units]`: `x * weight [K, units] + bias [units]` on the last dim.
    Dense {
        /// Output features, at least 1.
        units: usize,
        /// Whether to add a bias.
        #[serde(default = "true_")]
        bias: bool,
    },
    /// NHWC convolution `[B, H, W, C] -> [B, OH, OW, filters]` via im2col; `weight` is
    /// `[kernel*kernel*C, filters]` (row `(i*kernel + j)*C + c`), `bias` is `[filters]` (none
    /// with `bias: false`, as before a BatchNorm).
    Conv2d {
        /// Output channels, at least 1.
        filters: usize,
        /// Square kernel size, pixels; at least 1, and at most the padded input's height and
        /// width.
        kernel: usize,
        /// Stride, pixels; at least 1.
        #[serde(default = "one")]
        stride: usize,
        /// Zero padding on each side, pixels.
        #[serde(default)]
        padding: usize,
        /// Whether to add a bias.
        #[serde(default = "true_")]
        bias: bool,
    },
    /// Max pooling `[B, H, W, C] -> [B, OH, OW, C]`: the largest value of each `size x size`
    /// window per channel, no padding.
    MaxPool {
        /// Window side, pixels; at least 1 and at most the input's height and width.
        size: usize,
        /// Stride, pixels (default: `size`, windows side by side).
        #[serde(default)]
        stride: Option<usize>,
    },
    /// Average pooling `[B, H, W, C] -> [B, OH, OW, C]`: each `size x size` window's mean,
    /// zero padding counted in it.
    AvgPool {
        /// Window side, pixels; at least 1.
        size: usize,
        /// Stride, pixels (default: `size`).
        #[serde(default)]
        stride: Option<usize>,
        /// Zero padding on each side, pixels.
        #[serde(default)]
        padding: usize,
    },
    /// Global average pooling `[B, H, W, C] -> [B, C]`: each channel's mean over the image.
    GlobalAvgPool,
    /// Elementwise ReLU.
    Relu,
    /// Elementwise GELU (tanh form).
    Gelu,
    /// Elementwise SiLU (swish), `x * sigmoid(x)`: with `Dense` and `Mul` layers, a SwiGLU MLP.
    Silu,
    /// Softmax over the last dimension.
    Softmax,
    /// LayerNorm over the last dimension `D`, with `gamma [D]` (ones) and `beta [D]` (zeros).
    LayerNorm {
        /// Added to the variance: positive and finite.
        #[serde(default = "ln_eps")]
        eps: f64,
    },
    /// Batch normalisation over the last dimension `C` (each channel over the batch and, for
    /// images, every pixel), as PyTorch's `BatchNorm1d`/`BatchNorm2d` define it: in training
    /// `(x - mean) / sqrt(var + eps)` with the batch's mean and population variance, times
    /// `gamma [C]` (ones) plus `beta [C]` (zeros); the running estimates `<layer>.running_mean`
    /// (zeros) and `<layer>.running_var` (ones) move towards the batch's mean and unbiased
    /// variance by `momentum` each step, and inference normalises with them.
    BatchNorm {
        /// Added to the variance: positive and finite.
        #[serde(default = "ln_eps")]
        eps: f64,
        /// Weight of each batch in the running estimates, in (0, 1].
        #[serde(default = "bn_momentum")]
        momentum: f64,
    },
    /// RMSNorm over the last dimension `D` (as LLaMA's): `x / sqrt(mean(x^2) + eps)` times
    /// `gamma [D]` (ones); no centring, no shift.
    RmsNorm {
        /// Added to the mean square: positive and finite.
        #[serde(default = "ln_eps")]
        eps: f64,
    },
    /// `[B, ...] -> [B, prod(...)]`.
    Flatten,
    /// `[B, ...] -> [B, shape...]` (same element count).
    Reshape {
        /// Per-example output shape, with as many elements as the input's per-example shape.
        shape: Vec<usize>,
    },
    /// Sum of two inputs of the same shape (residual connections).
    Add,
    /// Elementwise product of two inputs of the same shape (a gated MLP's gate times its value).
    Mul,
    /// Token embedding `[B, T] -> [B, T, dim]`: each token id (`0..vocab`, as a float) looks up
    /// its row of `<layer>.table [vocab, dim]` (uniform ±0.1). On the machine, one-hot rows
    /// (a VPU comparison with the constant `0..vocab`) times the table (a GEMM), so the
    /// gradient scatter-adds into the rows as a GEMM too.
    Embedding {
        /// Token ids `0..vocab`, at least 1.
        vocab: usize,
        /// Row width, at least 1.
        dim: usize,
    },
    /// The output projection tied to an `Embedding` layer (`embedding`, by name): `[.., dim] ->
    /// [.., vocab]`, `x` times the transposed table, no parameter of its own (GPT-2's weight
    /// tying); the table's gradient sums both uses.
    TiedOutput {
        /// The `Embedding` layer whose table it reuses.
        embedding: String,
    },
    /// Adds a learned tensor `<layer>.table [T, D]` (uniform ±0.1) to `[B, T, D]`: a positional embedding.
    Positional,
    /// Scaled dot-product attention, inputs `[q, k, v]` each `[B, T, D]`: per head (of `heads`,
    /// each `dh = D / heads` of the width), `softmax(q k^T / sqrt(dh) + mask) v`, the heads'
    /// results side by side as `[B, T, D]`. With `causal`, position `t` attends to positions
    /// up to `t` only: the mask, a constant `<layer>.mask [T, T]` in memory, is `-inf` above
    /// the diagonal and 0 elsewhere. Projections are separate `Dense` layers. `Attention()`:
    /// one head, no mask.
    Attention {
        /// Heads, at least 1, dividing `D`.
        #[serde(default = "one")]
        heads: usize,
        /// Mask future positions (a language model's attention).
        #[serde(default)]
        causal: bool,
    },
    /// Mean over the sequence: `[B, T, D] -> [B, D]`.
    MeanPool,
}

/// A learning-rate schedule: the factor each step's learning rate is of the optimizer's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub enum Schedule {
    /// Linear warm-up to the full rate, then a half cosine down to `floor` times it (the
    /// GPT recipe): at step `t` (1-based), `t / warmup` for `t <= warmup`, then
    /// `floor + (1 - floor) (1 + cos(pi (t - warmup) / (total - warmup))) / 2` up to `total`,
    /// and `floor` after.
    WarmupCosine {
        /// Warm-up steps, at least 1 and below `total`.
        warmup: u64,
        /// The step the cosine reaches `floor`.
        total: u64,
        /// The final factor, in `[0, 1]` (e.g. 0.1).
        floor: f64,
    },
}

impl Schedule {
    /// The factor at step `t` (1-based), in f64.
    pub fn factor(&self, t: u64) -> f64 {
        match *self {
            Schedule::WarmupCosine { warmup, total, floor } => {
                if t <= warmup {
                    t as f64 / warmup as f64
                } else if t >= total {
                    floor
                } else {
                    let x = (t - warmup) as f64 / (total - warmup) as f64;
                    floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * x).cos())
                }
            }
        }
    }

    /// Why the schedule cannot run, if it cannot.
    pub fn invalid(&self) -> Option<String> {
        match *self {
            Schedule::WarmupCosine { warmup, total, floor } => {
                if warmup == 0 || warmup >= total {
                    Some(format!("WarmupCosine warmup = {warmup}, total = {total}: need 1 <= warmup < total"))
                } else if !(0.0..=1.0).contains(&floor) {
                    Some(format!("WarmupCosine floor = {floor}: must be in [0, 1]"))
                } else {
                    None
                }
            }
        }
    }
}

impl ModelSpec {
    /// Reads and parses a model file; errors carry `file:line:col`.
    pub fn load(path: impl AsRef<Path>) -> Result<ModelSpec, GraphError> {
        let path = path.as_ref();
        let mut spec: ModelSpec = read_ron(path, |source| GraphError::Io { file: path.to_path_buf(), source })?;
        spec.file = path.to_path_buf();
        Ok(spec)
    }

    /// Parses RON text; `file` is only used in error messages.
    pub fn from_ron(text: &str, file: impl AsRef<Path>) -> Result<ModelSpec, GraphError> {
        let file = file.as_ref();
        let mut spec: ModelSpec = parse_ron(text, file)?;
        spec.file = file.to_path_buf();
        Ok(spec)
    }
}
