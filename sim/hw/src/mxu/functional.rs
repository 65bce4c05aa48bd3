//! The functional twin: the same per-output sequence of MACs and accumulator adds as the
//! stepped array, without registers or clocks (see the bit-exactness section of [`super`]).
//!
//! Each output `(m, n)` is reduced over `K` in chunks (WS and IS: one chunk of `R` array rows
//! per fold; OS: all of `K` in one), each chunk a partial sum from zero in ascending `k`, and
//! the chunks added into the accumulator in fold order: exactly the stepped array's order.
//! Speed comes from doing many independent outputs at once, never from reordering one: a
//! register block of `MR x NR` outputs over operands decoded once per GEMM (`A` as it is,
//! `W` packed into zero-padded panels of `NR` columns, contiguous along `K`), and row blocks
//! shared out to threads (each output is computed by one thread, so any
//! thread count gives the same bits).

use super::microkernel::{as_values, block_f32, Kernel, Strided};
use super::Schedule;
use crate::matrix::Matrix;
use faultline_num::MacFormat;
use faultline_num::Precision;
use rayon::prelude::*;

/// Output columns per register block (two 8-lane AVX2 vectors).
pub(super) const NR: usize = 16;
/// Output rows per register block (with `NR`: 12 AVX2 accumulators, enough independent adds to
/// hide their latency, and each weight load serves `MR` rows); [`super::ragged`]'s full extent.
pub(super) const MR: usize = 6;
const _: () = assert!(MR == 6, "super::ragged unrolls blocks of up to 6 rows");
/// Packed weight bytes a row block sweeps before the next row block starts: the panels of one
/// column block stay in the L2 cache while every row block of `A` passes them.
const W_BLOCK_BYTES: usize = 256 << 10;
/// The most rows of `A` for which fp32 `W` is read in place rather than packed.
const W_IN_PLACE_ROWS: usize = 64;
/// MACs below which a GEMM runs on the calling thread (spreading it would cost more than it
/// saves).
const PAR_MACS: usize = 1 << 21;
/// MACs from which a GEMM uses fused multiply-adds where they are exact: below, the operands'
/// range scan and the short register blocks' longer dependency chains cost more than fusing
/// saves (mlp-digits' 32x64x64 GEMMs: 3.5% of a bf16 step; a 512^3 GEMM gains 10%).
pub(super) const FUSED_MACS: usize = PAR_MACS;

/// Functional twin of any schedule (WS, OS, and IS, whose products and K chunks are WS's on the
/// same operands: see [`super`]): `out = [acc +] a * w` as accumulator bits.
pub(super) fn functional<F: MacFormat>(s: &Schedule, a: &Matrix, w: &Matrix, acc: Option<&Matrix>) -> Matrix {
    let mut data = acc.map_or_else(|| vec![0u32; s.m * s.n], |c| c.data.clone());
    let (a, w) = (Raw { words: &a.data, transposed: false }, Raw { words: &w.data, transposed: false });
    functional_raw::<F>(s, a, w, (|x| x, true), &mut data, acc.is_some());
    Matrix { rows: s.m, cols: s.n, data }
}

/// A GEMM operand as memory holds it: a row-major matrix from the slice's first word, or its
/// transpose (`[cols][rows]`) if `transposed`.
#[derive(Debug, Clone, Copy)]
pub struct Raw<'a> {
    /// The words (at least rows x cols).
    pub words: &'a [u32],
    /// Stored transposed.
    pub transposed: bool,
}

