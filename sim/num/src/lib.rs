//! Bit-exact number formats of the simulated accelerator.
//!
//! Every value the machine holds lives in a register or SRAM word as raw bits (`u32`, low bits
//! used). This crate says how those bits are read as numbers, how numbers are rounded into them
//! (round-to-nearest-even everywhere), what one multiply-accumulate does to them, and how a bit
//! fault changes them.
//!
//! IEEE behaviour (tested in this crate):
//! * fp32 arithmetic is the host's IEEE-754 binary32 arithmetic with round-to-nearest-even and
//!   gradual underflow (Rust never enables flush-to-zero), so subnormals are kept.
//! * bf16 is the upper half of a binary32: 1 sign, 8 exponent, 7 mantissa bits. Conversion from
//!   fp32 rounds to nearest, ties to even; overflow goes to ±inf; NaN stays NaN (made quiet);
//!   bf16 subnormals exist (same exponent range as fp32) and are produced by rounding.
//! * A bf16 x bf16 product is exact in fp32 unless it overflows or underflows (8 + 8 significand
//!   bits fit in 24), so "bf16 inputs, fp32 accumulate" has exactly one rounding per add.
//! * int8 conversion rounds to nearest, ties to even, and saturates to [-128, 127]; int32
//!   accumulation wraps (two's complement), as an adder without saturation logic does.
//! * Accumulators store every NaN as one canonical quiet NaN ([`CANONICAL_NAN`]), as MXUs do;
//!   IEEE leaves payload propagation open, and bit-exact twins need it fixed.

#![warn(missing_docs)]

mod fault;
mod format;
pub mod json;
mod mac;

pub use fault::{BitFault, FaultKindParseError};
pub use format::{bf16_bits_to_f32, f32_to_bf16_bits, f64_to_int8, NumFormat, Precision};
pub use mac::{bf16_input_from_f32, canonical_f32_bits, Bf16Fp32, Fp32Fp32, Int8Int32, MacFormat, CANONICAL_NAN};

/// Calls `$body` with the type alias `$T` bound to the [`MacFormat`] of a runtime [`Precision`],
/// so that hot loops are monomorphised per format instead of branching per element.
#[macro_export]
macro_rules! with_precision {
    ($prec:expr, $T:ident => $body:expr) => {
        match $prec {
            $crate::Precision::Bf16Fp32 => {
                type $T = $crate::Bf16Fp32;
                $body
            }
            $crate::Precision::Fp32Fp32 => {
                type $T = $crate::Fp32Fp32;
                $body
            }
            $crate::Precision::Int8Int32 => {
                type $T = $crate::Int8Int32;
                $body
            }
        }
    };
}
