//! A training run set up the one way every entry point (`faultline train`, a campaign's golden
//! run) takes it, in named steps:
//! 1. the run's options: for `faultline train`, [`RunFlags::resolve`] (flags given, else a
//!    resumed checkpoint's, else the defaults);
//! 2. [`TrainSetup::graph`]: the step graph, so that a model error or an oversized model is
//!    reported before any data is made;
//! 3. [`TrainSetup::check_memory`]: the host memory the run needs, against the budget;
//! 4. [`TrainSetup::data`]: the data (a directory or the shipped set);
//! 5. [`TrainSetup::trainer`]: the [`Trainer`].
//!
//! A caller may change the graph between 2 and 3 (a campaign's protection plan adds checks).
//! [`run_recorded`] then runs the trainer, writing the trace and checkpoints as it goes.

use crate::checkpoint::RunIdentity;
use crate::data::dataset::Split;
use crate::data::source::{self, LoadOptions};
use crate::error::{Result, TrainError};
use crate::exec::MxuFormat;
use crate::trace::TraceWriter;
use crate::trainer::{InitWeights, OptimizerKind, StepRecord, Summary, TrainOptions, Trainer};
use faultline_graph::{GraphError, ModelSpec, TrainGraph};
use faultline_hw::budget::{self, HostMemory};
use faultline_hw::{ExecMode, HwConfig, HwError};
use std::fmt;
use std::path::{Path, PathBuf};

/// What a training run is made from: the model, the machine and the options.
#[derive(Debug, Clone)]
pub struct TrainSetup {
    /// The model.
    pub model: ModelSpec,
    /// The machine.
    pub hw: HwConfig,
    /// The run's options (`data_dir`: where the data comes from, `None` for the shipped set).
    pub options: TrainOptions,
}

impl TrainSetup {
    /// Step 2: the step graph of the options' batch and optimizer.
    pub fn graph(&self) -> std::result::Result<TrainGraph, GraphError> {
        TrainGraph::build(&self.model, self.options.batch, self.options.optimizer.spec(self.options.lr))
    }

    /// Step 3: checks that a step of `tg` ([`crate::exec::host_bytes`]) and what else the caller
    /// holds (`extra`, given the step's bytes) fit `mem`; `what` names the run in the error.
    /// Returns the step's bytes.
    pub fn check_memory(
        &self,
        tg: &TrainGraph,
        mem: &HostMemory,
        what: &str,
        extra: impl FnOnce(Option<u64>) -> Option<u64>,
    ) -> std::result::Result<Option<u64>, HwError> {
        let step = crate::exec::host_bytes(tg);
        mem.check(what, budget::sum(&[step, extra(step)]))?;
        Ok(step)
    }

    /// Step 4: the data: the options' directory if set, else the shipped set that fits the model,
    /// split and shuffled by the options' seed.
    pub fn data(&self, mem: &HostMemory) -> Result<Split> {
        let o = &self.options;
        match &o.data_dir {
            Some(dir) => source::load_dir(
                dir,
                &self.model,
                o.seed,
                &LoadOptions { mem: *mem, allow_nonfinite: o.allow_nonfinite },
            ),
            None => source::shipped(&self.model, o.seed, mem),
        }
    }

    /// Step 5: the trainer of step graph `tg` (from [`TrainSetup::graph`]) on `data`.
    pub fn trainer(&self, tg: TrainGraph, data: Split) -> Result<Trainer> {
        Trainer::from_graph(&self.model, tg, &self.hw, data, self.options.clone())
    }
}

/// The flags that define a `faultline train` run, as the user gave them (`None`: not given).
/// On a resumed run each comes from the checkpoint unless given, and a given one must agree
/// with it.
#[derive(Debug, Clone, Default)]
pub struct RunFlags {
    /// `--seed`.
    pub seed: Option<u64>,
    /// `--batch`.
    pub batch: Option<u64>,
    /// `--eval-every`.
    pub eval_every: Option<u64>,
    /// `--optimizer`, as written (parsed by [`RunFlags::resolve`]).
    pub optimizer: Option<String>,
    /// `--lr`.
    pub lr: Option<f64>,
    /// `--precision`, as written (parsed by [`RunFlags::resolve`]).
    pub precision: Option<String>,
    /// `--data`.
    pub data: Option<PathBuf>,
}

/// The value of a run-defining flag: the one given, else the checkpoint's, else the default.
/// A given value that contradicts the checkpoint is an error naming the flag.
fn inherit<T: PartialEq + fmt::Display>(flag: &str, given: Option<T>, ck: Option<T>, default: T) -> Result<T> {
    match (given, ck) {
        (Some(g), Some(c)) if g != c => Err(contradiction(flag, g, c)),
        (g, c) => Ok(g.or(c).unwrap_or(default)),
    }
}

