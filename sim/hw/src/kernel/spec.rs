//! The op vocabulary: [`KernelSpec`] and [`ConvShape`], their shapes, input and output lengths
//! and checks, and the VPU instruction sequence of a VPU op.

use crate::config::HwConfig;
use crate::error::HwError;
use crate::isa::{View, Window};
use crate::matrix::Matrix;
use crate::vpu::{Axis, VpuOp};
use serde::{Deserialize, Serialize};

/// Shape of a 2-D convolution (NHWC input, `[KH][KW][C_in] x C_out` weights as a `K x N` matrix
/// with row `(kh * KW + kw) * C_in + c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvShape {
    /// Batch size.
    pub batch: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Input channels.
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride (both dimensions).
    pub stride: usize,
    /// Zero padding (both dimensions, each side).
    pub pad: usize,
}

impl ConvShape {
    /// The kernel window, in the instruction set's conv geometry (the one definition of a
    /// convolution's output size and im2col layout).
    fn window(&self) -> Window {
        Window { kh: self.kh, kw: self.kw, stride: self.stride, padding: self.pad }
    }
    /// Output height and width ([`Window::output_hw`]); `None` for a stride or kernel of 0, a
    /// kernel larger than the padded input, or a padded size that does not fit `usize`.
    fn out_hw(&self) -> Option<(usize, usize)> {
        self.window().output_hw(self.h, self.w)
    }
    /// Output height (0 for a shape [`KernelSpec::check`] refuses).
    pub fn out_h(&self) -> usize {
        self.out_hw().map_or(0, |(h, _)| h)
    }
    /// Output width (0 for a shape [`KernelSpec::check`] refuses).
    pub fn out_w(&self) -> usize {
        self.out_hw().map_or(0, |(_, w)| w)
    }
    /// The lowered GEMM `(M, K, N)`; products saturate at `usize::MAX` (exact for a shape that
    /// passes [`KernelSpec::check`]).
    pub fn gemm(&self) -> (usize, usize, usize) {
        let m = self.batch.saturating_mul(self.out_h()).saturating_mul(self.out_w());
        (m, self.kh.saturating_mul(self.kw).saturating_mul(self.c_in), self.c_out)
    }
    /// The explicit im2col matrix of an input of [`KernelSpec::input_lens`] words (padding = zero
    /// bits): the instruction set's im2col gather ([`crate::isa::View::Im2Col`]), so the layout
    /// has one walker.
    pub fn im2col(&self, x: &[u32]) -> Matrix {
        let (m, k, _) = self.gemm();
        let view = View::Im2Col { window: self.window(), image: [self.batch, self.h, self.w, self.c_in] };
        Matrix { rows: m, cols: k, data: view.gather(x, m * k).into_owned() }
    }
}

/// One op on its own, as `faultline op` and `faultline scalesim` take it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum KernelSpec {
    /// `out[M][N] = A[M][K] * W[K][N]` on the MXU. Inputs: `A`, `W` (input-format bits).
    Matmul {
        /// Rows of A.
        m: usize,
        /// Reduction length.
        k: usize,
        /// Columns of W.
        n: usize,
    },
    /// Convolution lowered to an im2col GEMM. Inputs: NHWC `x`, `W` as `K x C_out`.
    Conv2d(ConvShape),
    /// `relu(x)` on the VPU. Input: `x` (fp32 bits).
    Relu {
        /// Elements.
        n: usize,
    },
    /// Row-wise softmax of a `rows x cols` fp32 matrix on the VPU.
    Softmax {
        /// Rows.
        rows: usize,
        /// Columns (the softmax axis).
        cols: usize,
    },
    /// One Adam step on the VPU. Inputs `p, g, m, v`; outputs `p', m', v'`.
    Adam {
        /// Parameters.
        n: usize,
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        b1: f32,
        /// Second-moment decay.
        b2: f32,
        /// Epsilon.
        eps: f32,
        /// 1-based step.
        t: u32,
    },
}

impl KernelSpec {
    /// Name and shape, for messages.
    pub fn describe(&self) -> String {
        match self {
            KernelSpec::Matmul { m, k, n } => format!("matmul {m}x{k}x{n}"),
            KernelSpec::Conv2d(c) => format!(
                "conv2d {}x{}x{}x{} -> {} ({}x{}, stride {}, pad {})",
                c.batch, c.h, c.w, c.c_in, c.c_out, c.kh, c.kw, c.stride, c.pad
            ),
            KernelSpec::Relu { n } => format!("relu {n}"),
            KernelSpec::Softmax { rows, cols } => format!("softmax {rows}x{cols}"),
            KernelSpec::Adam { n, .. } => format!("adam {n}"),
        }
    }

    /// Lengths of the inputs in elements (every entry `usize::MAX` if one does not fit, which
    /// [`KernelSpec::check`] reports).
    pub fn input_lens(&self) -> Vec<usize> {
        self.lens().map_or_else(|_| vec![usize::MAX; self.arity().0], |(i, _)| i)
    }

    /// Lengths of the outputs in elements (every entry `usize::MAX` if one does not fit).
    pub fn output_lens(&self) -> Vec<usize> {
        self.lens().map_or_else(|_| vec![usize::MAX; self.arity().1], |(_, o)| o)
    }

