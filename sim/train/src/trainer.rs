//! The training loop: batches in, steps on the executor, evaluation, per-step records,
//! checkpoints.

use crate::checkpoint::Checkpoint;
use crate::dataset::{Batcher, Dataset, Split};
use crate::error::{Result, TrainError};
use crate::exec::{accuracy, Executor, MxuFormat};
use crate::state::ModelState;
use faultline_graph::{lower, ModelSpec, OptimizerSpec, StepSchedule, TrainGraph};
use faultline_hw::{ExecMode, HwConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Optimizer family, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Plain SGD.
    Sgd,
    /// SGD with heavy-ball momentum 0.9.
    Momentum,
    /// Adam (beta1 0.9, beta2 0.999, eps 1e-8).
    Adam,
}

impl OptimizerKind {
    /// Name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Momentum => "momentum",
            OptimizerKind::Adam => "adam",
        }
    }

    /// Learning rate used when none is given.
    pub const fn default_lr(self) -> f64 {
        match self {
            OptimizerKind::Sgd => 0.5,
            OptimizerKind::Momentum => 0.05,
            OptimizerKind::Adam => 0.01,
        }
    }

    /// The graph's optimizer with this learning rate (or the default).
    pub fn spec(self, lr: Option<f64>) -> OptimizerSpec {
        let lr = lr.unwrap_or(self.default_lr());
        match self {
            OptimizerKind::Sgd => OptimizerSpec::Sgd { lr },
            OptimizerKind::Momentum => OptimizerSpec::Momentum { lr, momentum: 0.9 },
            OptimizerKind::Adam => OptimizerSpec::Adam { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
        }
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
        [OptimizerKind::Sgd, OptimizerKind::Momentum, OptimizerKind::Adam]
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
    /// Evaluate test accuracy every this many steps (and after the last); 0 = only at the end.
    pub eval_every: u64,
    /// Initial weights.
    pub init: InitWeights,
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
        }
    }
}

/// One line of the per-step JSONL trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Step number, 1-based.
    pub step: u64,
    /// Training loss of the step's batch (before the update).
    pub loss: f64,
    /// Accuracy on the step's batch (before the update).
    pub train_accuracy: f64,
    /// Accuracy on the held-out split after the update, on evaluation steps.
    pub test_accuracy: Option<f64>,
    /// Machine cycles of the step: the sum over the GEMMs and VPU instructions it issued (from
    /// their schedules, so the same in every mode).
    pub cycles: u64,
    /// Cycles per phase: `forward`, `backward`, `update`.
    pub phase_cycles: BTreeMap<String, u64>,
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
    /// The graph's static cycle estimate of one step (per node, phase and layer), for planning
    /// and reports; the records carry the cycles of what was actually issued.
    pub schedule: StepSchedule,
}

