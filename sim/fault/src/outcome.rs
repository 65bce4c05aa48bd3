//! What a fault did to training: the outcome taxonomy of He et al., *Understanding and
//! Mitigating Hardware Failures in Deep Learning Training Systems* (ISCA 2023), with the
//! operational definitions Faultline uses.
//!
//! A trial restores the golden run's state before the injection step `s`, runs step `s` with
//! the fault (hybrid: the faulted instruction at register level, the rest functionally) and
//! compares with the golden run:
//!
//! | outcome | definition |
//! |---|---|
//! | `HwMasked` | the faulted instruction's outputs are bit-identical to golden (the fault never left the hardware), or the (bit, cycle) is provably dead |
//! | `Masked` | outputs differ, but the training state (parameters, optimizer state) after step `s` is bit-identical to golden |
//! | `ImmediateInfNan` | step `s`'s loss or the state after it is not finite |
//! | `ShortTermInfNan` | a loss or the state turns non-finite within the follow-up window |
//! | `SharpDegrade` | a *loss jump* that does not recover within the window |
//! | `SharpSlowDegrade` | a loss jump whose loss recovers, but test accuracy at the window's end stays down |
//! | `SlowDegrade` | no jump; the loss at the window's end has not recovered |
//! | `LowTestAccuracy` | no jump; the loss recovers but test accuracy does not |
//! | `Benign` | the state differs, yet loss and test accuracy at the window's end are within tolerance |
//!
//! With a protection plan ([`crate::protect`]), a fault a mechanism catches is recorded by what
//! the mechanism did instead; one it misses keeps its class above:
//!
//! | outcome | definition |
//! |---|---|
//! | `Corrected` | a check code corrected every read of the changed bits: training saw none of the fault |
//! | `DetectedRecovered` | a check fired in the injection step, and re-executing the step from the state before it gave the golden state bit for bit |
//! | `Detected` | a check fired and the run stopped (no recovery, or every re-execution was struck again) |
//!
//! A check that fires on a fault-free step is a *false positive*: no trial records one (every
//! trial has a fault); they are counted per check on the golden run
//! ([`crate::protect::CheckInfo::false_positives`]) and per plan on a held-out fault-free run
//! ([`crate::explore::PlanResult::false_positives`]).
//!
//! Inference campaigns (faults in forward passes over test batches, as in the ABFT and LLM
//! error-propagation studies) use `HwMasked` and `Masked` (outputs bit-identical to golden) and:
//!
//! | outcome | definition |
//! |---|---|
//! | `SdcBenign` | outputs differ, every sample's top-1 prediction is unchanged |
//! | `SdcCritical` | some samples' top-1 predictions changed (the record counts them) |
//! | `Due` | an output is not finite |
//!
//! With the [`Thresholds`]: a *loss jump* is a follow-up loss, in the first `jump_within` steps,
//! above `(1 + jump) x` golden's loss on the same step; the loss *recovers* when its mean over
//! the window's last `recover_over` steps is at most `(1 + loss_tolerance) x` golden's mean
//! there; test accuracy *stays down* when it is more than `accuracy_drop` (absolute) below
//! golden's at the window's end.

use crate::error::{FaultError, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;

/// What one fault did to training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Outcome {
    /// Never left the hardware.
    HwMasked,
    /// Left the instruction, masked by training before the state changed.
    Masked,
    /// The state changed; loss and accuracy within tolerance at the window's end.
    Benign,
    /// Non-finite loss or state in the injection step.
    ImmediateInfNan,
    /// Non-finite loss or state within the follow-up window.
    ShortTermInfNan,
    /// A loss jump that does not recover.
    SharpDegrade,
    /// A loss jump that recovers in loss but not in test accuracy.
    SharpSlowDegrade,
    /// No jump; the loss has not recovered by the window's end.
    SlowDegrade,
    /// No jump; the loss recovered but test accuracy did not.
    LowTestAccuracy,
    /// Protection: a check code corrected every changed word or register the step read, so
    /// training saw none of the fault.
    Corrected,
    /// Protection: a check fired and re-executing the step from the state before it restored
    /// the golden state, bit for bit.
    DetectedRecovered,
    /// Protection: a check fired and the run stopped there (no recovery, or the fault
    /// struck every re-execution): a detected, unrecoverable error.
    Detected,
    /// Inference: outputs changed, every top-1 prediction unchanged.
    SdcBenign,
    /// Inference: some top-1 predictions changed (the record counts them).
    SdcCritical,
    /// Inference: a non-finite output (a detected, unrecoverable error).
    Due,
}