/// [`functional`] on operands as memory holds them, each word passed through `input` (the
/// MXU's input converter: raw word to input-format bits; with `identity` if it changes no word)
/// as it is decoded, with the result written into `out` (`m x n`), which holds the
/// accumulators' values when `acc`.
pub(super) fn functional_raw<F: MacFormat>(
    s: &Schedule,
    a: Raw<'_>,
    w: Raw<'_>,
    (input, identity): (impl Fn(u32) -> u32 + Copy + Sync, bool),
    out: &mut [u32],
    acc: bool,
) {
    if a.transposed && s.k >= super::outer::MIN_K {
        // Read where it lies, vectorised along M: no transposed copy of A.
        return super::outer::functional_transposed_a::<F>(s, a, w, input, out, acc);
    }
    let (m, k, n) = (s.m, s.k, s.n);
    // WS and IS reduce K in chunks of R (one per fold), OS in one piece.
    let (chunk, overwrite) = s.k_chunks();
    let kernel = Kernel::for_format::<F>();
    // fp32 words through an identity converter are their own decoded values: the f32 kernel
    // reads A's rows where they lie, and W's whole panels too when A has few rows (packing W
    // costs K x N against the products' M x K x N; with many rows the packed panels' contiguous
    // rows stay in cache better: a 32x784x256 GEMM took 0.93x the time in place, 512^3 1.05x).
    let in_place = identity && F::PRECISION == Precision::Fp32Fp32 && kernel != Kernel::Generic;
    let a_words = (in_place && !a.transposed).then(|| as_values::<F>(&a.words[..m * k])).flatten();
    let w_words =
        (in_place && !w.transposed && m <= W_IN_PLACE_ROWS).then(|| as_values::<F>(&w.words[..k * n])).flatten();
    let decoded;
    let ap = match a_words {
        Some(words) => words,
        None => {
            decoded = decode_a::<F>(a, m, k, input);
            &decoded
        }
    };
    // Whole panels read in place leave only the ragged last one to pack.
    let p0 = if w_words.is_some() { n / NR } else { 0 };
    let wp = pack_w::<F>(w, k, n, input, p0);
    let fused = m * k * n >= FUSED_MACS && F::products_exact(ap, &wp) && fma_available();
    let g = Packed { ap, wp: &wp, p0, w_words, acc, k, n, chunk, overwrite, kernel };
    by_row_blocks((m, k, n), MR, &mut out[..m * n], |m0, out| g.rows_dispatch::<F>(fused, m0, out));
}

/// Runs `run(m0, rows)` over the output rows (`out`, `m x n`) of an `m x k x n` GEMM: on the
/// calling thread below [`PAR_MACS`], else in tasks of whole blocks of `block` rows spread over
/// rayon's threads, so that each output is one thread's work and any thread count gives the
/// same bits.
pub(super) fn by_row_blocks(
    (m, k, n): (usize, usize, usize),
    block: usize,
    out: &mut [u32],
    run: impl Fn(usize, &mut [u32]) + Sync,
) {
    if m * k * n < PAR_MACS || rayon::current_num_threads() == 1 {
        run(0, out);
    } else {
        let rows = (m.div_ceil(block) / (4 * rayon::current_num_threads())).max(1) * block;
        out.par_chunks_mut(rows * n).enumerate().for_each(|(t, out)| run(t * rows, out));
    }
}

/// Whether the host has a fused multiply-add in hardware (else `mul_add` is a slow library
/// call: still exact, so this decides speed only).
pub(super) fn fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("fma");
    #[cfg(target_arch = "aarch64")]
    return true;
    #[allow(unreachable_code)]
    false
}

/// `A` (`m x k`, through `input`) decoded, row-major (the register block reads its `MR` rows
/// in place: a copy into blocks would cost more than it saves on the short GEMMs of small
/// models). A transposed `A` is gathered in square blocks
/// ([`crate::matrix::untranspose_into`]).
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn decode_a<F: MacFormat>(a: Raw<'_>, m: usize, k: usize, input: impl Fn(u32) -> u32) -> Vec<F::Value> {
    let mut av = vec![F::Value::default(); m * k];
    if !a.transposed {
        for (d, &x) in av.iter_mut().zip(&a.words[..m * k]) {
            *d = F::decode_in(input(x));
        }
    } else {
        crate::matrix::untranspose_into(a.words, m, k, &mut av, |x| F::decode_in(input(x)));
    }
    av
}

/// `W` (`k x n`, through `input`) decoded into column panels of `NR` from panel `p0` on, each
/// `k x NR` contiguous, the last panel zero-padded (zero weights: those columns' results are
/// dropped).
fn pack_w<F: MacFormat>(w: Raw<'_>, k: usize, n: usize, input: impl Fn(u32) -> u32, p0: usize) -> Vec<F::Value> {
    let mut wp = vec![F::Value::default(); (n.div_ceil(NR) - p0) * NR * k];
    for (p, panel) in wp.chunks_exact_mut(NR * k).enumerate() {
        let p = p0 + p;
        let (j0, nc) = (p * NR, NR.min(n - p * NR));
        if w.transposed {
            // Column j of W is row j of what memory holds, contiguous along K.
            for t in 0..nc {
                for (ki, &x) in w.words[(j0 + t) * k..(j0 + t + 1) * k].iter().enumerate() {
                    panel[ki * NR + t] = F::decode_in(input(x));
                }
            }
            continue;
        }
        for (ki, dst) in panel.chunks_exact_mut(NR).enumerate() {
            for (d, &x) in dst[..nc].iter_mut().zip(&w.words[ki * n + j0..ki * n + j0 + nc]) {
                *d = F::decode_in(input(x));
            }
        }
    }
    wp
}