fn contradiction(flag: &str, given: impl fmt::Display, ck: impl fmt::Display) -> TrainError {
    TrainError::Config(format!(
        "{flag} {given} contradicts the checkpoint, whose run has {flag} {ck}; omit {flag} to continue that run"
    ))
}

impl RunFlags {
    /// The options of a run on `hw` in `mode` from initial weights `init`, continuing the run
    /// `ck` (a checkpoint's) if set. Flags not given take the checkpoint's value, else
    /// [`TrainOptions::default`]'s (the precision: [`MxuFormat::default_for`] `hw`).
    pub fn resolve(
        &self,
        hw: &HwConfig,
        ck: Option<&RunIdentity>,
        mode: ExecMode,
        init: InitWeights,
        allow_nonfinite: bool,
    ) -> Result<TrainOptions> {
        let d = TrainOptions::default();
        let seed = inherit("--seed", self.seed, ck.map(|r| r.seed), d.seed)?;
        let batch = inherit("--batch", self.batch, ck.map(|r| r.batch as u64), d.batch as u64)? as usize;
        let eval_every = inherit("--eval-every", self.eval_every, ck.map(|r| r.eval_every), d.eval_every)?;
        let given_opt: Option<OptimizerKind> = self.optimizer.as_deref().map(str::parse).transpose()?;
        let ck_opt = ck.map(|r| OptimizerKind::of(&r.optimizer));
        let optimizer = inherit("--optimizer", given_opt, ck_opt.map(|o| o.0), d.optimizer)?;
        let lr = match (self.lr, ck_opt) {
            (Some(g), Some((_, c))) if g != c => return Err(contradiction("--lr", g, c)),
            (g, c) => g.or(c.map(|c| c.1)),
        };
        if let Some(lr) = lr.filter(|lr| !(lr.is_finite() && *lr > 0.0)) {
            return Err(TrainError::Config(format!("--lr {lr}: the learning rate must be a positive number")));
        }
        let given_prec: Option<MxuFormat> = self.precision.as_deref().map(str::parse).transpose()?;
        let precision = inherit("--precision", given_prec, ck.map(|r| r.precision), MxuFormat::default_for(hw))?;
        Ok(TrainOptions {
            batch,
            optimizer,
            lr,
            precision,
            mode,
            seed,
            eval_every,
            init,
            allow_nonfinite,
            data_dir: self.data.clone().or_else(|| ck.and_then(|r| r.data.dir.clone())),
        })
    }
}

/// The steps left to train from `start` (a checkpoint's step, or 0) to reach `target` in all:
/// an error when there are none (a summary of no steps would have NaN losses).
pub fn steps_to_train(start: u64, target: u64) -> Result<u64> {
    if start >= target {
        let rel = if start > target { "past" } else { "already at" };
        return Err(TrainError::Config(format!(
            "the checkpoint is at step {start}, {rel} --steps {target}: nothing to train; --steps is the total \
             to reach, so pass a larger value to continue"
        )));
    }
    Ok(target - start)
}

/// Where a run writes as it goes.
#[derive(Debug, Default)]
pub struct RunOutputs<'a> {
    /// The trace every step's record is appended to.
    pub trace: Option<TraceWriter>,
    /// Where the final checkpoint is saved.
    pub checkpoint: Option<&'a Path>,
    /// Also save a golden checkpoint every this many steps (0: never), to
    /// `<checkpoint>/step-<N>`.
    pub checkpoint_every: u64,
}

/// Runs `steps` steps of `trainer` ([`Trainer::run`]), writing each step's record to the
/// trace, the periodic checkpoints, and at the end the final checkpoint; `on_step` sees every
/// record (for progress). The trace is closed before the final checkpoint is saved.
pub fn run_recorded(
    trainer: &mut Trainer,
    steps: u64,
    out: RunOutputs,
    mut on_step: impl FnMut(&StepRecord),
) -> Result<Summary> {
    let RunOutputs { mut trace, checkpoint, checkpoint_every } = out;
    let summary = trainer.run(steps, |t, r| {
        // The record goes out before the step's checkpoint, so a checkpoint at step N always
        // has records 1..=N on disk.
        if let Some(w) = trace.as_mut() {
            w.write(r)?;
        }
        if let Some(dir) = checkpoint.filter(|_| checkpoint_every > 0 && r.step % checkpoint_every == 0) {
            t.checkpoint().save(&dir.join(format!("step-{:06}", r.step)))?;
        }
        on_step(r);
        Ok(())
    })?;
    drop(trace);
    if let Some(dir) = checkpoint {
        trainer.checkpoint().save(dir)?;
    }
    Ok(summary)
}
