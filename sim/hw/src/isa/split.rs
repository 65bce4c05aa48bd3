//! Cutting an instruction into row tiles ([`Instr::split_rows`]) that together compute
//! exactly what it computes.

use super::Instr;
use crate::vpu::{self, VpuOp};

impl Instr {
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
