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

use crate::budget::{product, sum};
use crate::config::{Dataflow, HwConfig, SramConfig};
use crate::error::HwError;
use crate::fault::{addr_bits, FaultSite, Register, Unit, DMA_ADDR_BITS, TILE_COUNTER_BITS};
use crate::fault::{ActiveFault, FaultEvent, FaultSchedule, FaultTime, FaultWindow};
use crate::isa::{View, Window};
use crate::matrix::Matrix;
use crate::memory::dma::{self, AddrReg, Direction, Transfer};
use crate::memory::Memory;
use crate::mxu::{self, Fold, Schedule};
use crate::timing::{self, OpTiming, TileTiming, TileWork};
use crate::vpu::{self, Axis, VpuOp};
use crate::ExecMode;
use faultline_num::{with_precision, MacFormat};
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
    /// Output height (0 for a shape [`OpKind::check`] refuses).
    pub fn out_h(&self) -> usize {
        self.out_hw().map_or(0, |(h, _)| h)
    }
    /// Output width (0 for a shape [`OpKind::check`] refuses).
    pub fn out_w(&self) -> usize {
        self.out_hw().map_or(0, |(_, w)| w)
    }
    /// The lowered GEMM `(M, K, N)`; products saturate at `usize::MAX` (exact for a shape that
    /// passes [`OpKind::check`]).
    pub fn gemm(&self) -> (usize, usize, usize) {
        let m = self.batch.saturating_mul(self.out_h()).saturating_mul(self.out_w());
        (m, self.kh.saturating_mul(self.kw).saturating_mul(self.c_in), self.c_out)
    }
    /// Input element index read by im2col element `(m, k)`, or `None` for padding (and for every
    /// element of a shape [`OpKind::check`] refuses).
    pub fn im2col_index(&self, m: usize, k: usize) -> Option<usize> {
        let (oh, ow) = self.out_hw()?;
        let (b, r) = (m / (oh * ow), m % (oh * ow));
        let (y, x) = (r / ow, r % ow);
        let (kk, c) = (k / self.c_in.max(1), k % self.c_in.max(1));
        let (ky, kx) = (kk / self.kw.max(1), kk % self.kw.max(1));
        let iy = (y * self.stride + ky).checked_sub(self.pad)?;
        let ix = (x * self.stride + kx).checked_sub(self.pad)?;
        (iy < self.h && ix < self.w).then(|| ((b * self.h + iy) * self.w + ix) * self.c_in + c)
    }
    /// The explicit im2col matrix of an input of [`OpKind::input_lens`] words (padding = zero
    /// bits): the instruction set's im2col gather ([`crate::isa::View::Im2Col`]), so the layout
    /// has one walker; [`ConvShape::im2col_index`] is the address generator's random-access form
    /// of it, and the op tests check the two agree.
    pub fn im2col(&self, x: &[u32]) -> Matrix {
        let (m, k, _) = self.gemm();
        let view = View::Im2Col { window: self.window(), image: [self.batch, self.h, self.w, self.c_in] };
        Matrix { rows: m, cols: k, data: view.gather(x, m * k).into_owned() }
    }
}

/// An operation of the `op` command and the training executor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum OpKind {
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

impl OpKind {
    /// Name and shape, for messages.
    pub fn describe(&self) -> String {
        match self {
            OpKind::Matmul { m, k, n } => format!("matmul {m}x{k}x{n}"),
            OpKind::Conv2d(c) => format!(
                "conv2d {}x{}x{}x{} -> {} ({}x{}, stride {}, pad {})",
                c.batch, c.h, c.w, c.c_in, c.c_out, c.kh, c.kw, c.stride, c.pad
            ),
            OpKind::Relu { n } => format!("relu {n}"),
            OpKind::Softmax { rows, cols } => format!("softmax {rows}x{cols}"),
            OpKind::Adam { n, .. } => format!("adam {n}"),
        }
    }

    /// Lengths of the inputs in elements (every entry `usize::MAX` if one does not fit, which
    /// [`OpKind::check`] reports).
    pub fn input_lens(&self) -> Vec<usize> {
        self.lens().map_or_else(|_| vec![usize::MAX; self.arity().0], |(i, _)| i)
    }

    /// Lengths of the outputs in elements (every entry `usize::MAX` if one does not fit).
    pub fn output_lens(&self) -> Vec<usize> {
        self.lens().map_or_else(|_| vec![usize::MAX; self.arity().1], |(_, o)| o)
    }

    /// Number of inputs and outputs.
    fn arity(&self) -> (usize, usize) {
        match self {
            OpKind::Matmul { .. } | OpKind::Conv2d(_) => (2, 1),
            OpKind::Relu { .. } | OpKind::Softmax { .. } => (1, 1),
            OpKind::Adam { .. } => (4, 3),
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
            OpKind::Matmul { m, k, n } => {
                (vec![prod("A's elements", &[m, k])?, prod("W's elements", &[k, n])?], vec![prod("outputs", &[m, n])?])
            }
            OpKind::Conv2d(c) => {
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
            OpKind::Relu { n } => (vec![n], vec![n]),
            OpKind::Softmax { rows, cols } => {
                let n = prod("elements", &[rows, cols])?;
                (vec![n], vec![n])
            }
            OpKind::Adam { n, .. } => (vec![n; 4], vec![n; 3]),
        })
    }

