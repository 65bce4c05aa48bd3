//! The training loop: batches in, steps on the executor, evaluation, per-step records,
//! checkpoints.

use crate::checkpoint::{Checkpoint, DataIdentity, RunIdentity};
use crate::data::dataset::{Batcher, Dataset, Split};
use crate::error::{Result, TrainError};
use crate::exec::{accuracy, Executor, MxuFormat};
use crate::golden::GoldenStep;
use crate::inject::{self, InjectionReport, StepFault};
use crate::state::ModelState;
use faultline_graph::program::UnitCycles;
use faultline_graph::{ModelSpec, OptimizerSpec, StepSchedule, TrainGraph};
use faultline_hw::matrix::bits_checksum;
use faultline_hw::{ExecMode, HwConfig};
use faultline_num::NumFormat;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The largest step a run may reach: the step counter `t` reaches Adam's bias correction as an
/// fp32 value, exact only up to 2^24.
pub const MAX_STEPS: u64 = 1 << 24;

/// Optimizer family, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Plain SGD (default learning rate 0.5).
    Sgd,
    /// SGD with heavy-ball momentum ([`OptimizerSpec::MOMENTUM`], 0.9; default learning rate
    /// 0.05).
    Momentum,
    /// Adam ([`OptimizerSpec::adam`]'s decays and epsilon: 0.9, 0.999, 1e-8; default learning
    /// rate 0.01).
    Adam,
    /// AdamW ([`OptimizerSpec::adamw`]: Adam's defaults, weight decay 0.1 on weight matrices
    /// and tables; default learning rate 0.01).
    AdamW,
}

impl OptimizerKind {
    /// Name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum => "momentum",
            OptimizerKind::Adam => "adam",
            OptimizerKind::AdamW => "adamw",
        }
    }

    /// Learning rate used when none is given.
    pub const fn default_lr(self) -> f64 {
        match self {
            OptimizerKind::Sgd => 0.5,
            OptimizerKind::Momentum => 0.05,
            OptimizerKind::Adam | OptimizerKind::AdamW => 0.01,
        }
    }

    /// The graph's optimizer with this learning rate (or the default).
    pub fn spec(self, lr: Option<f64>) -> OptimizerSpec {
        let lr = lr.unwrap_or(self.default_lr());
        match self {
            OptimizerKind::Sgd => OptimizerSpec::Sgd { lr },
            OptimizerKind::Momentum => OptimizerSpec::momentum(lr),
            OptimizerKind::Adam => OptimizerSpec::adam(lr),
            OptimizerKind::AdamW => OptimizerSpec::adamw(lr),
        }
    }

    /// The family and learning rate of a graph's optimizer (the inverse of
    /// [`OptimizerKind::spec`]).
    pub const fn of(spec: &OptimizerSpec) -> (OptimizerKind, f64) {
        let kind = match spec {
            OptimizerSpec::Sgd { .. } => OptimizerKind::Sgd,
            OptimizerSpec::Momentum { .. } => OptimizerKind::Momentum,
            OptimizerSpec::Adam { .. } => OptimizerKind::Adam,
            OptimizerSpec::AdamW { .. } => OptimizerKind::AdamW,
        };
        (kind, spec.lr())
    }
}

impl fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OptimizerKind {
    type Err = TrainError;
    fn from_str(s: &str) -> Result<Self> {
        [OptimizerKind::Sgd, OptimizerKind::Momentum, OptimizerKind::Adam, OptimizerKind::AdamW]
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| TrainError::UnknownOptimizer(s.into()))
    }
}

/// Where initial weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitWeights {
    /// The graph's initialisers seeded with the run seed.
    Seed,
    /// `<dir>/<param>.npy` for every parameter.
    NpyDir(PathBuf),
}

