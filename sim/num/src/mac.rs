//! What one processing element's multiply-accumulate does to raw bits.
//!
//! The cycle-level MXU and its functional twin both go through these functions, so they round
//! identically by construction: a product, then one rounded add into the accumulator.

use crate::format::{bf16_bits_to_f32, f32_to_bf16_bits, Precision};

/// A supported (input, accumulator) pair with its bit-level arithmetic.
pub trait MacFormat: Copy + Send + Sync + 'static {
    /// The runtime tag of this pair.
    const PRECISION: Precision;
    /// Value the arithmetic works in once decoded (exact for inputs and accumulators).
    type Value: Copy + Send + Sync + Default + PartialEq + std::fmt::Debug + 'static;
    /// Whether the values are `f32`, [`MacFormat::mac_value`] is `acc + a * w` (one rounding
    /// each), [`MacFormat::add_value`] `acc + x` and [`MacFormat::mac_fused`] `a.mul_add(w, acc)`:
    /// then vector code doing those operations gives the same bits.
    const F32_MUL_ADD: bool = false;

    /// Decodes input-register bits (exact).
    fn decode_in(bits: u32) -> Self::Value;
    /// Decodes accumulator bits (exact).
    fn decode_acc(bits: u32) -> Self::Value;
    /// Encodes an accumulator value as bits.
    fn encode_acc(v: Self::Value) -> u32;
    /// `acc + a * w` with this pair's rounding, on decoded values.
    fn mac_value(acc: Self::Value, a: Self::Value, w: Self::Value) -> Self::Value;
    /// `acc + x` for two accumulator values (the accumulator-SRAM add between K folds).
    fn add_value(acc: Self::Value, x: Self::Value) -> Self::Value;
    /// Whether every product `a * w` of a value of `a` and one of `w` is exact in
    /// [`MacFormat::Value`], so that [`MacFormat::mac_fused`] equals [`MacFormat::mac_value`]
    /// on them. `false` when in doubt.
    fn products_exact(_a: &[Self::Value], _w: &[Self::Value]) -> bool {
        false
    }
    /// `acc + a * w` with one rounding (a fused multiply-add where the host has one): the same
    /// bits as [`MacFormat::mac_value`] wherever the product is exact.
    #[inline(always)]
    fn mac_fused(acc: Self::Value, a: Self::Value, w: Self::Value) -> Self::Value {
        Self::mac_value(acc, a, w)
    }

    /// `acc + a * w` on raw bits.
    #[inline(always)]
    fn mac(acc: u32, a: u32, w: u32) -> u32 {
        Self::encode_acc(Self::mac_value(Self::decode_acc(acc), Self::decode_in(a), Self::decode_in(w)))
    }
    /// `acc + x` on raw accumulator bits.
    #[inline(always)]
    fn add(acc: u32, x: u32) -> u32 {
        Self::encode_acc(Self::add_value(Self::decode_acc(acc), Self::decode_acc(x)))
    }
    /// Rounds a real number into input-register bits.
    fn input_from_f64(x: f64) -> u32 {
        Self::PRECISION.input().f64_to_bits(x)
    }
    /// Reads accumulator bits as a real number.
    fn acc_to_f64(bits: u32) -> f64 {
        Self::PRECISION.acc().bits_to_f64(bits)
    }
}

/// bf16 x bf16 -> fp32 accumulate. The product is exact in fp32 barring over/underflow.
#[derive(Debug, Clone, Copy)]
pub struct Bf16Fp32;
/// fp32 x fp32 -> fp32 accumulate: product rounded, then sum rounded (no fused multiply-add).
#[derive(Debug, Clone, Copy)]
pub struct Fp32Fp32;
/// int8 x int8 -> int32 accumulate, wrapping.
#[derive(Debug, Clone, Copy)]
pub struct Int8Int32;

/// The two fp32-accumulating pairs differ only in how input bits widen to `f32`.
macro_rules! fp32_accumulate {
    ($ty:ty, $prec:expr, $decode_in:expr, $exact:expr) => {
        impl MacFormat for $ty {
            const PRECISION: Precision = $prec;
            type Value = f32;
            const F32_MUL_ADD: bool = true;
            #[inline(always)]
            fn decode_in(bits: u32) -> f32 {
                $decode_in(bits)
            }
            #[inline(always)]
            fn decode_acc(bits: u32) -> f32 {
                f32::from_bits(bits)
            }
            #[inline(always)]
            fn encode_acc(v: f32) -> u32 {
                canonical_f32_bits(v)
            }
            #[inline(always)]
            fn mac_value(acc: f32, a: f32, w: f32) -> f32 {
                acc + a * w
            }
            #[inline(always)]
            fn add_value(acc: f32, x: f32) -> f32 {
                acc + x
            }
            fn products_exact(a: &[f32], w: &[f32]) -> bool {
                $exact(a, w)
            }
            #[inline(always)]
            fn mac_fused(acc: f32, a: f32, w: f32) -> f32 {
                a.mul_add(w, acc)
            }
        }
    };
}

fp32_accumulate!(Bf16Fp32, Precision::Bf16Fp32, bf16_bits_to_f32, bf16_products_exact);
// fp32 x fp32 products round (24 x 24 significand bits): never fused.
fp32_accumulate!(Fp32Fp32, Precision::Fp32Fp32, f32::from_bits, |_: &[f32], _: &[f32]| false);

