//! Running a campaign: the golden run once (this file), then trials (`trial.rs`) in parallel, each restoring the golden
//! state before its injection step, running that step with the fault (hybrid: the faulted
//! instruction at register level, the rest functionally) and, unless the fault was masked,
//! the follow-up window functionally. Workers (`workers.rs`) take the next trial as they
//! finish one (no barrier: a long trial holds up no other thread); the records are appended in
//! trial order, one writer at a time, as they continue what was written (in batches, at least
//! every 0.1 s while trials end, and synced to disk every second), so the records do not depend
//! on the threads and a run killed at any moment resumes with nothing lost or repeated.
//! `run.rs` runs a campaign, a shard of it, or an adaptive campaign's rounds, which `rounds.rs`
//! plans.

use crate::error::{FaultError, Result};
use crate::model::Anchor;
use crate::protect::{self, ProtectionPlan, Rule};
use crate::record::{CampaignInfo, ClassInfo, Golden, CODE_VERSION, SCHEMA};
use crate::sample::Space;
use crate::spec::{CampaignSpec, Mode};
use faultline_graph::checks::{BF16_UNIT, FP32_UNIT};
use faultline_graph::ModelSpec;
use faultline_graph::StepSchedule;
use faultline_hw::budget::HostMemory;
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::{
    Executor, GoldenStep, InitWeights, ModelState, MxuFormat, StepFault, TrainOptions, TrainSetup, TrainState, Trainer,
};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod rounds;
mod run;
mod trial;
mod workers;

pub use rounds::{Finish, Next, Rounds};
pub use run::{Progress, RunOptions, Shard, TrialMode};

/// The golden run's states around each injection step.
#[derive(Debug, Clone)]
struct GoldenStates {
    /// State before each injection step.
    before: BTreeMap<u64, TrainState>,
    /// State after each injection step.
    after: BTreeMap<u64, TrainState>,
    /// State at the end of each injection step's follow-up window.
    window_end: BTreeMap<u64, TrainState>,
    /// Each injection step kept whole, for hybrid trials to start where their faults do (the
    /// first steps whose buffers fit [`GOLDEN_STEP_BYTES`]).
    steps: BTreeMap<u64, GoldenStep>,
}

/// Where a trial's time went, apart from its injection step (`timing.jsonl`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TrialTime {
    /// The follow-up window's training steps.
    pub follow: Duration,
    /// The test-set evaluation at the window's end.
    pub eval: Duration,
}

/// Host bytes a campaign may spend on keeping its injection steps whole ([`GoldenStep`]), at
/// most a quarter of the memory limit: trials at a step past it recompute the fault-free
/// instructions before their fault.
pub const GOLDEN_STEP_BYTES: u64 = 1 << 30;

/// What an inference campaign's trials run: the forward program, the trained model, and the
/// test batches faults strike with their fault-free outputs.
struct Inference {
    /// The inference executor, functional and cycle-level.
    exec: [Executor; 2],
    /// Its program's schedule.
    sched: StepSchedule,
    /// The model after the golden run.
    state: ModelState,
    /// Each injection batch: inputs, samples that count (the last batch is padded), golden
    /// outputs.
    batches: BTreeMap<u64, (Vec<f32>, usize, Vec<f32>)>,
    /// The forward pass of each injection batch kept whole (the first ones that fit
    /// [`GOLDEN_STEP_BYTES`]), for hybrid trials to start where their faults do.
    passes: BTreeMap<u64, GoldenStep>,
    /// Host bytes `passes` hold.
    pass_bytes: u64,
}

/// A prepared campaign: spec, machine, golden run and sampled space.
pub struct Campaign {
    /// What `campaign.json` holds.
    pub info: CampaignInfo,
    /// The space trials are drawn from.
    pub space: Space,
    /// A trainer at step 0 (functional), cloned per worker.
    trainer: Trainer,
    golden: GoldenStates,
    /// For an inference campaign: what its trials run.
    inference: Option<Inference>,
    /// Host bytes one worker's step needs ([`faultline_train::exec::host_bytes`]).
    step_bytes: Option<u64>,
    /// Host bytes of the injection steps kept whole (`golden.steps`).
    golden_step_bytes: u64,
    /// Faults trial `t` injects instead of a draw from `space` ([`Campaign::with_faults`]).
    faults: Option<Vec<(Anchor, Vec<StepFault>)>>,
    /// [`CampaignInfo::identity`] of `info`, which every record carries.
    id: String,
}

