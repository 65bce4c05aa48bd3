//! The functional twin: the same per-output sequence of MACs and accumulator adds as the
//! stepped array, without registers or clocks (see the bit-exactness section of [`super`]).

use super::Schedule;
use crate::config::Dataflow;
use crate::matrix::Matrix;
use faultline_num::MacFormat;

/// Functional twin of any schedule: [`functional`], an IS schedule through its WS view on the
/// transposed operands (so the MACs see their operands in the array's order), the result
/// transposed back.
pub(super) fn twin<F: MacFormat>(s: &Schedule, a: &Matrix, w: &Matrix, acc: Option<&Matrix>) -> Matrix {
    if s.dataflow == Dataflow::InputStationary {
        let acct = acc.map(Matrix::transpose);
        functional::<F>(&s.as_ws(), &w.transpose(), &a.transpose(), acct.as_ref()).transpose()
    } else {
        functional::<F>(s, a, w, acc)
    }
}

/// Functional twin (WS and OS; IS through [`twin`]): the same per-output operation sequence, without registers or clocks.
/// Compiled for AVX2 as well as the baseline and picked at run time: wider vectors, the same
/// IEEE multiplies and adds in the same order (Rust never fuses them), so the same bits.
#[multiversion::multiversion(targets("x86_64+avx2"))]
pub(super) fn functional<F: MacFormat>(s: &Schedule, a: &Matrix, w: &Matrix, acc: Option<&Matrix>) -> Matrix {
    let (m, k, n) = (s.m, s.k, s.n);
    // Columns are padded to whole blocks of `B` (zero weights, results dropped), so every block
    // takes the vectorised path; a column's own sequence of operations is unchanged.
    let np = n.div_ceil(B) * B;
    // Plain loops, not `map().collect()` (compiled without AVX2, it would not inline these).
    let mut av = vec![F::Value::default(); a.data.len()];
    for (d, &b) in av.iter_mut().zip(&a.data) {
        *d = F::decode_in(b);
    }
    let mut wv = vec![F::Value::default(); k * np];
    for (row, src) in wv.chunks_exact_mut(np).zip(w.data.chunks_exact(n)) {
        for (d, &b) in row.iter_mut().zip(src) {
            *d = F::decode_in(b);
        }
    }
    let mut out = vec![F::Value::default(); m * np];
    if let Some(c) = acc {
        for (row, src) in out.chunks_exact_mut(np).zip(c.data.chunks_exact(n)) {
            for (d, &b) in row.iter_mut().zip(src) {
                *d = F::decode_acc(b);
            }
        }
    }
    // Whether the first K fold overwrites the accumulators (else every fold adds).
    let overwrite = s.folds.first().is_some_and(|f| f.overwrite);
    // K is reduced in chunks of R in WS (one chunk per fold) and in one piece in OS (IS comes
    // here as its WS view, see [`twin`]).
    let chunk = match s.dataflow {
        Dataflow::WeightStationary | Dataflow::InputStationary => s.rows,
        Dataflow::OutputStationary => k,
    }
    .max(1);
    let g = Gemm { a: &av, w: &wv, k, np, overwrite };
    for m0 in (0..m - m % MR).step_by(MR) {
        g.rows::<F, MR>(m0, chunk, &mut out[m0 * np..(m0 + MR) * np]);
    }
    for m0 in m - m % MR..m {
        g.rows::<F, 1>(m0, chunk, &mut out[m0 * np..(m0 + 1) * np]);
    }
    let mut data = vec![0; m * n];
    for (dst, row) in data.chunks_exact_mut(n).zip(out.chunks_exact(np)) {
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = F::encode_acc(v);
        }
    }
    Matrix { rows: m, cols: n, data }
}

/// Output columns per register block of the functional GEMM.
pub(super) const B: usize = 16;
/// Output rows per register block (with `B`, 8 AVX2 accumulators: enough independent adds to
/// hide the add latency, and each weight load serves `MR` rows).
const MR: usize = 4;

/// Decoded operands of the functional GEMM (weights padded to `np` columns).
struct Gemm<'a, V> {
    a: &'a [V],
    w: &'a [V],
    k: usize,
    np: usize,
    overwrite: bool,
}

impl<V: Copy + Default> Gemm<'_, V> {
    /// Output rows `m0..m0 + R` (`out`, `R x np`): per block of `B` columns and per K chunk,
    /// partial sums in registers over `k` ascending, then written or added to `out`.
    #[inline(always)]
    fn rows<F: MacFormat<Value = V>, const R: usize>(&self, m0: usize, chunk: usize, out: &mut [V]) {
        let (k, np) = (self.k, self.np);
        for j0 in (0..np).step_by(B) {
            for k0 in (0..k).step_by(chunk) {
                let mut acc = [[V::default(); B]; R];
                for ki in k0..(k0 + chunk).min(k) {
                    let w: &[V; B] = self.w[ki * np + j0..ki * np + j0 + B].try_into().expect("B columns");
                    let x: [V; R] = std::array::from_fn(|r| self.a[(m0 + r) * k + ki]);
                    for r in 0..R {
                        for t in 0..B {
                            acc[r][t] = F::mac_value(acc[r][t], x[r], w[t]);
                        }
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    let o = &mut out[r * np + j0..r * np + j0 + B];
                    if k0 == 0 && self.overwrite {
                        o.copy_from_slice(acc);
                    } else {
                        for (o, &t) in o.iter_mut().zip(acc) {
                            *o = F::add_value(*o, t);
                        }
                    }
                }
            }
        }
    }
}