/// Settings of a run (everything but the model, the machine and the data).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    /// Minibatch size (the graph's static batch).
    pub batch: usize,
    /// Optimizer family.
    pub optimizer: OptimizerKind,
    /// Learning rate; `None` for the optimizer's default.
    pub lr: Option<f64>,
    /// MXU input format.
    pub precision: MxuFormat,
    /// Functional or cycle-level MXU.
    pub mode: ExecMode,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Record test accuracy every this many steps; 0 = never in the records ([`Trainer::run`]
    /// evaluates once more at the end for its summary).
    pub eval_every: u64,
    /// Initial weights.
    pub init: InitWeights,
    /// Accept NaN or infinite values in initial weights (and, for the loaders, in data).
    pub allow_nonfinite: bool,
    /// Where the data came from (`--data`), recorded in checkpoints; `None` = the shipped set.
    pub data_dir: Option<PathBuf>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            batch: 32,
            optimizer: OptimizerKind::Sgd,
            lr: None,
            precision: MxuFormat::Bf16,
            mode: ExecMode::Functional,
            seed: 1,
            eval_every: 10,
            init: InitWeights::Seed,
            allow_nonfinite: false,
            data_dir: None,
        }
    }
}

/// One line of the per-step JSONL trace. A non-finite loss or check residual is written as
/// the string `"NaN"`, `"Infinity"` or `"-Infinity"` ([`faultline_num::json`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Step number, 1-based.
    pub step: u64,
    /// Training loss of the step's batch (before the update).
    #[serde(with = "faultline_num::json")]
    pub loss: f64,
    /// Accuracy on the step's batch (before the update).
    pub train_accuracy: f64,
    /// Accuracy on the held-out split after the update, on evaluation steps.
    pub test_accuracy: Option<f64>,
    /// The global gradient norm, before any clipping ([`crate::exec::Signals`]).
    #[serde(default, with = "faultline_num::json")]
    pub grad_norm: f64,
    /// The norm of the step's parameter update.
    #[serde(default, with = "faultline_num::json")]
    pub update_norm: f64,
    /// The largest `|attention logit|` (models with attention).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "faultline_num::json")]
    pub max_attention_logit: Option<f64>,
    /// A language model's perplexity on the held-out split, on evaluation steps
    /// ([`Trainer::evaluation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_perplexity: Option<f64>,
    /// Machine cycles of the step: the critical path of the instructions it issued, the MXU
    /// and VPU overlapping as the data allow (from their schedules, so the same in every mode).
    pub cycles: u64,
    /// Busy cycles (MXU + VPU) of each phase's instructions: `forward`, `backward`, `update`
    /// (the units overlap, so these add up to more than `cycles`).
    pub phase_cycles: BTreeMap<String, u64>,
    /// Each unit's (`mxu`, `vpu`) busy cycles and stall cycles (free, with its next
    /// instruction waiting for an input).
    pub unit_cycles: BTreeMap<String, UnitCycles>,
    /// The fault injected in this step, where it landed and what it did (absent in fault-free
    /// steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injection: Option<InjectionReport>,
    /// Each check's residual ([`faultline_graph::checks`]), in the graph's check order (absent
    /// without checks).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "faultline_num::json")]
    pub checks: Vec<f32>,
}

/// Everything a step changes: parameters, optimizer state and step counter, and the batch
/// order. Cloning and restoring it is cheap (the model's tensors and a permutation), so a
/// campaign trial restores a snapshot instead of re-training to the injection step.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainState {
    /// Parameters, optimizer state, step counter.
    pub model: ModelState,
    /// Data order.
    pub batcher: Batcher,
}

/// A model being trained on one machine with one dataset.
#[derive(Debug, Clone)]
pub struct Trainer {
    /// The executor (graph, machine, mode, format).
    pub exec: Executor,
    /// Parameters, optimizer state, step counter.
    pub state: ModelState,
    /// Data order.
    pub batcher: Batcher,
    /// Train and test data.
    pub data: Split,
    /// Run settings.
    pub options: TrainOptions,
    /// The step program's schedule (per instruction, node, phase and layer): exactly the
    /// cycles each step issues.
    pub schedule: StepSchedule,
    /// FNV-1a of the model definition (part of the run's identity).
    model_digest: u64,
    /// Faults to inject, at most one per step ([`Trainer::set_faults`]).
    faults: Vec<StepFault>,
}

/// FNV-1a of a value's JSON form: a digest of a model or machine definition.
fn json_digest<T: Serialize>(v: &T) -> u64 {
    let text = serde_json::to_vec(v).expect("definitions serialise");
    bits_checksum(&[], text.into_iter().map(u32::from))
}

fn hex(d: u64) -> String {
    format!("{d:016x}")
}