/// Whether two model states hold the same bits.
fn same_bits(a: &ModelState, b: &ModelState) -> bool {
    a.step == b.step
        && a.tensors.len() == b.tensors.len()
        && a.tensors.iter().zip(&b.tensors).all(|((na, ta), (nb, tb))| {
            na == nb && ta.shape == tb.shape && ta.data.iter().zip(&tb.data).all(|(x, y)| x.to_bits() == y.to_bits())
        })
}

/// Whether every value of a model state is finite.
fn finite(s: &ModelState) -> bool {
    s.tensors.values().all(|t| t.data.iter().all(|v| v.is_finite()))
}

impl Inference {
    /// Checks that test batches `batches` (1-based, of `trainer`'s batch size) are batches of
    /// its test split: before the golden run, so that a wrong step costs no training.
    fn check_batches(trainer: &Trainer, batches: &crate::spec::Steps, file: &Path) -> Result<()> {
        let (b, test) = (trainer.exec.batch(), &trainer.data.test);
        let count = test.len().div_ceil(b) as u64;
        match batches.span() {
            Some((_, last)) if last > count => Err(FaultError::Invalid {
                file: file.into(),
                field: "inject_steps".into(),
                value: last.to_string(),
                allowed: format!(
                    "test batches 1..={count} (an Inference campaign's steps are batches of {b} of the {} test samples)",
                    test.len()
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The inference trials of `trainer`'s model as the golden run left it: executor `exec`
    /// (schedule `sched`), and test batches `batches` (1-based) with their golden outputs.
    /// `batches` must be checked first ([`Inference::check_batches`]).
    fn new(
        exec: Executor,
        sched: StepSchedule,
        trainer: &Trainer,
        batches: &[u64],
        mem: &HostMemory,
    ) -> Result<Inference> {
        let (b, test) = (exec.batch(), &trainer.data.test);
        let state = trainer.state.clone();
        let per_pass = exec.golden_step_bytes().max(1);
        let whole = (GOLDEN_STEP_BYTES.min(mem.limit / 4) / per_pass) as usize;
        let (mut out, mut passes) = (BTreeMap::new(), BTreeMap::new());
        for &k in batches {
            let start = (k as usize - 1) * b;
            let real = (test.len() - start).min(b);
            // Padded as evaluation pads: with the first sample, not counted.
            let idx: Vec<usize> = (0..b).map(|i| if i < real { start + i } else { 0 }).collect();
            let (x, _) = test.gather(&idx);
            let golden = exec.infer_with_fault(&state, &x, None)?.output;
            if passes.len() < whole {
                passes.insert(k, exec.golden_step(&state, &x, None)?);
            }
            out.insert(k, (x, real, golden));
        }
        let mut cycle = exec.clone();
        cycle.mode = ExecMode::CycleLevel;
        let pass_bytes = passes.len() as u64 * per_pass;
        Ok(Inference { exec: [exec, cycle], sched, state, batches: out, passes, pass_bytes })
    }
}

/// A checksum of a training state's tensors.
fn state_checksum(s: &ModelState) -> u64 {
    s.tensors.values().fold(0u64, |h, t| h.rotate_left(5) ^ t.checksum())
}

/// Runs `steps` golden steps from the trainer's state with the plan's clamps wide open,
/// sets each clamp's bound from its node's largest `|x|` ([`protect::calibrate_clamps`]),
/// rebuilds the trainer's executor with them and restores its state; returns the pass's
/// losses and final state checksum (the golden run proper must reproduce both). `plan` names
/// the plan file in errors.
fn learn_clamp_bounds(
    trainer: &mut Trainer,
    applied: &mut protect::Applied,
    steps: u64,
    plan: &Path,
) -> Result<(Vec<f64>, u64)> {
    let start = trainer.snapshot();
    let mut maxes = vec![0f64; applied.clamps.len()];
    let mut losses = Vec::new();
    for _ in 0..steps {
        let (x, y) = trainer.data.train.gather(&trainer.batcher.clone().next_indices());
        let bufs = trainer.exec.step_buffers(&trainer.state, &x, &y)?;
        let step = protect::clamp_maxes(&trainer.exec.tg, trainer.exec.program(), &bufs);
        maxes.iter_mut().zip(step).for_each(|(m, v)| *m = m.max(v));
        losses.push(trainer.step()?.loss);
    }
    let checksum = state_checksum(&trainer.state);
    trainer.restore_snapshot(&start);
    let mut tg = trainer.exec.tg.clone();
    protect::calibrate_clamps(applied, &mut tg, &maxes, plan)?;
    let e = &trainer.exec;
    trainer.exec = Executor::new(tg, &e.hw, e.mode, e.format)?;
    Ok((losses, checksum))
}

/// What the golden run recorded.
struct GoldenRun {
    /// The states trials start from and are compared with.
    states: GoldenStates,
    /// Each step's loss.
    losses: Vec<f64>,
    /// Test accuracy at the end of each injection step's follow-up window.
    window_accuracy: Vec<(u64, f64)>,
    /// Each step's check residuals, and with an ABFT check each step's bounds: what a plan's
    /// checks are calibrated on.
    residuals: Vec<Vec<f32>>,
    bounds: Vec<Vec<Option<f64>>>,
}

/// Runs the golden run of `spec` on `trainer` from its state (`protection` calibrated on it
/// after), calling `golden_step` after each step; keeps the states around each injection
/// step. A run whose loss or state stops being finite is an error naming `file`.
/// Keeps the first `whole` injection steps whole ([`GoldenStep`]).
fn golden_run(
    trainer: &mut Trainer,
    spec: &CampaignSpec,
    file: &Path,
    protection: Option<&protect::Applied>,
    whole: usize,
    mut golden_step: impl FnMut(u64),
) -> Result<GoldenRun> {
    let steps = spec.inject_steps.steps();
    let training = spec.mode == Mode::Training;
    let (mut before, mut after, mut window_end) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let mut kept = BTreeMap::new();
    let (mut losses, mut window_accuracy) = (vec![], vec![]);
    // A plan's checks are calibrated on the golden run: residuals, and ABFT's bound.
    let (mut residuals, mut bounds) = (vec![], vec![]);
    let abft = protection.is_some_and(|p| p.checks.iter().any(|c| c.rule == Rule::AbftBound));
    let input_unit = if trainer.exec.format == MxuFormat::Fp32 { FP32_UNIT } else { BF16_UNIT };
    for step in 1..=spec.golden_steps {
        let inject = training && steps.binary_search(&step).is_ok();
        if inject {
            before.insert(step, trainer.snapshot());
            if kept.len() < whole {
                kept.insert(step, trainer.golden_step()?);
            }
        }
        if abft {
            // A step kept whole already holds every buffer the bounds read.
            let bufs = match kept.get(&step) {
                Some(g) => std::borrow::Cow::Borrowed(g.buffers()),
                None => {
                    let (x, y) = trainer.data.train.gather(&trainer.batcher.clone().next_indices());
                    std::borrow::Cow::Owned(trainer.exec.step_buffers(&trainer.state, &x, &y)?)
                }
            };
            bounds.push(protect::step_bounds(&trainer.exec.tg, trainer.exec.program(), &bufs, input_unit));
        }
        let r = trainer.step()?;
        residuals.push(r.checks.clone());
        if !r.loss.is_finite() || !finite(&trainer.state) {
            return Err(FaultError::Invalid {
                file: file.into(),
                field: "train".into(),
                value: format!("{:?}", spec.train),
                allowed: format!("a run that trains: the golden run's loss or state is not finite at step {step}"),
            });
        }
        losses.push(r.loss);
        golden_step(step);
        if inject {
            after.insert(step, trainer.snapshot());
        }
        if training && step > spec.follow_up && steps.binary_search(&(step - spec.follow_up)).is_ok() {
            window_accuracy.push((step - spec.follow_up, trainer.evaluate(&trainer.data.test)?));
            window_end.insert(step - spec.follow_up, trainer.snapshot());
        }
    }
    let states = GoldenStates { before, after, window_end, steps: kept };
    Ok(GoldenRun { states, losses, window_accuracy, residuals, bounds })
}

/// What `campaign.json` says of each of `space`'s classes on machine `hw`.
fn class_info(space: &Space, hw: &HwConfig) -> Vec<ClassInfo> {
    space
        .classes
        .iter()
        .enumerate()
        .map(|(i, c)| ClassInfo {
            class: c.pattern(),
            bits: c.bits,
            width: c.width(hw),
            unit: c.class.unit.name().to_string(),
            register: c.class.register_name().to_string(),
            kind: c.class.kind(),
            dims: c.class.dims(hw),
            // Check bits hold no number.
            format: c.class.format(hw).filter(|_| c.check_bits == 0).map(|f| f.name().to_string()),
            weight: space.weight(i),
            live_bit_cycles: c.live.iter().map(|w| w.bit_cycles(hw)).sum::<u128>() * c.width(hw) as u128
                / c.class.width(hw) as u128,
            sampled_share: space.reach_share(hw, i),
        })
        .collect()
}

impl Campaign {
    /// Loads the spec's model, machine and data, checks the spec against them, runs the golden
    /// run and lays out the sampled space.
    pub fn prepare(spec: CampaignSpec, file: &Path, mem: &HostMemory) -> Result<Campaign> {
        Self::prepare_with(spec, file, mem, |_| {})
    }

    /// [`Campaign::prepare`], calling `golden_step` after each step of the golden run.
    pub fn prepare_with(
        spec: CampaignSpec,
        file: &Path,
        mem: &HostMemory,
        golden_step: impl FnMut(u64),
    ) -> Result<Campaign> {
        let setup = Self::setup(&spec, file)?;
        let (mut trainer, mut protection, step_bytes) = Self::golden_trainer(&setup, &spec, file, mem)?;
        if spec.mode == Mode::Inference {
            Inference::check_batches(&trainer, &spec.inject_steps, file)?;
        }
        // A plan's clamps learn their bounds on a first pass of the golden run.
        let profile = match &mut protection {
            Some((p, f)) if !p.clamps.is_empty() => Some(learn_clamp_bounds(&mut trainer, p, spec.golden_steps, f)?),
            _ => None,
        };
        let steps = spec.inject_steps.steps();
        // Inference faults strike the forward program, training faults the step program.
        let inference_exec = (spec.mode == Mode::Inference).then(|| trainer.exec.inference());
        let (exec, sched) = match &inference_exec {
            Some(e) => (e, e.schedule()),
            None => (&trainer.exec, trainer.schedule.clone()),
        };
        let ecc = protection.as_ref().map_or(&[][..], |(p, _)| &p.ecc[..]);
        let space = Space::new(exec, &sched, &spec, file, ecc)?;
        let classes: Vec<_> = space.classes.iter().map(|c| c.class).collect();
        spec.fault.check(&exec.hw, &classes, sched.total_cycles, file)?;
        let (cycles_per_step, instructions_per_step) = (sched.total_cycles, exec.program().instrs.len());

        let start = trainer.snapshot();
        // Hybrid trials start from their injection step kept whole, as many as fit.
        let per_step = trainer.exec.golden_step_bytes().max(1);
        let whole = match spec.mode {
            Mode::Training => (GOLDEN_STEP_BYTES.min(mem.limit / 4) / per_step).min(steps.len() as u64) as usize,
            Mode::Inference => 0,
        };
        let plan = protection.as_ref().map(|(p, _)| p);
        let golden = golden_run(&mut trainer, &spec, file, plan, whole, golden_step)?;
        if let Some((p, f)) = &mut protection {
            protect::calibrate(p, &golden.residuals, &golden.bounds, f)?;
        }
        let checksum = state_checksum(&trainer.state);
        if let Some((l, c)) = profile {
            // Every golden value is within its clamp's bound: the clamps changed nothing.
            let bits = |l: &[f64]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            if bits(&l) != bits(&golden.losses) || c != checksum {
                return Err(FaultError::Output {
                    path: file.into(),
                    why: "the golden run with learned clamp bounds differs from the run that learned them".into(),
                });
            }
        }
        let test_accuracy = trainer.evaluate(&trainer.data.test)?;
        let inference = match inference_exec {
            Some(e) => Some(Inference::new(e, sched, &trainer, &steps, mem)?),
            None => None,
        };
        trainer.restore_snapshot(&start);
        let info = CampaignInfo {
            schema: SCHEMA,
            spec_file: fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf()).display().to_string(),
            code: CODE_VERSION.to_string(),
            hw: setup.hw.name.clone(),
            cycles_per_step,
            instructions_per_step,
            trials: space.trials(),
            classes: class_info(&space, &trainer.exec.hw),
            golden: Golden {
                test_accuracy,
                losses: golden.losses,
                window_accuracy: golden.window_accuracy,
                final_checksum: format!("{checksum:016x}"),
            },
            spec,
            protection: protection.map(|(p, _)| p),
            faults_from: None,
        };
        Ok(Campaign {
            id: info.identity(),
            info,
            space,
            trainer,
            golden: golden.states,
            inference,
            step_bytes,
            golden_step_bytes: whole as u64 * per_step,
            faults: None,
        })
    }

    /// The model, machine and training options of `spec` (read from `file`).
    fn setup(spec: &CampaignSpec, file: &Path) -> Result<TrainSetup> {
        let model = ModelSpec::load(spec.resolve(file, &spec.model))?;
        let hw = HwConfig::load(spec.resolve(file, &spec.hw))?;
        let s = &spec.train;
        let options = TrainOptions {
            batch: s.batch,
            optimizer: s.optimizer,
            lr: s.lr,
            precision: s.precision.unwrap_or(MxuFormat::default_for(&hw)),
            mode: ExecMode::Functional,
            seed: s.seed,
            // Trials evaluate once, at the window's end.
            eval_every: 0,
            init: InitWeights::Seed,
            allow_nonfinite: false,
            data_dir: s.data.as_ref().map(|d| spec.resolve(file, d)),
        };
        Ok(TrainSetup { model, hw, options })
    }

    /// The golden run's trainer: the step graph with the protection plan applied (the plan and
    /// its file returned with it), checked against the host-memory budget (the step's bytes
    /// returned), then the data.
    #[allow(clippy::type_complexity)]
    fn golden_trainer(
        setup: &TrainSetup,
        spec: &CampaignSpec,
        file: &Path,
        mem: &HostMemory,
    ) -> Result<(Trainer, Option<(protect::Applied, PathBuf)>, Option<u64>)> {
        let mut tg = setup.graph()?;
        let protection = match spec.protection.as_ref().map(|p| spec.resolve(file, p)) {
            Some(p) => {
                let machine = Executor::machine(&setup.hw, setup.options.precision);
                Some((ProtectionPlan::load(&p)?.apply(&mut tg, &machine, &p)?, p))
            }
            None => None,
        };
        // Checked before anything large is made: the golden run's step, and its snapshots
        // (two states per injection step: parameters and optimizer state; the batch order
        // they also hold is a few bytes per training sample), or an inference campaign's test
        // batches with their golden outputs.
        let what = format!(
            "the golden run of campaign `{}` ({} steps of `{}`)",
            spec.name, spec.golden_steps, setup.model.name
        );
        let per_step = match spec.mode {
            Mode::Training => faultline_train::exec::state_bytes(&tg).and_then(|b| b.checked_mul(2)),
            Mode::Inference => {
                let size = |n| faultline_hw::budget::product(&tg.graph.node(n).shape);
                size(tg.input).zip(size(tg.output)).and_then(|(i, o)| i.checked_add(o)?.checked_mul(4))
            }
        };
        let step_bytes =
            setup.check_memory(&tg, mem, &what, |_| per_step.and_then(|b| b.checked_mul(spec.inject_steps.count())))?;
        let data = setup.data(mem)?;
        Ok((setup.trainer(tg, data)?, protection, step_bytes))
    }

    /// Host bytes `threads` workers need (`None` past 2^64), the injection steps it keeps whole
    /// included ([`Campaign::kept_bytes`]): check it before [`Campaign::run`].
    pub fn host_bytes(&self, threads: usize) -> Option<u64> {
        self.step_bytes?.checked_mul(threads as u64)?.checked_add(self.kept_bytes())
    }

    /// Host bytes of the injection steps (an inference campaign's forward passes) this campaign
    /// keeps whole for its hybrid trials to start from: held as long as it is.
    pub fn kept_bytes(&self) -> u64 {
        self.golden_step_bytes + self.inference.as_ref().map_or(0, |i| i.pass_bytes)
    }

    /// The model's name.
    pub fn model(&self) -> &str {
        &self.trainer.exec.tg.model
    }

    /// The spec.
    pub fn spec(&self) -> &CampaignSpec {
        &self.info.spec
    }

    /// A trainer to run trials on (each worker owns one).
    pub fn trainer(&self) -> Trainer {
        self.trainer.clone()
    }

    /// Injection step `s` kept whole, for a hybrid trial on `tr` to start from (`None` if it was
    /// not kept, or `tr` runs everything at cycle level).
    fn golden_step(&self, tr: &Trainer, s: u64) -> Option<&GoldenStep> {
        self.golden.steps.get(&s).filter(|_| tr.exec.mode == ExecMode::Functional)
    }

    /// The golden run's state before injection step `step` (`None` for a step faults do not
    /// strike, and in an inference campaign): what a trial restores, and what a replay of one
    /// trial's faulted instruction (`faultline vcd`) starts from.
    pub fn golden_before(&self, step: u64) -> Option<&TrainState> {
        self.golden.before.get(&step)
    }

    /// For an inference campaign: the executor of its forward program, that program's
    /// schedule, the trained model and the inputs of test batch `batch` (1-based; `None` for a
    /// batch faults do not strike, and in a training campaign). What a replay of one trial
    /// starts from.
    pub fn inference_batch(&self, batch: u64) -> Option<(&Executor, &StepSchedule, &ModelState, &[f32])> {
        let inf = self.inference.as_ref()?;
        let (x, _, _) = inf.batches.get(&batch)?;
        Some((&inf.exec[0], &inf.sched, &inf.state, x))
    }

    /// This campaign with trial `t` injecting `faults[t]` instead of a draw from its space
    /// (the same faults another campaign ran, translated onto this one's step), `from` saying
    /// where they come from (recorded in `campaign.json`, so a resume cannot mix the two).
    pub fn with_faults(mut self, faults: Vec<(Anchor, Vec<StepFault>)>, from: String) -> Campaign {
        self.info.trials = faults.len() as u64;
        self.info.faults_from = Some(from);
        self.faults = Some(faults);
        self.id = self.info.identity();
        self
    }

    /// With a protection plan: the fault-free steps, of a run like the golden one but
    /// initialised and batched from training seed `seed` (data held out from calibration),
    /// in which a calibrated check fires: false positives, of `golden_steps` steps. A run
    /// that stops training (non-finite loss or state) ends there. `None` without a plan.
    pub fn held_out_false_positives(&self, seed: u64) -> Result<Option<crate::stats::Estimate>> {
        let Some(p) = &self.info.protection else { return Ok(None) };
        let mut t = self.trainer();
        t.state = ModelState::from_seed(&t.exec.tg, seed);
        t.batcher = faultline_train::Batcher::new(t.data.train.len(), self.spec().train.batch, seed)?;
        let (mut fired, mut steps, mut history) = (0, 0, Vec::new());
        for _ in 0..self.spec().golden_steps {
            let r = t.step()?;
            steps += 1;
            let seen: Vec<&[f32]> = history.iter().map(Vec::as_slice).collect();
            fired += p.detect(r.loss, &r.checks, &seen).is_some() as u64;
            history.push(r.checks);
            if !r.loss.is_finite() || !finite(&t.state) {
                break;
            }
        }
        Ok(Some(crate::stats::Estimate::of(fired, steps)))
    }
}
