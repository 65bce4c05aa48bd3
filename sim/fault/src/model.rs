//! Fault models: the bits one fault strikes and how, from a sampled anchor (a bit of an
//! element of a class at a cycle of a step).

use crate::error::{FaultError, Result};
use crate::spec::{Along, FaultModel, Lasts};
use faultline_hw::{HwConfig, SiteClass, Unit};
use faultline_num::BitFault;
use faultline_train::StepFault;
use std::ops::Range;
use std::path::Path;

/// Where a trial's fault is anchored: bit `bit` of element `elem` of a class, at `cycle` of
/// training step `step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// The class.
    pub class: SiteClass,
    /// Element (PE, lane, word) as [`SiteClass::site_at`] numbers them.
    pub elem: u64,
    /// Bit within the element's register or word; at or past the class's width, a bit of the
    /// check bits a code adds (codeword order: data bits, then check bits).
    pub bit: u32,
    /// Training step (1-based).
    pub step: u64,
    /// Cycle within the step.
    pub cycle: u64,
    /// For an anchor in a code's check bits: check bits per element; 0 in the data bits.
    pub check_bits: u32,
}

impl Anchor {
    /// The stratum's name: the class's pattern, with `.check` for a code's check bits.
    pub fn pattern(&self) -> String {
        crate::sample::check_pattern(self.class, self.check_bits)
    }
}

/// Elements in one row of `class` (the neighbours of an element): a PE row, or all lanes or
/// words.
fn row_len(hw: &HwConfig, class: SiteClass) -> u64 {
    let d = class.dims(hw);
    if d[1] > 1 {
        d[1] as u64
    } else {
        class.elements(hw)
    }
}

impl FaultModel {
    /// Checks that every selected class can take this fault (a `k`-bit upset needs `k` bits per
    /// word or `k` elements per row) and that a stuck-at of `Cycles(n)` fits in a step of
    /// `step_cycles` cycles.
    pub fn check(self, hw: &HwConfig, classes: &[SiteClass], step_cycles: u64, file: &Path) -> Result<()> {
        if let FaultModel::StuckAt { lasts: Lasts::Cycles(n), .. } = self {
            // A longer one acts exactly as `Cycles(step_cycles)` (a trial's fault ends with its
            // step), and past 2^64 - step_cycles its end would overflow.
            if n > step_cycles {
                return Err(FaultError::Invalid {
                    file: file.into(),
                    field: "fault.lasts".into(),
                    value: format!("Cycles({n})"),
                    allowed: format!(
                        "Cycles(n) with 1 <= n <= {step_cycles} (the step's cycles; from the sampled cycle to \
                         the step's end is Cycles({step_cycles})), Step or Permanent"
                    ),
                });
            }
        }
        let FaultModel::MultiBit { bits, along } = self else { return Ok(()) };
        for &c in classes {
            if c.unit == Unit::Seq {
                return Err(FaultError::Invalid {
                    file: file.into(),
                    field: "fault".into(),
                    value: format!("MultiBit(bits: {bits}, ..)"),
                    allowed: format!(
                        "Flip or StuckAt for class {c}: the sequencer's fold loop is modelled with one faulty bit"
                    ),
                });
            }
            let (room, what) = match along {
                Along::Bits => (c.width(hw) as u64, "bits per element"),
                Along::Elements => (row_len(hw, c), "elements per row"),
            };
            if (bits as u64) > room {
                return Err(FaultError::Invalid {
                    file: file.into(),
                    field: "fault.bits".into(),
                    value: bits.to_string(),
                    allowed: format!("at most {room}: class {c} has {room} {what}"),
                });
            }
        }
        Ok(())
    }

    /// Bits one fault strikes.
    pub fn bits(self) -> u32 {
        match self {
            FaultModel::MultiBit { bits, .. } => bits,
            FaultModel::Flip | FaultModel::StuckAt { .. } => 1,
        }
    }

    /// Whether the fault covers whole steps, so trials sample no cycle (the anchor's is 0).
    pub fn whole_steps(self) -> bool {
        matches!(self, FaultModel::StuckAt { lasts: Lasts::Step | Lasts::Permanent, .. })
    }

    /// Whether the fault stays for every later step.
    pub fn permanent(self) -> bool {
        matches!(self, FaultModel::StuckAt { lasts: Lasts::Permanent, .. })
    }

