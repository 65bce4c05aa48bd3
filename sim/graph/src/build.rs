//! Builds the step graph of a [`ModelSpec`]: layers to forward nodes, loss, autodiff, optimizer.

use crate::autodiff;
use crate::error::GraphError;
use crate::graph::OpGraph;
use crate::op::{Op, Phase, Window};
use crate::spec::{LayerOp, LayerSpec, LossSpec, ModelSpec};
use crate::train_graph::{Init, OptStateInfo, OptimizerSpec, ParamInfo, TrainGraph};
use petgraph::graph::NodeIndex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

struct Param {
    name: String,
    layer: String,
    shape: Vec<usize>,
    init: Init,
    node: NodeIndex,
}

struct Builder<'a> {
    g: OpGraph,
    layer: &'a LayerSpec,
    params: &'a mut Vec<Param>,
    running: &'a mut Vec<Running>,
    /// Attention logits, in layer order.
    logits: &'a mut Vec<NodeIndex>,
}

/// A BatchNorm layer's running statistic: its placeholder, the batch statistic it follows and
/// how (`scale` turns the batch's population variance into the unbiased one).
struct Running {
    name: String,
    layer: String,
    shape: Vec<usize>,
    init: Init,
    node: NodeIndex,
    batch: NodeIndex,
    scale: f64,
    momentum: f64,
}

