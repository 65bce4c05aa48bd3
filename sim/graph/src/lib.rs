//! The training-step graph: op IR, RON models, reverse-mode autodiff, optimizer nodes, lowering.
//!
//! # Using it (what an executor needs)
//! ```no_run
//! use faultline_graph::{ModelSpec, OptimizerSpec, TrainGraph, Tensor, reference, program};
//! let spec = ModelSpec::load("models/mlp-digits.ron")?;
//! let tg = TrainGraph::build(&spec, 32, OptimizerSpec::Sgd { lr: 0.1 })?;
//! let mut state = tg.initial_state(7);            // params + optimizer state, by name
//! let mut feeds = state.clone();
//! feeds.insert("input".into(), Tensor::zeros(&[32, 64]));
//! feeds.insert("labels".into(), Tensor::one_hot(&[0; 32], 10));
//! // (Adam graphs also need feeds["step"] = [t], t starting at 1.)
//! let values = reference::eval(&tg.graph, &feeds)?;   // f64 golden model of every node
//! let loss = values.get(tg.loss).unwrap().data[0];
//! tg.apply_updates(&values, &mut state);            // params/state for the next step
//! let hw = faultline_hw::HwConfig::load("configs/tpu-32x32.ron").unwrap();
//! let sched = program::schedule(&tg, &hw)?;          // cycles per instruction / node / phase
//! # Ok::<(), faultline_graph::GraphError>(())
//! ```
//! * Walk `tg.graph.indices()` (insertion order is topological) or `tg.topo_order()`; each
//!   [`Node`] has `op`, `name`, `layer`, `phase`, `shape`, `inputs`. Placeholders (`Op::Input`,
//!   `Label`, `Step`, `Param`, `OptState`) are bound by node name.
//! * [`Op`] documents every op's exact semantics; layouts are row-major, images NHWC, matmul
//!   `[M, K] x [K, N]` with optional transposes (rank 3 = batch of independent matmuls).
//! * [`Program::step`] lowers the step to machine instructions (GEMMs on the MXU, VPU
//!   instructions for everything else, reshapes free) over a buffer table; its
//!   [`Program::schedule`] is the step's cost, and the executor interprets the same program.
//!
//! **Architecture invariant:** this crate knows shapes, values in f64 and cycle estimates; it
//! does not know machine number formats, fault sites or datasets. The executor (`train`) decides
//! how an op maps onto registers; this crate only promises the maths.

#![warn(missing_docs)]

pub mod autodiff;
mod build;
pub mod checks;
pub mod direct;
pub mod error;
pub mod graph;
pub mod kernel;
pub mod op;
pub mod program;
pub mod reference;
pub mod residency;
pub mod spec;
pub mod tensor;
pub mod touch;
pub mod train_graph;

pub use error::GraphError;
pub use graph::{Node, OpGraph};
pub use op::{Mode, Op, Phase, Window};
pub use petgraph::graph::NodeIndex;
pub use program::{Program, StepSchedule};
pub use spec::{LayerOp, LayerSpec, LossSpec, ModelSpec};
pub use tensor::Tensor;
pub use train_graph::{Init, OptStateInfo, OptimizerSpec, ParamInfo, TrainGraph};
