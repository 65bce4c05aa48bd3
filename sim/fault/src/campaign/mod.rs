//! Running a campaign: the golden run once, then trials in parallel, each restoring the golden
//! state before its injection step, running that step with the fault (hybrid: the faulted
//! instruction at register level, the rest functionally) and, unless the fault was masked,
//! the follow-up window functionally. Workers (`workers.rs`) take the next trial as they
//! finish one (no barrier: a long trial holds up no other thread); the records are appended in
//! trial order, one writer at a time, as they continue what was written (in batches, at least
//! every 0.1 s while trials end, and synced to disk every second), so the records do not depend
//! on the threads and a run killed at any moment resumes with nothing lost or repeated.

use crate::error::{FaultError, Result};
use crate::model::Anchor;
use crate::outcome::Outcome;
use crate::protect::{self, ProtectionPlan, Rule};
use crate::record::{CampaignInfo, ClassInfo, Golden, Summary, TrialRecord, CODE_VERSION, SCHEMA};
use crate::sample::Space;
use crate::spec::{CampaignSpec, FaultModel, Lasts, Mode, Sampling, Target};
use crate::stats::design::{next_round, Stratum};
use crate::stats::Estimate;
use crate::store;
use faultline_graph::checks::{BF16_UNIT, FP32_UNIT};
use faultline_graph::ModelSpec;
use faultline_graph::StepSchedule;
use faultline_hw::budget::HostMemory;
use faultline_hw::isa::ExecUnit;
use faultline_hw::protect::ecc::Decoded;
use faultline_hw::{ExecMode, FaultSite, HwConfig};
use faultline_num::BitFault;
use faultline_train::{
    inject, Executor, GoldenStep, InitWeights, InjectionReport, ModelState, MxuFormat, StepFault, TrainOptions,
    TrainSetup, TrainState, Trainer,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use workers::{run_ordered, Writer, WINDOW_PER_THREAD};

mod workers;

/// A deterministic slice of a campaign: trials `t` with `t % count == index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This slice, `0..count`.
    pub index: u64,
    /// Slices in all.
    pub count: u64,
}

impl Shard {
    /// The whole campaign.
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// Parses `I/N` (0-based `I < N`).
    pub fn parse(s: &str) -> std::result::Result<Shard, String> {
        let bad = || format!("`{s}` is not a shard: expected I/N with 0 <= I < N, e.g. 0/4");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// This shard's trials of `trials`, in order.
    pub fn trials(self, trials: u64) -> impl Iterator<Item = u64> {
        (self.index..trials).step_by(self.count as usize)
    }
}

/// What [`Campaign::run`] reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// Before the first trial: this shard's trials, of which `recorded` are in the output
    /// already (a resumed run).
    Start {
        /// Trials recorded before this run.
        recorded: u64,
        /// This shard's trials.
        trials: u64,
    },
    /// A trial ended.
    Trial(&'a TrialRecord),
}

/// How a campaign runs (none of it changes a record).
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Worker threads.
    pub threads: usize,
    /// The slice to run.
    pub shard: Shard,
    /// Continue the records already in the output directory.
    pub resume: bool,
    /// How the injection step runs.
    pub mode: TrialMode,
}