impl Trainer {
    /// Builds the step graph and the initial state.
    pub fn new(spec: &ModelSpec, hw: &HwConfig, data: Split, options: TrainOptions) -> Result<Trainer> {
        let tg = TrainGraph::build(spec, options.batch, options.optimizer.spec(options.lr))
            .map_err(|e| TrainError::Model(e.to_string()))?;
        Trainer::from_graph(spec, tg, hw, data, options)
    }

    /// [`Trainer::new`] with the step graph already built (by `TrainGraph::build(spec, ...)`
    /// with the options' batch and optimizer), e.g. to check its size before loading data.
    pub fn from_graph(
        spec: &ModelSpec,
        tg: TrainGraph,
        hw: &HwConfig,
        data: Split,
        options: TrainOptions,
    ) -> Result<Trainer> {
        if let Some(lr) = options.lr {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(TrainError::Config(format!("learning rate {lr} must be a positive number")));
            }
        }
        if !matches!(hw.mxu.input_format, NumFormat::Bf16 | NumFormat::Fp32) {
            return Err(TrainError::Config(format!(
                "hardware config `{}` has an {} x {} -> {} MXU: training needs floating-point MXU inputs (a config \
                 with input_format Bf16 or Fp32; --precision then picks bf16 or fp32)",
                hw.name,
                hw.mxu.input_format.name(),
                hw.mxu.input_format.name(),
                hw.mxu.acc_format.name()
            )));
        }
        let state = match &options.init {
            InitWeights::Seed => ModelState::from_seed(&tg, options.seed),
            InitWeights::NpyDir(dir) => ModelState::from_npy_dir(&tg, dir, options.allow_nonfinite)?,
        };
        // The batch is checked against the data first: its message is the one a user can act on.
        let batcher = Batcher::new(data.train.len(), options.batch, options.seed)?;
        let exec = Executor::new(tg, hw, options.mode, options.precision)?;
        let schedule = exec.schedule();
        if data.train.sample_len() != exec.sample_len() {
            return Err(TrainError::Data(format!(
                "{}: samples of {} values, model input needs {}",
                data.train.name,
                data.train.sample_len(),
                exec.sample_len()
            )));
        }
        Ok(Trainer {
            exec,
            state,
            batcher,
            data,
            options,
            schedule,
            model_digest: json_digest(spec),
            faults: Vec::new(),
        })
    }

    /// Faults to inject in the coming steps, at most one per step; each is checked against the
    /// step program now (site, unit, cycle), so a bad one fails before any training.
    pub fn set_faults(&mut self, faults: Vec<StepFault>) -> Result<()> {
        for (i, f) in faults.iter().enumerate() {
            if let Some(g) = faults[..i].iter().find(|g| g.step == f.step) {
                return Err(TrainError::Config(format!(
                    "faults `{g}` and `{f}` strike the same step; inject at most one fault per step"
                )));
            }
            inject::resolve(&self.exec, &self.schedule, f)?;
        }
        self.faults = faults;
        Ok(())
    }

    /// The faults planned with [`Trainer::set_faults`].
    pub fn faults(&self) -> &[StepFault] {
        &self.faults
    }

    /// Everything that defines this run (what a checkpoint must match to be resumed here).
    pub fn identity(&self) -> RunIdentity {
        RunIdentity {
            model: self.exec.tg.model.clone(),
            model_digest: hex(self.model_digest),
            hw: self.exec.hw.name.clone(),
            hw_digest: hex(json_digest(&self.exec.hw)),
            optimizer: self.exec.tg.optimizer,
            precision: self.options.precision,
            batch: self.options.batch,
            seed: self.options.seed,
            eval_every: self.options.eval_every,
            data: DataIdentity {
                dir: self.options.data_dir.clone(),
                name: self.data.train.name.clone(),
                train_samples: self.data.train.len(),
                test_samples: self.data.test.len(),
                digest: hex(self.data.digest()),
            },
        }
    }

    /// The buffers as instruction `i` of the coming step finds them in a fault-free run
    /// ([`Executor::buffers_before`]), on the batch that step trains on; neither the state nor
    /// the data order advances. What a replay of one faulted instruction starts from.
    pub fn buffers_before(&self, i: usize) -> Result<Vec<Vec<u32>>> {
        let idx = self.batcher.clone().next_indices();
        let (x, y) = self.data.train.gather(&idx);
        self.exec.buffers_before(&self.state, &x, Some(&y), i)
    }

    /// Runs one training step, with the fault [`Trainer::set_faults`] planned for it if any;
    /// records test accuracy on steps that are multiples of `eval_every` (so a record never
    /// depends on where an invocation stopped).
    pub fn step(&mut self) -> Result<StepRecord> {
        let planned = self.faults.iter().find(|f| f.step == self.state.step + 1).copied();
        self.step_with(planned.as_ref())
    }

    /// The training state: what a trial restores before replaying a step with a fault.
    pub fn snapshot(&self) -> TrainState {
        TrainState { model: self.state.clone(), batcher: self.batcher.clone() }
    }

    /// Puts the run back at a [`Trainer::snapshot`] of itself.
    pub fn restore_snapshot(&mut self, s: &TrainState) {
        self.state.clone_from(&s.model);
        self.batcher.clone_from(&s.batcher);
    }

    /// [`Trainer::step`] with `fault` (which must strike the coming step) instead of the
    /// planned one.
    pub fn step_with(&mut self, fault: Option<&StepFault>) -> Result<StepRecord> {
        self.step_with_upset(fault.map(std::slice::from_ref).unwrap_or_default())
    }

    /// [`Trainer::step_with`] with an upset of several bits struck together
    /// ([`inject::resolve_upset`]); no bits: a fault-free step.
    pub fn step_with_upset(&mut self, upset: &[StepFault]) -> Result<StepRecord> {
        self.step_with_upset_from(upset, None)
    }

    /// The fault-free coming step kept whole ([`Executor::golden_step`]) on the batch it will
    /// take: what [`Trainer::step_with_upset_from`] starts faulted runs of it from. Changes
    /// nothing.
    pub fn golden_step(&self) -> Result<GoldenStep> {
        let (x, y) = self.data.train.gather(&self.batcher.clone().next_indices());
        self.exec.golden_step(&self.state, &x, Some(&y))
    }

    /// [`Trainer::step_with_upset`] starting from `golden` ([`Trainer::golden_step`] in this
    /// very state: else an error) where the upset does: the same record, bit for bit, without
    /// recomputing what comes before it.
    pub fn step_with_upset_from(&mut self, upset: &[StepFault], golden: Option<&GoldenStep>) -> Result<StepRecord> {
        if let Some(f) = upset.iter().find(|f| f.step != self.state.step + 1) {
            return Err(TrainError::Config(format!(
                "fault `{f}` strikes step {}, but the coming step is {}",
                f.step,
                self.state.step + 1
            )));
        }
        if self.state.step >= MAX_STEPS {
            return Err(TrainError::Config(format!(
                "step {} would pass the largest supported step {MAX_STEPS}",
                self.state.step + 1
            )));
        }
        let idx = self.batcher.next_indices();
        let (x, y) = self.data.train.gather(&idx);
        let (out, injection) = inject::run_upset(&self.exec, &self.schedule, upset, |inj| {
            self.exec.step_with_fault_from(&mut self.state, &x, &y, inj, golden)
        })?;
        let step = self.state.step;
        let every = self.options.eval_every;
        let due = every > 0 && step.is_multiple_of(every);
        let (test_accuracy, test_perplexity) = match due {
            true => self.test_metrics().map(|(a, p)| (Some(a), p))?,
            false => (None, None),
        };
        Ok(StepRecord {
            step,
            loss: out.loss as f64,
            train_accuracy: accuracy(&out.output, &y, self.exec.outputs()),
            test_accuracy,
            grad_norm: out.signals.grad_norm,
            update_norm: out.signals.update_norm,
            max_attention_logit: out.signals.max_attention_logit,
            test_perplexity,
            cycles: out.cycles,
            phase_cycles: out.phase_cycles,
            unit_cycles: out.unit_cycles,
            injection,
            checks: out.checks,
        })
    }

    /// Accuracy of the current parameters on `ds` (of every label: each next token, for a
    /// language model), in batches of the graph's size (the last batch is padded with repeats
    /// of the first sample, which are not counted).
    pub fn evaluate(&self, ds: &Dataset) -> Result<f64> {
        Ok(self.evaluation(ds)?.0)
    }

    /// [`Trainer::evaluate`] and the perplexity, `exp` of the mean cross-entropy of every label
    /// under the model's output (softmax over the classes, computed on the host in f64 from the
    /// logits the machine produced).
    pub fn evaluation(&self, ds: &Dataset) -> Result<(f64, f64)> {
        let (b, c, l) = (self.exec.batch(), self.exec.outputs(), ds.label_len);
        let (mut hits, mut nll) = (0usize, 0.0f64);
        for start in (0..ds.len()).step_by(b) {
            let real = (ds.len() - start).min(b);
            let idx: Vec<usize> = (0..b).map(|i| if i < real { start + i } else { 0 }).collect();
            let (x, y) = ds.gather(&idx);
            let out = self.exec.forward(&self.state, &x)?;
            for (r, &label) in y.iter().enumerate().take(real * l) {
                let row = &out.output[r * c..(r + 1) * c];
                hits += usize::from(crate::exec::argmax(row) == label as usize);
                let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
                nll += lse - row[label as usize] as f64;
            }
        }
        let labels = (ds.len() * l).max(1) as f64;
        Ok((hits as f64 / labels, (nll / labels).exp()))
    }

    /// The test split's accuracy and, for a language model, its perplexity: one pass gives
    /// both ([`Trainer::evaluation`]).
    fn test_metrics(&self) -> Result<(f64, Option<f64>)> {
        let lm = self.data.test.label_len > 1;
        self.evaluation(&self.data.test).map(|(a, p)| (a, lm.then_some(p)))
    }

    /// The exact state of the run, to save.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint { run: self.identity(), state: self.state.clone(), batcher: self.batcher.state() }
    }

    /// Continues from a checkpoint of this very run: every field of its [`RunIdentity`] must
    /// equal this trainer's (the error names the first that differs), and its state must fit
    /// the graph.
    pub fn restore(&mut self, c: Checkpoint, origin: &std::path::Path) -> Result<()> {
        let bad = |detail: String| TrainError::Checkpoint { file: origin.to_path_buf(), detail };
        let (ck, me) = (&c.run, self.identity());
        let differs = |what: &str, theirs: String, mine: String| {
            bad(format!("the checkpoint's {what} is {theirs}, this run's is {mine}: resume with the same {what}"))
        };
        if (&ck.model, &ck.model_digest) != (&me.model, &me.model_digest) {
            return Err(differs(
                "model",
                format!("`{}` (digest {})", ck.model, ck.model_digest),
                format!("`{}` (digest {})", me.model, me.model_digest),
            ));
        }
        if (&ck.hw, &ck.hw_digest) != (&me.hw, &me.hw_digest) {
            return Err(differs(
                "hardware config",
                format!("`{}` (digest {})", ck.hw, ck.hw_digest),
                format!("`{}` (digest {})", me.hw, me.hw_digest),
            ));
        }
        if ck.optimizer != me.optimizer {
            return Err(differs("optimizer", format!("{:?}", ck.optimizer), format!("{:?}", me.optimizer)));
        }
        if ck.precision != me.precision {
            return Err(differs("precision", ck.precision.to_string(), me.precision.to_string()));
        }
        for (what, a, b) in [
            ("batch", ck.batch as u64, me.batch as u64),
            ("seed", ck.seed, me.seed),
            ("eval interval", ck.eval_every, me.eval_every),
        ] {
            if a != b {
                return Err(differs(what, a.to_string(), b.to_string()));
            }
        }
        if ck.data != me.data {
            let show = |d: &DataIdentity| {
                format!(
                    "{} `{}` ({} train / {} test samples, digest {})",
                    d.dir.as_ref().map_or("the shipped set".to_string(), |p| p.display().to_string()),
                    d.name,
                    d.train_samples,
                    d.test_samples,
                    d.digest
                )
            };
            return Err(differs("data", show(&ck.data), show(&me.data)));
        }
        c.state.check(&self.exec.tg, origin)?;
        self.batcher = Batcher::from_state(&c.batcher).map_err(bad)?;
        self.state = c.state;
        Ok(())
    }
}

