//! One op on its own ([`faultline_hw::kernel::KernelSpec`]: a matmul, a convolution, a ReLU, a softmax
//! or an Adam update) as a graph, so that `faultline op` lowers, places, schedules and runs it
//! exactly as a training step runs the same op: one program, one executor, one fault path.

use crate::error::GraphError;
use crate::graph::OpGraph;
use crate::op::{Op, Phase, Window};
use crate::program::Program;
use faultline_hw::kernel::KernelSpec;
use petgraph::graph::NodeIndex;

/// The graph of one op: its inputs as placeholders, in [`KernelSpec::input_lens`] order, and its
/// outputs, in [`KernelSpec::output_lens`] order.
#[derive(Debug, Clone)]
pub struct KernelGraph {
    /// The op's nodes.
    pub graph: OpGraph,
    /// The input placeholders.
    pub inputs: Vec<NodeIndex>,
    /// The step placeholder of an Adam update, with its value `t`.
    pub step: Option<(NodeIndex, u32)>,
    /// The nodes whose values are the op's outputs.
    pub outputs: Vec<NodeIndex>,
}

impl KernelGraph {
    /// The graph of `spec` (checked first: a shape [`KernelSpec::check`] refuses is an error naming
    /// the op). A convolution is an im2col and a matmul, its output `[N*OH*OW, C_out]`.
    pub fn of(spec: &KernelSpec) -> Result<KernelGraph, GraphError> {
        spec.check().map_err(|e| GraphError::Invalid {
            file: "<op>".into(),
            node: spec.describe(),
            message: e.to_string(),
        })?;
        let mut g = OpGraph::new("<op>");
        let layer = "op";
        let input = |g: &mut OpGraph, op: Op, name: &str, shape: Vec<usize>| {
            g.placeholder(op, name, layer, Phase::Forward, shape)
        };
        let fwd = |g: &mut OpGraph, op: Op, name: &str, ins: &[NodeIndex]| g.add(op, name, layer, Phase::Forward, ins);
        let (inputs, step, outputs) = match *spec {
            KernelSpec::Matmul { m, k, n } => {
                let a = input(&mut g, Op::Input, "a", vec![m, k])?;
                let w = input(&mut g, Op::Param, "w", vec![k, n])?;
                let out = fwd(&mut g, Op::MatMul { trans_a: false, trans_b: false }, "out", &[a, w])?;
                (vec![a, w], None, vec![out])
            }
            KernelSpec::Conv2d(c) => {
                let x = input(&mut g, Op::Input, "x", vec![c.batch, c.h, c.w, c.c_in])?;
                let w = input(&mut g, Op::Param, "w", vec![c.kh * c.kw * c.c_in, c.c_out])?;
                let window = Window { kh: c.kh, kw: c.kw, stride: c.stride, padding: c.pad };
                let cols = fwd(&mut g, Op::Im2Col { window }, "cols", &[x])?;
                let out = fwd(&mut g, Op::MatMul { trans_a: false, trans_b: false }, "out", &[cols, w])?;
                (vec![x, w], None, vec![out])
            }
            KernelSpec::Relu { n } => {
                let x = input(&mut g, Op::Input, "x", vec![n])?;
                (vec![x], None, vec![fwd(&mut g, Op::Relu, "out", &[x])?])
            }
            KernelSpec::Softmax { rows, cols } => {
                let x = input(&mut g, Op::Input, "x", vec![rows, cols])?;
                (vec![x], None, vec![fwd(&mut g, Op::Softmax, "out", &[x])?])
            }
            KernelSpec::Adam { n, lr, b1, b2, eps, t } => {
                let p = input(&mut g, Op::Param, "p", vec![n])?;
                let grad = input(&mut g, Op::Input, "g", vec![n])?;
                let m = input(&mut g, Op::OptState, "m", vec![n])?;
                let v = input(&mut g, Op::OptState, "v", vec![n])?;
                let s = input(&mut g, Op::Step, "step", vec![1])?;
                let (beta1, beta2) = (f64::from(b1), f64::from(b2));
                let m2 = fwd(&mut g, Op::AdamMoment { beta: beta1 }, "m.next", &[m, grad])?;
                let v2 = fwd(&mut g, Op::AdamSecondMoment { beta: beta2 }, "v.next", &[v, grad])?;
                let update = Op::AdamUpdate { lr: f64::from(lr), beta1, beta2, eps: f64::from(eps) };
                let p2 = fwd(&mut g, update, "p.next", &[p, m2, v2, s])?;
                (vec![p, grad, m, v], Some((s, t)), vec![p2, m2, v2])
            }
        };
        Ok(KernelGraph { graph: g, inputs, step, outputs })
    }

    /// The op lowered to a program (unplaced), its outputs kept.
    pub fn program(&self) -> Result<Program, GraphError> {
        Ok(Program::lower(&self.graph, &self.graph.topo_order()?, &self.outputs))
    }
}
