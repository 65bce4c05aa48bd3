//! One trial: its fault, the injection step, the follow-up window and the verdict.

use super::{finite, same_bits, Campaign, Inference, TrialTime};
use crate::error::{FaultError, Result};
use crate::model::Anchor;
use crate::outcome::Outcome;
use crate::protect;
use crate::record::{TrialRecord, SCHEMA};
use crate::spec::{FaultModel, Lasts};
use faultline_graph::StepSchedule;
use faultline_hw::isa::ExecUnit;
use faultline_hw::protect::ecc::Decoded;
use faultline_hw::{ExecMode, FaultSite};
use faultline_num::BitFault;
use faultline_train::{inject, InjectionReport, StepFault, Trainer};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

impl Campaign {
    /// The fault trial `t` injects.
    pub fn upset(&self, t: u64) -> (Anchor, Vec<StepFault>) {
        if let Some(f) = self.faults.as_ref().and_then(|f| f.get(t as usize)) {
            return f.clone();
        }
        let hw = &self.trainer.exec.hw;
        let a = self.space.anchor(hw, t);
        (a, self.spec().fault.upset(hw, &a, self.info.cycles_per_step))
    }

    /// Runs trial `t` on `tr` (any state: it is restored first). A provably dead trial is
    /// recorded `HwMasked` without running, unless it is one checked (every
    /// `verify_dead_every`-th) or `tr` runs at cycle level ([`super::TrialMode::CycleLevel`] runs
    /// everything, to check and to time hybrid trials against).
    pub fn trial(&self, tr: &mut Trainer, t: u64) -> Result<TrialRecord> {
        Ok(self.trial_timed(tr, t)?.0)
    }

    /// [`Campaign::trial`], with the time its follow-up window took apart
    /// (`timing.jsonl`'s `follow_us` and `eval_us`).
    pub fn trial_timed(&self, tr: &mut Trainer, t: u64) -> Result<(TrialRecord, TrialTime)> {
        let spec = self.spec();
        let mut time = TrialTime::default();
        let (a, upset) = self.upset(t);
        let dead = spec.skip_dead && self.space.dead(&tr.exec.hw, &upset);
        let verify = dead && spec.verify_dead_every > 0 && t.is_multiple_of(spec.verify_dead_every);
        let skip = dead && !verify;
        if skip && tr.exec.mode == ExecMode::CycleLevel {
            // The reference runs it too (and checks it is masked), but records what hybrid does.
            self.judge_timed(tr, t, &a, &upset, true, &mut time)?;
        }
        let mut rec = self.judge_timed(tr, t, &a, &upset, !skip, &mut time)?;
        rec.verified_dead = verify;
        Ok((rec, time))
    }

    /// Injects `upset` (anchored at `a`) on `tr` from the golden state before its step and
    /// judges what it did; with `run` false, records it skipped and `HwMasked` (for a provably
    /// dead upset). A dead upset that runs must come out `HwMasked`, else the liveness analysis
    /// is wrong: an error.
    pub fn judge(&self, tr: &mut Trainer, t: u64, a: &Anchor, upset: &[StepFault], run: bool) -> Result<TrialRecord> {
        self.judge_timed(tr, t, a, upset, run, &mut TrialTime::default())
    }

