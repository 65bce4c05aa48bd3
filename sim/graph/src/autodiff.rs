//! Reverse-mode autodiff: appends the backward nodes of a scalar loss to the graph.
//!
//! Every backward node is tagged `Phase::Backward` and the layer of the forward node it serves.
//! Gradients of a node with several consumers are summed with `Add` nodes.

use crate::error::GraphError;
use crate::graph::OpGraph;
use crate::op::{Op, Phase};
use petgraph::graph::NodeIndex;
use std::collections::BTreeMap;

/// Adds the gradient of `loss` (a `SoftmaxCrossEntropy` or `Mse` node) with respect to each node
/// of `wrt`, returning the gradient node of each (same order).
pub fn backward(g: &mut OpGraph, loss: NodeIndex, wrt: &[NodeIndex]) -> Result<Vec<NodeIndex>, GraphError> {
    // Which nodes depend on a `wrt` node (only those need gradients).
    let mut needs = vec![false; g.len()];
    for &w in wrt {
        needs[w.index()] = true;
    }
    for i in g.indices() {
        if g.node(i).inputs.iter().any(|j| needs[j.index()]) {
            needs[i.index()] = true;
        }
    }
    let mut contribs: BTreeMap<NodeIndex, Vec<NodeIndex>> = BTreeMap::new();
    let order: Vec<NodeIndex> = g.indices().filter(|i| i.index() <= loss.index()).collect();
    for &y in order.iter().rev() {
        if !needs[y.index()] || g.node(y).inputs.is_empty() {
            continue;
        }
        let dy = if y == loss {
            None
        } else {
            match contribs.remove(&y) {
                Some(c) => Some(sum(g, y, c)?),
                None => continue, // does not reach the loss
            }
        };
        let node = g.node(y).clone();
        for (slot, &x) in node.inputs.iter().enumerate() {
            if !needs[x.index()] {
                continue;
            }
            if let Some(d) = rule(g, y, dy, slot)? {
                contribs.entry(x).or_default().push(d);
            }
        }
    }
    wrt.iter()
        .map(|&w| match contribs.remove(&w) {
            Some(c) => sum(g, w, c),
            None => Err(GraphError::Invalid {
                file: g.file.clone(),
                node: g.node(w).name.clone(),
                message: "does not affect the loss (no gradient path)".into(),
            }),
        })
        .collect()
}

/// The total gradient of `x` from its contributions.
fn sum(g: &mut OpGraph, x: NodeIndex, c: Vec<NodeIndex>) -> Result<NodeIndex, GraphError> {
    let mut acc = c[0];
    if c.len() > 1 {
        let (name, layer) = (format!("d/{}", g.node(x).name), g.node(x).layer.clone());
        for &d in &c[1..] {
            let n = g.fresh_name(&name);
            acc = g.add(Op::Add, &n, &layer, Phase::Backward, &[acc, d])?;
        }
    }
    Ok(acc)
}

/// The contribution to `d loss / d input[slot]` of node `y`, given `dy` (None for the loss);
/// `None` where the op passes no gradient to that input (batch statistics, whose effect the
/// gradient of batch normalisation with respect to `x` includes; token ids).
fn rule(g: &mut OpGraph, y: NodeIndex, dy: Option<NodeIndex>, slot: usize) -> Result<Option<NodeIndex>, GraphError> {
    match (&g.node(y).op, slot) {
        (Op::BatchNorm { .. }, 1..=4) | (Op::BatchMean | Op::BatchVar | Op::ColSum | Op::OneHot, _) => Ok(None),
        (Op::BatchNorm { eps }, _) => {
            let eps = *eps;
            let dy = dy.expect("BatchNorm is not a loss");
            let ins = g.node(y).inputs.clone();
            // `dgamma` and `dbeta` hold the two column sums `dx` needs: made once, read by all.
            let [dgamma, dbeta] = ["gamma", "beta"].map(|what| format!("d/{}:{what}", g.node(y).name));
            let (phase, layer) = (Phase::Backward, g.node(y).layer.clone());
            let dgamma = match g.find(&dgamma) {
                Some(d) => d,
                None => g.add(Op::BatchNormGammaGrad { eps }, &dgamma, &layer, phase, &[ins[0], ins[1], ins[2], dy])?,
            };
            let dbeta = match g.find(&dbeta) {
                Some(d) => d,
                None => g.add(Op::ColSum, &dbeta, &layer, phase, &[dy])?,
            };
            Ok(Some(match slot {
                5 => dgamma,
                6 => dbeta,
                _ => {
                    let name = g.fresh_name(&format!("d/{}:x", g.node(y).name));
                    let grad_ins = [ins[0], ins[1], ins[2], ins[5], dy, dgamma, dbeta];
                    g.add(Op::BatchNormGrad { eps }, &name, &layer, phase, &grad_ins)?
                }
            }))
        }
        _ => contribution(g, y, dy, slot).map(Some),
    }
}

