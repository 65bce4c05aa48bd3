//! Fault-injection campaigns during training: one hardware fault per trial, in a named bit at a
//! chosen time of a training run, and what it did to training (or, for inference campaigns, to
//! the predictions of the trained model on a test batch).
//!
//! * [`spec`]: the campaign file (`configs/campaign-*.ron`);
//! * [`model`]: fault models (flips, multi-bit upsets, stuck-ats) and the bits a fault strikes;
//! * [`sample`]: the (bit, cycle, step) space and the deterministic trial plan;
//! * [`outcome`]: He et al.'s outcome taxonomy and the thresholds that separate outcomes, and
//!   the inference outcomes (SDC, DUE);
//! * [`campaign`]: the golden run, trials in parallel, resumable and sharded output, merge;
//! * [`record`]: the schema of the files a campaign writes, and the summary;
//! * [`store`]: a campaign directory on disk: one writer, records identified by campaign,
//!   bounded reads, resume and merge;
//! * [`stats`]: Wilson intervals and stratified estimates;
//! * [`abft_trials`]: random flips of one GEMM with ABFT checksums (`faultline gemm --abft --trials`);
//! * [`replay`]: one trial replayed at cycle level, golden and faulty registers cycle by cycle
//!   (what `faultline vcd` writes).
//!
//! **Architecture invariant:** this crate decides what to inject and how to judge it; how a
//! fault acts on the machine is `train` and `hw`'s business. Records are a function of the spec
//! and the trial id alone: threads, shards and resumption never change a byte.

#![warn(missing_docs)]

pub mod abft_trials;
pub mod campaign;
pub mod error;
pub mod explore;
pub mod model;
pub mod outcome;
pub mod plan;
pub mod protect;
pub mod record;
pub mod replay;
pub mod sample;
pub mod spec;
pub mod stats;
pub mod store;

pub use campaign::{Campaign, Progress, RunOptions, Shard, TrialMode, TrialTime};
pub use error::{FaultError, Result};
pub use outcome::{Outcome, Thresholds};
pub use record::{Summary, TrialRecord};
pub use spec::CampaignSpec;
pub use store::merge;
