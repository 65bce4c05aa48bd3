//! The instruction set: what a program asks the machine to do, and how one instruction executes.
//!
//! A program (built by `graph::program`) is a list of [`Instr`]s over a table of buffers, each
//! buffer a flat vector of fp32 words named by a [`BufId`]. Every value a training step computes
//! is computed by an instruction, so every value can be faulted:
//!
//! * [`Instr::Gemm`]: one matrix multiply on the MXU (TPUv1's *read weights* + *matrix
//!   multiply*). Operands are read as fp32 words and rounded to the MXU's input format by its
//!   input converter; the result is the accumulator format (fp32). Transposed operands are read
//!   in transposed order (a layout choice of the load path, exact).
//! * [`Instr::Vpu`]: one vector-unit instruction ([`crate::vpu::VpuOp`]) on `n` elements (TPUv1's
//!   *activate*, extended with reductions, the transcendental functions training needs and the
//!   fused optimizer updates). Each input is an [`Operand`]: a buffer read through an address
//!   pattern ([`View`]) so that broadcasts, per-row scalars, repeats and im2col/col2im gathers
//!   are addressing, not arithmetic. Data movement that must produce a new tensor (im2col, a
//!   repeat) is a `Copy` through the lanes, so it costs cycles and its lane registers are sites.
//!
//! [`cycles`] is an instruction's cost from the unit's own schedule; [`execute`] runs it in an
//! [`ExecMode`] and reports the same cycles. Costing a program and executing it therefore agree
//! by construction.
//!
//! * [`Instr::Dma`]: a load or store of consecutive words between DRAM and the unified buffer
//!   or accumulators. Where each buffer lives (its *home*) is the program's choice (see
//!   `graph::residency`); GEMM and VPU instructions read and write buffers wherever they live,
//!   and only DMA instructions cross between DRAM and the SRAMs.

use crate::memory::dma::{self, Direction};
use crate::error::HwError;
use crate::fault::{FaultSchedule, FaultTime};
use crate::matrix::Matrix;
use crate::vpu::{self, VpuOp};
use crate::{mxu, ExecMode, HwConfig};
use faultline_num::{f32_to_bf16_bits, NumFormat};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::ops::Range;

/// Window geometry of a convolution (square stride and zero padding on all four sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Window {
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride in both directions (>= 1).
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
}

impl Window {
    /// Output (height, width) for an input of `h x w`, or `None` if the kernel does not fit.
    pub fn output_hw(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        let pad = self.padding.checked_mul(2)?;
        let (ph, pw) = (h.checked_add(pad)?, w.checked_add(pad)?);
        if self.kh == 0 || self.kw == 0 || self.stride == 0 || ph < self.kh || pw < self.kw {
            return None;
        }
        Some(((ph - self.kh) / self.stride + 1, (pw - self.kw) / self.stride + 1))
    }

    /// Walks the im2col layout of an NHWC image of shape `img = [N, H, W, C]`: calls
    /// `f(row, offset, src)` for every im2col row (output pixel, row-major over N, OH, OW) and
    /// kernel offset (`offset = kh_i * KW + kw_j`, outer loop `kh_i`) that lands inside the
    /// image, in that order, with `src` the image offset of channel 0. Entry `(row, col)` of the
    /// im2col matrix, `col = offset * C + c`, is image element `src + c`; entries not visited
    /// are padding (zero). The one definition of the im2col layout.
    pub fn for_each_im2col_pixel(&self, img: &[usize], mut f: impl FnMut(usize, usize, usize)) {
        let (n, h, wd, c) = (img[0], img[1], img[2], img[3]);
        let Some((oh, ow)) = self.output_hw(h, wd) else { return };
        for b in 0..n {
            for y0 in 0..oh {
                for x0 in 0..ow {
                    let row = (b * oh + y0) * ow + x0;
                    for i in 0..self.kh {
                        let Some(y) = (y0 * self.stride + i).checked_sub(self.padding).filter(|&y| y < h) else {
                            continue;
                        };
                        for j in 0..self.kw {
                            let Some(x) = (x0 * self.stride + j).checked_sub(self.padding).filter(|&x| x < wd) else {
                                continue;
                            };
                            f(row, i * self.kw + j, ((b * h + y) * wd + x) * c);
                        }
                    }
                }
            }
        }
    }
}

/// Index of a buffer in a program's buffer table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufId(pub u32);

impl BufId {
    /// The table index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// The address pattern through which an operand reads its buffer: element `e` of the operand
/// (`0 <= e < n`) is the buffer word given below, counted from the operand's offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum View {
    /// Word `e`.
    Whole,
    /// Word `e / cols`: a per-row scalar repeated across each row of `cols`.
    PerRow {
        /// Row length of the operand.
        cols: usize,
    },
    /// Word `e % len`: a row vector of `len` repeated over the leading dimensions.
    Cycle {
        /// Length of the repeated vector.
        len: usize,
    },
    /// `[N, D] -> [N, T, D]`: word `(e / (T*D)) * D + e % D`.
    RepeatRows {
        /// Row length `D`.
        d: usize,
        /// Repeats `T`.
        t: usize,
    },
    /// The im2col matrix `[N*OH*OW, KH*KW*C]` of an NHWC image (zero in the padding).
    Im2Col {
        /// Kernel window.
        window: Window,
        /// Image shape `[N, H, W, C]`.
        image: [usize; 4],
    },
    /// Image-shaped `[N, H, W, C]`: for kernel offset `tap`, the im2col entry (of a `cols`
    /// buffer `[N*OH*OW, KH*KW*C]`) that was copied from each pixel at that offset, zero where
    /// that offset copied nothing. Col2im is the sum of these over the taps.
    Col2ImTap {
        /// Kernel window.
        window: Window,
        /// Image shape `[N, H, W, C]`.
        image: [usize; 4],
        /// Kernel offset `kh_i * KW + kw_j`.
        tap: usize,
    },
}