    /// [`Campaign::judge`], adding what its follow-up window took to `time`.
    fn judge_timed(
        &self,
        tr: &mut Trainer,
        t: u64,
        a: &Anchor,
        upset: &[StepFault],
        run: bool,
        time: &mut TrialTime,
    ) -> Result<TrialRecord> {
        let spec = self.spec();
        let mut rec = TrialRecord {
            schema: SCHEMA,
            campaign: self.id.clone(),
            trial: t,
            fault: upset.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(" + "),
            class: a.pattern(),
            model: model_name(spec.fault),
            bit: a.bit,
            element: a.elem,
            step: a.step,
            cycle: a.cycle,
            skipped: !run,
            verified_dead: false,
            outcome: Outcome::HwMasked,
            injection: None,
            loss_delta: Vec::new(),
            test_accuracy_delta: None,
            register_level_cycles: 0,
            changed_predictions: None,
            detected_by: None,
        };
        if rec.skipped {
            return Ok(rec);
        }
        let dead = spec.skip_dead && self.space.dead(&tr.exec.hw, upset);
        if let Some(inf) = &self.inference {
            self.infer(inf, tr.exec.mode, &mut rec, a, upset)?;
        } else {
            self.train(tr, &mut rec, a, upset, time)?;
        }
        if dead && rec.outcome != Outcome::HwMasked {
            return Err(FaultError::Inconsistent(format!(
                "trial {t}: `{}` lies outside every live window, yet its outcome is {}",
                rec.fault, rec.outcome
            )));
        }
        Ok(rec)
    }

    /// Runs an inference trial's forward pass with `upset` (in `mode`) and judges it.
    fn infer(
        &self,
        inf: &Inference,
        mode: ExecMode,
        rec: &mut TrialRecord,
        a: &Anchor,
        upset: &[StepFault],
    ) -> Result<()> {
        let exec = &inf.exec[(mode == ExecMode::CycleLevel) as usize];
        let (x, real, golden) = &inf.batches[&a.step];
        let pass = inf.passes.get(&a.step).filter(|_| mode == ExecMode::Functional);
        let (out, report) =
            inject::run_upset(exec, &inf.sched, upset, |inj| exec.infer_with_fault_from(&inf.state, x, inj, pass))?;
        let report =
            report.ok_or_else(|| FaultError::Inconsistent(format!("trial {}: no injection report", rec.trial)))?;
        rec.register_level_cycles = register_cycles(&inf.sched, a, upset, &report);
        let c = exec.outputs();
        let (got, want) = (&out.output[..real * c], &golden[..real * c]);
        let same = got.iter().zip(want).all(|(g, w)| g.to_bits() == w.to_bits());
        let masked = report.masked();
        rec.injection = Some(report.into());
        rec.outcome = if masked && same {
            Outcome::HwMasked
        } else if masked {
            return Err(FaultError::Inconsistent(format!(
                "trial {}: `{}` left the faulted instruction's outputs bit-identical, yet the model's output changed",
                rec.trial, rec.fault
            )));
        } else if same {
            Outcome::Masked
        } else if got.iter().any(|v| !v.is_finite()) {
            Outcome::Due
        } else {
            let rows = |v: &[f32]| v.chunks(c).map(faultline_train::exec::argmax).collect::<Vec<_>>();
            let changed = rows(got).iter().zip(rows(want)).filter(|(g, w)| **g != *w).count() as u64;
            rec.changed_predictions = Some(changed);
            if changed == 0 {
                Outcome::SdcBenign
            } else {
                Outcome::SdcCritical
            }
        };
        Ok(())
    }