/// [`rule`] for an input that receives a gradient.
fn contribution(g: &mut OpGraph, y: NodeIndex, dy: Option<NodeIndex>, slot: usize) -> Result<NodeIndex, GraphError> {
    let node = g.node(y).clone();
    let ins = node.inputs.clone();
    let x = ins[slot];
    let xs = g.node(x).shape.clone();
    let file = g.file.clone();
    let not_diff =
        |why: &str| GraphError::Invalid { file: file.clone(), node: node.name.clone(), message: why.to_string() };
    let add = |g: &mut OpGraph, op: Op, what: &str, inputs: &[NodeIndex]| {
        let n = g.fresh_name(&format!("d/{}:{what}", node.name));
        g.add(op, &n, &node.layer, Phase::Backward, inputs)
    };
    let Some(dy) = dy else {
        return match (&node.op, slot) {
            (Op::SoftmaxCrossEntropy, 0) => add(g, Op::SoftmaxCrossEntropyGrad, "logits", &ins),
            (Op::Mse, 0) => add(g, Op::MseGrad, "pred", &ins),
            (Op::Mse, _) => {
                let d = add(g, Op::MseGrad, "pred", &ins)?;
                add(g, Op::Scale { factor: -1.0 }, "target", &[d])
            }
            (Op::SoftmaxCrossEntropy, _) => Err(not_diff("gradient with respect to the labels is not supported")),
            _ => Err(not_diff("the loss must be a SoftmaxCrossEntropy or Mse node")),
        };
    };
    let other = |s: usize| ins[s];
    match &node.op {
        Op::MatMul { trans_a: ta, trans_b: tb } => {
            let (ta, tb) = (*ta, *tb);
            let (a, b) = (other(0), other(1));
            // C = A'B' with A' = op(A): dA' = dC B'^T, dB' = A'^T dC, transposed back if needed.
            if slot == 0 {
                let (op, i) = if ta {
                    (Op::MatMul { trans_a: tb, trans_b: true }, [b, dy])
                } else {
                    (Op::MatMul { trans_a: false, trans_b: !tb }, [dy, b])
                };
                add(g, op, "a", &i)
            } else {
                let (op, i) = if tb {
                    (Op::MatMul { trans_a: true, trans_b: ta }, [dy, a])
                } else {
                    (Op::MatMul { trans_a: !ta, trans_b: false }, [a, dy])
                };
                add(g, op, "b", &i)
            }
        }
        Op::Im2Col { window } => add(g, Op::Col2Im { window: *window, image: xs }, "x", &[dy]),
        Op::Col2Im { window, .. } => add(g, Op::Im2Col { window: *window }, "x", &[dy]),
        Op::Reshape { .. } => add(g, Op::Reshape { shape: xs }, "x", &[dy]),
        Op::SwapAxes => add(g, Op::SwapAxes, "x", &[dy]),
        Op::BiasAdd if slot == 0 => Ok(dy),
        Op::BiasAdd => add(g, Op::SumToShape { shape: xs }, "b", &[dy]),
        Op::RowScale if slot == 0 => add(g, Op::RowScale, "x", &[dy, other(1)]),
        Op::RowScale => {
            let p = add(g, Op::Mul, "x_dy", &[other(0), dy])?;
            add(g, Op::SumToShape { shape: xs }, "g", &[p])
        }
        Op::Add => Ok(dy),
        Op::Mul => add(g, Op::Mul, if slot == 0 { "a" } else { "b" }, &[dy, other(1 - slot)]),
        Op::Scale { factor } => add(g, Op::Scale { factor: *factor }, "x", &[dy]),
        Op::Relu => add(g, Op::ReluGrad, "x", &[x, dy]),
        Op::Gelu => add(g, Op::GeluGrad, "x", &[x, dy]),
        Op::Silu => add(g, Op::SiluGrad, "x", &[x, dy]),
        Op::RmsNorm { eps } => add(g, Op::RmsNormGrad { eps: *eps }, "x", &[x, dy]),
        Op::Softmax => add(g, Op::SoftmaxGrad, "x", &[y, dy]),
        Op::LayerNorm { eps } => add(g, Op::LayerNormGrad { eps: *eps }, "x", &[x, dy]),
        Op::MeanPool => add(g, Op::MeanPoolGrad { len: xs[1] }, "x", &[dy]),
        Op::MaxPool { window } => add(g, Op::MaxPoolGrad { window: *window }, "x", &[x, y, dy]),
        Op::AvgPool { window } => add(g, Op::AvgPoolGrad { window: *window, image: xs }, "x", &[dy]),
        op => Err(not_diff(&format!("op `{}` has no gradient rule (only forward ops and the loss do)", op.name()))),
    }
}