impl View {
    /// Buffer words (past the operand's offset) the view reads for an operand of `n` elements.
    pub fn span(&self, n: usize) -> usize {
        match *self {
            View::Whole => n,
            View::PerRow { cols } => n.div_ceil(cols.max(1)),
            View::Cycle { len } => len.min(n),
            View::RepeatRows { t, .. } => n / t.max(1),
            View::Im2Col { image, .. } => image.iter().product(),
            View::Col2ImTap { window, image, .. } => {
                let (oh, ow) = window.output_hw(image[1], image[2]).unwrap_or((0, 0));
                image[0] * oh * ow * window.kh * window.kw * image[3]
            }
        }
    }

    /// The smallest run of operand elements (of `n`) that a tile may start at a multiple of, so
    /// that the tile reads a contiguous part of the buffer through the same kind of view.
    fn row_unit(&self, n: usize) -> Option<usize> {
        match *self {
            View::Whole => Some(1),
            View::PerRow { cols } => Some(cols),
            View::Cycle { len } => Some(len),
            View::RepeatRows { d, t } => Some(d * t),
            // One sample's im2col rows (or image).
            View::Im2Col { image, .. } | View::Col2ImTap { image, .. } => {
                (image[0] > 0 && n.is_multiple_of(image[0])).then(|| n / image[0])
            }
        }
    }

    /// Narrows the view of an `n`-element operand (and the operand's `offset`) to elements
    /// `e0 .. e0 + len`, both multiples of [`View::row_unit`].
    fn skip(&mut self, offset: &mut usize, e0: usize, len: usize, n: usize) {
        // An image view's operand elements and buffer words per sample.
        let (per_sample, words) = match *self {
            View::Im2Col { image, .. } | View::Col2ImTap { image, .. } => {
                let samples = image[0].max(1);
                (n / samples, self.span(n) / samples)
            }
            _ => (1, 1),
        };
        match self {
            View::Whole => *offset += e0,
            View::PerRow { cols } => *offset += e0 / *cols,
            View::Cycle { .. } => {}
            View::RepeatRows { t, .. } => *offset += e0 / *t,
            View::Im2Col { image, .. } | View::Col2ImTap { image, .. } => {
                *offset += e0 / per_sample * words;
                image[0] = len / per_sample;
            }
        }
    }

    /// The operand elements (of `n`) that read word `x` through this view, ascending.
    pub fn readers(&self, x: usize, n: usize) -> Vec<usize> {
        if x >= self.span(n) {
            return Vec::new();
        }
        match *self {
            View::Whole => vec![x],
            View::PerRow { cols } => (x * cols..((x + 1) * cols).min(n)).collect(),
            View::Cycle { len } => (x..n).step_by(len.max(1)).collect(),
            View::RepeatRows { d, t } => {
                let (r, c) = (x / d.max(1), x % d.max(1));
                (0..t).map(|k| (r * t + k) * d + c).filter(|&e| e < n).collect()
            }
            View::Im2Col { .. } | View::Col2ImTap { .. } => {
                // Word i gathered as i + 1, so that the zeros the view reads no word for
                // (padding, taps that copied nothing) are told apart.
                let idx: Vec<u32> = (1..=self.span(n) as u32).collect();
                let got = self.gather(&idx, n);
                (0..n).filter(|&e| got[e] == x as u32 + 1).collect()
            }
        }
    }

    /// The `n` operand words read from `src` (which starts at the operand's offset).
    pub fn gather<'a>(&self, src: &'a [u32], n: usize) -> Cow<'a, [u32]> {
        match *self {
            View::Whole => Cow::Borrowed(&src[..n]),
            // Built with slice copies and fills (an iterator chain here costs a branch per word).
            View::PerRow { cols } => {
                let mut out = Vec::with_capacity(n);
                for &s in &src[..n / cols] {
                    out.resize(out.len() + cols, s);
                }
                Cow::Owned(out)
            }
            View::Cycle { len } => {
                let mut out = Vec::with_capacity(n);
                while len > 0 && out.len() < n {
                    out.extend_from_slice(&src[..len.min(n - out.len())]);
                }
                Cow::Owned(out)
            }
            View::RepeatRows { d, t } => {
                let mut out = Vec::with_capacity(n);
                for row in src[..n / t].chunks(d) {
                    for _ in 0..t {
                        out.extend_from_slice(row);
                    }
                }
                Cow::Owned(out)
            }
            View::Im2Col { window, image } => {
                let (oh, ow) = window.output_hw(image[1], image[2]).unwrap_or((0, 0));
                let c = image[3];
                let cols = window.kh * window.kw * c;
                let mut out = vec![0u32; image[0] * oh * ow * cols];
                window.for_each_im2col_pixel(&image, |row, off, from| {
                    let dst = row * cols + off * c;
                    out[dst..dst + c].copy_from_slice(&src[from..from + c]);
                });
                Cow::Owned(out)
            }
            View::Col2ImTap { window, image, tap } => {
                let c = image[3];
                let cols = window.kh * window.kw * c;
                let mut out = vec![0u32; image.iter().product()];
                window.for_each_im2col_pixel(&image, |row, off, to| {
                    if off == tap {
                        let from = row * cols + off * c;
                        out[to..to + c].copy_from_slice(&src[from..from + c]);
                    }
                });
                Cow::Owned(out)
            }
        }
    }
}