    /// The anchors (elements x cycles of a class with `elements` elements) whose upset can
    /// strike some bit of `elems` in some cycle of `cycles`: the window itself for a one-cycle
    /// fault on one element, earlier cycles for a stuck-at that lasts, every element for one
    /// that covers whole steps (anchored at cycle 0), and neighbouring elements for an upset
    /// along a row. A superset is safe (its extra anchors are skipped as dead); a subset
    /// would lose faults, which `sample`'s `anchors_outside_the_reach_are_dead` checks.
    pub fn reach(self, elems: &Range<u64>, cycles: &Range<u64>, elements: u64) -> (Range<u64>, Range<u64>) {
        match self {
            _ if self.whole_steps() => (elems.clone(), 0..1),
            FaultModel::StuckAt { lasts: Lasts::Cycles(n), .. } => {
                (elems.clone(), cycles.start.saturating_sub(n.saturating_sub(1))..cycles.end)
            }
            FaultModel::MultiBit { bits, along: Along::Elements } => {
                let by = bits.saturating_sub(1) as u64;
                (elems.start.saturating_sub(by)..(elems.end + by).min(elements), cycles.clone())
            }
            FaultModel::Flip | FaultModel::MultiBit { along: Along::Bits, .. } | FaultModel::StuckAt { .. } => {
                (elems.clone(), cycles.clone())
            }
        }
    }

