//! `faultline train`: trains a model on the simulated machine and reports loss, accuracy and
//! cycles.

use anyhow::Context;
use clap::{Args, ValueEnum};
use faultline_graph::ModelSpec;
use faultline_hw::budget::HostMemory;
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::{source, Checkpoint, InitWeights, MxuFormat, OptimizerKind, TrainOptions, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
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
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Model file (RON), e.g. models/mlp-digits.ron.
    #[arg(long)]
    pub model: PathBuf,
    /// Hardware config (RON), e.g. configs/tpu-32x32.ron.
    #[arg(long)]
    pub config: PathBuf,
    /// Training steps.
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// Minibatch size.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Learning rate [default: sgd 0.5, momentum 0.05, adam 0.01].
    #[arg(long)]
    pub lr: Option<f64>,
    /// Optimizer: sgd, momentum or adam.
    #[arg(long, default_value = "sgd")]
    pub optimizer: String,
    /// MXU input format: bf16 (TPU-like, fp32 accumulate) or fp32 (for comparing with frameworks).
    #[arg(long, default_value = "bf16")]
    pub precision: String,
    /// MXU execution mode.
    #[arg(long, value_enum, default_value_t = Mode::Functional)]
    pub mode: Mode,
    /// Directory of initial weights, one `<param>.npy` per parameter (e.g. fc1.weight.npy).
    #[arg(long)]
    pub init_weights: Option<PathBuf>,
    /// Data directory: x.npy + y.npy (optional x_test.npy + y_test.npy) or MNIST IDX files.
    /// Default: the shipped dataset that fits the model.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Seed of initialisation, data split and batch order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Evaluate test accuracy every N steps (and after the last); 0 = only at the end.
    #[arg(long, default_value_t = 10)]
    pub eval_every: u64,
    /// Write one JSON record per step to this file (JSONL).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Save a checkpoint (weights, optimizer state, RNG, step) to this directory at the end.
    #[arg(long)]
    pub save_checkpoint: Option<PathBuf>,
    /// Also save golden checkpoints every N steps, to `<save-checkpoint>/step-<N>` (0 = off).
    #[arg(long, default_value_t = 0, requires = "save_checkpoint")]
    pub checkpoint_every: u64,
    /// Resume from a checkpoint directory written by --save-checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Print the final summary as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Runs `faultline train`.
pub fn run(a: TrainArgs, _mem: &HostMemory) -> anyhow::Result<()> {
    let optimizer: OptimizerKind = a.optimizer.parse()?;
    let precision: MxuFormat = a.precision.parse()?;
    let spec = ModelSpec::load(&a.model)?;
    let hw = HwConfig::load(&a.config)?;
    let data = match &a.data {
        Some(dir) => source::load_dir(dir, &spec, a.seed)?,
        None => source::shipped(&spec, a.seed)?,
    };
    let options = TrainOptions {
        batch: a.batch,
        optimizer,
        lr: a.lr,
        precision,
        mode: match a.mode {
            Mode::Functional => ExecMode::Functional,
            Mode::Cycle => ExecMode::CycleLevel,
        },
        seed: a.seed,
        eval_every: a.eval_every,
        init: a.init_weights.clone().map_or(InitWeights::Seed, InitWeights::NpyDir),
    };
    let mut trainer = Trainer::new(&spec, &hw, data, options)?;
    if let Some(dir) = &a.resume {
        let c = Checkpoint::load(dir)?;
        trainer.restore(c, dir)?;
    }
    let mut trace = match &a.trace {
        Some(p) => {
            if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("{}: cannot create directory", parent.display()))?;
            }
            let run_file = run_description_path(p);
            let text = serde_json::to_string_pretty(&run_description(&a, &spec, &trainer))?;
            std::fs::write(&run_file, text + "\n")
                .with_context(|| format!("{}: cannot write run description", run_file.display()))?;
            let f = std::fs::File::create(p).with_context(|| format!("{}: cannot create trace", p.display()))?;
            Some(std::io::BufWriter::new(f))
        }
        None => None,
    };
    let bar = if a.json || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(a.steps);
        b.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} steps  {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        b
    };
    let trace_path = a.trace.clone().unwrap_or_default();
    let mut last_acc = String::new();
    let summary = trainer.run(a.steps, |t, r| {
        if let Some(dir) =
            a.save_checkpoint.as_ref().filter(|_| a.checkpoint_every > 0 && r.step % a.checkpoint_every == 0)
        {
            t.checkpoint().save(&dir.join(format!("step-{:06}", r.step)))?;
        }
        if let Some(w) = trace.as_mut() {
            let line = serde_json::to_string(r).expect("record serialises");
            // Flushed per record: a crash loses at most the step in flight.
            writeln!(w, "{line}")
                .and_then(|()| w.flush())
                .map_err(|error| faultline_train::TrainError::Io { file: trace_path.clone(), error })?;
        }
        if let Some(t) = r.test_accuracy {
            last_acc = format!("  test acc {:.1}%", 100.0 * t);
        }
        bar.set_message(format!("loss {:.4}{last_acc}", r.loss));
        bar.inc(1);
        Ok(())
    })?;
    bar.finish_and_clear();
    if let Some(mut w) = trace {
        w.flush().with_context(|| format!("{}: cannot write trace", trace_path.display()))?;
    }
    if let Some(dir) = &a.save_checkpoint {
        trainer.checkpoint().save(dir)?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    let phases: Vec<String> = faultline_graph::Phase::ALL
        .iter()
        .map(|p| format!("{} {}", p.name(), summary.phase_cycles.get(p.name()).copied().unwrap_or(0)))
        .collect();
    println!(
        "trained {} on {} ({}, {} MXU inputs, {} lr {}, batch {}): {} steps in {:.2} s",
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
    println!(
        "loss {first:.4} -> {:.4}, test accuracy {:.1}% ({} samples)",
        summary.final_loss,
        100.0 * summary.test_accuracy,
        trainer.data.test.len()
    );
    println!(
        "cycles/step {} ({}) = {:.1} us at {} MHz; the graph's static estimate is {}",
        summary.cycles_per_step,
        phases.join(", "),
        summary.simulated_seconds_per_step * 1e6,
        hw.clock_mhz,
        summary.estimated_cycles_per_step
    );
    if let Some(p) = &a.trace {
        println!("trace: {}", p.display());
    }
    if let Some(p) = &a.save_checkpoint {
        println!("checkpoint: {}", p.display());
    }
    Ok(())
}

/// `<trace>.run.json` beside the trace, e.g. `traces/golden.run.json` for `traces/golden.jsonl`.
fn run_description_path(trace: &std::path::Path) -> PathBuf {
    let stem = trace.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "trace".into());
    trace.with_file_name(format!("{stem}.run.json"))
}

/// Everything a trace depends on, resolved: the command line, the model, the machine as
/// executed (with the `--precision` override applied), the optimizer with its learning rate,
/// the data and the seeds. A trace plus this file is a reproducible result.
fn run_description(a: &TrainArgs, spec: &ModelSpec, t: &Trainer) -> serde_json::Value {
    serde_json::json!({
        "faultline_version": env!("CARGO_PKG_VERSION"),
        "command": std::env::args().collect::<Vec<_>>(),
        "model_file": a.model,
        "model": spec,
        "hw_config_file": a.config,
        "hw": t.exec.hw,
        "optimizer": t.exec.tg.optimizer,
        "batch": t.options.batch,
        "precision": t.options.precision.name(),
        "mode": if t.options.mode == ExecMode::CycleLevel { "cycle" } else { "functional" },
        "seed": t.options.seed,
        "eval_every": t.options.eval_every,
        "init_weights": a.init_weights,
        "resumed_from": a.resume,
        "data": {
            "dir": a.data,
            "name": t.data.train.name,
            "train_samples": t.data.train.len(),
            "test_samples": t.data.test.len(),
        },
    })
}