/// A GEMM's packed operands and how its K is folded.
struct Packed<'a, V> {
    /// `A`, `m x k` row-major.
    ap: &'a [V],
    /// `W`'s column panels from panel `p0` on.
    wp: &'a [V],
    p0: usize,
    /// `W` (`k x n`) row-major, whose panels before `p0` are read from it.
    w_words: Option<&'a [V]>,
    /// The output holds the accumulators' values, which the result adds to.
    acc: bool,
    k: usize,
    n: usize,
    chunk: usize,
    overwrite: bool,
    /// Who computes the register blocks.
    kernel: Kernel,
}

impl<V: Copy + Default + 'static> Packed<'_, V> {
    /// [`Packed::rows`] compiled for the host's best vector unit, fused or not.
    fn rows_dispatch<F: MacFormat<Value = V>>(&self, fused: bool, m0: usize, out: &mut [u32]) {
        if fused {
            rows_simd::<F, true>(self, m0, out)
        } else {
            rows_simd::<F, false>(self, m0, out)
        }
    }

    /// Output rows `m0..` (`out`, whole rows of `n` words, starting at a row block): per column
    /// block, per row block, per column panel, the K chunks in order.
    #[inline(always)]
    fn rows<F: MacFormat<Value = V>, const FUSED: bool>(&self, m0: usize, out: &mut [u32]) {
        let (k, n) = (self.k, self.n);
        let rows = out.len() / n.max(1);
        let panels = n.div_ceil(NR);
        let per_block = (W_BLOCK_BYTES / (k * NR * size_of::<V>()).max(1)).max(1);
        for p0 in (0..panels).step_by(per_block) {
            for r0 in (0..rows).step_by(MR) {
                let a = &self.ap[(m0 + r0) * k..];
                let out = &mut out[r0 * n..];
                for p in p0..(p0 + per_block).min(panels) {
                    super::ragged!(rows - r0, |R| self.tile::<F, FUSED, R>(a, p, out));
                }
            }
        }
    }

    /// `R` rows of column panel `p` (`a` and `out` start at the first): the accumulators'
    /// values (or zeros), each K chunk's partial sums added in fold order, encoded into `out`.
    #[inline(always)]
    fn tile<F: MacFormat<Value = V>, const FUSED: bool, const R: usize>(&self, a: &[V], p: usize, out: &mut [u32]) {
        let (k, n) = (self.k, self.n);
        // Panel `p`'s rows: where they lie in `W` (`n` apart) or packed (`NR` apart).
        let (w, w_step) = match self.w_words {
            Some(words) if p < self.p0 => (&words[p * NR..], n),
            _ => (&self.wp[(p - self.p0) * NR * k..(p - self.p0 + 1) * NR * k], NR),
        };
        let (j0, nc) = (p * NR, NR.min(n - p * NR));
        let mut tot = [[V::default(); NR]; R];
        if self.acc {
            // Each block reads the accumulator words it then overwrites, and no others.
            for (i, t) in tot.iter_mut().enumerate() {
                for (d, &x) in t.iter_mut().zip(&out[i * n + j0..][..nc]) {
                    *d = F::decode_acc(x);
                }
            }
        }
        for k0 in (0..k).step_by(self.chunk) {
            let k1 = (k0 + self.chunk).min(k);
            let psum = match self.kernel {
                Kernel::Generic => block::<F, FUSED, R>(a, k, w, k0, k1),
                kernel => {
                    let o = Strided {
                        vecs: &w[k0 * w_step..],
                        vec_step: w_step,
                        scalars: &a[k0..],
                        scalar_step: 1,
                        row_step: k,
                        len: k1 - k0,
                    };
                    block_f32::<F, FUSED, R>(kernel, &o, &[[V::default(); NR]; R]).expect("f32 values")
                }
            };
            for (t, ps) in tot.iter_mut().zip(&psum) {
                if k0 == 0 && self.overwrite {
                    *t = *ps;
                } else {
                    for (t, &x) in t.iter_mut().zip(ps) {
                        *t = F::add_value(*t, x);
                    }
                }
            }
        }
        for (i, t) in tot.iter().enumerate() {
            for (d, &v) in out[i * n + j0..][..nc].iter_mut().zip(t) {
                *d = F::encode_acc(v);
            }
        }
    }
}