/// An instruction input: a buffer, a word offset into it, and the address pattern.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Operand {
    /// The buffer read.
    pub buf: BufId,
    /// First word.
    pub offset: usize,
    /// Address pattern from there.
    pub view: View,
}

impl Operand {
    /// The whole buffer from word 0.
    pub fn whole(buf: BufId) -> Operand {
        Operand { buf, offset: 0, view: View::Whole }
    }
    /// `buf` from word 0 through `view`.
    pub fn view(buf: BufId, view: View) -> Operand {
        Operand { buf, offset: 0, view }
    }
}

/// An instruction output: `n` consecutive words of a buffer from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dest {
    /// The buffer written.
    pub buf: BufId,
    /// First word.
    pub offset: usize,
}

impl Dest {
    /// `buf` from word 0.
    pub fn whole(buf: BufId) -> Dest {
        Dest { buf, offset: 0 }
    }
}

/// A GEMM operand: a row-major matrix in a buffer from `offset`, read transposed if set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatOperand {
    /// The buffer read.
    pub buf: BufId,
    /// First word.
    pub offset: usize,
    /// Stored transposed (`[cols][rows]` of the logical matrix).
    pub transposed: bool,
}

/// Which unit an instruction occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ExecUnit {
    /// The matrix unit.
    Mxu,
    /// The vector unit.
    Vpu,
    /// The DMA engine.
    Dma,
}

impl ExecUnit {
    /// The unit whose registers a site of `unit` is, if instructions run on it (memories, DMA
    /// and the sequencer run none).
    pub fn of(unit: crate::Unit) -> Option<ExecUnit> {
        match unit {
            crate::Unit::Mxu => Some(ExecUnit::Mxu),
            crate::Unit::Vpu => Some(ExecUnit::Vpu),
            _ => None,
        }
    }

    /// Every unit, in the order timelines list them.
    pub const ALL: [ExecUnit; 3] = [ExecUnit::Mxu, ExecUnit::Vpu, ExecUnit::Dma];

    /// Lower-case name: `mxu`, `vpu` or `dma`.
    pub const fn name(self) -> &'static str {
        match self {
            ExecUnit::Mxu => "mxu",
            ExecUnit::Vpu => "vpu",
            ExecUnit::Dma => "dma",
        }
    }
}

/// One machine instruction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Instr {
    /// `out[M][N] = A[M][K] * B[K][N]` on the MXU; operands rounded to the MXU input format.
    Gemm {
        /// `A` (`[M][K]`, or `[K][M]` if transposed).
        a: MatOperand,
        /// `B` (`[K][N]`, or `[N][K]` if transposed).
        b: MatOperand,
        /// Where the `M x N` result goes.
        out: Dest,
        /// Rows of the result.
        m: usize,
        /// Reduction length.
        k: usize,
        /// Columns of the result.
        n: usize,
        /// Add the product to what `out` holds (`out += A * B`: every fold adds, the first K
        /// fold included), as a later K tile of a GEMM cut along `K` does.
        acc: bool,
    },
    /// One VPU instruction on `n` elements: one operand per input of `op`, one destination per
    /// output (reductions write one word per row or column).
    Vpu {
        /// The operation.
        op: VpuOp,
        /// Elements read per input.
        n: usize,
        /// Inputs.
        ins: Vec<Operand>,
        /// Outputs.
        outs: Vec<Dest>,
        /// A column reduction that starts from what its output holds (as if those words were
        /// a first row of the input), as a later tile of a column reduction cut along its rows
        /// does; `n` counts the input's own elements.
        acc: bool,
    },
    /// A DMA transfer between DRAM and an on-chip SRAM (TPUv1's *read host memory* / *write
    /// host memory*): `dst[dst_offset + i] = src[src_offset + i]` for `len` words (a tile of a
    /// larger tensor moves with an offset). Costed by [`crate::memory::dma`]; the engine's address
    /// registers are sites.
    Dma {
        /// Load (DRAM to SRAM) or store (SRAM to DRAM).
        dir: Direction,
        /// The SRAM end of the transfer (`Ub` or `Acc`), whose ports bound its bandwidth.
        sram: crate::Unit,
        /// Buffer read.
        src: BufId,
        /// First word read.
        src_offset: usize,
        /// Buffer written.
        dst: BufId,
        /// First word written.
        dst_offset: usize,
        /// Words moved.
        len: usize,
    },
}

