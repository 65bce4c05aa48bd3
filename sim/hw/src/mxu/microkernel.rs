//! Hand-written x86-64 register blocks for the formats whose MAC is an `f32` multiply and add
//! ([`MacFormat::F32_MUL_ADD`]): bf16 and fp32 inputs, fp32 accumulation.
//!
//! The generic [`super::functional`] block is left to LLVM, which kept the weight vectors in
//! memory (every multiply reloaded its operand: 18 loads per `k` for 96 MACs), bounds-checked
//! each row's read and spilled a row stride, so it ran at about half the rate of the same
//! multiplies and adds written out. Here each `k` loads the two weight vectors once, broadcasts
//! each row's `a`, and does per output exactly one multiply then one add (or one fused
//! multiply-add where [`MacFormat::products_exact`] allowed it): the generic block's IEEE
//! operations in the generic block's order, so the same bits.

use super::functional::NR;
use faultline_num::MacFormat;
use std::any::TypeId;

const _: () = assert!(NR == 16, "the kernels below are two 8-lane vectors wide");

/// Which instruction set runs the `f32` blocks, picked once per GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    /// The generic block (any format, any host).
    Generic,
    /// AVX2 and FMA: 16 vector registers, which six rows' 12 sums, the two weight vectors and
    /// a broadcast all but fill.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// The same 256-bit code with AVX-512VL's 32 registers (Zen 4 and other cores whose 512-bit
    /// units are two 256-bit halves gain nothing from wider vectors, so the blocks stay 256 bits
    /// wide).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    /// The best kernel for format `F` on this host (picked per GEMM: no allocation, the host's
    /// kernels found once).
    pub(super) fn for_format<F: MacFormat>() -> Kernel {
        match Kernel::hand_written::<F>().last() {
            Some(&best) => best,
            None => Kernel::Generic,
        }
    }

    /// Every kernel this host can run for format `F`, best last (the tests run them all).
    #[cfg(test)]
    pub(super) fn available<F: MacFormat>() -> Vec<Kernel> {
        std::iter::once(Kernel::Generic).chain(Kernel::hand_written::<F>().iter().copied()).collect()
    }

    /// The hand-written kernels this host runs for format `F`, best last: none unless its
    /// values are `f32` multiplied and added.
    fn hand_written<F: MacFormat>() -> &'static [Kernel] {
        if !F::F32_MUL_ADD || TypeId::of::<F::Value>() != TypeId::of::<f32>() {
            return &[];
        }
        static HOST: std::sync::OnceLock<Vec<Kernel>> = std::sync::OnceLock::new();
        HOST.get_or_init(|| {
            #[allow(unused_mut)]
            let mut all = Vec::new();
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") && has!("fma") {
                    all.push(Kernel::Avx2);
                    if has!("avx512f") && has!("avx512vl") {
                        all.push(Kernel::Avx512);
                    }
                }
            }
            all
        })
    }
}

/// The operands of one register block of `R x 16` sums, run along `len` steps of `K`: at step
/// `i`, the 16-wide vector `vecs[i * vec_step..][..16]` and, for sum row `r`, the scalar
/// `scalars[i * scalar_step + r * row_step]`. [`super::functional`]'s blocks are rows of `A` by
/// a panel of `W` (vectors along `N`), [`super::outer`]'s columns of `W` by rows of `A^T`
/// (vectors along `M`).
pub(super) struct Strided<'a, V> {
    pub vecs: &'a [V],
    pub vec_step: usize,
    pub scalars: &'a [V],
    pub scalar_step: usize,
    pub row_step: usize,
    pub len: usize,
}

/// Sum row `r`, lane `t` continued from `init[r][t]` by `acc + scalar * vec[t]` (fused if
/// `FUSED`) over the steps in order, as the generic blocks compute it, by `kernel` (not
/// [`Kernel::Generic`]); `None` if `F`'s values are not `f32`.
#[inline(always)]
pub(super) fn block_f32<F: MacFormat, const FUSED: bool, const R: usize>(
    kernel: Kernel,
    o: &Strided<'_, F::Value>,
    init: &[[F::Value; NR]; R],
) -> Option<[[F::Value; NR]; R]> {
    let (vecs, scalars) = (as_f32(o.vecs)?, as_f32(o.scalars)?);
    // SAFETY: `F::Value` is `f32` (checked by `as_f32`), so the two arrays are one type.
    let init: [[f32; NR]; R] = unsafe { std::mem::transmute_copy(init) };
    // The kernels read no further than this: checked here once.
    if o.len > 0 {
        let last = o.len - 1;
        assert!(last * o.vec_step + NR <= vecs.len(), "block's vectors");
        assert!(last * o.scalar_step + (R - 1) * o.row_step < scalars.len(), "block's scalars");
    }
    let (v, sc) = (vecs.as_ptr(), scalars.as_ptr());
    let steps = (o.len, o.vec_step, o.scalar_step, o.row_step);
    let sums: [[f32; NR]; R] = match kernel {
        Kernel::Generic => unreachable!("the generic block has no f32 kernel"),
        // SAFETY: the extents are checked above and the CPU features when `kernel` was picked.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::block_avx2::<FUSED, R>(v, sc, steps, &init) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => unsafe { x86::block_avx512::<FUSED, R>(v, sc, steps, &init) },
    };
    // SAFETY: as above.
    Some(unsafe { std::mem::transmute_copy(&sums) })
}

/// Raw words as `F`'s values if those are `f32` (bits as they are: no NaN is quieted).
pub(super) fn as_values<F: MacFormat>(words: &[u32]) -> Option<&[F::Value]> {
    // SAFETY: `u32` and `f32` have one size and alignment, and every bit pattern is an `f32`.
    (TypeId::of::<F::Value>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len()) })
}

