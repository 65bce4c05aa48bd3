//! `faultline train`: trains a model on the simulated machine and reports loss, accuracy and
//! cycles.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use faultline_graph::ModelSpec;
use faultline_hw::budget::HostMemory;
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::setup::{self, RunOutputs};
use faultline_train::{
    Checkpoint, InitWeights, RunDescription, RunFlags, StepFault, Summary, TraceWriter, TrainSetup, Trainer, MAX_STEPS,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Execution mode of the MXU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Functional twin (fast).
    Functional,
    /// Every register stepped each clock (bit-identical, slower).
    #[value(alias = "cycle-level")]
    Cycle,
}

/// Arguments of `faultline train`.
///
/// Flags that define the run (batch, optimizer, learning rate, precision, seed, evaluation
/// interval, data) are optional so that `--resume` can tell a flag the user gave from a default:
/// on resume each is taken from the checkpoint, and a given flag that contradicts it is an error.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Model file (RON), e.g. models/mlp-digits.ron.
    #[arg(long)]
    pub model: PathBuf,
    /// Hardware config (RON), e.g. configs/tpu-32x32.ron.
    #[arg(long)]
    pub config: PathBuf,
    /// Train until this many steps are done in all (a resumed run continues to it, so it must be
    /// past the checkpoint's step).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=MAX_STEPS))]
    pub steps: u64,
    /// Minibatch size [default: 32].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub batch: Option<u64>,
    /// Learning rate [default: sgd 0.5, momentum 0.05, adam 0.01].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Optimizer: sgd, momentum, adam or adamw [default: sgd].
    #[arg(long)]
    pub optimizer: Option<String>,
    /// MXU input format: bf16 (TPU-like, fp32 accumulate) or fp32 (for comparing with
    /// frameworks) [default: the config's input_format].
    #[arg(long)]
    pub precision: Option<String>,
    /// MXU execution mode (never changes a bit; may differ between a run and its resumption).
    #[arg(long, value_enum, default_value_t = Mode::Functional)]
    pub mode: Mode,
    /// Directory of initial weights, one `<param>.npy` per parameter (e.g. fc1.weight.npy).
    #[arg(long, conflicts_with = "resume")]
    pub init_weights: Option<PathBuf>,
    /// Data directory: x.npy + y.npy (optional x_test.npy + y_test.npy) or MNIST IDX files.
    /// Default: the shipped dataset that fits the model (on resume: the checkpoint's data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Accept NaN or infinite values in the data and initial weights (by default an error
    /// naming the file and the first such value).
    #[arg(long)]
    pub allow_nonfinite: bool,
    /// Seed of initialisation, data split and batch order [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Record test accuracy every N steps; 0 = never (the summary always evaluates at the end)
    /// [default: 10].
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Write one JSON record per step to this file (JSONL), and the run description beside it.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Save a checkpoint (weights, optimizer state, RNG, step) to this directory at the end.
    #[arg(long)]
    pub save_checkpoint: Option<PathBuf>,
    /// Also save golden checkpoints every N steps, to `<save-checkpoint>/step-<N>` (0 = off).
    #[arg(long, default_value_t = 0, requires = "save_checkpoint")]
    pub checkpoint_every: u64,
    /// Resume from a checkpoint directory, or from the newest complete `step-<N>` checkpoint in
    /// a --save-checkpoint directory. With the same --trace, the trace continues where the
    /// checkpoint left it.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Inject a fault at a (step, cycle within the step) of the run, e.g.
    /// 'flip:mxu.pe[31][0].psum[30]@step=5,cycle=400' or
    /// 'stuck1:vpu.lane[3].out[30]@step=2,cycle=1000,for=50' (repeatable, one per step; any
    /// site `faultline sites` lists). Where it lands and what it corrupts is printed and
    /// recorded in the trace.
    #[arg(long = "inject", value_name = "FAULT", conflicts_with_all = ["resume", "save_checkpoint"])]
    pub inject: Vec<String>,
    /// Print the final summary as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Runs `faultline train`.