    /// Runs a training trial: the injection step with `upset` from the golden state before it,
    /// then whatever judging it needs ([`Campaign::follow`]).
    ///
    /// The machine takes the upset's data bits. Bits past the class's width are a code's check
    /// bits, which hold no value: a trial struck only there runs a probe instead (the same
    /// words' top data bit, at the same time) to learn whether a word is read while wrong, and
    /// the code then judges the actual error pattern. A permanent fault in check bits is
    /// judged by the injection step's reads.
    fn train(
        &self,
        tr: &mut Trainer,
        rec: &mut TrialRecord,
        a: &Anchor,
        upset: &[StepFault],
        time: &mut TrialTime,
    ) -> Result<()> {
        let t = rec.trial;
        let s = a.step;
        let golden = &self.info.golden;
        let width = a.class.width(&tr.exec.hw);
        let mut data = data_bits(upset, width);
        let probe = data.is_empty();
        let run: Vec<StepFault> = if probe {
            upset.iter().map(|f| StepFault { site: FaultSite { bit: width - 1, ..f.site }, ..*f }).collect()
        } else {
            data.clone()
        };
        tr.restore_snapshot(&self.golden.before[&s]);
        let mut r = tr.step_with_upset_from(&run, self.golden_step(tr, s))?;
        let report =
            r.injection.clone().ok_or_else(|| FaultError::Inconsistent(format!("trial {t}: no injection report")))?;
        rec.register_level_cycles = register_cycles(&tr.schedule, a, upset, &report);
        let mut same = same_bits(&tr.state, &self.golden.after[&s].model);
        let mut corrupted = !report.masked();
        rec.injection = Some(report.into());
        let unchanged = same && r.loss.to_bits() == golden.losses[s as usize - 1].to_bits();
        if !corrupted && !unchanged {
            return Err(FaultError::Inconsistent(format!(
                "trial {t}: `{}` left the faulted instruction's outputs bit-identical, yet the step's loss or state changed",
                rec.fault
            )));
        }
        let Some(p) = &self.info.protection else {
            rec.outcome = self.follow(tr, rec, upset, (r.loss, same, &mut corrupted, &r.checks), time)?;
            return Ok(());
        };
        let code = p.code_of(&a.class.pattern());
        if probe && !corrupted {
            // No word was read while its check bits were wrong.
            rec.outcome = Outcome::HwMasked;
            return Ok(());
        }
        // A code on the struck class acts on the reads that saw the changed bits.
        if let Some(e) = code.filter(|_| corrupted) {
            let by = format!("ecc:{}", e.class);
            match decode_upset(e, upset) {
                EccVerdict::Corrected => {
                    rec.detected_by = Some(by);
                    rec.outcome = Outcome::Corrected;
                    return Ok(());
                }
                EccVerdict::Detected => {
                    rec.detected_by = Some(by);
                    rec.outcome = self.recover(tr, rec, upset, &data, p, code)?;
                    return Ok(());
                }
                EccVerdict::Residual(rest) => {
                    let rest = data_bits(&rest, width);
                    if rest != run {
                        // Miscorrected or partly corrected: the data error the decoder passes on.
                        tr.restore_snapshot(&self.golden.before[&s]);
                        r = tr.step_with_upset_from(&rest, self.golden_step(tr, s))?;
                        corrupted = r.injection.as_ref().is_some_and(|i| !i.masked());
                        same = same_bits(&tr.state, &self.golden.after[&s].model);
                        data = rest;
                    }
                }
            }
        }
        if let Some(by) = p.detect(r.loss, &r.checks, &p.golden_history(s)) {
            rec.detected_by = Some(by);
            rec.outcome = self.recover(tr, rec, upset, &data, p, None)?;
            return Ok(());
        }
        rec.outcome = self.follow(tr, rec, &data, (r.loss, same, &mut corrupted, &r.checks), time)?;
        Ok(())
    }

    /// The outcome of a trial whose injection step a check caught: re-executed from the state
    /// before it, as the plan's recovery allows, until a run passes every check (the golden
    /// step, bit for bit, for a transient fault: else an inconsistency), or `Detected`. A
    /// permanent fault (`upset`, whose data bits are `data`) strikes every re-execution; if
    /// `code` caught it, it catches it in every re-execution.
    fn recover(
        &self,
        tr: &mut Trainer,
        rec: &TrialRecord,
        upset: &[StepFault],
        data: &[StepFault],
        p: &protect::Applied,
        code: Option<&protect::EccInfo>,
    ) -> Result<Outcome> {
        let (s, permanent) = (rec.step, self.spec().fault.permanent());
        if permanent && code.is_some_and(|e| !matches!(decode_upset(e, upset), EccVerdict::Residual(_))) {
            return Ok(Outcome::Detected);
        }
        for _ in 0..p.plan.recovery.attempts() {
            tr.restore_snapshot(&self.golden.before[&s]);
            let r = if permanent { tr.step_with_upset_from(data, self.golden_step(tr, s))? } else { tr.step()? };
            if p.detect(r.loss, &r.checks, &p.golden_history(s)).is_some() {
                continue;
            }
            if !same_bits(&tr.state, &self.golden.after[&s].model) {
                if permanent {
                    // The permanent fault got past the checks this time: not recovered.
                    return Ok(Outcome::Detected);
                }
                return Err(FaultError::Inconsistent(format!(
                    "trial {}: re-executing step {s} after `{}` was detected did not restore the golden state",
                    rec.trial, rec.fault
                )));
            }
            return Ok(Outcome::DetectedRecovered);
        }
        Ok(Outcome::Detected)
    }