impl Builder<'_> {
    fn file(&self) -> PathBuf {
        self.g.file.clone()
    }

    fn op(&mut self, op: Op, what: &str, inputs: &[NodeIndex]) -> Result<NodeIndex, GraphError> {
        let name = format!("{}.{what}", self.layer.name);
        self.g.add(op, &name, &self.layer.name, Phase::Forward, inputs)
    }

    fn param(&mut self, role: &str, shape: Vec<usize>, init: Init) -> Result<NodeIndex, GraphError> {
        let name = format!("{}.{role}", self.layer.name);
        let node = self.g.placeholder(Op::Param, &name, &self.layer.name, Phase::Forward, shape.clone())?;
        self.params.push(Param { name, layer: self.layer.name.clone(), shape, init, node });
        Ok(node)
    }

    /// A running statistic `<layer>.<role>` of `[c]` that follows `batch` times `scale`.
    fn running(
        &mut self,
        role: &str,
        c: usize,
        init: Init,
        batch: NodeIndex,
        scale: f64,
        momentum: f64,
    ) -> Result<NodeIndex, GraphError> {
        let name = format!("{}.{role}", self.layer.name);
        let node = self.g.placeholder(Op::OptState, &name, &self.layer.name, Phase::Forward, vec![c])?;
        let layer = self.layer.name.clone();
        self.running.push(Running { name, layer, shape: vec![c], init, node, batch, scale, momentum });
        Ok(node)
    }

    fn shape(&self, i: NodeIndex) -> Vec<usize> {
        self.g.node(i).shape.clone()
    }

    fn shape_err(&self, expected: String, found: &[usize]) -> GraphError {
        GraphError::Shape {
            file: self.file(),
            node: self.layer.name.clone(),
            op: layer_kind(&self.layer.op).into(),
            expected,
            found: format!("{found:?}"),
        }
    }

    fn invalid(&self, message: String) -> GraphError {
        GraphError::Invalid { file: self.file(), node: self.layer.name.clone(), message }
    }

    /// A pooling layer's window over an NHWC input `xs`, checked.
    fn pool_window(
        &self,
        size: usize,
        stride: Option<usize>,
        padding: usize,
        xs: &[usize],
    ) -> Result<Window, GraphError> {
        let stride = stride.unwrap_or(size);
        if size == 0 || stride == 0 {
            return Err(self.invalid(format!("`size` ({size}) and `stride` ({stride}) must be >= 1")));
        }
        if xs.len() != 4 {
            return Err(self.shape_err("input [B, H, W, C] (NHWC)".into(), xs));
        }
        let window = Window { kh: size, kw: size, stride, padding };
        if window.output_hw(xs[1], xs[2]).is_none() {
            return Err(self.shape_err(format!("H, W >= {size} - 2*{padding}"), xs));
        }
        Ok(window)
    }

    /// Forward nodes of the layer; returns its output node.
    fn layer(&mut self, ins: &[NodeIndex]) -> Result<NodeIndex, GraphError> {
        let x = ins[0];
        let xs = self.shape(x);
        let glorot = |fan_in: usize, fan_out: usize| Init::Uniform {
            limit: (6.0 / fan_in.saturating_add(fan_out) as f64).sqrt(),
        };
        match self.layer.op.clone() {
            LayerOp::Dense { units, bias } => {
                if units == 0 {
                    return Err(self.invalid("Dense `units` must be >= 1".into()));
                }
                if xs.len() < 2 {
                    return Err(self.shape_err("input [B, .., K]".into(), &xs));
                }
                let k = xs[xs.len() - 1];
                let w = self.param("weight", vec![k, units], glorot(k, units))?;
                let mut y = if xs.len() == 2 {
                    self.op(Op::MatMul { trans_a: false, trans_b: false }, "matmul", &[x, w])?
                } else {
                    let rows = xs[..xs.len() - 1].iter().product();
                    let flat = self.op(Op::Reshape { shape: vec![rows, k] }, "flatten", &[x])?;
                    let mm = self.op(Op::MatMul { trans_a: false, trans_b: false }, "matmul", &[flat, w])?;
                    let mut out = xs[..xs.len() - 1].to_vec();
                    out.push(units);
                    self.op(Op::Reshape { shape: out }, "unflatten", &[mm])?
                };
                if bias {
                    let b = self.param("bias", vec![units], Init::Zeros)?;
                    y = self.op(Op::BiasAdd, "bias_add", &[y, b])?;
                }
                Ok(y)
            }
            LayerOp::Conv2d { filters, kernel, stride, padding, bias } => {
                if filters == 0 || kernel == 0 || stride == 0 {
                    return Err(self.invalid("Conv2d `filters`, `kernel` and `stride` must be >= 1".into()));
                }
                if xs.len() != 4 {
                    return Err(self.shape_err("input [B, H, W, C] (NHWC)".into(), &xs));
                }
                let window = Window { kh: kernel, kw: kernel, stride, padding };
                let Some((oh, ow)) = window.output_hw(xs[1], xs[2]) else {
                    return Err(self.shape_err(format!("H, W >= {kernel} - 2*{padding}"), &xs));
                };
                let fan_in = kernel * kernel * xs[3];
                let w = self.param("weight", vec![fan_in, filters], glorot(fan_in, filters))?;
                let cols = self.op(Op::Im2Col { window }, "im2col", &[x])?;
                let mm = self.op(Op::MatMul { trans_a: false, trans_b: false }, "matmul", &[cols, w])?;
                let y = self.op(Op::Reshape { shape: vec![xs[0], oh, ow, filters] }, "unflatten", &[mm])?;
                if !bias {
                    return Ok(y);
                }
                let b = self.param("bias", vec![filters], Init::Zeros)?;
                self.op(Op::BiasAdd, "bias_add", &[y, b])
            }
            LayerOp::MaxPool { size, stride } => {
                let window = self.pool_window(size, stride, 0, &xs)?;
                self.op(Op::MaxPool { window }, "max_pool", &[x])
            }
            LayerOp::AvgPool { size, stride, padding } => {
                let window = self.pool_window(size, stride, padding, &xs)?;
                self.op(Op::AvgPool { window }, "avg_pool", &[x])
            }
            LayerOp::GlobalAvgPool => {
                if xs.len() != 4 {
                    return Err(self.shape_err("input [B, H, W, C] (NHWC)".into(), &xs));
                }
                let pixels = self.op(Op::Reshape { shape: vec![xs[0], xs[1] * xs[2], xs[3]] }, "pixels", &[x])?;
                self.op(Op::MeanPool, "mean", &[pixels])
            }
            LayerOp::Relu => self.op(Op::Relu, "relu", &[x]),
            LayerOp::Gelu => self.op(Op::Gelu, "gelu", &[x]),
            LayerOp::Silu => self.op(Op::Silu, "silu", &[x]),
            LayerOp::RmsNorm { eps } => {
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(self.invalid(format!("RmsNorm `eps` = {eps}: must be a positive number")));
                }
                let d = *xs.last().unwrap_or(&0);
                let n = self.op(Op::RmsNorm { eps }, "normalize", &[x])?;
                let gamma = self.param("gamma", vec![d], Init::Ones)?;
                self.op(Op::RowScale, "scale", &[n, gamma])
            }
            LayerOp::Softmax => self.op(Op::Softmax, "softmax", &[x]),
            LayerOp::LayerNorm { eps } => {
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(self.invalid(format!("LayerNorm `eps` = {eps}: must be a positive number")));
                }
                let d = *xs.last().unwrap_or(&0);
                let n = self.op(Op::LayerNorm { eps }, "normalize", &[x])?;
                let gamma = self.param("gamma", vec![d], Init::Ones)?;
                let beta = self.param("beta", vec![d], Init::Zeros)?;
                let s = self.op(Op::RowScale, "scale", &[n, gamma])?;
                self.op(Op::BiasAdd, "shift", &[s, beta])
            }
            LayerOp::BatchNorm { eps, momentum } => {
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(self.invalid(format!("BatchNorm `eps` = {eps}: must be a positive number")));
                }
                if !(momentum > 0.0 && momentum <= 1.0) {
                    return Err(self.invalid(format!("BatchNorm `momentum` = {momentum}: must be in (0, 1]")));
                }
                if xs.len() < 2 {
                    return Err(self.shape_err("input [B, .., C]".into(), &xs));
                }
                let c = xs[xs.len() - 1];
                let rows: usize = xs[..xs.len() - 1].iter().product();
                if rows < 2 {
                    return Err(self.shape_err("at least 2 values per channel in a batch".into(), &xs));
                }
                let flat = self.op(Op::Reshape { shape: vec![rows, c] }, "rows", &[x])?;
                let mean = self.op(Op::BatchMean, "mean", &[flat])?;
                let var = self.op(Op::BatchVar, "var", &[flat, mean])?;
                let rm = self.running("running_mean", c, Init::Zeros, mean, 1.0, momentum)?;
                let unbiased = rows as f64 / (rows - 1) as f64;
                let rv = self.running("running_var", c, Init::Ones, var, unbiased, momentum)?;
                let gamma = self.param("gamma", vec![c], Init::Ones)?;
                let beta = self.param("beta", vec![c], Init::Zeros)?;
                let n = self.op(Op::BatchNorm { eps }, "normalize", &[flat, mean, var, rm, rv, gamma, beta])?;
                self.op(Op::Reshape { shape: xs.clone() }, "unflatten", &[n])
            }
            LayerOp::Flatten => {
                let rest: usize = xs[1..].iter().product();
                self.op(Op::Reshape { shape: vec![xs[0], rest] }, "flatten", &[x])
            }
            LayerOp::Reshape { shape } => {
                let mut s = vec![xs[0]];
                s.extend(shape);
                self.op(Op::Reshape { shape: s }, "reshape", &[x])
            }
            LayerOp::Add => self.op(Op::Add, "add", &[x, ins[1]]),
            LayerOp::Mul => self.op(Op::Mul, "mul", &[x, ins[1]]),
            LayerOp::Embedding { vocab, dim } => {
                if vocab == 0 || dim == 0 {
                    return Err(self.invalid(format!("Embedding `vocab` ({vocab}) and `dim` ({dim}) must be >= 1")));
                }
                let table = self.param("table", vec![vocab, dim], Init::Uniform { limit: 0.1 })?;
                let name = format!("{}.classes", self.layer.name);
                let values = (0..vocab).map(|c| c as f64).collect();
                let classes =
                    self.g.placeholder(Op::Const { values }, &name, &self.layer.name, Phase::Forward, vec![vocab])?;
                let rows: usize = xs.iter().product();
                let flat = self.op(Op::Reshape { shape: vec![rows] }, "ids", &[x])?;
                let onehot = self.op(Op::OneHot, "one_hot", &[flat, classes])?;
                let mm = self.op(Op::MatMul { trans_a: false, trans_b: false }, "lookup", &[onehot, table])?;
                let mut out = xs.clone();
                out.push(dim);
                self.op(Op::Reshape { shape: out }, "unflatten", &[mm])
            }
            LayerOp::TiedOutput { embedding } => {
                let name = format!("{embedding}.table");
                // Only an Embedding layer makes `<layer>.one_hot`.
                let table = self.g.find(&name).filter(|_| self.g.find(&format!("{embedding}.one_hot")).is_some());
                let table = table.ok_or_else(|| {
                    self.invalid(format!(
                        "TiedOutput `embedding` = {embedding:?}: no earlier Embedding layer of that name"
                    ))
                })?;
                let (vocab, dim) = (self.shape(table)[0], self.shape(table)[1]);
                if xs.last() != Some(&dim) {
                    return Err(self.shape_err(format!("input [B, .., {dim}] (the embedding's width)"), &xs));
                }
                let rows = xs[..xs.len() - 1].iter().product();
                let flat = self.op(Op::Reshape { shape: vec![rows, dim] }, "flatten", &[x])?;
                let mm = self.op(Op::MatMul { trans_a: false, trans_b: true }, "matmul", &[flat, table])?;
                let mut out = xs[..xs.len() - 1].to_vec();
                out.push(vocab);
                self.op(Op::Reshape { shape: out }, "unflatten", &[mm])
            }
            LayerOp::Positional => {
                if xs.len() != 3 {
                    return Err(self.shape_err("input [B, T, D]".into(), &xs));
                }
                let table = self.param("table", vec![xs[1], xs[2]], Init::Uniform { limit: 0.1 })?;
                self.op(Op::BiasAdd, "add", &[x, table])
            }
            LayerOp::Attention { heads, causal } => {
                let (ks, vs) = (self.shape(ins[1]), self.shape(ins[2]));
                if xs.len() != 3 {
                    return Err(self.shape_err("q: [B, T, D]".into(), &xs));
                }
                if ks != xs || vs != xs {
                    return Err(self.shape_err(format!("k, v: {xs:?} (same as q)"), if ks != xs { &ks } else { &vs }));
                }
                let (b, t, d) = (xs[0], xs[1], xs[2]);
                if heads == 0 || d % heads != 0 {
                    return Err(self.invalid(format!("Attention `heads` = {heads}: must divide the width {d}")));
                }
                let dh = d / heads;
                // [B, T, D] -> [B*H, T, dh]: each head a batch of its own for the MXU.
                let split = |s: &mut Self, x: NodeIndex, what: &str| -> Result<NodeIndex, GraphError> {
                    if heads == 1 {
                        return Ok(x);
                    }
                    let r = s.op(Op::Reshape { shape: vec![b, t, heads, dh] }, &format!("{what}_heads"), &[x])?;
                    let sw = s.op(Op::SwapAxes, &format!("{what}_split"), &[r])?;
                    s.op(Op::Reshape { shape: vec![b * heads, t, dh] }, &format!("{what}_batched"), &[sw])
                };
                let (q, k, v) = (split(self, x, "q")?, split(self, ins[1], "k")?, split(self, ins[2], "v")?);
                let scores = self.op(Op::MatMul { trans_a: false, trans_b: true }, "scores", &[q, k])?;
                let mut scaled = self.op(Op::Scale { factor: 1.0 / (dh as f64).sqrt() }, "scale", &[scores])?;
                self.logits.push(scaled);
                if causal {
                    // Position i attends to j <= i: -inf above the diagonal, so softmax gives 0.
                    let values = (0..t * t).map(|e| if e % t <= e / t { 0.0 } else { f64::NEG_INFINITY }).collect();
                    let name = format!("{}.mask", self.layer.name);
                    let mask = self.g.placeholder(
                        Op::Const { values },
                        &name,
                        &self.layer.name,
                        Phase::Forward,
                        vec![t, t],
                    )?;
                    scaled = self.op(Op::BiasAdd, "masked", &[scaled, mask])?;
                }
                let p = self.op(Op::Softmax, "softmax", &[scaled])?;
                let ctx = self.op(Op::MatMul { trans_a: false, trans_b: false }, "context", &[p, v])?;
                if heads == 1 {
                    return Ok(ctx);
                }
                let r = self.op(Op::Reshape { shape: vec![b, heads, t, dh] }, "context_heads", &[ctx])?;
                let sw = self.op(Op::SwapAxes, "merge", &[r])?;
                self.op(Op::Reshape { shape: xs.clone() }, "context_merged", &[sw])
            }
            LayerOp::MeanPool => self.op(Op::MeanPool, "mean_pool", &[x]),
        }
    }
}

