//! Lowering: where each node runs (MXU, VPU or nowhere) and a cycle-approximate step schedule.
//!
//! # Cost model
//! * `MatMul` -> [`HwOp::Gemm`]: cycles from [`faultline_hw::mxu::gemm_timing`] (the MXU's own
//!   fold schedule), times the batch count for rank-3 matmuls. Transposed operands are assumed to
//!   be laid out transposed by the loader (no extra cycles). Convolutions reach the MXU as
//!   `Im2Col` + `MatMul`.
//! * Everything else that computes -> [`HwOp::Vpu`]: the node is decomposed into VPU
//!   instructions ([`vpu_program`]) and costs the sum of [`faultline_hw::vpu::timing`] over them
//!   (so lanes, pipeline depth and reduction trees come from `cfg.vpu`).
//! * Placeholders and reshapes -> [`HwOp::View`]: no cycles (a reshape reinterprets row-major
//!   data in place; placeholders are resident).
//! * Nodes run one after another (no MXU/VPU overlap, no DMA time: operands are assumed
//!   resident on chip); the step is the sum.

use crate::op::{Op, Phase};
use crate::train_graph::TrainGraph;
use crate::{NodeIndex, OpGraph};
use faultline_hw::mxu::gemm_timing;
use faultline_hw::vpu::{self, Axis, VpuOp};
use faultline_hw::HwConfig;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// Hardware work of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum HwOp {
    /// No work: placeholders and reshapes.
    View,
    /// `count` independent GEMMs `[m, k] x [k, n]` on the MXU.
    Gemm {
        /// Output rows.
        m: usize,
        /// Reduction length.
        k: usize,
        /// Output columns.
        n: usize,
        /// Number of GEMMs (batch of a rank-3 matmul; 1 otherwise).
        count: usize,
    },
    /// A sequence of VPU instructions ([`vpu_program`]).
    Vpu {
        /// Elements of the largest instruction (the node's main tensor).
        elements: usize,
        /// Number of instruction issues.
        passes: u64,
    },
}

/// One instruction of an op's VPU cost decomposition: `op` on `elements` elements, `count` times.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VpuInstr {
    /// The vector-unit instruction (its timing is [`faultline_hw::vpu::timing`]).
    pub op: VpuOp,
    /// Elements per issue (`n` of the instruction).
    pub elements: usize,
    /// Issues (e.g. one per batch element for a per-example reduction).
    pub count: usize,
}

fn ins(op: VpuOp, elements: usize) -> VpuInstr {
    VpuInstr { op, elements, count: 1 }
}

