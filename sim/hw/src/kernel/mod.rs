//! One op described on its own ([`KernelSpec`]: a matmul, a convolution, a ReLU, a softmax or an
//! Adam update) and its whole-op tile timing ([`timing()`]), the cost model the SCALE-Sim
//! comparison uses (`faultline scalesim`, [`crate::interop::scalesim`]).
//!
//! `faultline op` does not run the op here: it lowers it to a program and runs it through the
//! training executor (`faultline_graph::kernel`, `faultline_train::kernel`), so an op's memory
//! layout, schedule and fault path are a training step's. This module only names the op and
//! times its tiles as SCALE-Sim does.
//!
//! One concern per file: `spec.rs` (the vocabulary, [`KernelSpec`] and [`ConvShape`]) and
//! `plan.rs` (the tiling and its costs from the shapes alone: [`timing()`],
//! [`timing_host_bytes`]).
//!
//! # Tiles and timing
//!
//! Matmul/conv2d tiles are the MXU folds of [`crate::mxu::Schedule`]; tile 0 loads the
//! activations and its weights, tile `f` loads its weight tile, occupancy = the schedule's fold
//! period, latency = fold start to its last accumulator write + 1 (WS: `M + R + nc`, OS: the
//! period), release (weight slot reusable) = WS `R + C - 1`, OS `K + C - 1`. An output tile is
//! stored from the accumulator once complete (WS: after the last K fold of an N tile; OS: after
//! each fold). VPU tiles are chunks of `B` UB slots of `(inputs + outputs) * chunk` words each:
//! load the inputs, run ([`crate::vpu::timing`]; softmax is `ReduceMax, Sub, Exp, ReduceSum,
//! Recip, Mul` back to back), store the outputs. See [`crate::timing`] for the pipeline and
//! [`crate::memory::dma`] for transfer costs.

mod plan;
mod spec;

pub use plan::{timing, timing_host_bytes};
pub use spec::{ConvShape, KernelSpec};