/// Name of a layer kind for errors.
fn layer_kind(op: &LayerOp) -> &'static str {
    match op {
        LayerOp::Dense { .. } => "Dense",
        LayerOp::Conv2d { .. } => "Conv2d",
        LayerOp::Relu => "Relu",
        LayerOp::Gelu => "Gelu",
        LayerOp::Silu => "Silu",
        LayerOp::RmsNorm { .. } => "RmsNorm",
        LayerOp::Mul => "Mul",
        LayerOp::Softmax => "Softmax",
        LayerOp::LayerNorm { .. } => "LayerNorm",
        LayerOp::Flatten => "Flatten",
        LayerOp::Reshape { .. } => "Reshape",
        LayerOp::Add => "Add",
        LayerOp::Positional => "Positional",
        LayerOp::Embedding { .. } => "Embedding",
        LayerOp::TiedOutput { .. } => "TiedOutput",
        LayerOp::Attention { .. } => "Attention",
        LayerOp::MeanPool => "MeanPool",
        LayerOp::MaxPool { .. } => "MaxPool",
        LayerOp::AvgPool { .. } => "AvgPool",
        LayerOp::GlobalAvgPool => "GlobalAvgPool",
        LayerOp::BatchNorm { .. } => "BatchNorm",
    }
}

fn check_optimizer(file: &Path, o: &OptimizerSpec) -> Result<(), GraphError> {
    let bad = |message: String| GraphError::Invalid { file: file.to_path_buf(), node: "optimizer".into(), message };
    let (lr, extra): (f64, Vec<(&str, f64)>) = match *o {
        OptimizerSpec::Sgd { lr } => (lr, vec![]),
        OptimizerSpec::Momentum { lr, momentum } => (lr, vec![("momentum", momentum)]),
        OptimizerSpec::Adam { lr, beta1, beta2, eps } | OptimizerSpec::AdamW { lr, beta1, beta2, eps, .. } => {
            if !(eps.is_finite() && eps > 0.0) {
                return Err(bad(format!("eps = {eps}: must be a positive number")));
            }
            (lr, vec![("beta1", beta1), ("beta2", beta2)])
        }
    };
    if !(lr.is_finite() && lr > 0.0) {
        return Err(bad(format!("lr = {lr}: must be a positive number")));
    }
    if let OptimizerSpec::AdamW { weight_decay: wd, .. } = *o {
        if !(0.0..1.0).contains(&(lr * wd)) {
            return Err(bad(format!("weight_decay = {wd}: must be >= 0 with lr * weight_decay < 1")));
        }
    }
    for (name, v) in extra {
        if !(0.0..1.0).contains(&v) {
            return Err(bad(format!("{name} = {v}: must be in [0, 1)")));
        }
    }
    Ok(())
}

