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
//! [`ExecMode`](crate::ExecMode) and reports the same cycles. Costing a program and executing it therefore agree
//! by construction.
//!
//! * [`Instr::Dma`]: a load or store of consecutive words between DRAM and the unified buffer
//!   or accumulators. Where each buffer lives (its *home*) is the program's choice (see
//!   `graph::residency`); GEMM and VPU instructions read and write buffers wherever they live,
//!   and only DMA instructions cross between DRAM and the SRAMs.
//!
//! This file holds the vocabulary ([`Instr`], [`Operand`], [`Dest`], [`BufId`], ...); beside
//! it, one concern each: `view.rs` (addressing, [`View`]), `conv.rs` (convolution geometry,
//! [`Window`]), `cost.rs` ([`cycles`], [`fault_time`]), `exec.rs` (the interpreters, [`execute`])
//! and `split.rs` (row tiles, [`Instr::split_rows`]).

use crate::memory::dma::Direction;
use crate::vpu::VpuOp;
use serde::{Deserialize, Serialize};
use std::ops::Range;

mod conv;
mod cost;
mod exec;
mod split;
mod view;

pub use conv::Window;
pub use cost::{cycles, dma_word_cycle, fault_time, occupancy};
pub use exec::{
    accumulators, execute, execute_faulty, execute_vpu_edited, gemm_operands, to_input, write_result, OperandEdit,
};
pub use view::View;

/// Index of a buffer in a program's buffer table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufId(pub u32);

impl BufId {
    /// The table index.
    pub const fn index(self) -> usize {
        self.0 as usize
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
            Instr::Vpu { op, n, .. } => op.out_len(*n),
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
}