/// How a trial's steps run: never changes a record (the twins are bit-exact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrialMode {
    /// The faulted instruction at register level, everything else functionally; provably dead
    /// faults are not run.
    #[default]
    Hybrid,
    /// Every instruction of every step at register level, dead faults included: the reference
    /// hybrid trials are checked and timed against.
    CycleLevel,
}

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
    /// `verify_dead_every`-th) or `tr` runs at cycle level ([`TrialMode::CycleLevel`] runs
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

    /// Runs the campaign's `opts.shard` into `out`, telling `progress` how many trials are
    /// recorded already and then each trial as it ends (from worker threads), and returns the
    /// summary of the records in `out`. Idle workers take the next trial (each with its own
    /// trainer) and records are written in trial order; on an error, the trials before the first
    /// failing one are written.
    pub fn run(&self, out: &Path, opts: RunOptions, progress: impl Fn(Progress) + Sync) -> Result<Summary> {
        if let Sampling::Adaptive { target, budget, round, floor } = self.info.spec.sampling {
            return self.run_adaptive(out, opts, (target, budget, round, floor), &progress);
        }
        // The lock is held until the summary is written.
        let (_lock, done) = store::open_output(out, &self.info, &self.id, opts)?;
        let ids: Vec<u64> = opts.shard.trials(self.info.trials).collect();
        progress(Progress::Start { recorded: done as u64, trials: ids.len() as u64 });
        self.run_ids(out, opts, &ids[done.min(ids.len())..], &progress, None)?;
        store::finish(out)
    }

    /// An adaptive campaign: rounds planned from the records of the rounds before
    /// ([`crate::stats::design::next_round`]), run until the target or the budget is reached.
    /// A resumed run plans the same rounds from the same records and runs what is missing.
    fn run_adaptive(
        &self,
        out: &Path,
        opts: RunOptions,
        (target, budget, round, floor): (Target, u64, u64, u64),
        progress: &(impl Fn(Progress) + Sync),
    ) -> Result<Summary> {
        if opts.shard != Shard::ALL {
            return Err(FaultError::Invalid {
                file: out.join("campaign.json"),
                field: "sampling".into(),
                value: "Adaptive".into(),
                allowed: "an unsharded run (--shard 0/1): each round is planned from every earlier trial".into(),
            });
        }
        let (_lock, done) = store::open_output(out, &self.info, &self.id, opts)?;
        progress(Progress::Start { recorded: done as u64, trials: budget });
        let strata = &self.space.strata;
        let mut counts = vec![(0u64, 0u64); strata.len()];
        // Every trial's outcome in trial order: those recorded before (read once), then each
        // round's as it is written.
        let mut outcomes: Vec<Outcome> = if done > 0 { store::outcomes(out)? } else { Vec::new() };
        self.space.rounds.write().expect("no thread panics holding the rounds").clear();
        loop {
            let have: u64 = counts.iter().map(|c| c.1).sum();
            let next = if have == 0 {
                vec![floor; strata.len()]
            } else {
                let total: f64 = strata.iter().map(|s| s.bits as f64).sum();
                let est: Vec<(f64, Estimate)> = (strata.iter().zip(&counts))
                    .map(|(s, &(k, n))| (s.bits as f64 / total, Estimate::of(k, n)))
                    .collect();
                let (p, lo, hi) = crate::stats::stratified(&est);
                if target.met(p, lo, hi) || have >= budget {
                    break;
                }
                let design: Vec<Stratum> = est.iter().map(|(w, e)| Stratum::at_wilson_centre(*w, e)).collect();
                let have_per: Vec<u64> = counts.iter().map(|c| c.1).collect();
                next_round(&design, &have_per, round.min(budget - have), 0)
            };
            let ids = self.space.plan_round(next.clone());
            let todo: Vec<u64> = ids.clone().filter(|&t| t >= done as u64).collect();
            self.run_ids(out, opts, &todo, progress, Some(&mut outcomes))?;
            // The round's trials are numbered stratum after stratum.
            let mut t = ids.start;
            for (s, &n) in next.iter().enumerate() {
                for t in t..t + n {
                    let o = outcomes.get(t as usize).ok_or_else(|| {
                        FaultError::Inconsistent(format!(
                            "trial {t} of an adaptive round is not recorded in {}",
                            out.display()
                        ))
                    })?;
                    counts[s].0 += o.failure() as u64;
                }
                counts[s].1 += n;
                t += n;
            }
        }
        store::finish(out)
    }

    /// Runs trials `todo` (in order, after those recorded in `out`) on `opts.threads` workers,
    /// appending their outcomes, in trial order, to `outcomes` if given.
    fn run_ids(
        &self,
        out: &Path,
        opts: RunOptions,
        todo: &[u64],
        progress: &(impl Fn(Progress) + Sync),
        mut outcomes: Option<&mut Vec<Outcome>>,
    ) -> Result<()> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.threads.max(1))
            .build()
            .map_err(|e| FaultError::Inconsistent(format!("cannot start worker threads: {e}")))?;
        let mut writer = Writer::open(out)?;
        let trainer = || {
            let mut t = self.trainer();
            if opts.mode == TrialMode::CycleLevel {
                t.exec.mode = ExecMode::CycleLevel;
            }
            t
        };
        let trial = |tr: &mut Trainer, i: usize| {
            let clock = Instant::now();
            let (rec, time) = self.trial_timed(tr, todo[i])?;
            let wall = clock.elapsed();
            progress(Progress::Trial(&rec));
            Ok((rec, wall, time))
        };
        let window = WINDOW_PER_THREAD * pool.current_num_threads();
        let ran = run_ordered(&pool, todo.len(), window, trainer, trial, |batch| {
            if let Some(o) = outcomes.as_mut() {
                o.extend(batch.iter().map(|(rec, _, _)| rec.outcome));
            }
            writer.add(&batch)
        });
        // What was recorded is kept, whatever stopped the run.
        writer.finish()?;
        ran
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
