//! The functional twin for an `A` that memory holds transposed (`[K][M]`, a weight gradient's
//! activations): outer products along `K`, vectorised over `M`, reading `A` as it lies.
//!
//! [`super::functional`]'s register block runs along rows of `A`, so a transposed `A` had to be
//! transposed first: for a convolution's weight gradient that is the whole im2col matrix (tens
//! of MB, a tenth of a ResNet step). Here a register block is [`MT`] consecutive outputs of one
//! column of the result (`M` contiguous in a row of `A^T`) by up to [`NT`] columns: each step
//! along `K` loads one vector row of `A^T` and broadcasts `NT` words of `W`'s row.
//!
//! Every output gets exactly [`super::functional`]'s sequence: per K chunk (one fold's rows; all
//! of `K` in OS), a partial sum from zero in ascending `k` of `acc + a * w`, the chunks added into
//! the accumulator in fold order. Operands are decoded a slice of `K` rows at a time (at most
//! [`SLICE`], never across a chunk's end) into buffers that stay in cache; a partial sum that
//! continues into the next slice is kept in memory between them, which changes no bit.

use super::functional::{by_row_blocks, fma_available, Raw, FUSED_MACS};
use super::microkernel::{block_f32, Kernel, Strided};
use super::Schedule;
use faultline_num::MacFormat;

/// Outputs along `M` per register block (two 8-lane AVX2 vectors).
const MT: usize = 16;
/// Output columns per register block (with `MT`: 12 AVX2 accumulators); [`super::ragged`]'s
/// full extent.
const NT: usize = 6;
const _: () = assert!(MT == super::functional::NR, "the f32 kernels are 16 lanes wide");
const _: () = assert!(NT == 6, "super::ragged unrolls blocks of up to 6 columns");
/// `K` rows decoded at a time: a slice of `A^T` (`SLICE x MT` words per block of `M`) stays in
/// the first-level cache while every column block passes it.
const SLICE: usize = 128;
/// The shortest `K` this kernel takes a transposed `A` for: below, transposing `A` is cheap and
/// [`super::functional`]'s blocks, which write their outputs straight away, are faster (a
/// 784x32x256 weight gradient took 1.3-1.4x the time of even a plain transpose followed by the
/// row kernel; ResNet-20's first weight gradient, `K` 32768, took 0.29-0.36x the time of the
/// blocked transpose and row kernel it replaces).
pub(super) const MIN_K: usize = 64;

/// `out = [acc +] a * w` with `a` transposed in memory, for schedule `s`; see the module docs.
/// `input` converts a raw word to input-format bits; `out` (`m x n`) holds the accumulators'
/// values when `acc`.
pub(super) fn functional_transposed_a<F: MacFormat>(
    s: &Schedule,
    a: Raw<'_>,
    w: Raw<'_>,
    input: impl Fn(u32) -> u32 + Copy + Sync,
    out: &mut [u32],
    acc: bool,
) {
    debug_assert!(a.transposed);
    let (m, n) = (s.m, s.n);
    let (chunk, overwrite) = s.k_chunks();
    // Fusing pays only on large GEMMs (as in `super::functional`); it never changes a bit.
    let fuse = m * s.k * n >= FUSED_MACS;
    let g = Outer { a, w, k: s.k, m, n, chunk, overwrite, acc, fuse, kernel: Kernel::for_format::<F>() };
    by_row_blocks((m, s.k, n), MT, &mut out[..m * n], |m0, out| g.rows::<F>(m0, out, input));
}

/// A GEMM with a transposed `A`, as memory holds it.
struct Outer<'a> {
    a: Raw<'a>,
    w: Raw<'a>,
    k: usize,
    m: usize,
    n: usize,
    /// K rows per partial sum.
    chunk: usize,
    /// The first chunk overwrites the accumulators (else every chunk adds).
    overwrite: bool,
    /// `out` holds the accumulators' values.
    acc: bool,
    /// Use fused multiply-adds where every product of a slice is exact.
    fuse: bool,
    /// Who computes the register blocks.
    kernel: Kernel,
}