pub(crate) fn build(spec: &ModelSpec, batch: usize, optimizer: OptimizerSpec) -> Result<TrainGraph, GraphError> {
    let file = spec.file.clone();
    let invalid = |node: &str, message: String| GraphError::Invalid { file: file.clone(), node: node.into(), message };
    if batch == 0 {
        return Err(invalid("model", "batch size must be >= 1".into()));
    }
    if spec.layers.is_empty() {
        return Err(invalid("model", "no layers".into()));
    }
    if spec.input.is_empty() || spec.input.contains(&0) || spec.outputs == 0 {
        return Err(invalid(
            "model",
            format!("`input` {:?} and `outputs` {} must be non-empty and non-zero", spec.input, spec.outputs),
        ));
    }
    check_optimizer(&file, &optimizer)?;
    if let Some(c) = spec.clip_norm.filter(|c| !(c.is_finite() && *c > 0.0)) {
        return Err(invalid("clip_norm", format!("{c}: must be a positive number")));
    }
    if let Some(why) = spec.schedule.and_then(|s| s.invalid()) {
        return Err(invalid("schedule", why));
    }

    let mut g = OpGraph::new(file.clone());
    let mut shape = vec![batch];
    shape.extend(&spec.input);
    let input = g.placeholder(Op::Input, "input", "input", Phase::Forward, shape)?;
    let mut env: BTreeMap<String, NodeIndex> = BTreeMap::from([("input".to_string(), input)]);
    let mut params = Vec::new();
    let mut running = Vec::new();
    let mut attn_logits = Vec::new();
    let mut prev = input;
    // Names appear in errors, listings and traces: refuse what would print as more than one
    // token (shown escaped, so the error itself stays one line).
    let printable = |n: &str| !n.is_empty() && !n.chars().any(|c| c.is_control() || c.is_whitespace());
    let names =
        std::iter::once(&spec.name).chain(spec.layers.iter().flat_map(|l| std::iter::once(&l.name).chain(&l.inputs)));
    if let Some(bad) = names.into_iter().find(|n| !printable(n)) {
        return Err(invalid(
            &format!("{bad:?}"),
            "a model or layer name must be non-empty, without spaces or control characters".into(),
        ));
    }
    for layer in &spec.layers {
        if env.contains_key(&layer.name) || ["loss", "labels", "step", "lr", "clip"].contains(&layer.name.as_str()) {
            return Err(GraphError::Duplicate { file: file.clone(), node: layer.name.clone() });
        }
        let ins: Vec<NodeIndex> = if layer.inputs.is_empty() {
            vec![prev]
        } else {
            layer
                .inputs
                .iter()
                .map(|n| {
                    env.get(n).copied().ok_or_else(|| GraphError::UnknownInput {
                        file: file.clone(),
                        node: layer.name.clone(),
                        input: n.clone(),
                        known: env.keys().cloned().collect::<Vec<_>>().join(", "),
                    })
                })
                .collect::<Result<_, _>>()?
        };
        let want = match layer.op {
            LayerOp::Add | LayerOp::Mul => 2,
            LayerOp::Attention { .. } => 3,
            _ => 1,
        };
        if ins.len() != want {
            return Err(invalid(
                &layer.name,
                format!("{} takes {want} input(s), found {}", layer_kind(&layer.op), ins.len()),
            ));
        }
        let mut b = Builder { g, layer, params: &mut params, running: &mut running, logits: &mut attn_logits };
        let out = b.layer(&ins);
        g = b.g;
        prev = out?;
        env.insert(layer.name.clone(), prev);
    }
    let output = prev;
    let out_shape = g.node(output).shape.clone();
    // A language model has a label per position: its logits are scored as `[batch*T, outputs]`.
    let scored = match spec.loss {
        LossSpec::TokenCrossEntropy => vec![batch, spec.input[0], spec.outputs],
        _ => vec![batch, spec.outputs],
    };
    if out_shape != scored {
        let what = if scored.len() == 3 { "(batch, positions, outputs)" } else { "(batch, outputs)" };
        return Err(GraphError::Shape {
            file: file.clone(),
            node: g.node(output).layer.clone(),
            op: "model output".into(),
            expected: format!("{scored:?} {what}"),
            found: format!("{out_shape:?}"),
        });
    }
    let rows = scored[..scored.len() - 1].iter().product();
    let logits = if scored.len() == 3 {
        g.add(Op::Reshape { shape: vec![rows, spec.outputs] }, "logits", "loss", Phase::Forward, &[output])?
    } else {
        output
    };
    let labels = g.placeholder(Op::Label, "labels", "input", Phase::Forward, vec![rows, spec.outputs])?;
    let loss_op = match spec.loss {
        LossSpec::SoftmaxCrossEntropy | LossSpec::TokenCrossEntropy => Op::SoftmaxCrossEntropy,
        LossSpec::Mse => Op::Mse,
    };
    let loss = g.add(loss_op, "loss", "loss", Phase::Forward, &[logits, labels])?;
    let nodes: Vec<NodeIndex> = params.iter().map(|p| p.node).collect();
    let grads = autodiff::backward(&mut g, loss, &nodes)?;

    let step = match optimizer {
        OptimizerSpec::Adam { .. } | OptimizerSpec::AdamW { .. } => {
            Some(g.placeholder(Op::Step, "step", "input", Phase::Update, vec![1])?)
        }
        _ => None,
    };
    // The rate is data when it changes from step to step, or when AdamW's decay reads it.
    let lr = (spec.schedule.is_some() || matches!(optimizer, OptimizerSpec::AdamW { .. }))
        .then(|| g.placeholder(Op::LearningRate, "lr", "input", Phase::Update, vec![1]))
        .transpose()?;
    // Global-norm clipping: each gradient's squares summed, added up in parameter order, the
    // factor, and every gradient scaled by it before the optimizer reads it.
    let (grads_used, grad_sumsq) = match spec.clip_norm {
        None => (grads.clone(), None),
        Some(max_norm) => {
            let clip =
                |g: &mut OpGraph, op: Op, name: &str, ins: &[NodeIndex]| g.add(op, name, "clip", Phase::Update, ins);
            let mut total = None;
            for (p, &grad) in params.iter().zip(&grads) {
                let s = clip(&mut g, Op::SumSquares, &format!("{}.sumsq", p.name), &[grad])?;
                total = Some(match total {
                    None => s,
                    Some(t) => clip(&mut g, Op::Add, &format!("clip.sumsq.{}", p.name), &[t, s])?,
                });
            }
            let total = total.expect("a model has parameters");
            let coef = clip(&mut g, Op::ClipCoef { max_norm }, "clip.coef", &[total])?;
            let mut used = Vec::new();
            for (p, &grad) in params.iter().zip(&grads) {
                used.push(clip(&mut g, Op::ScaleBy, &format!("{}.clipped", p.name), &[grad, coef])?);
            }
            (used, Some(total))
        }
    };
    let mut infos = Vec::new();
    let mut opt_state = Vec::new();
    for ((p, &raw), &grad) in params.iter().zip(&grads).zip(&grads_used) {
        let state = |g: &mut OpGraph, role: &str| -> Result<(String, NodeIndex), GraphError> {
            let name = format!("{}.{role}", p.name);
            let node = g.placeholder(Op::OptState, &name, &p.layer, Phase::Update, p.shape.clone())?;
            Ok((name, node))
        };
        let upd =
            |g: &mut OpGraph, op: Op, name: &str, ins: &[NodeIndex]| g.add(op, name, &p.layer, Phase::Update, ins);
        let next_name = format!("{}.next", p.name);
        // With a data rate, SGD's step is `w - 1 * (lr g)`: the same rounding as `w - lr g`.
        let sgd = |g: &mut OpGraph, lr_const: f64, d: NodeIndex| match lr {
            Some(r) => {
                let scaled = upd(g, Op::ScaleBy, &format!("{}.lr_scaled", p.name), &[d, r])?;
                upd(g, Op::SgdUpdate { lr: 1.0 }, &next_name, &[p.node, scaled])
            }
            None => upd(g, Op::SgdUpdate { lr: lr_const }, &next_name, &[p.node, d]),
        };
        let next = match optimizer {
            OptimizerSpec::Sgd { lr } => sgd(&mut g, lr, grad)?,
            OptimizerSpec::Momentum { lr, momentum } => {
                let (name, v) = state(&mut g, "momentum")?;
                let v2 = upd(&mut g, Op::MomentumVelocity { momentum }, &format!("{name}.next"), &[v, grad])?;
                opt_state.push(OptStateInfo {
                    name,
                    param: p.name.clone(),
                    shape: p.shape.clone(),
                    init: Init::Zeros,
                    node: v,
                    next: v2,
                });
                sgd(&mut g, lr, v2)?
            }
            OptimizerSpec::Adam { lr: lr_const, beta1, beta2, eps }
            | OptimizerSpec::AdamW { lr: lr_const, beta1, beta2, eps, .. } => {
                let (mname, m) = state(&mut g, "adam_m")?;
                let (vname, v) = state(&mut g, "adam_v")?;
                let m2 = upd(&mut g, Op::AdamMoment { beta: beta1 }, &format!("{mname}.next"), &[m, grad])?;
                let v2 = upd(&mut g, Op::AdamSecondMoment { beta: beta2 }, &format!("{vname}.next"), &[v, grad])?;
                opt_state.push(OptStateInfo {
                    name: mname,
                    param: p.name.clone(),
                    shape: p.shape.clone(),
                    init: Init::Zeros,
                    node: m,
                    next: m2,
                });
                opt_state.push(OptStateInfo {
                    name: vname,
                    param: p.name.clone(),
                    shape: p.shape.clone(),
                    init: Init::Zeros,
                    node: v,
                    next: v2,
                });
                let t = step.expect("Adam graphs have a step placeholder");
                match lr {
                    None => upd(
                        &mut g,
                        Op::AdamUpdate { lr: lr_const, beta1, beta2, eps },
                        &next_name,
                        &[p.node, m2, v2, t],
                    )?,
                    Some(r) => {
                        let wd = match optimizer {
                            OptimizerSpec::AdamW { weight_decay, .. } if p.shape.len() >= 2 => weight_decay,
                            _ => 0.0,
                        };
                        let op = Op::AdamWUpdate { beta1, beta2, eps, weight_decay: wd };
                        upd(&mut g, op, &next_name, &[p.node, m2, v2, t, r])?
                    }
                }
            }
        };
        infos.push(ParamInfo {
            name: p.name.clone(),
            layer: p.layer.clone(),
            shape: p.shape.clone(),
            init: p.init,
            node: p.node,
            grad: raw,
            next,
        });
    }
    // Running statistics move towards the batch's: `r' = (1 - momentum) r + momentum b`, the
    // exponential average Adam's first moment is.
    for r in running {
        let upd =
            |g: &mut OpGraph, op: Op, name: &str, ins: &[NodeIndex]| g.add(op, name, &r.layer, Phase::Update, ins);
        let batch = if r.scale == 1.0 {
            r.batch
        } else {
            upd(&mut g, Op::Scale { factor: r.scale }, &format!("{}.unbiased", r.name), &[r.batch])?
        };
        let next =
            upd(&mut g, Op::AdamMoment { beta: 1.0 - r.momentum }, &format!("{}.next", r.name), &[r.node, batch])?;
        opt_state.push(OptStateInfo { name: r.name, param: r.layer, shape: r.shape, init: r.init, node: r.node, next });
    }
    Ok(TrainGraph {
        model: spec.name.clone(),
        batch,
        optimizer,
        graph: g,
        input,
        labels,
        step,
        lr,
        schedule: spec.schedule,
        grad_sumsq,
        attention_logits: attn_logits,
        output,
        loss,
        params: infos,
        opt_state,
        checks: Vec::new(),
        clamps: Vec::new(),
    })
}