impl Outcome {
    /// Every outcome: training's from most to least benign, then inference's.
    pub const ALL: [Outcome; 15] = [
        Outcome::HwMasked,
        Outcome::Masked,
        Outcome::Benign,
        Outcome::ImmediateInfNan,
        Outcome::ShortTermInfNan,
        Outcome::SharpDegrade,
        Outcome::SharpSlowDegrade,
        Outcome::SlowDegrade,
        Outcome::LowTestAccuracy,
        Outcome::Corrected,
        Outcome::DetectedRecovered,
        Outcome::Detected,
        Outcome::SdcBenign,
        Outcome::SdcCritical,
        Outcome::Due,
    ];

    /// Position in [`Outcome::ALL`] (declaration order), for per-outcome count arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name in records and summaries.
    pub const fn name(self) -> &'static str {
        match self {
            Outcome::HwMasked => "HwMasked",
            Outcome::Masked => "Masked",
            Outcome::Benign => "Benign",
            Outcome::ImmediateInfNan => "ImmediateInfNan",
            Outcome::ShortTermInfNan => "ShortTermInfNan",
            Outcome::SharpDegrade => "SharpDegrade",
            Outcome::SharpSlowDegrade => "SharpSlowDegrade",
            Outcome::SlowDegrade => "SlowDegrade",
            Outcome::LowTestAccuracy => "LowTestAccuracy",
            Outcome::Corrected => "Corrected",
            Outcome::DetectedRecovered => "DetectedRecovered",
            Outcome::Detected => "Detected",
            Outcome::SdcBenign => "SdcBenign",
            Outcome::SdcCritical => "SdcCritical",
            Outcome::Due => "Due",
        }
    }

    /// The fault changed the training state silently (anything but `HwMasked`, `Masked` and
    /// the protection outcomes): what the per-bit vulnerability counts.
    pub const fn unmasked(self) -> bool {
        !matches!(self, Outcome::HwMasked | Outcome::Masked) && !self.protection_only()
    }

    /// An outcome only a campaign run with a protection plan records (`Corrected`,
    /// `DetectedRecovered`, `Detected`).
    pub const fn protection_only(self) -> bool {
        matches!(self, Outcome::Corrected | Outcome::DetectedRecovered | Outcome::Detected)
    }

    /// A check fired (`DetectedRecovered`, `Detected`).
    pub const fn detected(self) -> bool {
        matches!(self, Outcome::DetectedRecovered | Outcome::Detected)
    }

    /// An outcome only inference campaigns record (`SdcBenign`, `SdcCritical`, `Due`).
    pub const fn inference_only(self) -> bool {
        matches!(self, Outcome::SdcBenign | Outcome::SdcCritical | Outcome::Due)
    }

    /// Training or inference failed: non-finite values, a degraded model, changed predictions
    /// (not masked, not benign).
    pub const fn failure(self) -> bool {
        self.unmasked() && !matches!(self, Outcome::Benign | Outcome::SdcBenign)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The thresholds that tell a training campaign's degraded outcomes (`SharpDegrade`,
/// `SharpSlowDegrade`, `SlowDegrade`, `LowTestAccuracy`) from `Benign`: a loss jump, a loss
/// that has not recovered, a test accuracy that stays down.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// A loss jump: a follow-up loss above `(1 + jump) x` golden's. A fraction, positive and
    /// finite (1.0: twice golden's loss).
    pub jump: f64,
    /// Follow-up steps in which a jump counts as sharp (from the step after injection;
    /// clipped to the window). Steps, at least 1.
    pub jump_within: u64,
    /// The loss recovered: its mean over the last `recover_over` steps is at most
    /// `(1 + loss_tolerance) x` golden's. A fraction, positive and finite.
    pub loss_tolerance: f64,
    /// Steps at the end of the window the recovery is judged over (clipped to the window).
    /// Steps, at least 1.
    pub recover_over: u64,
    /// Test accuracy stays down: more than this below golden's. Absolute accuracy (a fraction),
    /// 0 <= x < 1 (0.02: two points).
    pub accuracy_drop: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { jump: 1.0, jump_within: 2, loss_tolerance: 0.05, recover_over: 5, accuracy_drop: 0.02 }
    }
}

