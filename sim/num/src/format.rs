//! Number formats, their widths, and round-to-nearest-even conversions.

use serde::{Deserialize, Serialize};

/// A storage format of a register or memory word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
pub enum NumFormat {
    /// bfloat16: 1 sign, 8 exponent, 7 mantissa bits.
    Bf16,
    /// IEEE-754 binary32.
    Fp32,
    /// Two's-complement 8-bit integer.
    Int8,
    /// Two's-complement 32-bit integer.
    Int32,
}

impl NumFormat {
    /// Number of bits a value of this format occupies (the register width).
    pub const fn bits(self) -> u32 {
        match self {
            NumFormat::Bf16 => 16,
            NumFormat::Fp32 | NumFormat::Int32 => 32,
            NumFormat::Int8 => 8,
        }
    }

    /// Mask of the bits used in a `u32` register holding this format.
    pub const fn mask(self) -> u32 {
        match self.bits() {
            32 => u32::MAX,
            b => (1u32 << b) - 1,
        }
    }

    /// Short lower-case name, as used in configs and output.
    pub const fn name(self) -> &'static str {
        match self {
            NumFormat::Bf16 => "bf16",
            NumFormat::Fp32 => "fp32",
            NumFormat::Int8 => "int8",
            NumFormat::Int32 => "int32",
        }
    }

    /// Reads raw bits of this format as an `f64` (exact for every format here).
    pub fn bits_to_f64(self, bits: u32) -> f64 {
        match self {
            NumFormat::Bf16 => bf16_bits_to_f32(bits) as f64,
            NumFormat::Fp32 => f32::from_bits(bits) as f64,
            NumFormat::Int8 => (bits as u8 as i8) as f64,
            NumFormat::Int32 => (bits as i32) as f64,
        }
    }

    /// Rounds an `f64` into this format (nearest-even; integers saturate).
    pub fn f64_to_bits(self, x: f64) -> u32 {
        match self {
            // Rounding f64 -> f32 -> bf16 could double-round; go through f32 only when exact.
            NumFormat::Bf16 => f64_to_bf16_bits(x),
            NumFormat::Fp32 => (x as f32).to_bits(),
            NumFormat::Int8 => f64_to_int8(x) as u8 as u32,
            NumFormat::Int32 => x.round_ties_even().clamp(i32::MIN as f64, i32::MAX as f64) as i32 as u32,
        }
    }
}

/// The (input, accumulator) format pair of the matrix unit. Only pairs real MXUs implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Precision {
    /// bf16 inputs, fp32 accumulation (TPU MXU).
    Bf16Fp32,
    /// fp32 inputs, fp32 accumulation (for comparing against frameworks).
    Fp32Fp32,
    /// int8 inputs, int32 accumulation (inference-style integer MXU).
    Int8Int32,
}

impl Precision {
    /// Every supported pair, for error messages and exhaustive tests.
    pub const ALL: [Precision; 3] = [Precision::Bf16Fp32, Precision::Fp32Fp32, Precision::Int8Int32];

    /// Format of the activation and weight registers.
    pub const fn input(self) -> NumFormat {
        match self {
            Precision::Bf16Fp32 => NumFormat::Bf16,
            Precision::Fp32Fp32 => NumFormat::Fp32,
            Precision::Int8Int32 => NumFormat::Int8,
        }
    }

    /// Format of the partial-sum registers and accumulators.
    pub const fn acc(self) -> NumFormat {
        match self {
            Precision::Bf16Fp32 | Precision::Fp32Fp32 => NumFormat::Fp32,
            Precision::Int8Int32 => NumFormat::Int32,
        }
    }

    /// Finds the pair for an (input, accumulator) combination, if the hardware has it.
    pub fn from_formats(input: NumFormat, acc: NumFormat) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.input() == input && p.acc() == acc)
    }
}

/// Widens bf16 raw bits (low 16 bits of `bits`) to the `f32` they denote (exact).
#[inline(always)]
pub fn bf16_bits_to_f32(bits: u32) -> f32 {
    f32::from_bits(bits << 16)
}

/// Rounds an `f32` to bf16 raw bits: nearest, ties to even; NaN stays NaN, its top payload
/// bits kept and made quiet (bit for bit what `half::bf16::from_f32` gives; a test checks).
/// Written branch-free so that loops over operand matrices vectorise.
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. An overflow
    // carries into the exponent (to infinity), as it should.
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    if x.is_nan() {
        nan
    } else {
        rounded
    }
}

/// Rounds an `f64` straight to bf16 (one rounding, no f32 double rounding).
fn f64_to_bf16_bits(x: f64) -> u32 {
    if x.is_nan() {
        return f32_to_bf16_bits(f32::NAN);
    }
    // f64 -> f32 with round-to-odd keeps enough information for a correct second rounding
    // (24 >= 8 + 2 bits), so bf16(round_to_odd_f32(x)) == bf16(x).
    let f = x as f32;
    let odd = if f.is_finite() && (f as f64) != x && f.to_bits() & 1 == 0 {
        // Truncate toward zero to the lower-magnitude neighbour, then set the sticky LSB.
        let t = if (f as f64).abs() > x.abs() { f32::from_bits(f.to_bits() - 1) } else { f };
        f32::from_bits(t.to_bits() | 1)
    } else {
        f
    };
    f32_to_bf16_bits(odd)
}