/// What a finished run reports (`train --json`; non-finite losses as in [`StepRecord`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Model name.
    pub model: String,
    /// Machine name.
    pub hw: String,
    /// `functional` or `cycle-level`.
    pub mode: String,
    /// MXU input format.
    pub precision: String,
    /// Optimizer name.
    pub optimizer: String,
    /// Learning rate used.
    pub lr: f64,
    /// Batch size.
    pub batch: usize,
    /// Steps run in this invocation.
    pub steps: u64,
    /// Steps completed in all, counting those of the checkpoint it resumed from.
    pub last_step: u64,
    /// Loss of the last step.
    #[serde(with = "faultline_num::json")]
    pub final_loss: f64,
    /// Test accuracy after the last step (next-token accuracy for a language model).
    pub test_accuracy: f64,
    /// A language model's test perplexity after the last step: `exp` of the mean cross-entropy
    /// per token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_perplexity: Option<f64>,
    /// Machine cycles per step.
    pub cycles_per_step: u64,
    /// Busy cycles per step by phase (MXU + VPU; see [`StepRecord::phase_cycles`]).
    pub phase_cycles: BTreeMap<String, u64>,
    /// Simulated seconds per step at the machine's clock.
    pub simulated_seconds_per_step: f64,
    /// Instructions per step (the step program's length).
    pub instructions_per_step: usize,
    /// Cycles per step the MXU is busy ([`Trainer::schedule`]).
    pub mxu_cycles_per_step: u64,
    /// Cycles per step the VPU is busy ([`Trainer::schedule`]).
    pub vpu_cycles_per_step: u64,
    /// Loss of every step of this invocation, in order.
    #[serde(with = "faultline_num::json")]
    pub losses: Vec<f64>,
    /// What each injected fault did ([`Trainer::set_faults`]), in step order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injections: Vec<InjectionReport>,
    /// Host wall-clock seconds of the run.
    pub wall_seconds: f64,
}