    /// The outcome of a trial whose injection step (loss, state the same as golden's or not,
    /// the faulted instructions' outputs corrupted or not: `injection`) has run on `tr`: judged
    /// there, or after the follow-up window, which a permanent fault strikes in every step.
    /// Adds the window's steps and its evaluation to `time`.
    fn follow(
        &self,
        tr: &mut Trainer,
        rec: &mut TrialRecord,
        upset: &[StepFault],
        injection: (f64, bool, &mut bool, &[f32]),
        time: &mut TrialTime,
    ) -> Result<Outcome> {
        let (clock, eval) = (Instant::now(), time.eval);
        let outcome = self.window(tr, rec, upset, injection, &mut time.eval);
        time.follow += clock.elapsed().saturating_sub(time.eval - eval);
        outcome
    }

    /// [`Campaign::follow`], adding the test-set evaluation's time to `eval`.
    fn window(
        &self,
        tr: &mut Trainer,
        rec: &mut TrialRecord,
        upset: &[StepFault],
        (loss, same, corrupted, checks): (f64, bool, &mut bool, &[f32]),
        eval: &mut Duration,
    ) -> Result<Outcome> {
        let (spec, golden, s) = (self.spec(), &self.info.golden, rec.step);
        let permanent = spec.fault.permanent();
        if !loss.is_finite() || !finite(&tr.state) {
            rec.loss_delta.push(loss - golden.losses[s as usize - 1]);
            return Ok(Outcome::ImmediateInfNan);
        }
        if !permanent && !*corrupted {
            return Ok(Outcome::HwMasked);
        }
        if !permanent && same {
            return Ok(Outcome::Masked);
        }
        rec.loss_delta.push(loss - golden.losses[s as usize - 1]);
        let window = &golden.losses[s as usize..(s + spec.follow_up) as usize];
        let mut losses = Vec::with_capacity(window.len());
        // A running statistic's history: the golden steps before the fault, then the trial's.
        let mut own = vec![checks.to_vec()];
        for (k, g) in window.iter().enumerate() {
            let l = if permanent {
                // The same bits, stuck for the whole of each later step.
                let step = s + 1 + k as u64;
                let again: Vec<StepFault> = upset.iter().map(|f| StepFault { step, cycle: 0, ..*f }).collect();
                let r = tr.step_with_upset(&again)?;
                *corrupted |= r.injection.is_some_and(|i| !i.masked());
                let caught = self.info.protection.as_ref().and_then(|p| {
                    let mut history = p.golden_history(s);
                    history.extend(own.iter().map(Vec::as_slice));
                    p.detect(r.loss, &r.checks, &history)
                });
                own.push(r.checks.clone());
                if let Some(by) = caught {
                    // Caught in a later step; re-executing cannot shed a hard fault.
                    rec.detected_by = Some(by);
                    return Ok(Outcome::Detected);
                }
                r.loss
            } else {
                tr.step()?.loss
            };
            rec.loss_delta.push(l - g);
            losses.push(l);
            if !l.is_finite() {
                return Ok(Outcome::ShortTermInfNan);
            }
        }
        if !finite(&tr.state) {
            return Ok(Outcome::ShortTermInfNan);
        }
        if permanent && same_bits(&tr.state, &self.golden.window_end[&s].model) {
            // Struck every step, yet training is where golden's is.
            rec.loss_delta.clear();
            return Ok(if *corrupted { Outcome::Masked } else { Outcome::HwMasked });
        }
        if !*corrupted {
            return Err(FaultError::Inconsistent(format!(
                "trial {}: `{}` never corrupted an instruction's outputs, yet training diverged",
                rec.trial, rec.fault
            )));
        }
        let clock = Instant::now();
        let acc = tr.evaluate(&tr.data.test)?;
        *eval += clock.elapsed();
        let g_acc = golden.window_accuracy.iter().find(|(st, _)| *st == s).map(|x| x.1).expect("golden window");
        rec.test_accuracy_delta = Some(acc - g_acc);
        Ok(spec.thresholds.classify(&losses, window, acc, g_acc))
    }
}