/// Whether every product of a bf16 value of `a` and one of `w` (as `f32`) is exact in `f32`:
/// 8 x 8 significand bits always fit in 24, so only the range can fail. Every value must be
/// finite and nonzero ones normal, and the exponent sums must keep each product in the normal
/// range (`|x| < 2^(ex+1)`, so `|x w| < 2^(ex+ew+2)`, at most `2^128`, and at least
/// `2^(ex+ew)`, at least `2^-126`).
fn bf16_products_exact(a: &[f32], w: &[f32]) -> bool {
    let (Some((alo, ahi)), Some((wlo, whi))) = (exponents(a), exponents(w)) else { return false };
    ahi + whi <= 126 && (alo + wlo >= -126 || alo > 127 || wlo > 127)
}

/// The least and greatest unbiased exponent of the nonzero values of `v` (`(128, -127)` if all
/// are zero); `None` if one is not finite or is subnormal. Two branch-free reductions over the
/// magnitudes' bits (their order is the values' order), so they vectorise.
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn exponents(v: &[f32]) -> Option<(i32, i32)> {
    let (mut max, mut min_nz) = (0u32, u32::MAX);
    for x in v {
        let mag = x.to_bits() & 0x7fff_ffff;
        max = max.max(mag);
        // Zero wraps to the largest value and so never is the least.
        min_nz = min_nz.min(mag.wrapping_sub(1));
    }
    let subnormal = min_nz < 0x007f_ffff;
    if max >= 0x7f80_0000 || subnormal {
        return None;
    }
    let exp = |mag: u32| (mag >> 23) as i32 - 127;
    Some((if min_nz == u32::MAX { 128 } else { exp(min_nz + 1) }, exp(max)))
}

impl MacFormat for Int8Int32 {
    const PRECISION: Precision = Precision::Int8Int32;
    type Value = i32;
    #[inline(always)]
    fn decode_in(bits: u32) -> i32 {
        bits as u8 as i8 as i32
    }
    #[inline(always)]
    fn decode_acc(bits: u32) -> i32 {
        bits as i32
    }
    #[inline(always)]
    fn encode_acc(v: i32) -> u32 {
        v as u32
    }
    #[inline(always)]
    fn mac_value(acc: i32, a: i32, w: i32) -> i32 {
        acc.wrapping_add(a * w)
    }
    #[inline(always)]
    fn add_value(acc: i32, x: i32) -> i32 {
        acc.wrapping_add(x)
    }
    fn products_exact(_: &[i32], _: &[i32]) -> bool {
        true
    }
}

/// The one NaN the accumulators store (quiet, positive), so NaN results are bit-reproducible
/// whatever payload the host's arithmetic propagated.
pub const CANONICAL_NAN: u32 = 0x7fc0_0000;

/// Raw bits of an accumulator value, with every NaN made [`CANONICAL_NAN`].
#[inline(always)]
pub fn canonical_f32_bits(v: f32) -> u32 {
    if v.is_nan() {
        CANONICAL_NAN
    } else {
        v.to_bits()
    }
}

/// Rounds an `f32` into bf16 input bits (helper for callers holding f32 data).
pub fn bf16_input_from_f32(x: f32) -> u32 {
    f32_to_bf16_bits(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn int32_accumulation_wraps() {
        let acc = Int8Int32::encode_acc(i32::MAX);
        let one = 1u32;
        assert_eq!(Int8Int32::decode_acc(Int8Int32::mac(acc, one, one)), i32::MIN);
        // -128 * -128 = 16384: int8 bits 0x80.
        assert_eq!(Int8Int32::decode_acc(Int8Int32::mac(0, 0x80, 0x80)), 16384);
    }

    #[test]
    fn bf16_nan_and_inf_propagate() {
        let inf = 0x7f80;
        let zero = 0;
        // inf * 0 = NaN per IEEE.
        assert_eq!(Bf16Fp32::mac(0, inf, zero), CANONICAL_NAN);
        assert_eq!(f32::from_bits(Bf16Fp32::mac(0, inf, 0x3f80)), f32::INFINITY);
        // -0 + (+0 * 1) = +0 under round-to-nearest.
        assert_eq!(Bf16Fp32::mac((-0.0f32).to_bits(), 0, 0x3f80), 0);
    }

    proptest! {
        #[test]
        fn bf16_product_is_exact_in_fp32(a in any::<u16>(), w in any::<u16>()) {
            let (x, y) = (bf16_bits_to_f32(a as u32), bf16_bits_to_f32(w as u32));
            let p32 = x * y;
            let p64 = x as f64 * y as f64;
            // Exact unless the f64 product is outside fp32's normal range.
            if p64.is_finite() && p64.abs() < f32::MAX as f64 && (p64 == 0.0 || p64.abs() >= f32::MIN_POSITIVE as f64) {
                prop_assert_eq!(p32 as f64, p64);
            }
        }

        #[test]
        fn mac_bits_match_value_arithmetic(acc in any::<f32>(), a in any::<u16>(), w in any::<u16>()) {
            let got = Bf16Fp32::mac(acc.to_bits(), a as u32, w as u32);
            let want = acc + bf16_bits_to_f32(a as u32) * bf16_bits_to_f32(w as u32);
            prop_assert_eq!(got, canonical_f32_bits(want));
        }
    }
}