/// Rounds an `f64` to int8: nearest, ties to even, saturating; NaN becomes 0.
pub fn f64_to_int8(x: f64) -> i8 {
    if x.is_nan() {
        return 0;
    }
    x.round_ties_even().clamp(-128.0, 127.0) as i8
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference RNE f32 -> bf16 written from the IEEE rule, to check the `half` crate against.
    fn ref_bf16(x: f32) -> u32 {
        let b = x.to_bits();
        if x.is_nan() {
            return (b >> 16) | 0x40;
        }
        let lower = b & 0xffff;
        let upper = b >> 16;
        let round_up = lower > 0x8000 || (lower == 0x8000 && upper & 1 == 1);
        upper + round_up as u32
    }

    /// The branch-free rounding is `half`'s, bit for bit: every sign, exponent and top
    /// mantissa pattern (all 2^16 upper halves, NaN payloads included) with the lower halves
    /// that decide the rounding (below, at and above the tie, and the extremes).
    #[test]
    fn bf16_rounding_is_the_half_crates() {
        for upper in 0u32..=0xffff {
            for lower in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xc000, 0xfffe, 0xffff] {
                let x = f32::from_bits(upper << 16 | lower);
                assert_eq!(f32_to_bf16_bits(x), half::bf16::from_f32(x).to_bits() as u32, "{:#010x}", x.to_bits());
            }
        }
    }

    #[test]
    fn bf16_special_values() {
        assert_eq!(f32_to_bf16_bits(0.0), 0x0000);
        assert_eq!(f32_to_bf16_bits(-0.0), 0x8000);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16_bits(f32::NEG_INFINITY), 0xff80);
        assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
        // Largest finite f32 rounds up past bf16's largest finite value: overflow to +inf.
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7f80);
        // bf16 max finite is 0x7f7f = (2 - 2^-7) * 2^127.
        assert_eq!(bf16_bits_to_f32(0x7f7f), (2.0 - 2f32.powi(-7)) * 2f32.powi(127));
        // Smallest bf16 subnormal is 2^-133 and survives conversion.
        let tiny = 2f32.powi(-133);
        assert_eq!(f32_to_bf16_bits(tiny), 0x0001);
        assert_eq!(bf16_bits_to_f32(0x0001), tiny);
        // Half of it is a tie between 0 and the smallest subnormal: goes to even (0).
        assert_eq!(f32_to_bf16_bits(tiny / 2.0), 0x0000);
    }

    #[test]
    fn bf16_ties_go_to_even() {
        // 1 + 2^-8 is halfway between 1.0 (even mantissa) and 1 + 2^-7 (odd): goes to 1.0.
        assert_eq!(f32_to_bf16_bits(1.0 + 2f32.powi(-8)), 0x3f80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): goes up.
        assert_eq!(f32_to_bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    }

    #[test]
    fn int8_rounding_and_saturation() {
        assert_eq!(f64_to_int8(2.5), 2);
        assert_eq!(f64_to_int8(3.5), 4);
        assert_eq!(f64_to_int8(-2.5), -2);
        assert_eq!(f64_to_int8(1000.0), 127);
        assert_eq!(f64_to_int8(-1000.0), -128);
        assert_eq!(f64_to_int8(f64::NAN), 0);
        assert_eq!(NumFormat::Int8.bits_to_f64(NumFormat::Int8.f64_to_bits(-7.0)), -7.0);
    }

    #[test]
    fn precision_pairs() {
        for p in Precision::ALL {
            assert_eq!(Precision::from_formats(p.input(), p.acc()), Some(p));
        }
        assert_eq!(Precision::from_formats(NumFormat::Int8, NumFormat::Fp32), None);
        assert_eq!(NumFormat::Bf16.mask(), 0xffff);
        assert_eq!(NumFormat::Fp32.mask(), u32::MAX);
    }

    proptest! {
        #[test]
        fn bf16_matches_reference_rne(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            let got = f32_to_bf16_bits(x);
            if x.is_nan() {
                prop_assert!(bf16_bits_to_f32(got).is_nan());
            } else {
                prop_assert_eq!(got, ref_bf16(x));
            }
        }

        #[test]
        fn bf16_roundtrip_is_exact(bits in 0u32..=0xffff) {
            let x = bf16_bits_to_f32(bits);
            if !x.is_nan() {
                prop_assert_eq!(f32_to_bf16_bits(x), bits);
            }
        }

        #[test]
        fn f64_to_bf16_is_single_rounding(x in -1e30f64..1e30) {
            // Exact reference: pick the nearer of the two bf16 neighbours of x, ties to even.
            let got = NumFormat::Bf16.f64_to_bits(x);
            let v = NumFormat::Bf16.bits_to_f64(got);
            let step_of = |b: u32| (NumFormat::Bf16.bits_to_f64(b + 1) - NumFormat::Bf16.bits_to_f64(b)).abs();
            let ulp = step_of(got & 0x7fff).max(step_of((got & 0x7fff).saturating_sub(1)));
            prop_assert!((v - x).abs() <= ulp / 2.0, "x={x} v={v} ulp={ulp}");
        }
    }
}