    /// The bits struck, all at the anchor's step and cycle (a step of `step_cycles` cycles).
    /// Neighbours extend up from the anchor (higher bits, or the next elements along the row)
    /// and shift down where they would pass the register's or row's end, so every bit of the
    /// class is struck by the same number of anchors except near the ends. An anchor in a
    /// code's check bits strikes bits of the codeword (its data and check bits), numbered past
    /// the data width as [`faultline_hw::protect::ecc::Code::decode_error`] numbers them.
    pub fn upset(self, hw: &HwConfig, a: &Anchor, step_cycles: u64) -> Vec<StepFault> {
        let width = a.class.width(hw);
        let fault = |elem: u64, bit: u32, kind: BitFault, duration: u64| {
            let mut site = a.class.site_at(hw, elem * width as u64).expect("anchors lie inside their class");
            site.bit = bit;
            StepFault { kind, site, step: a.step, cycle: a.cycle, duration }
        };
        match self {
            FaultModel::Flip => vec![fault(a.elem, a.bit, BitFault::Flip, 1)],
            FaultModel::StuckAt { value, lasts } => {
                let kind = if value == 0 { BitFault::StuckAt0 } else { BitFault::StuckAt1 };
                let cycles = match lasts {
                    Lasts::Cycles(n) => n,
                    Lasts::Step | Lasts::Permanent => step_cycles - a.cycle,
                };
                vec![fault(a.elem, a.bit, kind, cycles)]
            }
            FaultModel::MultiBit { bits, along: Along::Bits } => {
                let first = a.bit.min(width + a.check_bits - bits);
                (first..first + bits).map(|b| fault(a.elem, b, BitFault::Flip, 1)).collect()
            }
            FaultModel::MultiBit { bits, along: Along::Elements } => {
                let row = row_len(hw, a.class);
                let (base, at) = (a.elem / row * row, a.elem % row);
                let first = at.min(row - bits as u64);
                (first..first + bits as u64).map(|e| fault(base + e, a.bit, BitFault::Flip, 1)).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultline_hw::{Dataflow, Register};
    use faultline_num::Precision;

    fn hw() -> HwConfig {
        HwConfig::test_config(4, 6, Dataflow::WeightStationary, Precision::Bf16Fp32)
    }

    fn class(unit: Unit, register: Register) -> SiteClass {
        SiteClass::all(&hw()).into_iter().find(|c| c.unit == unit && c.register == register).unwrap()
    }

    #[test]
    fn upsets_strike_neighbours_inside_the_register_and_row() {
        let hw = hw();
        let psum = class(Unit::Mxu, Register::Psum);
        // PE (1, 5) is the last of its row of 6: a 3-PE upset shifts left to columns 3..=5.
        let a = Anchor { class: psum, elem: 11, bit: 31, step: 2, cycle: 7, check_bits: 0 };
        let up = FaultModel::MultiBit { bits: 3, along: Along::Elements }.upset(&hw, &a, 100);
        let names: Vec<String> = up.iter().map(|f| f.site.to_string()).collect();
        assert_eq!(names, ["mxu.pe[1][3].psum[31]", "mxu.pe[1][4].psum[31]", "mxu.pe[1][5].psum[31]"]);
        // Bit 31 of a 32-bit sum: two adjacent bits are 30 and 31.
        let up = FaultModel::MultiBit { bits: 2, along: Along::Bits }.upset(&hw, &a, 100);
        let names: Vec<String> = up.iter().map(|f| f.site.to_string()).collect();
        assert_eq!(names, ["mxu.pe[1][5].psum[30]", "mxu.pe[1][5].psum[31]"]);
        assert!(up.iter().all(|f| (f.step, f.cycle, f.kind) == (2, 7, BitFault::Flip)));
        let up = FaultModel::StuckAt { value: 1, lasts: Lasts::Cycles(9) }.upset(&hw, &a, 100);
        assert_eq!((up[0].kind, up[0].duration), (BitFault::StuckAt1, 9));
        // A whole-step stuck-at runs from its (zero) anchor cycle to the step's end.
        let a0 = Anchor { cycle: 0, ..a };
        let up = FaultModel::StuckAt { value: 0, lasts: Lasts::Step }.upset(&hw, &a0, 100);
        assert_eq!((up[0].kind, up[0].cycle, up[0].duration), (BitFault::StuckAt0, 0, 100));
    }

    #[test]
    fn upsets_in_check_bits_strike_the_codeword() {
        let hw = hw();
        let psum = class(Unit::Mxu, Register::Psum);
        // A 32-bit register under SECDED: check bits are codeword bits 32..39.
        let a = Anchor { class: psum, elem: 0, bit: 38, step: 1, cycle: 3, check_bits: 7 };
        assert_eq!(a.pattern(), "mxu.pe[*][*].psum.check");
        let bits = |up: Vec<StepFault>| up.iter().map(|f| f.site.bit).collect::<Vec<_>>();
        assert_eq!(bits(FaultModel::Flip.upset(&hw, &a, 100)), [38]);
        assert_eq!(bits(FaultModel::MultiBit { bits: 3, along: Along::Bits }.upset(&hw, &a, 100)), [36, 37, 38]);
        // Anchored at the first check bit, an upset does not reach back into the data bits...
        let a32 = Anchor { bit: 32, ..a };
        assert_eq!(bits(FaultModel::MultiBit { bits: 2, along: Along::Bits }.upset(&hw, &a32, 100)), [32, 33]);
        // ...but one anchored at the codeword's end shifts down across it.
        let one = Anchor { check_bits: 1, bit: 32, ..a };
        assert_eq!(bits(FaultModel::MultiBit { bits: 3, along: Along::Bits }.upset(&hw, &one, 100)), [30, 31, 32]);
    }

    #[test]
    fn upsets_wider_than_a_class_are_refused() {
        let hw = hw();
        let tile = class(Unit::Seq, Register::TileCounter);
        let e = FaultModel::MultiBit { bits: 2, along: Along::Elements }
            .check(&hw, &[tile], 100, Path::new("c.ron"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "c.ron: field `fault` = MultiBit(bits: 2, ..): Flip or StuckAt for class seq.tile: the sequencer's fold loop \
             is modelled with one faulty bit"
        );
        let dma = class(Unit::Dma, Register::SrcAddr);
        let e = FaultModel::MultiBit { bits: 2, along: Along::Elements }
            .check(&hw, &[dma], 100, Path::new("c.ron"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "c.ron: field `fault.bits` = 2: at most 1: class dma.src_addr has 1 elements per row");
    }

    #[test]
    fn stuck_ats_longer_than_the_step_are_refused() {
        let hw = hw();
        let psum = class(Unit::Mxu, Register::Psum);
        let stuck =
            |n| FaultModel::StuckAt { value: 1, lasts: Lasts::Cycles(n) }.check(&hw, &[psum], 100, Path::new("c.ron"));
        assert!(stuck(1).is_ok() && stuck(100).is_ok());
        for n in [101, u64::MAX] {
            let e = stuck(n).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("c.ron: field `fault.lasts` = Cycles({n}): Cycles(n) with 1 <= n <= 100")),
                "{e}"
            );
        }
    }
}