/// `v` as `f32`s if `V` is `f32`.
#[inline(always)]
fn as_f32<V: 'static>(v: &[V]) -> Option<&[f32]> {
    // SAFETY: same type, so same layout.
    (TypeId::of::<V>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::NR;
    use std::arch::x86_64::*;

    /// The block body, stamped out once per instruction set (the intrinsics inline only into a
    /// function that enables their features).
    macro_rules! block {
        ($name:ident, $features:literal) => {
            /// # Safety
            /// The CPU has `$features`; `v` and `s` hold what [`super::Strided`] says for
            /// `(len, vec_step, scalar_step, row_step)`.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const FUSED: bool, const R: usize>(
                v: *const f32,
                s: *const f32,
                (len, vec_step, scalar_step, row_step): (usize, usize, usize, usize),
                init: &[[f32; NR]; R],
            ) -> [[f32; NR]; R] {
                let mut lo: [__m256; R] = std::array::from_fn(|r| _mm256_loadu_ps(init[r].as_ptr()));
                let mut hi: [__m256; R] = std::array::from_fn(|r| _mm256_loadu_ps(init[r].as_ptr().add(8)));
                for i in 0..len {
                    let (w0, w1) = (_mm256_loadu_ps(v.add(i * vec_step)), _mm256_loadu_ps(v.add(i * vec_step + 8)));
                    let si = s.add(i * scalar_step);
                    for r in 0..R {
                        let x = _mm256_broadcast_ss(&*si.add(r * row_step));
                        if FUSED {
                            lo[r] = _mm256_fmadd_ps(x, w0, lo[r]);
                            hi[r] = _mm256_fmadd_ps(x, w1, hi[r]);
                        } else {
                            lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(x, w0));
                            hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(x, w1));
                        }
                    }
                }
                let mut out = [[0f32; NR]; R];
                for r in 0..R {
                    _mm256_storeu_ps(out[r].as_mut_ptr(), lo[r]);
                    _mm256_storeu_ps(out[r].as_mut_ptr().add(8), hi[r]);
                }
                out
            }
        };
    }
    block!(block_avx2, "avx2,fma");
    block!(block_avx512, "avx2,fma,avx512f,avx512vl");
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultline_num::{Bf16Fp32, Fp32Fp32};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// An `f32` from a pool with specials (signed zeros, infinities, NaNs with payloads,
    /// subnormals, huge values) or an ordinary one.
    fn value(rng: &mut ChaCha8Rng) -> f32 {
        let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::from_bits(0x7fc0_1234), 1e-40, -3e38, 2e38];
        if rng.gen_bool(0.1) {
            specials[rng.gen_range(0..specials.len())]
        } else {
            rng.gen_range(-4.0..4.0)
        }
    }

    /// Every hand-written block this host runs equals, bit for bit (NaNs as NaNs), the scalar
    /// sequence `acc + s * v` (fused: `s.mul_add(v, acc)`) from the given start, for every row
    /// count, both operand layouts' strides, empty runs, and specials.
    fn blocks_equal_scalar<const R: usize>(rng: &mut ChaCha8Rng) {
        for kernel in Kernel::available::<Fp32Fp32>().into_iter().filter(|&k| k != Kernel::Generic) {
            for (vec_step, scalar_step, row_step, len) in
                [(NR, 1, 37, 37), (40, 6, 1, 20), (NR, 1, 5, 0), (NR, 1, 3, 1)]
            {
                let vecs: Vec<f32> = (0..len * vec_step + NR).map(|_| value(rng)).collect();
                let scalars: Vec<f32> = (0..len * scalar_step + R * row_step + 1).map(|_| value(rng)).collect();
                let init: [[f32; NR]; R] = std::array::from_fn(|_| std::array::from_fn(|_| value(rng)));
                let o = Strided { vecs: &vecs, vec_step, scalars: &scalars, scalar_step, row_step, len };
                for fused in [false, true] {
                    let got = if fused {
                        block_f32::<Fp32Fp32, true, R>(kernel, &o, &init)
                    } else {
                        block_f32::<Fp32Fp32, false, R>(kernel, &o, &init)
                    };
                    let got = got.expect("f32 values");
                    for r in 0..R {
                        for t in 0..NR {
                            let mut want = init[r][t];
                            for i in 0..len {
                                let (x, w) = (scalars[i * scalar_step + r * row_step], vecs[i * vec_step + t]);
                                want = if fused { x.mul_add(w, want) } else { want + x * w };
                            }
                            let same = got[r][t].to_bits() == want.to_bits() || (got[r][t].is_nan() && want.is_nan());
                            assert!(same, "{kernel:?} fused {fused} R {R} row {r} lane {t}: {} vs {want}", got[r][t]);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn hand_written_blocks_equal_the_scalar_sequence() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for _ in 0..4 {
            blocks_equal_scalar::<1>(&mut rng);
            blocks_equal_scalar::<2>(&mut rng);
            blocks_equal_scalar::<3>(&mut rng);
            blocks_equal_scalar::<6>(&mut rng);
        }
    }

    /// Formats whose values are not `f32` (or whose MAC is not a plain multiply and add) get
    /// the generic block only.
    #[test]
    fn only_f32_multiply_add_formats_get_hand_written_blocks() {
        assert_eq!(Kernel::available::<faultline_num::Int8Int32>(), vec![Kernel::Generic]);
        assert_eq!(Kernel::available::<Bf16Fp32>(), Kernel::available::<Fp32Fp32>());
    }
}