impl Outer<'_> {
    /// Output rows `m0..` (`out`, whole rows of `n` words): every K slice in order, each decoded
    /// into cache-sized buffers and run through the register blocks.
    fn rows<F: MacFormat>(&self, m0: usize, out: &mut [u32], input: impl Fn(u32) -> u32 + Copy) {
        let (k, n) = (self.k, self.n);
        let rows = out.len() / n;
        let width = rows.div_ceil(MT) * MT;
        let decode = |x: u32| F::decode_in(input(x));
        // The accumulators (or zeros) and the partial sums of the chunk under way, by column
        // (`n x width`, rows zero-padded to whole blocks: a block moves whole vectors).
        let mut tot = vec![F::Value::default(); n * width];
        if self.acc {
            for (i, row) in out.chunks_exact(n).enumerate() {
                for (j, &x) in row.iter().enumerate() {
                    tot[j * width + i] = F::decode_acc(x);
                }
            }
        }
        let mut psum = vec![F::Value::default(); n * width];
        // One slice of A^T (zero-padded to whole blocks) and of W, row-major along K.
        let span = SLICE.min(k);
        let mut at = vec![F::Value::default(); span * width];
        let mut wk = vec![F::Value::default(); span * n];
        let mut k0 = 0;
        while k0 < k {
            let chunk_end = (k0 / self.chunk + 1) * self.chunk;
            let k1 = (k0 + span).min(chunk_end).min(k);
            let kr = k1 - k0;
            for (ki, row) in at.chunks_exact_mut(width).take(kr).enumerate() {
                let src = &self.a.words[(k0 + ki) * self.m + m0..][..rows];
                for (d, &x) in row.iter_mut().zip(src) {
                    *d = decode(x);
                }
            }
            for (ki, row) in wk.chunks_exact_mut(n).take(kr).enumerate() {
                if self.w.transposed {
                    for (j, d) in row.iter_mut().enumerate() {
                        *d = decode(self.w.words[j * k + k0 + ki]);
                    }
                } else {
                    for (d, &x) in row.iter_mut().zip(&self.w.words[(k0 + ki) * n..][..n]) {
                        *d = decode(x);
                    }
                }
            }
            let (at, wk) = (&at[..kr * width], &wk[..kr * n]);
            let fused = self.fuse && F::products_exact(at, wk) && fma_available();
            let slice = Slice { at, wk, width, n, fresh: k0 % self.chunk == 0, kernel: self.kernel };
            slice_dispatch::<F>(fused, &slice, &mut psum);
            if k1 == chunk_end || k1 == k {
                // The chunk's partial sums join the accumulators, in fold order.
                let first = k0 < self.chunk && self.overwrite;
                for (t, &p) in tot.iter_mut().zip(&psum) {
                    *t = if first { p } else { F::add_value(*t, p) };
                }
            }
            k0 = k1;
        }
        for (i, row) in out.chunks_exact_mut(n).enumerate() {
            for (j, d) in row.iter_mut().enumerate() {
                *d = F::encode_acc(tot[j * width + i]);
            }
        }
    }
}

/// One decoded K slice of a row range: `at` (`kr x width`, `A^T`'s rows, zero-padded) and `wk`
/// (`kr x n`); `fresh`: the slice starts a chunk (its partial sums start from zero).
struct Slice<'a, V> {
    at: &'a [V],
    wk: &'a [V],
    width: usize,
    n: usize,
    fresh: bool,
    kernel: Kernel,
}

/// [`Slice::run`], compiled for AVX2 with and without FMA as well as the baseline and picked at
/// run time (the same IEEE operations in the same order: the same bits).
#[multiversion::multiversion(targets("x86_64+avx2+fma", "x86_64+avx2"))]
fn slice_run<F: MacFormat, const FUSED: bool>(s: &Slice<'_, F::Value>, psum: &mut [F::Value]) {
    s.run::<F, FUSED>(psum)
}

/// [`slice_run`], fused or not.
fn slice_dispatch<F: MacFormat>(fused: bool, s: &Slice<'_, F::Value>, psum: &mut [F::Value]) {
    if fused {
        slice_run::<F, true>(s, psum)
    } else {
        slice_run::<F, false>(s, psum)
    }
}

impl<V: Copy + Default + 'static> Slice<'_, V> {
    /// Continues (or, `fresh`, starts) the partial sums `psum` (`n x width`) over this slice.
    #[inline(always)]
    fn run<F: MacFormat<Value = V>, const FUSED: bool>(&self, psum: &mut [V]) {
        for b in 0..self.width / MT {
            for n0 in (0..self.n).step_by(NT) {
                super::ragged!(self.n - n0, |C| self.block::<F, FUSED, C>(b, n0, psum));
            }
        }
    }

    /// Block `b` of `MT` outputs along `M` by columns `n0..n0 + C`.
    #[inline(always)]
    fn block<F: MacFormat<Value = V>, const FUSED: bool, const C: usize>(&self, b: usize, n0: usize, psum: &mut [V]) {
        let (m0, n, width) = (b * MT, self.n, self.width);
        let mut p = [[V::default(); MT]; C];
        if !self.fresh {
            for (c, pc) in p.iter_mut().enumerate() {
                *pc = psum[(n0 + c) * width + m0..][..MT].try_into().expect("MT outputs");
            }
        }
        if self.kernel != Kernel::Generic {
            let o = Strided {
                vecs: &self.at[m0..],
                vec_step: width,
                scalars: &self.wk[n0..],
                scalar_step: n,
                row_step: 1,
                len: self.wk.len() / n,
            };
            p = block_f32::<F, FUSED, C>(self.kernel, &o, &p).expect("f32 values");
        } else {
            self.generic::<F, FUSED, C>(m0, n0, &mut p);
        }
        for (c, pc) in p.iter().enumerate() {
            psum[(n0 + c) * width + m0..][..MT].copy_from_slice(pc);
        }
    }

    /// [`Slice::block`]'s sums for any format, left to LLVM.
    #[inline(always)]
    fn generic<F: MacFormat<Value = V>, const FUSED: bool, const C: usize>(
        &self,
        m0: usize,
        n0: usize,
        p: &mut [[V; MT]; C],
    ) {
        let n = self.n;
        // Indexed loops of constant length: LLVM keeps `p` in registers and vectorises along `t`.
        for ki in 0..self.wk.len() / n {
            let a: &[V; MT] = self.at[ki * self.width + m0..][..MT].try_into().expect("MT outputs");
            let w: &[V; C] = self.wk[ki * n + n0..][..C].try_into().expect("C columns");
            for c in 0..C {
                let x = w[c];
                for t in 0..MT {
                    p[c][t] = if FUSED { F::mac_fused(p[c][t], a[t], x) } else { F::mac_value(p[c][t], a[t], x) };
                }
            }
        }
    }
}