impl Trainer {
    /// Runs `steps` more steps, calling `on_step` with the trainer (state after the step) and
    /// the step's record after each, and summarises (evaluating the test split once more if the
    /// last step was not an evaluation step).
    pub fn run(&mut self, steps: u64, mut on_step: impl FnMut(&Trainer, &StepRecord) -> Result<()>) -> Result<Summary> {
        if self.state.step.checked_add(steps).is_none_or(|end| end > MAX_STEPS) {
            return Err(TrainError::Config(format!(
                "{steps} more steps from step {} would pass the largest supported step {MAX_STEPS} (the step \
                 counter is an fp32 value, exact up to 2^24)",
                self.state.step
            )));
        }
        let t0 = std::time::Instant::now();
        let mut losses = Vec::new();
        let mut test = None;
        let mut issued = (0, BTreeMap::new());
        let mut injections = Vec::new();
        for _ in 0..steps {
            let r = self.step()?;
            losses.push(r.loss);
            injections.extend(r.injection.clone());
            issued = (r.cycles, r.phase_cycles.clone());
            test = r.test_accuracy.map(|a| (a, r.test_perplexity));
            on_step(self, &r)?;
        }
        let (test_accuracy, test_perplexity) = match test {
            Some(t) => t,
            None => self.test_metrics()?,
        };
        let opt = self.exec.tg.optimizer;
        let lr = opt.lr();
        Ok(Summary {
            model: self.exec.tg.model.clone(),
            hw: self.exec.hw.name.clone(),
            mode: match self.options.mode {
                ExecMode::Functional => "functional",
                ExecMode::CycleLevel => "cycle-level",
            }
            .into(),
            precision: self.options.precision.name().into(),
            optimizer: self.options.optimizer.name().into(),
            lr,
            batch: self.options.batch,
            steps,
            last_step: self.state.step,
            final_loss: losses.last().copied().unwrap_or(f64::NAN),
            test_accuracy,
            test_perplexity,
            cycles_per_step: issued.0,
            phase_cycles: issued.1,
            simulated_seconds_per_step: issued.0 as f64 / (self.exec.hw.clock_mhz * 1e6),
            instructions_per_step: self.schedule.instrs.len(),
            mxu_cycles_per_step: self.schedule.mxu_cycles,
            vpu_cycles_per_step: self.schedule.vpu_cycles,
            losses,
            injections,
            wall_seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