    /// Checks the shape alone (not its fit on a machine): every dimension at least 1, a conv
    /// kernel that fits its padded input with a stride >= 1, and element and byte counts that
    /// fit 64 bits. [`HwError::Shape`] errors name the op.
    pub fn check(&self) -> Result<(), HwError> {
        let dims: Vec<usize> = match *self {
            OpKind::Matmul { m, k, n } => vec![m, k, n],
            OpKind::Conv2d(c) => vec![c.batch, c.h, c.w, c.c_in, c.c_out, c.kh, c.kw],
            OpKind::Relu { n } | OpKind::Adam { n, .. } => vec![n],
            OpKind::Softmax { rows, cols } => vec![rows, cols],
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

    /// The GEMM `(M, K, N)` the op runs on the MXU (conv2d: its im2col GEMM); `None` for VPU ops.
    pub fn gemm_dims(&self) -> Option<(usize, usize, usize)> {
        match *self {
            OpKind::Matmul { m, k, n } => Some((m, k, n)),
            OpKind::Conv2d(c) => Some(c.gemm()),
            _ => None,
        }
    }
}

/// Result of an op.
#[derive(Debug, Clone, PartialEq)]
pub struct OpOutput {
    /// Output bits, one vector per output ([`OpKind::output_lens`]): accumulator format for
    /// matmul/conv2d (row-major `M x N`), fp32 for VPU ops.
    pub out: Vec<Vec<u32>>,
    /// Whole-op timing (identical in every mode).
    pub timing: OpTiming,
}

/// The op's tiling: everything [`timing()`] and the value path share.
struct Plan {
    tiles: Vec<TileWork>,
    buffers: usize,
    /// Matmul: schedule and weight-slot words. VPU: chunk length (elements or rows).
    sched: Option<Schedule>,
    slot_words: u64,
    chunk: usize,
    /// Number of chunks (VPU ops) or folds.
    count: usize,
}

fn shape_err(kind: &OpKind, detail: String) -> HwError {
    HwError::Shape { op: kind.describe(), detail }
}

fn overflow(kind: &OpKind, memory: &str, field: &str, what: String, needed: u64, available: u64) -> HwError {
    HwError::SramOverflow {
        op: kind.describe(),
        memory: memory.into(),
        field: field.into(),
        what,
        needed_bytes: needed,
        available_bytes: available,
    }
}

fn vpu_ops(kind: &OpKind, cols: usize) -> Vec<VpuOp> {
    match *kind {
        OpKind::Relu { .. } => vec![VpuOp::Relu],
        OpKind::Softmax { .. } => vec![
            VpuOp::ReduceMax { cols, axis: Axis::Row },
            VpuOp::Sub,
            VpuOp::Exp,
            VpuOp::ReduceSum { cols, axis: Axis::Row },
            VpuOp::Recip,
            VpuOp::Mul,
        ],
        OpKind::Adam { lr, b1, b2, eps, t, .. } => vec![VpuOp::Adam { lr, b1, b2, eps, t }],
        _ => vec![],
    }
}

/// VPU cycles of each sub-op of a chunk of `len` elements (`len / cols` rows for softmax).
fn vpu_chunk_cycles(cfg: &HwConfig, kind: &OpKind, len: usize) -> Result<Vec<u64>, HwError> {
    match *kind {
        OpKind::Softmax { cols, .. } => {
            let rows = len / cols;
            let ops = vpu_ops(kind, cols);
            let lens = [len, len, len, len, rows, len];
            ops.iter().zip(lens).map(|(o, n)| Ok(vpu::try_timing(cfg, o, n)?.cycles)).collect()
        }
        _ => vpu_ops(kind, 1).iter().map(|o| Ok(vpu::try_timing(cfg, o, len)?.cycles)).collect(),
    }
}

/// An op's tiling on a machine in numbers, found without allocating anything proportional to
/// the op: what [`build_plan`] builds from and what [`host_bytes`] estimates from.
struct Geometry {
    /// Tiles: MXU folds or VPU chunks.
    count: usize,
    /// Tile buffers `B` (at most `dma.buffers`; fewer if they do not fit).
    buffers: usize,
    /// VPU ops: units (elements, or rows for softmax) per chunk; 0 for MXU ops.
    chunk: usize,
    /// VPU ops: elements per unit (softmax: `cols`, else 1).
    unit: usize,
    /// MXU ops: words of one weight-buffer tile slot; 0 for VPU ops.
    slot_words: u64,
    /// DRAM words of the op's inputs and outputs.
    dram_words: u64,
}

/// Checks that `kind` can run on `cfg` (shape, DRAM and SRAM fit) and sizes its tiling.
fn geometry(cfg: &HwConfig, kind: &OpKind) -> Result<Geometry, HwError> {
    kind.check()?;
    let lens = kind.input_lens();
    // `check` guarantees that these sums and products fit 64 bits.
    let dram_words: u64 = lens.iter().chain(&kind.output_lens()).map(|&l| l as u64).sum();
    if dram_words * 4 > cfg.dram.bytes {
        return Err(HwError::DramOverflow {
            op: kind.describe(),
            needed_bytes: dram_words * 4,
            available_bytes: cfg.dram.bytes,
        });
    }
    // From here every length is below the DRAM's 2^31 words, so products below fit 64 bits.
    let m = &cfg.memory;
    let nb = cfg.dma.buffers.max(1);
    if let Some((mm, kk, nn)) = kind.gemm_dims() {
        let (r, c) = (cfg.mxu.rows, cfg.mxu.cols);
        let ub = &m.unified_buffer;
        let need = lens[0] as u64 * ub.word_bytes();
        if need > ub.bytes {
            return Err(overflow(
                kind,
                "unified buffer",
                "memory.unified_buffer.bytes",
                format!("the whole activation input, {} elements", lens[0]),
                need,
                ub.bytes,
            ));
        }
        let acc = &m.accumulator;
        let need = (mm * nn) as u64 * acc.word_bytes();
        if need > acc.bytes {
            return Err(overflow(
                kind,
                "accumulator",
                "memory.accumulator.bytes",
                format!("the {mm}x{nn} output"),
                need,
                acc.bytes,
            ));
        }
        let wb = &m.weight_buffer;
        // IS streams the fold's `kr x N` rows of W (the stationary A tile comes from the UB).
        let slot_words = mxu::access::weight_slot_words(&cfg.mxu, kk, nn) as u64;
        let buffers = (wb.words() / slot_words).min(nb as u64) as usize;
        if buffers == 0 {
            return Err(overflow(
                kind,
                "weight buffer",
                "memory.weight_buffer.bytes",
                format!("one weight tile of {slot_words} elements"),
                slot_words * wb.word_bytes(),
                wb.bytes,
            ));
        }
        let count = match cfg.mxu.dataflow {
            Dataflow::WeightStationary => kk.div_ceil(r) * nn.div_ceil(c),
            Dataflow::OutputStationary => mm.div_ceil(r) * nn.div_ceil(c),
            Dataflow::InputStationary => kk.div_ceil(r) * mm.div_ceil(c),
        };
        return Ok(Geometry { count, buffers, chunk: 0, unit: 0, slot_words, dram_words });
    }
    // VPU ops.
    let ub = &m.unified_buffer;
    if ub.word_bits < 32 {
        return Err(HwError::Shape {
            op: kind.describe(),
            detail: format!("VPU ops keep fp32 data in the unified buffer, which has {}-bit words (memory.unified_buffer.word_bits must be 32)", ub.word_bits),
        });
    }
    let (ni, no) = (lens.len() as u64, kind.output_lens().len() as u64);
    let per_elem = (ni + no) * nb as u64;
    let (unit, total) = match *kind {
        OpKind::Softmax { rows, cols } => (cols, rows),
        _ => (1, lens[0]),
    };
    let cap_units = (ub.words() / (per_elem * unit as u64)) as usize;
    let lanes = cfg.vpu.lanes;
    // Whole vectors per chunk where possible (rows for softmax).
    let chunk = if unit == 1 && cap_units >= lanes { cap_units / lanes * lanes } else { cap_units };
    if chunk == 0 {
        return Err(overflow(
            kind,
            "unified buffer",
            "memory.unified_buffer.bytes",
            format!(
                "{nb} buffers of {ni} inputs + {no} outputs for one {}",
                if unit == 1 { "element".to_string() } else { format!("row of {unit}") }
            ),
            per_elem * unit as u64 * ub.word_bytes(),
            ub.bytes,
        ));
    }
    let chunk = chunk.min(total);
    Ok(Geometry { count: total.div_ceil(chunk), buffers: nb, chunk, unit, slot_words: 0, dram_words })
}

fn build_plan(cfg: &HwConfig, kind: &OpKind) -> Result<Plan, HwError> {
    let g = geometry(cfg, kind)?;
    let lens = kind.input_lens();
    let m = &cfg.memory;
    if let Some((mm, kk, nn)) = kind.gemm_dims() {
        let (r, c) = (cfg.mxu.rows, cfg.mxu.cols);
        let (ub, acc, wb) = (&m.unified_buffer, &m.accumulator, &m.weight_buffer);
        let sched = Schedule::new(&cfg.mxu, mm, kk, nn)?;
        let eb = cfg.mxu.input_format.bits() as u64 / 8;
        let tiles = sched
            .folds
            .iter()
            .enumerate()
            .map(|(f, fold)| {
                let mut loads = Vec::new();
                if f == 0 {
                    loads.push((lens[0] as u64 * eb, ub.clone()));
                }
                let wrows = match cfg.mxu.dataflow {
                    Dataflow::WeightStationary | Dataflow::InputStationary => fold.kr,
                    Dataflow::OutputStationary => kk,
                };
                loads.push(((wrows * fold.nc) as u64 * eb, wb.clone()));
                let (latency, release) = match cfg.mxu.dataflow {
                    Dataflow::WeightStationary => ((mm + r + fold.nc) as u64, (r + c - 1) as u64),
                    Dataflow::OutputStationary => (sched.period, (kk + c - 1) as u64),
                    // The last row of W enters the array's last row at `N + R - 1`.
                    Dataflow::InputStationary => ((nn + r + fold.mr) as u64, (nn + r) as u64),
                };
                let stores = match store_rows(cfg, &sched, f) {
                    Some(rows) => vec![((rows * fold.nc) as u64 * acc.word_bytes(), acc.clone())],
                    None => vec![],
                };
                TileWork { loads, occupancy: sched.period, latency: latency.max(sched.period), release, stores }
            })
            .collect();
        return Ok(Plan {
            tiles,
            buffers: g.buffers,
            sched: Some(sched),
            slot_words: g.slot_words,
            chunk: 0,
            count: g.count,
        });
    }
    // VPU ops.
    let ub = &m.unified_buffer;
    let (ni, no) = (lens.len(), kind.output_lens().len());
    let (chunk, unit) = (g.chunk, g.unit);
    let total = lens[0] / unit;
    let tiles = (0..g.count)
        .map(|f| {
            let units = chunk.min(total - f * chunk);
            let elems = (units * unit) as u64;
            let cyc = vpu_chunk_cycles(cfg, kind, elems as usize)?.iter().try_fold(0u64, |a, &c| a.checked_add(c));
            let cyc = cyc.ok_or_else(|| shape_err(kind, "a chunk's cycle count does not fit 64 bits".into()))?;
            Ok(TileWork {
                loads: (0..ni).map(|_| (elems * 4, ub.clone())).collect(),
                occupancy: cyc,
                latency: cyc,
                release: cyc,
                stores: (0..no).map(|_| (elems * 4, ub.clone())).collect(),
            })
        })
        .collect::<Result<_, HwError>>()?;
    Ok(Plan { tiles, buffers: g.buffers, sched: None, slot_words: 0, chunk, count: g.count })
}

/// Rows stored after fold `f` if its output tile is complete (WS: last K fold of an N tile;
/// IS: last K fold of an M tile).
fn store_rows(cfg: &HwConfig, s: &Schedule, f: usize) -> Option<usize> {
    let fold = &s.folds[f];
    match cfg.mxu.dataflow {
        Dataflow::WeightStationary => (fold.k0 + fold.kr == s.k).then_some(s.m),
        Dataflow::OutputStationary => Some(fold.mr),
        Dataflow::InputStationary => (fold.k0 + fold.kr == s.k).then_some(fold.mr),
    }
}

/// Whole-op timing of `kind` on `cfg` (errors if the shape is invalid, a tile cannot fit, or a
/// count does not fit 64 bits; never panics).
pub fn timing(cfg: &HwConfig, kind: &OpKind) -> Result<OpTiming, HwError> {
    let p = build_plan(cfg, kind)?;
    plan_timing(cfg, kind, &p)
}

fn plan_timing(cfg: &HwConfig, kind: &OpKind, p: &Plan) -> Result<OpTiming, HwError> {
    let (work, width, out_db) = match kind.gemm_dims() {
        // Below 2^62 (each of M*K and K*N fits the DRAM); saturating all the same.
        Some((m, k, n)) => (m.saturating_mul(k).saturating_mul(n) as f64, (cfg.mxu.rows * cfg.mxu.cols) as f64, false),
        None => {
            let n = kind.input_lens()[0] * kind.output_lens().len();
            (n as f64, cfg.vpu.lanes as f64, true)
        }
    };
    timing::plan(cfg, &kind.describe(), &p.tiles, p.buffers, out_db, work, width)
}

/// Host bytes running `kind` on `cfg` in `mode` needs, estimated before anything is allocated:
/// the caller's inputs and the outputs, the tile plan and timing, and per mode the functional
/// twin's copies (im2col matrix, decoded operands) or the memories the cycle-level path
/// materialises (every SRAM word and the op's DRAM words, each with its last-write cycle) plus
/// the largest fold's or chunk's working set. Hybrid needs what `CycleLevel` needs.
///
/// Errors (shape, DRAM or SRAM fit, as [`timing()`] reports them) come first, so an op that
/// cannot run is refused for the right reason; `Ok(None)` means the estimate exceeds 2^64.
/// Check the estimate with [`crate::budget::HostMemory::check`] before generating the inputs.
pub fn host_bytes(cfg: &HwConfig, kind: &OpKind, mode: ExecMode) -> Result<Option<u64>, HwError> {
    let g = geometry(cfg, kind)?;
    let (ins, outs) = (kind.input_lens(), kind.output_lens());
    let words = |v: &[usize]| v.iter().map(|&l| l as u64).sum::<u64>();
    let (w_in, w_out) = (words(&ins), words(&outs));
    let word = 4u64;
    let gemm = kind.gemm_dims();
    let plan = plan_bytes(kind, &g);
    let io = Some((w_in + w_out) * word);
    let work = match (mode, gemm) {
        (ExecMode::Functional, Some((m, k, n))) => mxu::gemm_host_bytes(cfg, m, k, n, ExecMode::Functional, false),
        (ExecMode::Functional, None) => vpu_chunk_bytes(cfg, kind, ins[0], ExecMode::Functional),
        (ExecMode::CycleLevel, _) => {
            let m = &cfg.memory;
            let mem_words = [m.unified_buffer.words(), m.accumulator.words(), m.weight_buffer.words(), g.dram_words];
            let mems = mem_words.iter().try_fold(0u64, |a, &w| a.checked_add(w)).and_then(|w| w.checked_mul(4 + 8));
            let tile = match gemm {
                Some((mm, kk, nn)) => {
                    let (r, c) = (cfg.mxu.rows, cfg.mxu.cols);
                    let (fm, fk, fnn) = match cfg.mxu.dataflow {
                        Dataflow::WeightStationary => (mm, kk.min(r), nn.min(c)),
                        Dataflow::OutputStationary => (mm.min(r), kk, nn.min(c)),
                        Dataflow::InputStationary => (mm.min(c), kk.min(r), nn),
                    };
                    let fold = mxu::gemm_host_bytes(cfg, fm, fk, fnn, ExecMode::Functional, false);
                    // With MXU faults: the whole GEMM's operands, every fold's partial sums (at
                    // most `M x N` per K fold) and the faulty array run ([`mxu::fold_psums`]).
                    let k_folds = match cfg.mxu.dataflow {
                        Dataflow::WeightStationary | Dataflow::InputStationary => kk.div_ceil(r),
                        Dataflow::OutputStationary => 1,
                    };
                    let faulty = sum(&[
                        product(&[mm, kk, word as usize]),
                        product(&[kk, nn, word as usize]),
                        product(&[mm, nn, k_folds, word as usize]),
                        mxu::gemm_host_bytes(cfg, mm, kk, nn, ExecMode::CycleLevel, true),
                    ]);
                    fold.max(faulty)
                }
                None => vpu_chunk_bytes(cfg, kind, g.chunk * g.unit, ExecMode::CycleLevel),
            };
            sum(&[mems, tile])
        }
    };
    Ok(sum(&[io, plan, work]))
}

/// Host bytes [`timing()`] needs for `kind` on `cfg` (its tile plan and timing), estimated
/// before anything is allocated; errors as [`timing()`]'s, `Ok(None)` beyond 2^64. Part of
/// [`host_bytes`], for a caller that times an op without running it.
pub fn timing_host_bytes(cfg: &HwConfig, kind: &OpKind) -> Result<Option<u64>, HwError> {
    Ok(plan_bytes(kind, &geometry(cfg, kind)?))
}

/// Host bytes of the tile plan of `kind` with geometry `g` and of its two timings.
fn plan_bytes(kind: &OpKind, g: &Geometry) -> Option<u64> {
    let (ins, outs) = (kind.input_lens(), kind.output_lens());
    let gemm = kind.gemm_dims();
    // Per tile: its work (loads and stores listed inline), and in each of the two timing plans
    // (with and without DMA) its timing and five per-tile scratch vectors; per transfer: its
    // record, its interval in the DMA-busy union and its entry in the run's action list.
    let parts = match gemm {
        Some(_) => 3,
        None => ins.len() + outs.len(),
    };
    let transfers = product(&[g.count, parts]).and_then(|t| t.checked_add(1));
    let per_tile = size_of::<TileWork>() + parts * size_of::<(u64, SramConfig)>();
    let per_timing_tile = size_of::<TileTiming>() + 5 * size_of::<u64>() + size_of::<Option<u64>>() + 16;
    let per_transfer = size_of::<Transfer>() + 16 + 24;
    sum(&[
        product(&[g.count, per_tile]),
        product(&[g.count, 2 * per_timing_tile]),
        transfers.and_then(|t| t.checked_mul(2 * per_transfer as u64)),
        // The fold schedule, and the copy the gemm path runs from.
        if gemm.is_some() { product(&[g.count, 2 * size_of::<Fold>()]) } else { Some(0) },
    ])
}

/// Host bytes of running a VPU op's instructions on `len` elements in `mode` (the whole input
/// in the functional twin, one chunk in cycle-level execution): the results, softmax's
/// intermediate vectors, and when stepped the operands read from the UB, the per-element
/// issue and write-back cycles and the per-cycle schedule of a reduction (or the ALU pipeline).
fn vpu_chunk_bytes(cfg: &HwConfig, kind: &OpKind, len: usize, mode: ExecMode) -> Option<u64> {
    let (ni, no) = kind.arity();
    let softmax = matches!(kind, OpKind::Softmax { .. });
    // Softmax: max, x - max, exp, sum, 1/sum and two broadcasts, one vector each.
    let intermediates = if softmax { product(&[len, 7, 4]) } else { Some(0) };
    let results = product(&[len, no, 4]);
    match mode {
        ExecMode::Functional => sum(&[results, intermediates]),
        ExecMode::CycleLevel => {
            let (times, steps) = if softmax {
                let cycles = vpu_chunk_cycles(cfg, kind, len).ok()?.iter().try_fold(0u64, |a, &c| a.checked_add(c))?;
                // Four per-cycle action lists of a reduction, under 96 bytes a cycle together.
                (Some(0), cycles.checked_mul(96))
            } else {
                let pipe = product(&[cfg.vpu.lanes, cfg.vpu.pipeline_depth as usize, 4]);
                (product(&[len, 1 + no, size_of::<u64>()]), pipe)
            };
            sum(&[product(&[len, ni, 4]), results, intermediates, times, steps])
        }
    }
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

/// What one DMA transfer moves: a 2-D block of `rows x cols` words.
#[derive(Debug, Clone, Copy)]
struct Block {
    dir: Direction,
    /// On-chip memory (loads: destination; stores: source).
    sram: Unit,
    dram_base: u64,
    dram_stride: u64,
    sram_base: u64,
    sram_stride: u64,
    rows: usize,
    cols: usize,
    /// Bytes per element for the bandwidth model.
    eb: u64,
}

/// The memories and registers of one cycle-level op run.
struct Machine<'a> {
    cfg: &'a HwConfig,
    kind: &'a OpKind,
    plan: &'a Plan,
    t: &'a OpTiming,
    dram: Memory,
    ub: Memory,
    acc: Memory,
    wbuf: Memory,
    /// DRAM base address of each input and output.
    in_base: Vec<u64>,
    out_base: Vec<u64>,
    /// With MXU faults: each fold's partial sums from the continuously pipelined array
    /// ([`mxu::fold_psums`]), which the folds take instead of running the array themselves.
    psums: Option<Vec<Matrix>>,
    vpu_faults: Vec<Vec<FaultEvent>>,
    acc_addr_faults: Vec<ActiveFault>,
    tile_faults: Vec<ActiveFault>,
    src_faults: Vec<ActiveFault>,
    dst_faults: Vec<ActiveFault>,
    /// Step the MXU/VPU only for tiles with a fault in them.
    hybrid: bool,
}

impl<'a> Machine<'a> {
    fn new(
        cfg: &'a HwConfig,
        kind: &'a OpKind,
        inputs: &[&[u32]],
        plan: &'a Plan,
        t: &'a OpTiming,
        faults: &FaultSchedule,
    ) -> Result<Machine<'a>, HwError> {
        let mut base = 0u64;
        let mut in_base = Vec::new();
        for x in inputs {
            in_base.push(base);
            base += x.len() as u64;
        }
        let mut out_base = Vec::new();
        for l in kind.output_lens() {
            out_base.push(base);
            base += l as u64;
        }
        // Only the op's footprint is materialised; DRAM words outside it hold nothing the op
        // reads (a read through a faulty address there returns 0), so faults there are dead.
        let dram_words = base;
        let mut m = Machine {
            cfg,
            kind,
            plan,
            t,
            dram: Memory::dram(dram_words),
            ub: Memory::unified_buffer(cfg),
            acc: Memory::accumulator(cfg),
            wbuf: Memory::weight_buffer(cfg),
            in_base,
            out_base,
            psums: None,
            vpu_faults: vec![vec![]; plan.count],
            acc_addr_faults: vec![],
            tile_faults: vec![],
            src_faults: vec![],
            dst_faults: vec![],
            hybrid: false,
        };
        for (x, &b) in inputs.iter().zip(&m.in_base) {
            m.dram.poke_slice(b, x);
        }
        for e in &faults.events {
            let tile = e.at.tile;
            let active = e.activate(t.tiles[tile].origin);
            match (e.site.unit, e.site.register) {
                // Run below, as one pipelined GEMM.
                (Unit::Mxu, _) => {}
                (Unit::Vpu, _) => m.vpu_faults[tile].push(*e),
                (Unit::Ub, _) => m.ub.inject(active)?,
                (Unit::Acc, _) => m.acc.inject(active)?,
                (Unit::Wbuf, _) => m.wbuf.inject(active)?,
                (Unit::Dram, _) if (e.site.instance[0] as u64) < m.dram.words() => m.dram.inject(active)?,
                (Unit::Dram, _) => {}
                (Unit::Seq, Register::AccAddr) => m.acc_addr_faults.push(active),
                (Unit::Seq, _) => m.tile_faults.push(active),
                (Unit::Dma, Register::SrcAddr) => m.src_faults.push(active),
                (Unit::Dma, _) => m.dst_faults.push(active),
            }
        }
        // MXU faults: the array runs the op's folds as one continuously pipelined GEMM (fault
        // times from each fold's start, as `gemm` and training count them), fed the operands
        // the memories hold; a fault after the array's last cycle is dead.
        let mxu: Vec<FaultEvent> = faults.events.iter().filter(|e| e.site.unit == Unit::Mxu).copied().collect();
        if let (Some(s), false) = (&plan.sched, mxu.is_empty()) {
            if mxu.len() != faults.events.len() {
                return Err(HwError::BadSite {
                    site: mxu[0].site.to_string(),
                    why: "an op run takes MXU register faults or faults elsewhere, not both".into(),
                });
            }
            let live = mxu.into_iter().filter(|e| s.folds[e.at.tile].start.saturating_add(e.at.cycle) < s.total_cycles);
            let (a, w) = gemm_operands(kind, inputs).expect("an op with MXU faults is a GEMM");
            let events = FaultSchedule { events: live.collect() };
            m.psums = Some(mxu::fold_psums(cfg, &a, &w, ExecMode::CycleLevel, &events)?);
        }
        Ok(m)
    }

    fn outputs(&self) -> Vec<Vec<u32>> {
        self.kind
            .output_lens()
            .iter()
            .zip(&self.out_base)
            .map(|(&l, &b)| (0..l as u64).map(|i| self.dram.peek(b + i).unwrap_or(0)).collect())
            .collect()
    }

    fn sram(&mut self, u: Unit) -> &mut Memory {
        match u {
            Unit::Acc => &mut self.acc,
            Unit::Wbuf => &mut self.wbuf,
            _ => &mut self.ub,
        }
    }

    fn sram_cfg(&self, u: Unit) -> &crate::config::SramConfig {
        self.cfg.memory.sram(u).unwrap_or(&self.cfg.memory.unified_buffer)
    }

    /// Moves a block word by word through the DMA address registers.
    fn transfer(&mut self, tr: &Transfer, b: &Block) {
        let bw = dma::bandwidth(self.cfg, self.sram_cfg(b.sram), b.dir);
        let dram_addr = |i: usize| b.dram_base + (i / b.cols) as u64 * b.dram_stride + (i % b.cols) as u64;
        let sram_addr = |i: usize| b.sram_base + (i / b.cols) as u64 * b.sram_stride + (i % b.cols) as u64;
        let (src_g, dst_g): (&dyn Fn(usize) -> u64, &dyn Fn(usize) -> u64) = match b.dir {
            Direction::Load => (&dram_addr, &sram_addr),
            Direction::Store => (&sram_addr, &dram_addr),
        };
        let n = b.rows * b.cols;
        let src_faults = std::mem::take(&mut self.src_faults);
        let dst_faults = std::mem::take(&mut self.dst_faults);
        // The registers belong to the transfer in its data phase (requests are pipelined), which
        // starts when word 0 moves.
        let load = dma::word_cycle(self.cfg, tr.start, 0, b.eb, bw);
        let mut src = AddrReg::new(src_g(0), DMA_ADDR_BITS, load, &src_faults);
        let mut dst = AddrReg::new(dst_g(0), DMA_ADDR_BITS, load, &dst_faults);
        for i in 0..n {
            let t = dma::word_cycle(self.cfg, tr.start, i as u64, b.eb, bw);
            let (s, d) = (src.use_at(t), dst.use_at(t));
            match b.dir {
                Direction::Load => {
                    let v = self.dram.read(s, t);
                    self.sram(b.sram).write(d, v, t);
                }
                Direction::Store => {
                    let v = self.sram(b.sram).read(s, t);
                    self.dram.write(d, v, t);
                }
            }
            if i + 1 < n {
                src.advance(src_g(i + 1) as i64 - src_g(i) as i64);
                dst.advance(dst_g(i + 1) as i64 - dst_g(i) as i64);
            }
        }
        self.src_faults = src_faults;
        self.dst_faults = dst_faults;
    }

    fn gemm_block(&self, tr: &Transfer) -> Block {
        let s = self.plan.sched.as_ref().expect("gemm plan");
        let (m, k, n) = (s.m, s.k, s.n);
        let c = self.cfg.mxu.cols;
        let eb = self.cfg.mxu.input_format.bits() as u64 / 8;
        let fold = &s.folds[tr.tile];
        match tr.dir {
            Direction::Load if tr.tile == 0 && tr.part == 0 => {
                let len = self.kind.input_lens()[0];
                Block {
                    dir: tr.dir,
                    sram: Unit::Ub,
                    dram_base: 0,
                    dram_stride: len as u64,
                    sram_base: 0,
                    sram_stride: len as u64,
                    rows: 1,
                    cols: len,
                    eb,
                }
            }
            Direction::Load => {
                let slot = (tr.tile % self.plan.buffers) as u64 * self.plan.slot_words;
                let (k0, rows, stride) = match self.cfg.mxu.dataflow {
                    Dataflow::WeightStationary => (fold.k0, fold.kr, c),
                    Dataflow::OutputStationary => (0, k, c),
                    // All N columns of the fold's rows of W, `N` words apart.
                    Dataflow::InputStationary => (fold.k0, fold.kr, n),
                };
                Block {
                    dir: tr.dir,
                    sram: Unit::Wbuf,
                    dram_base: self.in_base[1] + (k0 * n + fold.n0) as u64,
                    dram_stride: n as u64,
                    sram_base: slot,
                    sram_stride: stride as u64,
                    rows,
                    cols: fold.nc,
                    eb,
                }
            }
            Direction::Store => {
                let (m0, rows) = match self.cfg.mxu.dataflow {
                    Dataflow::WeightStationary => (0, m),
                    Dataflow::OutputStationary | Dataflow::InputStationary => (fold.m0, fold.mr),
                };
                let off = (m0 * n + fold.n0) as u64;
                Block {
                    dir: tr.dir,
                    sram: Unit::Acc,
                    dram_base: self.out_base[0] + off,
                    dram_stride: n as u64,
                    sram_base: off,
                    sram_stride: n as u64,
                    rows,
                    cols: fold.nc,
                    eb: 4,
                }
            }
        }
    }

    fn run_gemm(&mut self) -> Result<(), HwError> {
        let prec = self.cfg.mxu.precision();
        with_precision!(prec, F => self.run_gemm_typed::<F>())
    }

    fn run_gemm_typed<F: MacFormat>(&mut self) -> Result<(), HwError> {
        let s = self.plan.sched.clone().expect("gemm plan");
        self.run_schedule(Machine::gemm_block, |m, q, c| {
            let cs = m.t.tiles[q].compute_start;
            m.fold::<F>(&s, c, cs)
        })
    }

    /// Runs the op's schedule in time order: DMA transfers (each moving the [`Block`] that
    /// `block` names for it) and tile slots. At each slot the sequencer's tile counter
    /// (`seq.tile`, faults included) names the tile that `compute(machine, slot, tile)` runs;
    /// a counter value past the last tile ends the loop.
    fn run_schedule(
        &mut self,
        block: impl Fn(&Self, &Transfer) -> Block,
        mut compute: impl FnMut(&mut Self, usize, usize) -> Result<(), HwError>,
    ) -> Result<(), HwError> {
        // Actions in time order: transfers (DMA order) and tile slots; ties: transfers first.
        let mut actions: Vec<(u64, usize, usize)> = Vec::with_capacity(self.t.transfers.len() + self.t.tiles.len());
        actions.extend(self.t.transfers.iter().enumerate().map(|(i, tr)| (tr.start, 0, i)));
        actions.extend(self.t.tiles.iter().enumerate().map(|(q, tt)| (tt.compute_start, 1, q)));
        actions.sort();
        let tile_faults = std::mem::take(&mut self.tile_faults);
        let mut counter = AddrReg::new(0, TILE_COUNTER_BITS, 0, &tile_faults);
        let mut halted = false;
        for (_, kind, i) in actions {
            if kind == 0 {
                let tr = self.t.transfers[i];
                let b = block(self, &tr);
                self.transfer(&tr, &b);
                continue;
            }
            let c = counter.use_at(self.t.tiles[i].compute_start) as usize;
            counter.advance(1);
            if halted || c >= self.plan.count {
                halted = true;
                continue;
            }
            compute(self, i, c)?;
        }
        self.tile_faults = tile_faults;
        Ok(())
    }

    /// Executes fold `c` of the schedule in a fold slot starting at cycle `cs`: its operands
    /// read from the SRAMs at the cycles the array takes them, its partial sums (those of
    /// [`Machine::psums`] when the array has faults) added into the accumulators.
    fn fold<F: MacFormat>(&mut self, s: &Schedule, c: usize, cs: u64) -> Result<(), HwError> {
        let fold: Fold = s.folds[c];
        let cfg = self.cfg;
        let (k, n) = (s.k, s.n);
        let mask = cfg.mxu.input_format.mask();
        let slot = (c % self.plan.buffers) as u64 * self.plan.slot_words;
        let conv = match self.kind {
            OpKind::Conv2d(cv) => Some(*cv),
            _ => None,
        };
        let ub = &self.ub;
        let a_at = |mi: usize, ki: usize, t: u64| -> u32 {
            let addr = match conv {
                Some(cv) => cv.im2col_index(mi, ki).map(|e| e as u64),
                None => Some((mi * k + ki) as u64),
            };
            addr.map_or(0, |a| ub.read(a, t) & mask)
        };
        let ps = match &self.psums {
            Some(p) => p[c].clone(),
            None => {
                // The fold's operands as the array reads them, each at its cycle
                // ([`mxu::access`]): `A[m0..m0+mr][k0..k0+kr]` and `W[k0..k0+kr][n0..n0+nc]`.
                let a = Matrix::from_fn(fold.mr, fold.kr, |i, j| {
                    let (mi, ki) = (fold.m0 + i, fold.k0 + j);
                    a_at(mi, ki, cs + s.a_read(c, mi, ki).expect("the fold reads its operands"))
                });
                let w = Matrix::from_fn(fold.kr, fold.nc, |i, j| {
                    let (ki, ni) = (fold.k0 + i, fold.n0 + j);
                    let word = s.weight_word(c, ki, ni).expect("the fold's tile holds its weights");
                    let t = cs + s.w_read(c, ki, ni).expect("the fold reads its weights");
                    self.wbuf.read(slot + word as u64, t) & mask
                });
                mxu::gemm(cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none())?.out
            }
        };
        // Accumulator writes, in time order, through seq.acc_addr: it is loaded with each
        // line's first word address when that line is written, advanced line to line.
        let lines = s.result_lines(c);
        let golden = |l: &mxu::access::ResultLine| (l.m * n + l.n) as u64;
        let (psum_m, psum_n) = (fold.m0, fold.n0);
        let bits = addr_bits(cfg.memory.accumulator.words());
        let mut reg = AddrReg::new(golden(&lines[0]), bits, cs + lines[0].cycle, &self.acc_addr_faults);
        for (idx, l) in lines.iter().enumerate() {
            let t = cs + l.cycle;
            let base = reg.use_at(t);
            for j in 0..l.len {
                let addr = base + (j * l.stride(n)) as u64;
                let (mi, ni) = l.element(j);
                let p = ps.get(mi - psum_m, ni - psum_n);
                let v = if fold.overwrite { p } else { F::add(self.acc.read(addr, t), p) };
                self.acc.write(addr, v, t);
            }
            if let Some(next) = lines.get(idx + 1) {
                reg.advance(golden(next) as i64 - golden(l) as i64);
            }
        }
        Ok(())
    }

    fn run_vpu(&mut self) -> Result<(), HwError> {
        let lens = self.kind.input_lens();
        let (ni, no) = (lens.len(), self.kind.output_lens().len());
        let unit = match *self.kind {
            OpKind::Softmax { cols, .. } => cols,
            _ => 1,
        };
        let chunk_elems = self.plan.chunk * unit;
        let total = lens[0];
        let elems_of = |f: usize| chunk_elems.min(total - f * chunk_elems);
        let buffers = self.plan.buffers;
        let slot_base = |f: usize| (f % buffers) as u64 * ((ni + no) * chunk_elems) as u64;
        let block = |m: &Machine, tr: &Transfer| -> Block {
            let f = tr.tile;
            let len = elems_of(f);
            let (dram, sram) = match tr.dir {
                Direction::Load => (m.in_base[tr.part], slot_base(f) + (tr.part * chunk_elems) as u64),
                Direction::Store => (m.out_base[tr.part], slot_base(f) + ((ni + tr.part) * chunk_elems) as u64),
            };
            Block {
                dir: tr.dir,
                sram: Unit::Ub,
                dram_base: dram + (f * chunk_elems) as u64,
                dram_stride: len as u64,
                sram_base: sram,
                sram_stride: len as u64,
                rows: 1,
                cols: len,
                eb: 4,
            }
        };
        self.run_schedule(block, |m, q, c| {
            let tt = m.t.tiles[q];
            let len = elems_of(c);
            let base = slot_base(c);
            let cs = tt.compute_start;
            // Single-instruction ops read each vector's operands at its issue and write each
            // result at its write-back; softmax reads at the chunk start, writes at the end.
            let times = match m.kind {
                OpKind::Softmax { .. } => None,
                k => vpu::element_cycles(m.cfg, &vpu_ops(k, 1)[0], len),
            };
            let ins: Vec<Vec<u32>> = (0..ni)
                .map(|p| {
                    (0..len)
                        .map(|e| {
                            let t = times.as_ref().map_or(cs, |(r, _)| cs + r[e]);
                            m.ub.read(base + (p * chunk_elems + e) as u64, t)
                        })
                        .collect()
                })
                .collect();
            let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
            let faults = std::mem::take(&mut m.vpu_faults[q]);
            let mode = if m.hybrid && faults.is_empty() { ExecMode::Functional } else { ExecMode::CycleLevel };
            let outs = vpu_compute(m.cfg, m.kind, &refs, mode, &faults)?;
            let end = tt.ready.saturating_sub(1).max(cs);
            for (o, vals) in outs.iter().enumerate() {
                for (e, &v) in vals.iter().enumerate() {
                    let t = times.as_ref().map_or(end, |(_, w)| cs + w[o][e]);
                    m.ub.write(base + ((ni + o) * chunk_elems + e) as u64, v, t);
                }
            }
            Ok(())
        })
    }
}