pub fn run(a: TrainArgs, mem: &HostMemory) -> anyhow::Result<()> {
    let _lock = a.save_checkpoint.as_deref().map(|d| crate::args::lock_output("--save-checkpoint", d)).transpose()?;
    let spec = ModelSpec::load(&a.model)?;
    let hw = HwConfig::load(&a.config)?;
    let ck = match &a.resume {
        Some(dir) => Some(Checkpoint::load_newest(dir, |p, e| {
            eprintln!("note: skipping checkpoint {}: {}", p.display(), e);
        })?),
        None => None,
    };
    let start_step = ck.as_ref().map_or(0, |c| c.state.step);
    let todo = setup::steps_to_train(start_step, a.steps)?;
    let flags = RunFlags {
        seed: a.seed,
        batch: a.batch,
        eval_every: a.eval_every,
        optimizer: a.optimizer.clone(),
        lr: a.lr,
        precision: a.precision.clone(),
        data: a.data.clone(),
    };
    let mode = match a.mode {
        Mode::Functional => ExecMode::Functional,
        Mode::Cycle => ExecMode::CycleLevel,
    };
    let init = a.init_weights.clone().map_or(InitWeights::Seed, InitWeights::NpyDir);
    let options = flags.resolve(&hw, ck.as_ref().map(|c| &c.run), mode, init, a.allow_nonfinite)?;
    let setup = TrainSetup { model: spec, hw, options };
    let tg = setup.graph()?;
    let what = format!("training `{}` with batch {} for {todo} steps", setup.model.name, setup.options.batch);
    setup.check_memory(&tg, mem, &what, |_| todo.checked_mul(8))?;
    let data = setup.data(mem)?;
    let mut trainer = setup.trainer(tg, data)?;
    if let (Some(c), Some(dir)) = (ck, &a.resume) {
        trainer.restore(c, dir)?;
    }
    let faults: Vec<StepFault> = a.inject.iter().map(|f| f.parse()).collect::<Result<_, _>>()?;
    if let Some(f) = faults.iter().find(|f| f.step > a.steps) {
        bail!("fault `{f}` strikes step {}, after the run's last step {}", f.step, a.steps);
    }
    trainer.set_faults(faults)?;
    let trace = match &a.trace {
        Some(p) => {
            let w = if a.resume.is_some() { TraceWriter::resume(p, start_step)? } else { TraceWriter::create(p)? };
            run_description(&a, &setup.model, &trainer, start_step).write_for(p, a.resume.is_some())?;
            Some(w)
        }
        None => None,
    };
    let bar = if a.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(todo);
        b.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} steps  {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        b
    };
    let mut last_acc = String::new();
    let out = RunOutputs { trace, checkpoint: a.save_checkpoint.as_deref(), checkpoint_every: a.checkpoint_every };
    let summary = setup::run_recorded(&mut trainer, todo, out, |r| {
        if let Some(t) = r.test_accuracy {
            last_acc = format!("  test acc {:.1}%", 100.0 * t);
        }
        bar.set_message(format!("loss {:.4}{last_acc}", r.loss));
        bar.inc(1);
    });
    bar.finish_and_clear();
    let summary = summary?;
    print_summary(&a, &summary, &trainer, &setup.hw, start_step)
}

/// Prints the run's summary (as JSON with `--json`).
fn print_summary(a: &TrainArgs, summary: &Summary, trainer: &Trainer, hw: &HwConfig, start_step: u64) -> Result<()> {
    if a.json {
        println!("{}", serde_json::to_string_pretty(summary)?);
        return Ok(());
    }
    for r in &summary.injections {
        println!("fault: {r}");
    }
    let phases: Vec<String> = faultline_graph::Phase::ALL
        .iter()
        .map(|p| format!("{} {}", p.name(), summary.phase_cycles.get(p.name()).copied().unwrap_or(0)))
        .collect();
    let resumed = if start_step > 0 { format!(" (resumed at step {start_step})") } else { String::new() };
    println!(
        "trained {} on {} ({}, {} MXU inputs, {} lr {}, batch {}): {} steps{resumed} in {:.2} s",
        summary.model,
        summary.hw,
        summary.mode,
        summary.precision,
        summary.optimizer,
        summary.lr,
        summary.batch,
        summary.steps,
        summary.wall_seconds
    );
    let first = summary.losses.first().copied().unwrap_or(f64::NAN);
    match summary.test_perplexity {
        Some(p) => println!(
            "loss {first:.4} -> {:.4}, test next-token accuracy {:.1}%, perplexity {p:.2} ({} sequences of {} tokens)",
            summary.final_loss,
            100.0 * summary.test_accuracy,
            trainer.data.test.len(),
            trainer.data.test.label_len
        ),
        None => println!(
            "loss {first:.4} -> {:.4}, test accuracy {:.1}% ({} samples)",
            summary.final_loss,
            100.0 * summary.test_accuracy,
            trainer.data.test.len()
        ),
    }
    println!(
        "cycles/step {} = {:.1} us at {} MHz (busy cycles by phase: {})",
        summary.cycles_per_step,
        summary.simulated_seconds_per_step * 1e6,
        hw.clock_mhz,
        phases.join(", "),
    );
    let busy = |c: u64| 100.0 * c as f64 / summary.cycles_per_step.max(1) as f64;
    println!(
        "{} instructions/step; MXU busy {} cycles ({:.1}%), VPU busy {} cycles ({:.1}%)",
        summary.instructions_per_step,
        summary.mxu_cycles_per_step,
        busy(summary.mxu_cycles_per_step),
        summary.vpu_cycles_per_step,
        busy(summary.vpu_cycles_per_step)
    );
    if let Some(p) = &a.trace {
        println!("trace: {}", p.display());
    }
    if let Some(p) = &a.save_checkpoint {
        println!("checkpoint: {}", p.display());
    }
    Ok(())
}

/// The resolved run for `<trace stem>.run.json`: model, machine as executed (the precision
/// applied), the run identity, and this invocation.
fn run_description(a: &TrainArgs, spec: &ModelSpec, t: &Trainer, start_step: u64) -> RunDescription {
    RunDescription::new(
        t,
        spec,
        &a.model,
        &a.config,
        a.init_weights.as_deref(),
        std::env::args().collect(),
        a.resume.as_deref(),
        (start_step, a.steps),
    )
}