impl Trainer {
    /// Builds the step graph and the initial state.
    pub fn new(spec: &ModelSpec, hw: &HwConfig, data: Split, options: TrainOptions) -> Result<Trainer> {
        let optimizer = options.optimizer.spec(options.lr);
        if let Some(lr) = options.lr {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(TrainError::Config(format!("learning rate {lr} must be a positive number")));
            }
        }
        let tg = TrainGraph::build(spec, options.batch, optimizer).map_err(|e| TrainError::Model(e.to_string()))?;
        let schedule = lower::schedule(&tg, hw);
        let state = match &options.init {
            InitWeights::Seed => ModelState::from_seed(&tg, options.seed),
            InitWeights::NpyDir(dir) => ModelState::from_npy_dir(&tg, dir)?,
        };
        let exec = Executor::new(tg, hw, options.mode, options.precision)?;
        if data.train.sample_len() != exec.sample_len() {
            return Err(TrainError::Data(format!(
                "{}: samples of {} values, model input needs {}",
                data.train.name,
                data.train.sample_len(),
                exec.sample_len()
            )));
        }
        let batcher = Batcher::new(data.train.len(), options.batch, options.seed)?;
        Ok(Trainer { exec, state, batcher, data, options, schedule })
    }

    /// Runs one training step; evaluates the test split when due (`last` forces it).
    pub fn step(&mut self, last: bool) -> Result<StepRecord> {
        let idx = self.batcher.next_indices();
        let (x, y) = self.data.train.gather(&idx);
        let out = self.exec.step(&mut self.state, &x, &y)?;
        let step = self.state.step;
        let every = self.options.eval_every;
        let due = last || (every > 0 && step.is_multiple_of(every));
        let test_accuracy = if due { Some(self.evaluate(&self.data.test)?) } else { None };
        Ok(StepRecord {
            step,
            loss: out.loss as f64,
            train_accuracy: accuracy(&out.output, &y, self.exec.outputs()),
            test_accuracy,
            cycles: out.cycles(),
            phase_cycles: out.phase_cycles(&self.exec.tg.graph),
        })
    }

    /// Accuracy of the current parameters on `ds`, in batches of the graph's size (the last
    /// batch is padded with repeats of the first sample, which are not counted).
    pub fn evaluate(&self, ds: &Dataset) -> Result<f64> {
        let b = self.exec.batch();
        let c = self.exec.outputs();
        let mut hits = 0usize;
        for start in (0..ds.len()).step_by(b) {
            let real = (ds.len() - start).min(b);
            let idx: Vec<usize> = (0..b).map(|i| if i < real { start + i } else { 0 }).collect();
            let (x, y) = ds.gather(&idx);
            let out = self.exec.forward(&self.state, &x)?;
            hits +=
                (0..real).filter(|&r| crate::exec::argmax(&out.output[r * c..(r + 1) * c]) == y[r] as usize).count();
        }
        Ok(hits as f64 / ds.len().max(1) as f64)
    }

    /// The exact state of the run, to save.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            model: self.exec.tg.model.clone(),
            optimizer: self.exec.tg.optimizer,
            precision: self.options.precision,
            batch: self.options.batch,
            seed: self.options.seed,
            state: self.state.clone(),
            batcher: self.batcher.state(),
        }
    }

    /// Continues from a checkpoint of the same model, optimizer, batch and data size.
    pub fn restore(&mut self, c: Checkpoint, origin: &std::path::Path) -> Result<()> {
        let bad = |detail: String| TrainError::Checkpoint { file: origin.to_path_buf(), detail };
        if c.model != self.exec.tg.model {
            return Err(bad(format!("checkpoint is of model `{}`, this run trains `{}`", c.model, self.exec.tg.model)));
        }
        if c.optimizer != self.exec.tg.optimizer {
            return Err(bad(format!(
                "checkpoint optimizer {:?} differs from this run's {:?}",
                c.optimizer, self.exec.tg.optimizer
            )));
        }
        if c.precision != self.options.precision {
            return Err(bad(format!(
                "checkpoint was trained with {} MXU inputs, this run uses {} (pass --precision {})",
                c.precision, self.options.precision, c.precision
            )));
        }
        if c.batch != self.options.batch || c.batcher.perm.len() != self.data.train.len() {
            return Err(bad(format!(
                "checkpoint has batch {} over {} samples, this run has batch {} over {}",
                c.batch,
                c.batcher.perm.len(),
                self.options.batch,
                self.data.train.len()
            )));
        }
        c.state.check(&self.exec.tg, origin)?;
        self.batcher = Batcher::from_state(&c.batcher).map_err(bad)?;
        self.state = c.state;
        Ok(())
    }
}

/// What a finished run reports.
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
    /// Steps run (in this invocation).
    pub steps: u64,
    /// Loss of the last step.
    pub final_loss: f64,
    /// Test accuracy after the last step.
    pub test_accuracy: f64,
    /// Machine cycles per step.
    pub cycles_per_step: u64,
    /// Cycles per step by phase.
    pub phase_cycles: BTreeMap<String, u64>,
    /// Simulated seconds per step at the machine's clock.
    pub simulated_seconds_per_step: f64,
    /// The graph's static estimate of a step's cycles ([`Trainer::schedule`]).
    pub estimated_cycles_per_step: u64,
    /// Loss of every step, in order.
    pub losses: Vec<f64>,
    /// Host wall-clock seconds of the run.
    pub wall_seconds: f64,
}

impl Trainer {
    /// Runs `steps` steps, calling `on_step` with the trainer (state after the step) and the
    /// step's record after each, and summarises.
    pub fn run(&mut self, steps: u64, mut on_step: impl FnMut(&Trainer, &StepRecord) -> Result<()>) -> Result<Summary> {
        let t0 = std::time::Instant::now();
        let mut losses = Vec::with_capacity(steps as usize);
        let mut test_accuracy = f64::NAN;
        let mut issued = (0, BTreeMap::new());
        for i in 0..steps {
            let r = self.step(i + 1 == steps)?;
            losses.push(r.loss);
            issued = (r.cycles, r.phase_cycles.clone());
            if let Some(a) = r.test_accuracy {
                test_accuracy = a;
            }
            on_step(self, &r)?;
        }
        if steps == 0 {
            test_accuracy = self.evaluate(&self.data.test)?;
        }
        let opt = self.exec.tg.optimizer;
        let lr = match opt {
            OptimizerSpec::Sgd { lr } | OptimizerSpec::Momentum { lr, .. } | OptimizerSpec::Adam { lr, .. } => lr,
        };
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
            final_loss: losses.last().copied().unwrap_or(f64::NAN),
            test_accuracy,
            cycles_per_step: issued.0,
            phase_cycles: issued.1,
            simulated_seconds_per_step: issued.0 as f64 / (self.exec.hw.clock_mhz * 1e6),
            estimated_cycles_per_step: self.schedule.total_cycles,
            losses,
            wall_seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