impl Instr {
    /// The unit the instruction runs on.
    pub fn unit(&self) -> ExecUnit {
        match self {
            Instr::Gemm { .. } => ExecUnit::Mxu,
            Instr::Vpu { .. } => ExecUnit::Vpu,
            Instr::Dma { .. } => ExecUnit::Dma,
        }
    }

    /// Short name: `gemm`, the VPU op's name, `load` or `store`.
    pub fn name(&self) -> &'static str {
        match self {
            Instr::Gemm { .. } => "gemm",
            Instr::Vpu { op, .. } => op.name(),
            Instr::Dma { dir: Direction::Load, .. } => "load",
            Instr::Dma { dir: Direction::Store, .. } => "store",
        }
    }

    /// Words written to each destination.
    pub fn out_len(&self) -> usize {
        match self {
            Instr::Gemm { m, n, .. } => m * n,
            Instr::Vpu { op, n, .. } => match *op {
                VpuOp::ReduceSum { cols, axis } | VpuOp::ReduceMax { cols, axis } => match axis {
                    vpu::Axis::Row => n / cols.max(1),
                    vpu::Axis::Col => cols,
                },
                _ => *n,
            },
            Instr::Dma { len, .. } => *len,
        }
    }

    /// Elements a VPU instruction streams through the lanes: `n`, plus the output's words an
    /// accumulating reduction starts from (0 for other instructions).
    pub fn lane_elements(&self) -> usize {
        match self {
            Instr::Vpu { n, acc, .. } => n + if *acc { self.out_len() } else { 0 },
            _ => 0,
        }
    }

    /// Buffers the instruction reads, one per input ([`Instr::read_ranges`]).
    pub fn reads(&self) -> Vec<BufId> {
        self.read_ranges().into_iter().map(|(b, _)| b).collect()
    }

    /// Where the instruction writes: one destination per output, `out_len` words each.
    pub fn dests(&self) -> Vec<Dest> {
        match self {
            Instr::Gemm { out, .. } => vec![*out],
            Instr::Vpu { outs, .. } => outs.clone(),
            Instr::Dma { dst, dst_offset, .. } => vec![Dest { buf: *dst, offset: *dst_offset }],
        }
    }

    /// Buffers the instruction writes.
    pub fn writes(&self) -> Vec<BufId> {
        self.dests().iter().map(|d| d.buf).collect()
    }

    /// The words each input reads: `(buffer, first word .. past the last)`, one per operand,
    /// then the result an accumulating instruction (`acc`) adds to.
    pub fn read_ranges(&self) -> Vec<(BufId, Range<usize>)> {
        match self {
            Instr::Gemm { a, b, out, m, k, n, acc } => {
                let mut v = vec![(a.buf, a.offset..a.offset + m * k), (b.buf, b.offset..b.offset + k * n)];
                v.extend(acc.then(|| (out.buf, out.offset..out.offset + m * n)));
                v
            }
            Instr::Vpu { ins, outs, n, acc, .. } => {
                let len = self.out_len();
                let own = ins.iter().map(|o| (o.buf, o.offset..o.offset + o.view.span(*n)));
                own.chain(outs.iter().filter(|_| *acc).map(|d| (d.buf, d.offset..d.offset + len))).collect()
            }
            Instr::Dma { src, src_offset, len, .. } => vec![(*src, *src_offset..src_offset + len)],
        }
    }

    /// Moves operands: every read `(buffer, offset)` becomes `read(buffer, offset)` and every
    /// write `write(buffer, offset)` (how a placement pass redirects an instruction to staged
    /// copies, which may hold only the part of a tensor the instruction touches).
    pub fn relocate(
        &mut self,
        read: impl Fn(BufId, usize) -> (BufId, usize),
        write: impl Fn(BufId, usize) -> (BufId, usize),
    ) {
        match self {
            Instr::Gemm { a, b, out, .. } => {
                (a.buf, a.offset) = read(a.buf, a.offset);
                (b.buf, b.offset) = read(b.buf, b.offset);
                (out.buf, out.offset) = write(out.buf, out.offset);
            }
            Instr::Vpu { ins, outs, .. } => {
                ins.iter_mut().for_each(|o| (o.buf, o.offset) = read(o.buf, o.offset));
                outs.iter_mut().for_each(|d| (d.buf, d.offset) = write(d.buf, d.offset));
            }
            Instr::Dma { src, src_offset, dst, dst_offset, .. } => {
                (*src, *src_offset) = read(*src, *src_offset);
                (*dst, *dst_offset) = write(*dst, *dst_offset);
            }
        }
    }

    /// The instruction cut into at most `parts` tiles along its leading (row, sample) dimension,
    /// each reading and writing only its rows, that together compute exactly what it computes
    /// (every output word from the same inputs in the same order). A GEMM whose `A` is stored
    /// transposed (`[K][M]`: a weight gradient, whose long dimension is the batch) is cut along
    /// `K` instead, at multiples of `k_unit` (the array's rows, so that a weight-stationary
    /// GEMM's folds, and the order it adds them in, are unchanged): every tile after the first
    /// adds to the result ([`Instr::Gemm`]'s `acc`), as every row tile after the first of a
    /// column reduction continues the sums ([`Instr::Vpu`]'s `acc`). `None` when it cannot be
    /// cut: a GEMM with both operands transposed, a VPU operand whose pattern does not repeat
    /// by rows, a DMA transfer. Fewer than `parts` tiles when it has fewer rows.
    pub fn split_rows(&self, parts: usize, k_unit: usize) -> Option<Vec<Instr>> {
        if let &Instr::Gemm { a, b, m, k, n, .. } = self {
            if a.transposed {
                // `A` is `[K][M]` and `B` must be `[K][N]`: a K tile is a run of rows of both.
                if b.transposed {
                    return None;
                }
                let tile = |(k0, len): (usize, usize)| {
                    let mut t = self.clone();
                    if let Instr::Gemm { a: ta, b: tb, k: tk, acc, .. } = &mut t {
                        ta.offset = a.offset + k0 * m;
                        tb.offset = b.offset + k0 * n;
                        *tk = len;
                        *acc |= k0 > 0;
                    }
                    t
                };
                return Some(cuts(k, k_unit, parts).map(tile).collect());
            }
        }
        let (rows, unit) = self.row_unit()?;
        Some(cuts(rows, 1, parts).map(|(r0, len)| self.rows(r0, len, unit)).collect())
    }

    /// The rows [`Instr::split_rows`] cuts along and the elements (GEMM: result rows) per row.
    fn row_unit(&self) -> Option<(usize, usize)> {
        match self {
            Instr::Gemm { a, m, .. } => (!a.transposed).then_some((*m, 1)),
            Instr::Vpu { op, n, ins, .. } => {
                let mut unit = match *op {
                    VpuOp::ReduceSum { cols, .. } | VpuOp::ReduceMax { cols, .. } => cols,
                    _ => 1,
                };
                for o in ins {
                    unit = lcm(unit, o.view.row_unit(*n)?);
                }
                (unit > 0 && n.is_multiple_of(unit)).then(|| (n / unit, unit))
            }
            Instr::Dma { .. } => None,
        }
    }

    /// Rows `r0 .. r0 + rows` of the instruction, `unit` elements per row ([`Instr::row_unit`]).
    fn rows(&self, r0: usize, rows: usize, unit: usize) -> Instr {
        let mut t = self.clone();
        match &mut t {
            Instr::Gemm { a, out, m, k, n, .. } => {
                a.offset += r0 * *k;
                out.offset += r0 * *n;
                *m = rows;
            }
            Instr::Vpu { op, n, ins, outs, acc } => {
                let (e0, len) = (r0 * unit, rows * unit);
                let out0 = match *op {
                    VpuOp::ReduceSum { cols, axis: vpu::Axis::Row }
                    | VpuOp::ReduceMax { cols, axis: vpu::Axis::Row } => e0 / cols,
                    // Every row tile of a column reduction writes the same words; later ones
                    // continue from them.
                    VpuOp::ReduceSum { .. } | VpuOp::ReduceMax { .. } => {
                        *acc |= r0 > 0;
                        0
                    }
                    _ => e0,
                };
                for o in ins {
                    o.view.skip(&mut o.offset, e0, len, *n);
                }
                outs.iter_mut().for_each(|d| d.offset += out0);
                *n = len;
            }
            Instr::Dma { .. } => {}
        }
        t
    }
}