impl Thresholds {
    /// Checks value ranges.
    pub fn validate(&self, file: &Path) -> Result<()> {
        let bad = |field: &str, value: String, allowed: String| {
            Err(FaultError::Invalid { file: file.into(), field: format!("thresholds.{field}"), value, allowed })
        };
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.jump) {
            return bad("jump", self.jump.to_string(), "a positive number (0.5: 50% above golden)".into());
        }
        if !positive(self.loss_tolerance) {
            return bad("loss_tolerance", self.loss_tolerance.to_string(), "a positive number".into());
        }
        if !(self.accuracy_drop.is_finite() && (0.0..1.0).contains(&self.accuracy_drop)) {
            return bad("accuracy_drop", self.accuracy_drop.to_string(), "a number in [0, 1)".into());
        }
        if self.jump_within == 0 {
            return bad("jump_within", "0".into(), "at least 1 step (clipped to the follow-up window)".into());
        }
        if self.recover_over == 0 {
            return bad("recover_over", "0".into(), "at least 1 step (clipped to the follow-up window)".into());
        }
        Ok(())
    }

    /// The outcome of a trial whose state differs from golden and stayed finite through the
    /// window: `losses[k]` and `golden[k]` are the losses of follow-up step `k` (equal
    /// lengths), `accuracy` and `golden_accuracy` the test accuracies at the window's end.
    pub fn classify(&self, losses: &[f64], golden: &[f64], accuracy: f64, golden_accuracy: f64) -> Outcome {
        let within = (self.jump_within as usize).min(losses.len());
        let jump = losses[..within].iter().zip(golden).any(|(l, g)| *l > g * (1.0 + self.jump));
        let tail = |v: &[f64]| {
            let k = (self.recover_over as usize).clamp(1, v.len().max(1));
            v[v.len() - k..].iter().sum::<f64>() / k as f64
        };
        let recovered = tail(losses) <= tail(golden) * (1.0 + self.loss_tolerance);
        let accurate = golden_accuracy - accuracy <= self.accuracy_drop;
        match (jump, recovered, accurate) {
            (true, false, _) => Outcome::SharpDegrade,
            (true, true, false) => Outcome::SharpSlowDegrade,
            (false, false, _) => Outcome::SlowDegrade,
            (false, true, false) => Outcome::LowTestAccuracy,
            (_, true, true) => Outcome::Benign,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_is_the_position_in_all() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i, "{o}");
        }
    }

    #[test]
    fn classification_follows_the_definitions() {
        let t = Thresholds::default();
        let golden = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5];
        // Jump at the first follow-up step (2.5 > 2 x 1.0), never recovers.
        assert_eq!(t.classify(&[2.5, 2.4, 2.3, 2.2, 2.1, 2.0], &golden, 0.5, 0.9), Outcome::SharpDegrade);
        // Jump, loss back within 5%, accuracy down 10 points.
        let back = [2.5, 0.9, 0.8, 0.7, 0.6, 0.5];
        assert_eq!(t.classify(&back, &golden, 0.8, 0.9), Outcome::SharpSlowDegrade);
        assert_eq!(t.classify(&back, &golden, 0.89, 0.9), Outcome::Benign);
        // A jump after `jump_within` steps is not sharp.
        let long = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3];
        assert_eq!(t.classify(&[1.0, 0.9, 2.0, 0.7, 0.6, 0.5, 0.4, 0.3], &long, 0.9, 0.9), Outcome::Benign);
        // The same jump inside the window's last 5 steps: the loss has not recovered.
        assert_eq!(t.classify(&[1.0, 0.9, 0.8, 0.7, 2.0, 0.5, 0.4, 0.3], &long, 0.9, 0.9), Outcome::SlowDegrade);
        // No jump, loss 20% above golden at the end.
        assert_eq!(t.classify(&[1.1, 1.0, 1.0, 0.9, 0.8, 0.7], &golden, 0.9, 0.9), Outcome::SlowDegrade);
        // No jump, loss recovered, accuracy 5 points down.
        assert_eq!(t.classify(&golden, &golden, 0.85, 0.9), Outcome::LowTestAccuracy);
        assert_eq!(t.classify(&golden, &golden, 0.9, 0.9), Outcome::Benign);
    }

    #[test]
    fn thresholds_are_checked() {
        let t = Thresholds { recover_over: 0, ..Thresholds::default() };
        let e = t.validate(Path::new("c.ron")).unwrap_err().to_string();
        assert_eq!(e, "c.ron: field `thresholds.recover_over` = 0: at least 1 step (clipped to the follow-up window)");
        // Windows shorter than the defaults' 5 steps judge recovery over the whole window.
        let t = Thresholds::default();
        assert_eq!(t.classify(&[1.5, 1.5], &[1.0, 1.0], 0.9, 0.9), Outcome::SlowDegrade);
        assert_eq!(t.classify(&[1.0, 1.0], &[1.0, 1.0], 0.9, 0.9), Outcome::Benign);
    }
}
