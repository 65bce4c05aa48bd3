//! Bit faults applied to raw register or memory bits.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a fault does to one bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BitFault {
    /// Single-event upset: the bit is inverted once.
    Flip,
    /// The bit reads 0 for as long as the fault is active.
    StuckAt0,
    /// The bit reads 1 for as long as the fault is active.
    StuckAt1,
}

impl BitFault {
    /// Applies the fault to bit `bit` of `bits`. Bits at or above 32 are out of range and
    /// leave the value unchanged (callers validate sites against register widths).
    #[inline]
    pub fn apply(self, bits: u32, bit: u32) -> u32 {
        let Some(m) = 1u32.checked_shl(bit) else { return bits };
        match self {
            BitFault::Flip => bits ^ m,
            BitFault::StuckAt0 => bits & !m,
            BitFault::StuckAt1 => bits | m,
        }
    }

    /// Applies the fault to an `f32`'s raw bits.
    pub fn apply_f32(self, x: f32, bit: u32) -> f32 {
        f32::from_bits(self.apply(x.to_bits(), bit))
    }

    /// Every fault kind, for enumeration and messages.
    pub const ALL: [BitFault; 3] = [BitFault::Flip, BitFault::StuckAt0, BitFault::StuckAt1];

    /// Text name used on the command line and in traces.
    pub const fn name(self) -> &'static str {
        match self {
            BitFault::Flip => "flip",
            BitFault::StuckAt0 => "stuck0",
            BitFault::StuckAt1 => "stuck1",
        }
    }
}

impl fmt::Display for BitFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fault-kind name that is not one of `flip`, `stuck0`, `stuck1`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault kind `{0}` (expected one of: flip, stuck0, stuck1)")]
pub struct FaultKindParseError(pub String);

impl FromStr for BitFault {
    type Err = FaultKindParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BitFault::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| FaultKindParseError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sign_flip_negates_float() {
        assert_eq!(BitFault::Flip.apply_f32(1.5, 31), -1.5);
        // Flipping the top exponent bit of 1.0 gives 2^128 -> inf? No: 1.0 = 0x3f800000, bit 30
        // set gives 0x7f800000 = +inf, the classic "exponent MSB flip" failure.
        assert_eq!(BitFault::Flip.apply_f32(1.0, 30), f32::INFINITY);
        assert_eq!(BitFault::StuckAt0.apply(0xff, 3), 0xf7);
        assert_eq!(BitFault::StuckAt1.apply(0x00, 7), 0x80);
        assert_eq!(BitFault::Flip.apply(5, 40), 5);
        assert_eq!("stuck1".parse::<BitFault>(), Ok(BitFault::StuckAt1));
        assert!("stuck2".parse::<BitFault>().unwrap_err().to_string().contains("flip, stuck0, stuck1"));
    }

    proptest! {
        #[test]
        fn flip_is_an_involution_and_touches_one_bit(v in any::<u32>(), bit in 0u32..32) {
            let f = BitFault::Flip.apply(v, bit);
            prop_assert_eq!((f ^ v).count_ones(), 1);
            prop_assert_eq!(BitFault::Flip.apply(f, bit), v);
        }

        #[test]
        fn stuck_at_is_idempotent(v in any::<u32>(), bit in 0u32..32) {
            for k in [BitFault::StuckAt0, BitFault::StuckAt1] {
                let once = k.apply(v, bit);
                prop_assert_eq!(k.apply(once, bit), once);
                prop_assert_eq!(once >> bit & 1, (k == BitFault::StuckAt1) as u32);
                prop_assert_eq!(once & !(1 << bit), v & !(1 << bit));
            }
        }
    }
}