/// `0 .. len` cut into at most `parts` runs `(start, length)`, each but the last a multiple of
/// `unit`.
fn cuts(len: usize, unit: usize, parts: usize) -> impl Iterator<Item = (usize, usize)> {
    let unit = unit.max(1);
    let units = len.div_ceil(unit);
    let per = (units.div_ceil(parts.clamp(1, units.max(1))) * unit).max(1);
    (0..len).step_by(per).map(move |s| (s, per.min(len - s)))
}

/// Least common multiple (0 if either is 0).
fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    if a == 0 || b == 0 {
        0
    } else {
        a / gcd(a, b) * b
    }
}

/// Cycles of `instr` on `cfg`, from the unit's schedule (the same in every mode, and what
/// [`execute`] reports): from issue until its last result is written. Saturates at `u64::MAX`
/// for shapes whose count does not fit.
pub fn cycles(cfg: &HwConfig, instr: &Instr) -> u64 {
    match instr {
        Instr::Gemm { m, k, n, .. } => mxu::gemm_timing(&cfg.mxu, *m, *k, *n).total_cycles,
        Instr::Vpu { op, .. } => vpu::timing(cfg, op, instr.lane_elements()).cycles,
        Instr::Dma { dir, sram, len, .. } => {
            dma::transfer_cycles(cfg, (*len as u64).saturating_mul(4), dma_bandwidth(cfg, *dir, *sram))
                .unwrap_or(u64::MAX)
        }
    }
}

/// Cycles an instruction of `cycles` cycles on `unit` keeps the unit from issuing the next one.
/// The MXU and VPU are busy throughout; the DMA engine pipelines requests, so a transfer's
/// fixed overhead (`dma_overhead`, [`dma::overhead`] of the config) overlaps the previous
/// transfer's data phase and only the data phase occupies the engine.
pub fn occupancy(unit: ExecUnit, cycles: u64, dma_overhead: u64) -> u64 {
    match unit {
        ExecUnit::Dma => cycles.saturating_sub(dma_overhead),
        _ => cycles,
    }
}