    /// Number of inputs and outputs.
    pub(super) fn arity(&self) -> (usize, usize) {
        match self {
            KernelSpec::Matmul { .. } | KernelSpec::Conv2d(_) => (2, 1),
            KernelSpec::Relu { .. } | KernelSpec::Softmax { .. } => (1, 1),
            KernelSpec::Adam { .. } => (4, 3),
        }
    }

    /// Input and output lengths with checked arithmetic: the one place their formulas live.
    fn lens(&self) -> Result<(Vec<usize>, Vec<usize>), HwError> {
        let prod = |what: &str, dims: &[usize]| {
            dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| {
                let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
                shape_err(self, format!("{what} = {} does not fit 64 bits", dims.join(" x ")))
            })
        };
        Ok(match *self {
            KernelSpec::Matmul { m, k, n } => {
                (vec![prod("A's elements", &[m, k])?, prod("W's elements", &[k, n])?], vec![prod("outputs", &[m, n])?])
            }
            KernelSpec::Conv2d(c) => {
                if c.pad.checked_mul(2).and_then(|p| p.checked_add(c.h.max(c.w))).is_none() {
                    return Err(shape_err(self, "the padded input (h or w + 2 * pad) does not fit 64 bits".into()));
                }
                let (oh, ow) = c.out_hw().ok_or_else(|| {
                    shape_err(self, "stride must be >= 1 and the kernel must fit the padded input".into())
                })?;
                let k = prod("K (kernel x kernel x c_in)", &[c.kh, c.kw, c.c_in])?;
                (
                    vec![prod("input elements", &[c.batch, c.h, c.w, c.c_in])?, prod("weights", &[k, c.c_out])?],
                    vec![prod("outputs", &[c.batch, oh, ow, c.c_out])?],
                )
            }
            KernelSpec::Relu { n } => (vec![n], vec![n]),
            KernelSpec::Softmax { rows, cols } => {
                let n = prod("elements", &[rows, cols])?;
                (vec![n], vec![n])
            }
            KernelSpec::Adam { n, .. } => (vec![n; 4], vec![n; 3]),
        })
    }

    /// Checks the shape alone (not its fit on a machine): every dimension at least 1, a conv
    /// kernel that fits its padded input with a stride >= 1, and element and byte counts that
    /// fit 64 bits. [`HwError::Shape`] errors name the op.
    pub fn check(&self) -> Result<(), HwError> {
        let dims: Vec<usize> = match *self {
            KernelSpec::Matmul { m, k, n } => vec![m, k, n],
            KernelSpec::Conv2d(c) => vec![c.batch, c.h, c.w, c.c_in, c.c_out, c.kh, c.kw],
            KernelSpec::Relu { n } | KernelSpec::Adam { n, .. } => vec![n],
            KernelSpec::Softmax { rows, cols } => vec![rows, cols],
        };
        if dims.contains(&0) {
            return Err(shape_err(self, "every dimension must be at least 1".into()));
        }
        let (ins, outs) = self.lens()?;
        // Every element occupies one 32-bit DRAM word.
        let bytes = ins.iter().chain(&outs).try_fold(0u64, |a, &l| a.checked_add(l as u64));
        if bytes.and_then(|w| w.checked_mul(4)).is_none() {
            return Err(shape_err(self, "its inputs and outputs total more than 2^64 bytes".into()));
        }
        Ok(())
    }

    /// [`KernelSpec::check`], then that the op's inputs and outputs, one 32-bit word per element,
    /// fit `cfg`'s DRAM ([`HwError::DramOverflow`] otherwise).
    pub fn check_on(&self, cfg: &HwConfig) -> Result<(), HwError> {
        self.check()?;
        // `check` guarantees that these sums and products fit 64 bits.
        let words: u64 = self.input_lens().iter().chain(&self.output_lens()).map(|&l| l as u64).sum();
        if words * 4 > cfg.dram.bytes {
            return Err(HwError::DramOverflow {
                op: self.describe(),
                needed_bytes: words * 4,
                available_bytes: cfg.dram.bytes,
            });
        }
        Ok(())
    }

    /// The GEMM `(M, K, N)` the op runs on the MXU (conv2d: its im2col GEMM); `None` for VPU ops.
    pub fn gemm_dims(&self) -> Option<(usize, usize, usize)> {
        match *self {
            KernelSpec::Matmul { m, k, n } => Some((m, k, n)),
            KernelSpec::Conv2d(c) => Some(c.gemm()),
            _ => None,
        }
    }
}

pub(super) fn shape_err(kind: &KernelSpec, detail: String) -> HwError {
    HwError::Shape { op: kind.describe(), detail }
}

pub(super) fn vpu_ops(kind: &KernelSpec, cols: usize) -> Vec<VpuOp> {
    match *kind {
        KernelSpec::Relu { .. } => vec![VpuOp::Relu],
        KernelSpec::Softmax { .. } => vec![
            VpuOp::ReduceMax { cols, axis: Axis::Row },
            VpuOp::Sub,
            VpuOp::Exp,
            VpuOp::ReduceSum { cols, axis: Axis::Row },
            VpuOp::Recip,
            VpuOp::Mul,
        ],
        KernelSpec::Adam { lr, b1, b2, eps, t, .. } => vec![VpuOp::Adam { lr, b1, b2, eps, t }],
        _ => vec![],
    }
}