/// The VPU instructions a node costs, in issue order (empty for MXU and view nodes).
///
/// `n` is the node's element count, `D` its last dimension and `R = n / D` its rows.
/// Broadcast operands are assumed to be replicated by the load path (no instructions).
/// The VPU has no `log` or `tanh`: `log` is costed as one `Exp`, and `tanh(u)` as
/// `1 - 2 / (exp(2u) + 1)`. This is the cost model, not a bit-exact program: the executor is
/// free to compute an op differently as long as it meets [`crate::Op`]'s semantics.
pub fn vpu_program(g: &OpGraph, i: NodeIndex) -> Vec<VpuInstr> {
    use VpuOp::*;
    let node = g.node(i);
    let n: usize = node.shape.iter().product();
    let input = |k: usize| -> &[usize] { &g.node(node.inputs[k]).shape };
    let n_in: usize = node.inputs.first().map_or(n, |_| input(0).iter().product());
    let d_in = node.inputs.first().map_or(1, |_| *input(0).last().unwrap_or(&1)).max(1);
    let rows = n_in / d_in;
    let row_sum = |e: usize, cols: usize| ins(ReduceSum { cols, axis: Axis::Row }, e);
    let row_max = |e: usize, cols: usize| ins(ReduceMax { cols, axis: Axis::Row }, e);
    // (x - mean) * rstd over rows of `d_in`: two row sums, centre, square, rsqrt, scale.
    let normalise = |eps: f32| {
        vec![
            row_sum(n_in, d_in),
            ins(MulScalar(1.0 / d_in as f32), rows),
            ins(Sub, n_in),
            ins(Mul, n_in),
            row_sum(n_in, d_in),
            ins(MulScalar(1.0 / d_in as f32), rows),
            ins(AddScalar(eps), rows),
            ins(Rsqrt, rows),
            ins(Mul, n_in),
        ]
    };
    let softmax = || {
        vec![row_max(n_in, d_in), ins(Sub, n_in), ins(Exp, n_in), row_sum(n_in, d_in), ins(Recip, rows), ins(Mul, n_in)]
    };
    // tanh(u) = 1 - 2 / (exp(2u) + 1)
    let tanh = |e: usize| {
        vec![
            ins(MulScalar(2.0), e),
            ins(Exp, e),
            ins(AddScalar(1.0), e),
            ins(Recip, e),
            ins(MulScalar(-2.0), e),
            ins(AddScalar(1.0), e),
        ]
    };
    let gelu_inner = |e: usize| {
        let mut p =
            vec![ins(Mul, e), ins(Mul, e), ins(MulScalar(0.044715), e), ins(Add, e), ins(MulScalar(0.797_884_6), e)];
        p.extend(tanh(e));
        p
    };
    match &node.op {
        Op::Input | Op::Label | Op::Step | Op::Param | Op::OptState | Op::Reshape { .. } | Op::MatMul { .. } => vec![],
        Op::Im2Col { .. } => vec![ins(Copy, n)],
        Op::Col2Im { .. } => vec![ins(Add, n_in)],
        Op::BiasAdd | Op::Add => vec![ins(Add, n)],
        Op::RowScale | Op::Mul => vec![ins(Mul, n)],
        Op::Scale { factor } => vec![ins(MulScalar(*factor as f32), n)],
        Op::SumToShape { .. } => vec![ins(ReduceSum { cols: n.max(1), axis: Axis::Col }, n_in)],
        Op::Relu => vec![ins(Relu, n)],
        Op::ReluGrad => vec![ins(ReluGrad, n)],
        Op::Gelu => {
            let mut p = gelu_inner(n);
            p.extend([ins(AddScalar(1.0), n), ins(Mul, n), ins(MulScalar(0.5), n)]);
            p
        }
        Op::GeluGrad => {
            // 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), times dy
            let mut p = gelu_inner(n);
            p.extend([
                ins(Mul, n),
                ins(MulScalar(-1.0), n),
                ins(AddScalar(1.0), n),
                ins(Mul, n),
                ins(MulScalar(3.0 * 0.044715), n),
                ins(AddScalar(1.0), n),
                ins(Mul, n),
                ins(Mul, n),
                ins(MulScalar(0.5 * 0.797_884_6), n),
                ins(Add, n),
                ins(Mul, n),
            ]);
            p
        }
        Op::Softmax => softmax(),
        Op::SoftmaxGrad => vec![ins(Mul, n), row_sum(n, d_in), ins(Sub, n), ins(Mul, n)],
        Op::LayerNorm { eps } => normalise(*eps as f32),
        Op::LayerNormGrad { eps } => {
            let mut p = normalise(*eps as f32);
            p.extend([
                row_sum(n, d_in),
                ins(MulScalar(1.0 / d_in as f32), rows),
                ins(Mul, n),
                row_sum(n, d_in),
                ins(MulScalar(1.0 / d_in as f32), rows),
                ins(Mul, n),
                ins(Sub, n),
                ins(Sub, n),
                ins(Mul, n),
            ]);
            p
        }
        Op::MeanPool => {
            let (b, t, d) = (input(0)[0], input(0)[1], input(0)[2]);
            vec![
                VpuInstr { op: ReduceSum { cols: d, axis: Axis::Col }, elements: t * d, count: b },
                ins(MulScalar(1.0 / t as f32), n),
            ]
        }
        Op::MeanPoolGrad { len } => vec![ins(MulScalar(1.0 / *len as f32), n_in), ins(Copy, n)],
        Op::SoftmaxCrossEntropy => {
            // max, z - max, exp, sum, log (as Exp), + max, z - lse, * y, total
            vec![
                row_max(n_in, d_in),
                ins(Sub, n_in),
                ins(Exp, n_in),
                row_sum(n_in, d_in),
                ins(Exp, rows),
                ins(Add, rows),
                ins(Sub, n_in),
                ins(Mul, n_in),
                row_sum(n_in, n_in),
                ins(MulScalar(-1.0 / rows as f32), 1),
            ]
        }
        Op::SoftmaxCrossEntropyGrad => {
            let mut p = softmax();
            p.extend([row_sum(n, d_in), ins(Mul, n), ins(Sub, n), ins(MulScalar(1.0 / rows as f32), n)]);
            p
        }
        Op::Mse => vec![ins(Sub, n_in), ins(Mul, n_in), row_sum(n_in, n_in), ins(MulScalar(1.0 / n_in as f32), 1)],
        Op::MseGrad => vec![ins(Sub, n), ins(MulScalar(2.0 / n as f32), n)],
        Op::SgdUpdate { lr } => vec![ins(Sgd { lr: *lr as f32 }, n)],
        Op::MomentumVelocity { momentum } => vec![ins(MulScalar(*momentum as f32), n), ins(Add, n)],
        Op::AdamMoment { beta } => {
            vec![ins(MulScalar(*beta as f32), n), ins(MulScalar(1.0 - *beta as f32), n), ins(Add, n)]
        }
        Op::AdamSecondMoment { beta } => {
            vec![ins(Mul, n), ins(MulScalar(*beta as f32), n), ins(MulScalar(1.0 - *beta as f32), n), ins(Add, n)]
        }
        Op::AdamUpdate { lr, eps, .. } => {
            // m / c1, v / c2, sqrt (rsqrt + recip), + eps, divide, * lr, w - that
            vec![
                ins(MulScalar(1.0), n),
                ins(MulScalar(1.0), n),
                ins(Rsqrt, n),
                ins(Recip, n),
                ins(AddScalar(*eps as f32), n),
                ins(Recip, n),
                ins(Mul, n),
                ins(Sgd { lr: *lr as f32 }, n),
            ]
        }
    }
}

