//! One training step as one graph: forward, loss, backward, optimizer update.

use crate::error::GraphError;
use crate::graph::OpGraph;
use crate::op::{Op, Phase};
use crate::spec::ModelSpec;
use crate::tensor::Tensor;
use petgraph::graph::NodeIndex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The optimizer whose update nodes end the step graph.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum OptimizerSpec {
    /// `w -= lr * g`.
    Sgd {
        /// Learning rate.
        lr: f64,
    },
    /// Heavy ball: `v = momentum * v + g; w -= lr * v`.
    Momentum {
        /// Learning rate.
        lr: f64,
        /// Momentum coefficient, e.g. 0.9.
        momentum: f64,
    },
    /// Adam with bias correction (needs the `step` placeholder, 1-based).
    Adam {
        /// Learning rate, e.g. 1e-3.
        lr: f64,
        /// First-moment decay, e.g. 0.9.
        beta1: f64,
        /// Second-moment decay, e.g. 0.999.
        beta2: f64,
        /// Denominator epsilon, e.g. 1e-8.
        eps: f64,
    },
    /// AdamW: Adam with decoupled weight decay `w *= 1 - lr * weight_decay` on every parameter
    /// of rank 2 or more (weight matrices and tables; not biases or normalisation gains, as
    /// GPT training does). Reads the learning rate from memory (the `lr` placeholder).
    AdamW {
        /// Learning rate, e.g. 1e-3.
        lr: f64,
        /// First-moment decay, e.g. 0.9.
        beta1: f64,
        /// Second-moment decay, e.g. 0.999.
        beta2: f64,
        /// Denominator epsilon, e.g. 1e-8.
        eps: f64,
        /// Decoupled weight decay, e.g. 0.1.
        weight_decay: f64,
    },
}

impl OptimizerSpec {
    /// The heavy-ball coefficient `--optimizer momentum` uses.
    pub const MOMENTUM: f64 = 0.9;
    /// Adam's first-moment decay (Kingma and Ba's default, as every framework's).
    pub const ADAM_BETA1: f64 = 0.9;
    /// Adam's second-moment decay.
    pub const ADAM_BETA2: f64 = 0.999;
    /// Adam's denominator epsilon.
    pub const ADAM_EPS: f64 = 1e-8;

    /// AdamW's weight decay (GPT-2's and GPT-3's, as nanoGPT uses).
    pub const ADAMW_WEIGHT_DECAY: f64 = 0.1;

    /// Momentum with learning rate `lr` and coefficient [`OptimizerSpec::MOMENTUM`].
    pub const fn momentum(lr: f64) -> OptimizerSpec {
        OptimizerSpec::Momentum { lr, momentum: Self::MOMENTUM }
    }

    /// Adam with learning rate `lr` and the default decays and epsilon.
    pub const fn adam(lr: f64) -> OptimizerSpec {
        OptimizerSpec::Adam { lr, beta1: Self::ADAM_BETA1, beta2: Self::ADAM_BETA2, eps: Self::ADAM_EPS }
    }

    /// AdamW with learning rate `lr`, Adam's defaults and [`OptimizerSpec::ADAMW_WEIGHT_DECAY`].
    pub const fn adamw(lr: f64) -> OptimizerSpec {
        OptimizerSpec::AdamW {
            lr,
            beta1: Self::ADAM_BETA1,
            beta2: Self::ADAM_BETA2,
            eps: Self::ADAM_EPS,
            weight_decay: Self::ADAMW_WEIGHT_DECAY,
        }
    }

    /// The learning rate.
    pub const fn lr(&self) -> f64 {
        match *self {
            OptimizerSpec::Sgd { lr }
            | OptimizerSpec::Momentum { lr, .. }
            | OptimizerSpec::Adam { lr, .. }
            | OptimizerSpec::AdamW { lr, .. } => lr,
        }
    }
}

/// How a parameter is initialised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Uniform in `[-limit, limit]` (Glorot: `limit = sqrt(6 / (fan_in + fan_out))`).
    Uniform {
        /// Half-width of the interval.
        limit: f64,
    },
}

/// A trainable parameter and the nodes that read, differentiate and update it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamInfo {
    /// Name, `<layer>.<role>`: `fc1.weight`, `fc1.bias`, `ln1.gamma`, `pos.table`, ...
    pub name: String,
    /// Layer it belongs to.
    pub layer: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Initialisation.
    pub init: Init,
    /// The `Op::Param` placeholder.
    pub node: NodeIndex,
    /// The node holding `dL/dparam` (phase backward).
    pub grad: NodeIndex,
    /// The node holding the updated value (phase update); write it back after the step.
    pub next: NodeIndex,
}

/// One state tensor that is not a parameter: an optimizer's (zero at step 1), or a
/// BatchNorm layer's running statistic (mean zero, variance one at step 1).
#[derive(Debug, Clone, PartialEq)]
pub struct OptStateInfo {
    /// Name, `<param>.momentum`, `<param>.adam_m`, `<param>.adam_v`, or `<layer>.running_mean`
    /// and `<layer>.running_var`.
    pub name: String,
    /// The parameter it belongs to (the layer, for running statistics).
    pub param: String,
    /// Shape (that of the parameter; `[C]` for running statistics).
    pub shape: Vec<usize>,
    /// Its value before the first step: `Zeros`, or `Ones` for a running variance.
    pub init: Init,
    /// The `Op::OptState` placeholder.
    pub node: NodeIndex,
    /// The node holding the updated value (phase update); write it back after the step.
    pub next: NodeIndex,
}