/// Bandwidth of a transfer to or from `sram` (the accumulator's ports for `Acc`, else the
/// unified buffer's).
fn dma_bandwidth(cfg: &HwConfig, dir: Direction, sram: crate::Unit) -> f64 {
    let s = cfg.memory.sram(sram).unwrap_or(&cfg.memory.unified_buffer);
    dma::bandwidth(cfg, s, dir)
}

/// For a DMA instruction of `len` words issued at `start`: the cycle word `i` moves (read from
/// the source and written to the destination, [`dma::word_cycle`]).
pub fn dma_word_cycle(cfg: &HwConfig, instr: &Instr, start: u64, i: u64) -> Option<u64> {
    match instr {
        Instr::Dma { dir, sram, .. } => Some(dma::word_cycle(cfg, start, i, 4, dma_bandwidth(cfg, *dir, *sram))),
        _ => None,
    }
}

/// Where cycle `cycle` of `instr` (counted from the instruction's first cycle) falls in its
/// unit's tiles: the last MXU fold (GEMM) or VPU vector that started at or before it, and the
/// offset from that tile's origin, as a [`FaultTime`] the unit's fault hook takes. `None` past
/// the instruction's end, or before the first fold of a GEMM starts (no MXU register holds an
/// operand yet).
pub fn fault_time(cfg: &HwConfig, instr: &Instr, cycle: u64) -> Result<Option<FaultTime>, HwError> {
    Ok(match instr {
        Instr::Gemm { m, k, n, .. } => {
            let s = mxu::Schedule::new(&cfg.mxu, *m, *k, *n)?;
            let tile = s.folds.partition_point(|f| f.start <= cycle).checked_sub(1);
            tile.filter(|_| cycle < s.total_cycles).map(|t| FaultTime { tile: t, cycle: cycle - s.folds[t].start })
        }
        Instr::Vpu { op, .. } => vpu::vector_at(cfg, op, instr.lane_elements(), cycle)?
            .map(|(v, origin)| FaultTime { tile: usize::try_from(v).unwrap_or(usize::MAX), cycle: cycle - origin }),
        Instr::Dma { .. } => (cycle < cycles(cfg, instr)).then_some(FaultTime { tile: 0, cycle }),
    })
}

/// One fp32 word as the MXU's input converter rounds it to `format` (what [`gemm_operands`]
/// does to every operand word).
pub fn to_input(format: NumFormat, raw: u32) -> u32 {
    match format {
        NumFormat::Fp32 => raw,
        NumFormat::Bf16 => f32_to_bf16_bits(f32::from_bits(raw)),
        other => other.f64_to_bits(f32::from_bits(raw) as f64),
    }
}

/// The `rows x cols` matrix stored at the front of `s` (transposed: stored `[cols][rows]`), with
/// every fp32 word rounded to the MXU's input format by its input converter.
fn load_matrix(format: NumFormat, s: &[u32], rows: usize, cols: usize, transposed: bool) -> Matrix {
    fn gather(s: &[u32], rows: usize, cols: usize, transposed: bool, f: impl Fn(u32) -> u32) -> Vec<u32> {
        if !transposed {
            return s[..rows * cols].iter().map(|&x| f(x)).collect();
        }
        // Transposed in square blocks (a block's reads and writes stay in a few cache lines),
        // then converted in one contiguous, vectorisable pass.
        const T: usize = 16;
        let mut data = vec![0u32; rows * cols];
        for p0 in (0..cols).step_by(T) {
            let pe = (p0 + T).min(cols);
            for i0 in (0..rows).step_by(T) {
                for i in i0..(i0 + T).min(rows) {
                    for (d, p) in data[i * cols + p0..i * cols + pe].iter_mut().zip(p0..) {
                        *d = s[p * rows + i];
                    }
                }
            }
        }
        for x in &mut data {
            *x = f(*x);
        }
        data
    }
    let data = match format {
        NumFormat::Fp32 => gather(s, rows, cols, transposed, |x| x),
        NumFormat::Bf16 => gather(s, rows, cols, transposed, |x| f32_to_bf16_bits(f32::from_bits(x))),
        other => gather(s, rows, cols, transposed, |x| other.f64_to_bits(f32::from_bits(x) as f64)),
    };
    Matrix { rows, cols, data }
}

/// The operands of a GEMM as the MXU receives them: `A` (`M x K`) and `B` (`K x N`) read from
/// `bufs` and rounded to the input format by the input converters; `None` for other
/// instructions. Errors if a buffer holds too few words.
pub fn gemm_operands(cfg: &HwConfig, instr: &Instr, bufs: &[Vec<u32>]) -> Result<Option<(Matrix, Matrix)>, HwError> {
    let Instr::Gemm { a, b, m, k, n, .. } = instr else { return Ok(None) };
    let src = |o: &MatOperand, rows: usize, cols: usize| -> Result<Matrix, HwError> {
        let s = bufs[o.buf.index()].get(o.offset..).unwrap_or(&[]);
        if s.len() < rows * cols {
            return Err(missing(instr, "operand", o.buf, o.offset + rows * cols, o.offset + s.len()));
        }
        Ok(load_matrix(cfg.mxu.input_format, s, rows, cols, o.transposed))
    };
    Ok(Some((src(a, *m, *k)?, src(b, *k, *n)?)))
}

