//! The simulated accelerator at register granularity.
//!
//! The machine and its vocabulary:
//! * [`config`]: the hardware description (RON), validated on load.
//! * [`fault`]: the fault vocabulary: every injectable bit, addressable as a [`fault::FaultSite`]
//!   with a stable text form, and fault events applied at the clock's commit boundary.
//! * [`isa`]: the instruction set (GEMM, VPU and DMA instructions; addressing views, conv
//!   geometry), what one instruction costs and how it executes.
//!
//! The units, each a folder with its closed-form schedule, functional twin, stepped model and
//! checked entry points in files of their own:
//! * [`mxu`]: the systolic matrix unit, stepped clock by clock, plus its bit-exact functional twin.
//! * [`vpu`]: the vector unit (elementwise ops, reductions, optimizer updates), lane registers
//!   stepped clock by clock, plus its functional twin.
//!
//! The memory path and whole ops:
//! * [`memory`]: unified buffer, accumulator SRAM, weight buffer and DRAM as word arrays, with a
//!   functional (peek/poke) and a timed, fault-seeing (read/write) access path; [`memory::dma`],
//!   DRAM <-> SRAM transfer costs and the DMA address registers.
//! * [`timing`]: whole-op cycle accounting as SCALE-Sim times an op (tile pipeline, double
//!   buffering, stalls, overlap).
//! * [`kernel`]: one op described on its own (matmul, conv2d, relu, softmax, adam) and its
//!   whole-op tile timing; running it is a program's job (`faultline_train::kernel`).
//!
//! Around the machine:
//! * [`protect`]: [`protect::ecc`] (parity and Hsiao SEC-DED codes protecting SRAM words and
//!   registers) and [`protect::abft`] (exact-checksum ABFT for int8 GEMMs, Li et al. 2021).
//! * [`interop`]: [`interop::scalesim`], SCALE-Sim's run configs and topologies read as they
//!   are, and its counts; [`interop::scalesim_reports`], its three reports of a run.
//! * [`budget`]: host-memory limits checked before allocating.
//! * [`files`]: reads of regular files only, each bounded; one writer per output directory.
//! * [`error`], [`matrix`]: the crate's errors and its bit matrix; `fuzz` (feature `fuzzing`):
//!   input mutations for the parser tests.
//!
//! **Architecture invariant:** this crate knows nothing of graphs, training or campaigns. It
//! executes hardware operations on raw bits and reports cycles; callers decide what they mean.

#![warn(missing_docs)]

pub mod budget;
pub mod config;
pub mod error;
pub mod fault;
pub mod files;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod interop;
pub mod isa;
pub mod kernel;
pub mod matrix;
pub mod memory;
pub mod mxu;
pub mod protect;
pub mod timing;
pub mod vpu;

pub use config::{Dataflow, HwConfig, MxuConfig, PlacementConfig, WordChoice};
pub use error::{ConfigError, HwError};
pub use fault::{FaultEvent, FaultSchedule, FaultSite, Register, SiteClass, SiteKind, Unit};
pub use matrix::Matrix;

/// How an operation is executed. Both give identical bits when no fault is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ExecMode {
    /// Compute results directly with the same accumulation order and rounding (fast).
    Functional,
    /// Step every register one clock at a time (faults can be injected).
    CycleLevel,
}