/// The hardware work of node `i` of `g`.
pub fn lower(g: &OpGraph, i: NodeIndex) -> HwOp {
    let node = g.node(i);
    if let Op::MatMul { trans_a, .. } = &node.op {
        let a = &g.node(node.inputs[0]).shape;
        let r = a.len();
        let k = if *trans_a { a[r - 2] } else { a[r - 1] };
        let s = &node.shape;
        let count = if r == 3 { s[0] } else { 1 };
        return HwOp::Gemm { m: s[s.len() - 2], k, n: s[s.len() - 1], count };
    }
    let prog = vpu_program(g, i);
    if prog.is_empty() {
        return HwOp::View;
    }
    let elements = prog.iter().map(|p| p.elements).max().unwrap_or(0);
    HwOp::Vpu { elements, passes: prog.iter().map(|p| p.count as u64).sum() }
}

/// Cycles of node `i` of `g` on `cfg`: MXU fold schedule for GEMMs, the sum of
/// [`faultline_hw::vpu::timing`] over [`vpu_program`] otherwise.
pub fn node_cycles(g: &OpGraph, i: NodeIndex, cfg: &HwConfig) -> u64 {
    match lower(g, i) {
        HwOp::View => 0,
        HwOp::Gemm { m, k, n, count } => {
            if m == 0 || k == 0 || n == 0 {
                0
            } else {
                gemm_timing(&cfg.mxu, m, k, n).total_cycles * count as u64
            }
        }
        HwOp::Vpu { .. } => {
            vpu_program(g, i).iter().map(|p| vpu::timing(cfg, &p.op, p.elements.max(1)).cycles * p.count as u64).sum()
        }
    }
}

/// Cost of one node in the schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeCost {
    /// The node.
    #[serde(skip)]
    pub node: NodeIndex,
    /// Node name.
    pub name: String,
    /// Layer.
    pub layer: String,
    /// Phase.
    pub phase: Phase,
    /// Op name.
    pub op: &'static str,
    /// Lowered work.
    pub hw: HwOp,
    /// First cycle (step-relative).
    pub start: u64,
    /// Cycles.
    pub cycles: u64,
}

/// Cycle-approximate timing of one training step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepSchedule {
    /// Hardware config name.
    pub hw: String,
    /// Clock in MHz (for [`StepSchedule::seconds`]).
    pub clock_mhz: f64,
    /// Every node, in execution order.
    pub nodes: Vec<NodeCost>,
    /// Cycles per phase.
    pub per_phase: BTreeMap<Phase, u64>,
    /// Cycles per layer.
    pub per_layer: BTreeMap<String, u64>,
    /// Cycles per layer and phase (layers with no work in a phase are absent).
    pub per_layer_phase: BTreeMap<String, BTreeMap<Phase, u64>>,
    /// Cycles spent on the MXU.
    pub mxu_cycles: u64,
    /// Cycles spent on the VPU.
    pub vpu_cycles: u64,
    /// Cycles of the whole step.
    pub total_cycles: u64,
}

/// Schedules a step graph on `cfg`: nodes back to back in graph order.
pub fn schedule(tg: &TrainGraph, cfg: &HwConfig) -> StepSchedule {
    schedule_graph(&tg.graph, cfg)
}