/// What an accumulating GEMM ([`Instr::Gemm`]'s `acc`) adds to: its result's words as they are
/// (accumulator-format bits); `None` for other instructions. Errors if the buffer is too short.
pub fn accumulators(instr: &Instr, bufs: &[Vec<u32>]) -> Result<Option<Matrix>, HwError> {
    let &Instr::Gemm { out, m, n, acc: true, .. } = instr else { return Ok(None) };
    let have = bufs[out.buf.index()].len();
    let data = bufs[out.buf.index()]
        .get(out.offset..out.offset + m * n)
        .ok_or_else(|| missing(instr, "accumulated output", out.buf, out.offset + m * n, have))?;
    Ok(Some(Matrix { rows: m, cols: n, data: data.to_vec() }))
}

/// Executes `instr` on `cfg` in `mode`, reading and writing `bufs` (one word vector per buffer;
/// an empty destination buffer written from word 0 receives the output vector whole, so a
/// caller sizes a buffer first only when instructions fill it in parts). `faults` (sites of the
/// instruction's unit, times relative to its own schedule as in [`crate::mxu`] and
/// [`crate::vpu`]) need [`ExecMode::CycleLevel`]. Returns the instruction's cycles.
pub fn execute(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<u64, HwError> {
    match instr {
        Instr::Gemm { .. } => Ok(execute_gemm(cfg, instr, bufs, mode, faults, false)?.0),
        Instr::Vpu { .. } => execute_vpu(cfg, instr, bufs, mode, faults, None),
        Instr::Dma { src, src_offset, dst, dst_offset, len, .. } => {
            let (src, dst, len) = (*src, Dest { buf: *dst, offset: *dst_offset }, *len);
            if bufs[src.index()].len() < src_offset + len {
                return Err(missing(instr, "source", src, src_offset + len, bufs[src.index()].len()));
            }
            if src == dst.buf {
                let b = &mut bufs[src.index()];
                if b.len() < dst.offset + len {
                    return Err(missing(instr, "destination", dst.buf, dst.offset + len, b.len()));
                }
                b.copy_within(*src_offset..src_offset + len, dst.offset);
                return Ok(cycles(cfg, instr));
            }
            // The source is taken out for the copy (no temporary vector) and put back.
            let from = std::mem::take(&mut bufs[src.index()]);
            let done = put(&mut bufs[dst.buf.index()], dst.offset, Cow::Borrowed(&from[*src_offset..src_offset + len]));
            bufs[src.index()] = from;
            done.map_err(|have| missing(instr, "destination", dst.buf, dst.offset + len, have))?;
            Ok(cycles(cfg, instr))
        }
    }
}

/// [`execute`] for a GEMM: its cycles and, with `golden`, its fault-free result (from the run
/// itself when it computed it on the way, [`mxu::GemmOutput::golden`], else from a functional
/// run on the same operands).
fn execute_gemm(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    mode: ExecMode,
    faults: &FaultSchedule,
    golden: bool,
) -> Result<(u64, Option<Vec<u32>>), HwError> {
    let Instr::Gemm { out, .. } = instr else { unreachable!("execute_gemm runs GEMMs") };
    let (am, bm) = gemm_operands(cfg, instr, bufs)?.expect("a GEMM has operands");
    let acc = accumulators(instr, bufs)?;
    let res = mxu::gemm_into(cfg, &am, &bm, acc.as_ref(), mode, faults)?;
    let fault_free = match (golden, res.golden) {
        (false, _) => None,
        (true, Some(g)) => Some(g.data),
        (true, None) => {
            Some(mxu::gemm_into(cfg, &am, &bm, acc.as_ref(), ExecMode::Functional, &FaultSchedule::none())?.out.data)
        }
    };
    write_result(instr, bufs, *out, res.out.data)?;
    Ok((res.stats.total_cycles, fault_free))
}

/// [`execute`] at cycle level with `faults`, also returning what each destination's written
/// words ([`Instr::dests`] order, `out_len` each) would be without them: from the run itself
/// when it computed them (a windowed faulty GEMM), else from a functional run first.
pub fn execute_faulty(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    faults: &FaultSchedule,
) -> Result<(u64, Vec<Vec<u32>>), HwError> {
    if matches!(instr, Instr::Gemm { .. }) {
        let (c, golden) = execute_gemm(cfg, instr, bufs, ExecMode::CycleLevel, faults, true)?;
        return Ok((c, golden.into_iter().collect()));
    }
    let (dests, len) = (instr.dests(), instr.out_len());
    let before: Vec<Vec<u32>> = dests.iter().map(|d| bufs[d.buf.index()].clone()).collect();
    execute(cfg, instr, bufs, ExecMode::Functional, &FaultSchedule::none())?;
    let mut golden = Vec::with_capacity(dests.len());
    for (d, b) in dests.iter().zip(before) {
        let all = std::mem::replace(&mut bufs[d.buf.index()], b);
        golden.push(all[d.offset..d.offset + len].to_vec());
    }
    let c = execute(cfg, instr, bufs, ExecMode::CycleLevel, faults)?;
    Ok((c, golden))
}

/// [`execute`] for a VPU instruction whose operands, as the lanes read them (operand `o`'s
/// element `e`: `inputs[o][e]`, after the view's gather), `edit` may change first.
pub fn execute_vpu_edited(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    mode: ExecMode,
    faults: &FaultSchedule,
    edit: &mut OperandEdit<'_>,
) -> Result<u64, HwError> {
    execute_vpu(cfg, instr, bufs, mode, faults, Some(edit))
}

/// A change to a VPU instruction's gathered operands (see [`execute_vpu_edited`]).
pub type OperandEdit<'a> = dyn FnMut(&mut [Vec<u32>]) + 'a;

fn execute_vpu(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    mode: ExecMode,
    faults: &FaultSchedule,
    edit: Option<&mut OperandEdit<'_>>,
) -> Result<u64, HwError> {
    let Instr::Vpu { op, n, ins, outs, acc } = instr else { unreachable!("execute_vpu runs VPU instructions") };
    let n = *n;
    let mut inputs = Vec::with_capacity(ins.len());
    for o in ins {
        let s = bufs[o.buf.index()].get(o.offset..).unwrap_or(&[]);
        let need = o.view.span(n);
        if s.len() < need {
            return Err(missing(instr, "operand", o.buf, o.offset + need, o.offset + s.len()));
        }
        inputs.push(o.view.gather(s, n));
    }
    if let (true, Some(d), Some(x)) = (*acc, outs.first(), inputs.first_mut()) {
        // The output's words enter first, as a row before the input's.
        let len = instr.out_len();
        let Some(init) = bufs[d.buf.index()].get(d.offset..d.offset + len) else {
            return Err(missing(instr, "accumulated output", d.buf, d.offset + len, bufs[d.buf.index()].len()));
        };
        *x = Cow::Owned(init.iter().chain(x.iter()).copied().collect());
    }
    let res = match edit {
        None => {
            let refs: Vec<&[u32]> = inputs.iter().map(|c| c.as_ref()).collect();
            vpu::run(cfg, *op, &refs, mode, faults)?
        }
        Some(edit) => {
            let mut owned: Vec<Vec<u32>> = inputs.into_iter().map(|c| c.into_owned()).collect();
            edit(&mut owned);
            let refs: Vec<&[u32]> = owned.iter().map(|c| c.as_slice()).collect();
            vpu::run(cfg, *op, &refs, mode, faults)?
        }
    };
    for (d, v) in outs.iter().zip(res.out) {
        write_result(instr, bufs, *d, v)?;
    }
    Ok(res.stats.cycles)
}

/// The error for a buffer `b` of `instr` holding `have` words where it needs `need`.
fn missing(instr: &Instr, what: &str, b: BufId, need: usize, have: usize) -> HwError {
    HwError::Shape {
        op: instr.name().to_string(),
        detail: format!("{what} buffer {} holds {have} words, the instruction needs {need}", b.0),
    }
}

/// Writes `v`, one result of `instr` (`out_len` words), at `d` (see [`execute`] for how an
/// empty destination is filled). Errors if the destination holds too few words.
pub fn write_result(instr: &Instr, bufs: &mut [Vec<u32>], d: Dest, mut v: Vec<u32>) -> Result<(), HwError> {
    let len = instr.out_len();
    v.truncate(len);
    put(&mut bufs[d.buf.index()], d.offset, Cow::Owned(v))
        .map_err(|have| missing(instr, "output", d.buf, d.offset + len, have))
}

/// Writes `v` at word `offset` of `buf`; an empty buffer written from word 0 takes `v` whole.
/// `Err(words held)` if the buffer is too short.
fn put(buf: &mut Vec<u32>, offset: usize, v: Cow<'_, [u32]>) -> Result<(), usize> {
    if buf.is_empty() && offset == 0 {
        *buf = v.into_owned();
        return Ok(());
    }
    let have = buf.len();
    buf.get_mut(offset..offset + v.len()).ok_or(have)?.copy_from_slice(&v);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `View::readers` says exactly which elements read each word, as a gather of the view
    /// does, for every kind (the im2col ones with strides that skip pixels and with padding).
    #[test]
    fn a_view_reads_exactly_the_words_its_gather_reads() {
        let image = [2, 5, 5, 3];
        let views = [
            (View::Whole, 12),
            (View::PerRow { cols: 4 }, 12),
            (View::Cycle { len: 5 }, 15),
            (View::RepeatRows { d: 3, t: 2 }, 12),
            (View::Im2Col { window: Window { kh: 2, kw: 2, stride: 3, padding: 0 }, image }, 2 * 2 * 2 * 12),
            (View::Im2Col { window: Window { kh: 3, kw: 3, stride: 1, padding: 1 }, image }, 2 * 25 * 27),
            (View::Col2ImTap { window: Window { kh: 2, kw: 2, stride: 3, padding: 0 }, image, tap: 3 }, 150),
        ];
        for (view, n) in views {
            let span = view.span(n);
            // Word i gathered as i + 1: a 0 is an element that reads no word.
            let idx: Vec<u32> = (1..=span as u32).collect();
            let read = view.gather(&idx, n);
            for x in 0..span + 3 {
                let readers: Vec<usize> = (0..n).filter(|&e| read[e] == x as u32 + 1).collect();
                assert_eq!(view.readers(x, n), readers, "{view:?}, word {x}");
            }
        }
    }
}
