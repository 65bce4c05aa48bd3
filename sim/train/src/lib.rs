//! Training on the simulated accelerator: the executor half of Faultline.
//!
//! * [`exec`]: interprets a step's program (`faultline_graph::Program`: GEMMs on the MXU with
//!   bf16 or fp32 inputs and fp32 accumulation, everything else as VPU instructions) in
//!   `Functional` or `CycleLevel` mode with identical bits, with an optional fault injected
//!   into one or more instructions and its effect on the first one's outputs it corrupts
//!   reported.
//! * [`golden`]: a fault-free step kept whole, from which a faulted run of the same step starts
//!   at the first instruction its fault reaches (and a masked register fault ends after its
//!   last).
//! * [`inject`]: the fault path, from a fault on the training clock (step, cycle within the
//!   step) to the reads, folds and vectors it changes: register faults resolved to the
//!   instructions they hit, memory, weight-buffer and DMA faults to the words they change
//!   ([`inject::memory`], GEMMs fold by fold in [`inject::gemm_fold`]), sequencer faults to
//!   the fold loops they change ([`inject::sequencer`]); a step's injection space
//!   ([`inject::space`]).
//! * [`kernel`]: one op (`faultline op`) lowered, placed and run by the executor with the
//!   same fault path, on the op's own clock.
//! * [`trainer`]: the loop (batches, steps, evaluation on the held-out split, per-step
//!   records, summary), optimizer choice and run options.
//! * [`state`]: parameters and optimizer state, initialised from a seed or `.npy` files.
//! * [`checkpoint`]: exact save/restore of weights, optimizer state, data-order RNG and step.
//! * [`data`]: the data a run trains on: in-memory datasets, seeded splits and minibatch order
//!   ([`data::dataset`]), the shipped datasets ([`data::digits`], [`data::synth`]), `.npy` and
//!   MNIST IDX readers ([`data::npy`], [`data::idx`]) and which data a run uses
//!   ([`data::source`]).
//! * [`trace`]: the per-step JSONL trace (resumable) and the run description beside it.
//! * [`setup`]: a run set up in named steps (options, graph, memory check, data, trainer) and
//!   run with its trace and checkpoints.
//!
//! ```no_run
//! use faultline_train::{data::source, TrainOptions, Trainer};
//! let spec = faultline_graph::ModelSpec::load("models/mlp-digits.ron")?;
//! let hw = faultline_hw::HwConfig::load("configs/tpu-32x32.ron")?;
//! let mut t = Trainer::new(&spec, &hw, source::shipped(&spec, 1, &Default::default())?, TrainOptions::default())?;
//! let summary = t.run(200, |_, record| Ok(println!("{}", record.loss)))?;
//! println!("test accuracy {}", summary.test_accuracy);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Architecture invariant:** this crate decides how graph values map onto machine formats
//! and registers; it knows no fault models or campaigns. A step's cycles are those of the
//! instructions it issues, from the machine's schedules, so they are the same in every mode and
//! equal, instruction for instruction, to the program's schedule; values never depend on mode.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
pub mod error;
pub mod exec;
pub mod golden;
pub mod inject;
pub mod kernel;
pub mod setup;
pub mod state;
pub mod trace;
pub mod trainer;

pub use checkpoint::{Checkpoint, DataIdentity, RunIdentity};
pub use data::dataset::{Batcher, BatcherState, Dataset, Split};
pub use error::{Result, TrainError};
pub use exec::{Effect, Executor, Injection, MxuFormat, StepOutput};
pub use golden::GoldenStep;
pub use inject::{InjectionReport, StepFault};
pub use setup::{RunFlags, TrainSetup};
pub use state::{ModelState, Tensor32};
pub use trace::{RunDescription, TraceWriter};
pub use trainer::{InitWeights, OptimizerKind, StepRecord, Summary, TrainOptions, TrainState, Trainer, MAX_STEPS};