/// [`Packed::rows`], compiled for AVX2 with and without FMA as well as the baseline and picked
/// at run time: wider vectors, the same IEEE operations in the same order, so the same bits
/// (a fused multiply-add is asked for only where [`MacFormat::products_exact`] holds).
#[multiversion::multiversion(targets("x86_64+avx2+fma", "x86_64+avx2"))]
fn rows_simd<F: MacFormat, const FUSED: bool>(g: &Packed<'_, F::Value>, m0: usize, out: &mut [u32]) {
    g.rows::<F, FUSED>(m0, out)
}

/// One K chunk `k0..k1` of an `R x NR` register block (`a`: its rows, `k` apart): partial
/// sums from zero, `k` ascending.
#[inline(always)]
fn block<F: MacFormat, const FUSED: bool, const R: usize>(
    a: &[F::Value],
    k: usize,
    w: &[F::Value],
    k0: usize,
    k1: usize,
) -> [[F::Value; NR]; R] {
    let mut acc = [[F::Value::default(); NR]; R];
    for ki in k0..k1 {
        let w: &[F::Value; NR] = w[ki * NR..(ki + 1) * NR].try_into().expect("NR columns");
        for r in 0..R {
            let x = a[r * k + ki];
            for t in 0..NR {
                acc[r][t] = if FUSED { F::mac_fused(acc[r][t], x, w[t]) } else { F::mac_value(acc[r][t], x, w[t]) };
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultline_num::{Bf16Fp32, NumFormat};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The fused kernel (used only on large GEMMs, which the array proptests do not reach) gives
    /// the unfused kernel's bits wherever the products are exact, for ragged shapes, K chunks
    /// and an accumulator, with every register block this host can run.
    #[test]
    fn fused_unfused_and_hand_written_kernels_give_the_same_bits_where_products_are_exact() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for &(m, k, n, chunk) in &[(37, 70, 45, 32), (6, 16, 16, 16), (13, 129, 33, 128), (1, 5, 3, 2)] {
            let mut gen = |r, c| Matrix::from_fn(r, c, |_, _| NumFormat::Bf16.f64_to_bits(rng.gen_range(-4.0..4.0)));
            let (a, w) = (gen(m, k), gen(k, n));
            let acc = Matrix::from_fn(m, n, |i, j| ((i * n + j) as f32 * 0.25).to_bits());
            fn raw(x: &Matrix) -> Raw<'_> {
                Raw { words: &x.data, transposed: false }
            }
            let (ap, wp) = (decode_a::<Bf16Fp32>(raw(&a), m, k, |x| x), pack_w::<Bf16Fp32>(raw(&w), k, n, |x| x, 0));
            assert!(Bf16Fp32::products_exact(&ap, &wp), "operands in range");
            for acc in [None, Some(&acc)] {
                let start = acc.map_or_else(|| vec![0u32; m * n], |c| c.data.clone());
                let run = |kernel, fused| {
                    let g = Packed {
                        ap: &ap,
                        wp: &wp,
                        p0: 0,
                        w_words: None,
                        acc: acc.is_some(),
                        k,
                        n,
                        chunk,
                        overwrite: acc.is_none(),
                        kernel,
                    };
                    let mut out = start.clone();
                    g.rows_dispatch::<Bf16Fp32>(fused, 0, &mut out);
                    out
                };
                let plain = run(Kernel::Generic, false);
                for kernel in Kernel::available::<Bf16Fp32>() {
                    for fused in [false, true] {
                        let what = format!("{m}x{k}x{n}, chunk {chunk}, acc {}, {kernel:?}", acc.is_some());
                        assert_eq!(run(kernel, fused), plain, "{what}, fused {fused}");
                    }
                }
            }
        }
    }
}