/// [`schedule`] for any op graph.
pub fn schedule_graph(g: &OpGraph, cfg: &HwConfig) -> StepSchedule {
    let mut s = StepSchedule {
        hw: cfg.name.clone(),
        clock_mhz: cfg.clock_mhz,
        nodes: Vec::with_capacity(g.len()),
        per_phase: Phase::ALL.iter().map(|&p| (p, 0)).collect(),
        per_layer: BTreeMap::new(),
        per_layer_phase: BTreeMap::new(),
        mxu_cycles: 0,
        vpu_cycles: 0,
        total_cycles: 0,
    };
    for i in g.indices() {
        let node = g.node(i);
        let hw = lower(g, i);
        let c = node_cycles(g, i, cfg);
        match hw {
            HwOp::Gemm { .. } => s.mxu_cycles += c,
            HwOp::Vpu { .. } => s.vpu_cycles += c,
            HwOp::View => {}
        }
        *s.per_phase.entry(node.phase).or_default() += c;
        *s.per_layer.entry(node.layer.clone()).or_default() += c;
        if c > 0 {
            *s.per_layer_phase.entry(node.layer.clone()).or_default().entry(node.phase).or_default() += c;
        }
        s.nodes.push(NodeCost {
            node: i,
            name: node.name.clone(),
            layer: node.layer.clone(),
            phase: node.phase,
            op: node.op.name(),
            hw,
            start: s.total_cycles,
            cycles: c,
        });
        s.total_cycles += c;
    }
    s
}

impl StepSchedule {
    /// Wall time of the step at the configured clock.
    pub fn seconds(&self) -> f64 {
        self.total_cycles as f64 / (self.clock_mhz * 1e6)
    }

    /// One CSV row per node: `name,layer,phase,op,unit,m,k,n,count,elements,passes,start,cycles`.
    pub fn to_csv(&self) -> String {
        let mut out = String::from("name,layer,phase,op,unit,m,k,n,count,elements,passes,start,cycles\n");
        for n in &self.nodes {
            let hw = match n.hw {
                HwOp::View => "view,,,,,,".to_string(),
                HwOp::Gemm { m, k, n, count } => format!("mxu,{m},{k},{n},{count},,"),
                HwOp::Vpu { elements, passes } => format!("vpu,,,,,{elements},{passes}"),
            };
            out += &format!("{},{},{},{},{hw},{},{}\n", n.name, n.layer, n.phase, n.op, n.start, n.cycles);
        }
        out
    }
}

impl fmt::Display for StepSchedule {
    /// A summary: per-phase and per-layer cycles and the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |c: u64| if self.total_cycles == 0 { 0.0 } else { 100.0 * c as f64 / self.total_cycles as f64 };
        writeln!(f, "step schedule on {} ({} MHz)", self.hw, self.clock_mhz)?;
        writeln!(f, "{:<12} {:>12} {:>7}", "phase", "cycles", "share")?;
        for (p, &c) in &self.per_phase {
            writeln!(f, "{:<12} {:>12} {:>6.1}%", p.name(), c, pct(c))?;
        }
        writeln!(
            f,
            "{:<12} {:>12} {:>7} {:>10} {:>10} {:>10}",
            "layer", "cycles", "share", "forward", "backward", "update"
        )?;
        for (l, &c) in &self.per_layer {
            let ph = |p: Phase| self.per_layer_phase.get(l).and_then(|m| m.get(&p)).copied().unwrap_or(0);
            writeln!(
                f,
                "{:<12} {:>12} {:>6.1}% {:>10} {:>10} {:>10}",
                l,
                c,
                pct(c),
                ph(Phase::Forward),
                ph(Phase::Backward),
                ph(Phase::Update)
            )?;
        }
        writeln!(f, "mxu {} cycles, vpu {} cycles", self.mxu_cycles, self.vpu_cycles)?;
        write!(f, "total {} cycles = {:.3} us", self.total_cycles, self.seconds() * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelSpec, OptimizerSpec};

    #[test]
    fn vpu_programs_are_well_formed_for_the_shipped_models() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let opt = OptimizerSpec::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        for m in ["mlp-digits.ron", "cnn-small.ron", "transformer-tiny.ron"] {
            let tg = TrainGraph::build(&ModelSpec::load(dir.join(m)).unwrap(), 4, opt).unwrap();
            for i in tg.graph.indices() {
                let node = tg.graph.node(i);
                let prog = vpu_program(&tg.graph, i);
                assert_eq!(
                    prog.is_empty(),
                    matches!(lower(&tg.graph, i), HwOp::View | HwOp::Gemm { .. }),
                    "{}",
                    node.name
                );
                for p in prog {
                    assert!(p.elements >= 1 && p.count >= 1, "{}", node.name);
                    if let VpuOp::ReduceSum { cols, .. } | VpuOp::ReduceMax { cols, .. } = p.op {
                        assert!(cols >= 1 && p.elements % cols == 0, "{}: {p:?}", node.name);
                    }
                }
            }
        }
    }
}