/// What a check code does with an upset, over every word or register it changes.
#[derive(Debug, Clone, PartialEq)]
enum EccVerdict {
    /// Every changed word's error was corrected.
    Corrected,
    /// Some word's error was detected and not corrected.
    Detected,
    /// The data errors the decoder passes on: the upset's bits in words it missed, and in a
    /// miscorrected word the error with the decoder's wrong flip added.
    Residual(Vec<StepFault>),
}

/// Runs `e`'s decoder on each word or register `upset` changes (its bits as one error
/// pattern per word; a stuck-at counts as changing its bit, as it does whenever it matters).
fn decode_upset(e: &protect::EccInfo, upset: &[StepFault]) -> EccVerdict {
    // One error pattern per word or register: the site with its bit cleared.
    let mut words: BTreeMap<FaultSite, Vec<StepFault>> = BTreeMap::new();
    for f in upset {
        words.entry(FaultSite { bit: 0, ..f.site }).or_default().push(*f);
    }
    let mut rest = Vec::new();
    let mut all_corrected = true;
    for faults in words.values() {
        let mask = faults.iter().fold(0u128, |m, f| m | 1u128 << f.site.bit);
        match e.code.decode_error(e.width, 0, mask) {
            Decoded::Detected => return EccVerdict::Detected,
            Decoded::Corrected { bit, .. } if mask == 1u128 << bit => {}
            Decoded::Corrected { bit, .. } => {
                all_corrected = false;
                let mut out: Vec<StepFault> = faults.clone();
                if bit < e.width {
                    let f0 = faults[0];
                    out.push(StepFault { kind: BitFault::Flip, site: FaultSite { bit, ..f0.site }, duration: 1, ..f0 });
                }
                rest.extend(out);
            }
            Decoded::Clean => {
                all_corrected = false;
                rest.extend(faults.iter().copied());
            }
        }
    }
    if all_corrected {
        EccVerdict::Corrected
    } else {
        EccVerdict::Residual(rest)
    }
}

/// The faults of `upset` in data bits (below `width`): what the machine can take.
fn data_bits(upset: &[StepFault], width: u32) -> Vec<StepFault> {
    upset.iter().filter(|f| f.site.bit < width).copied().collect()
}

/// Cycles run at register level: every instruction of the site's unit the fault's cycles
/// overlap (none for memory and sequencer sites, or a unit idle throughout).
fn register_cycles(sched: &StepSchedule, a: &Anchor, upset: &[StepFault], report: &InjectionReport) -> u64 {
    let Some(unit) = ExecUnit::of(a.class.unit).filter(|_| report.unit_busy) else { return 0 };
    let (from, to) = (a.cycle, a.cycle + upset[0].duration);
    (sched.instrs.iter())
        .filter(|c| c.unit == unit && c.start < to && from < c.start + c.cycles)
        .map(|c| c.cycles)
        .sum()
}

/// The fault model's name in records.
fn model_name(m: FaultModel) -> String {
    match m {
        FaultModel::Flip => "flip".into(),
        FaultModel::MultiBit { bits, along } => format!("multibit{bits}-{along:?}").to_lowercase(),
        FaultModel::StuckAt { value, lasts: Lasts::Cycles(n) } => format!("stuck{value}-{n}cycles"),
        FaultModel::StuckAt { value, lasts: Lasts::Step } => format!("stuck{value}-step"),
        FaultModel::StuckAt { value, lasts: Lasts::Permanent } => format!("stuck{value}-permanent"),
    }
}