/// A training step: `graph` in insertion (= topological) order computes forward, loss, backward
/// and update. The executor binds the placeholders by name (`input`, `labels`, `step`, every
/// parameter and optimizer-state name), runs every node, then copies each `next` node's value
/// into its parameter / state for the following step.
#[derive(Debug, Clone)]
pub struct TrainGraph {
    /// Model name.
    pub model: String,
    /// Batch size the graph was built for.
    pub batch: usize,
    /// The optimizer.
    pub optimizer: OptimizerSpec,
    /// All nodes.
    pub graph: OpGraph,
    /// `input` placeholder, `[batch, ...spec.input]`.
    pub input: NodeIndex,
    /// `labels` placeholder, `[batch, outputs]` (one-hot for classification).
    pub labels: NodeIndex,
    /// `step` placeholder `[1]` (1-based), present only for Adam and AdamW.
    pub step: Option<NodeIndex>,
    /// `lr` placeholder `[1]`, the step's learning rate: present with a schedule or AdamW.
    pub lr: Option<NodeIndex>,
    /// The learning-rate schedule (the model's).
    pub schedule: Option<crate::spec::Schedule>,
    /// The gradients' summed squares (`[1]`) when the step clips them: the squared global
    /// gradient norm, as the machine computed it.
    pub grad_sumsq: Option<NodeIndex>,
    /// Each attention layer's logits (`q k^T / sqrt(d)`, before the mask and softmax): what
    /// the LLM-training studies watch for spikes.
    pub attention_logits: Vec<NodeIndex>,
    /// Model output (logits or predictions), `[batch, outputs]`.
    pub output: NodeIndex,
    /// The scalar loss `[1]`.
    pub loss: NodeIndex,
    /// Parameters, in layer order.
    pub params: Vec<ParamInfo>,
    /// Optimizer state, in parameter order.
    pub opt_state: Vec<OptStateInfo>,
    /// Checks computed beside training ([`crate::checks`]), in the order they were added.
    pub(crate) checks: Vec<crate::checks::Check>,
    /// Clamps feeding training ([`crate::checks`]), in the order they were added.
    pub(crate) clamps: Vec<crate::checks::Clamp>,
}

impl TrainGraph {
    /// Builds the step graph of `spec` for a batch size and optimizer.
    pub fn build(spec: &ModelSpec, batch: usize, optimizer: OptimizerSpec) -> Result<TrainGraph, GraphError> {
        crate::build::build(spec, batch, optimizer)
    }

    /// The learning rate of step `t` (1-based): the optimizer's, times the schedule's factor.
    pub fn lr_at(&self, t: u64) -> f64 {
        self.optimizer.lr() * self.schedule.map_or(1.0, |s| s.factor(t))
    }

    /// Parameters with names, shapes, initialisation and nodes.
    pub fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    /// Total number of trainable scalars.
    pub fn param_count(&self) -> usize {
        self.params.iter().map(|p| p.shape.iter().product::<usize>()).sum()
    }

    /// The node order to execute (topological).
    pub fn topo_order(&self) -> Result<Vec<NodeIndex>, GraphError> {
        self.graph.topo_order()
    }

    /// Deterministic initial values of every parameter and optimizer-state tensor, by name.
    /// Parameter `i` (in `params` order) draws from ChaCha8 seeded with `seed`, stream `i`.
    pub fn initial_state(&self, seed: u64) -> BTreeMap<String, Tensor> {
        let mut out = BTreeMap::new();
        for (i, p) in self.params.iter().enumerate() {
            let n: usize = p.shape.iter().product();
            let data = match p.init {
                Init::Zeros => vec![0.0; n],
                Init::Ones => vec![1.0; n],
                Init::Uniform { limit } => {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed);
                    rng.set_stream(i as u64);
                    (0..n).map(|_| rng.gen_range(-limit..=limit)).collect()
                }
            };
            out.insert(p.name.clone(), Tensor { shape: p.shape.clone(), data });
        }
        for s in &self.opt_state {
            let t = Tensor::zeros(&s.shape);
            let data = if s.init == Init::Ones { vec![1.0; t.data.len()] } else { t.data };
            out.insert(s.name.clone(), Tensor { data, ..t });
        }
        out
    }

    /// Copies each `next` value of `values` (from a finished step) into `state` by name.
    pub fn apply_updates(&self, values: &crate::reference::Values, state: &mut BTreeMap<String, Tensor>) {
        let pairs =
            self.params.iter().map(|p| (&p.name, p.next)).chain(self.opt_state.iter().map(|s| (&s.name, s.next)));
        for (name, next) in pairs {
            if let Some(v) = values.get(next) {
                state.insert(name.clone(), v.clone());
            }
        }
    }

    /// A human-readable table: parameters (name, shape, count) and node counts per phase.
    pub fn summary(&self) -> String {
        let mut s = format!("model {} (batch {}, optimizer {:?})\n", self.model, self.batch, self.optimizer);
        s += &format!("{:<24} {:<16} {:>8}\n", "parameter", "shape", "count");
        for p in &self.params {
            s += &format!("{:<24} {:<16} {:>8}\n", p.name, format!("{:?}", p.shape), p.shape.iter().product::<usize>());
        }
        s += &format!("{:<24} {:<16} {:>8}\n", "total", "", self.param_count());
        for ph in Phase::ALL {
            s += &format!("{ph} nodes: {}\n", self.nodes_in_phase(ph).len());
        }
        s
    }

    /// Nodes of one phase, in execution order.
    pub fn nodes_in_phase(&self, phase: Phase) -> Vec<NodeIndex> {
        self.graph.indices().filter(|&i| self.graph.node(i).phase == phase).collect()
    }

    /// Whether a node runs on the MXU (matmul) rather than the VPU or as a free view.
    pub fn is_mxu(&self, i: NodeIndex) -> bool {
        matches!(self.graph.node(i).op, Op::MatMul { .. })
    }
}
