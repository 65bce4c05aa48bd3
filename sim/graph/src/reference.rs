//! The f64 reference interpreter: the exact maths of every [`Op`], on the host.
//!
//! It is the golden model for gradient checks and for the executor's f64 comparison; it is
//! written for clarity, not speed (models here are tiny).

use crate::error::GraphError;
use crate::graph::OpGraph;
use crate::op::{Mode, Op};
use crate::tensor::Tensor;
use petgraph::graph::NodeIndex;
use std::collections::BTreeMap;

/// The value of every node after evaluation, indexed by node.
#[derive(Debug, Clone, PartialEq)]
pub struct Values {
    values: Vec<Option<Tensor>>,
}

impl Values {
    /// Value of node `i` (`None` if it was not evaluated).
    pub fn get(&self, i: NodeIndex) -> Option<&Tensor> {
        self.values.get(i.index())?.as_ref()
    }

    /// Value of the node called `name` in `g`.
    pub fn by_name<'a>(&'a self, g: &OpGraph, name: &str) -> Option<&'a Tensor> {
        g.find(name).and_then(|i| self.get(i))
    }
}

/// Evaluates every node of `g` in order. `feeds` binds each placeholder by node name.
pub fn eval(g: &OpGraph, feeds: &BTreeMap<String, Tensor>) -> Result<Values, GraphError> {
    match g.indices().last() {
        Some(last) => eval_until(g, feeds, last),
        None => Ok(Values { values: vec![] }),
    }
}

/// Evaluates nodes `0..=last` only (e.g. `last = tg.loss` for forward + loss, no backward);
/// placeholders after `last` need no feed. A node that reads a later node (a clamp inserted
/// after the graph was built, [`crate::checks`]) has that node evaluated first.
pub fn eval_until(g: &OpGraph, feeds: &BTreeMap<String, Tensor>, last: NodeIndex) -> Result<Values, GraphError> {
    eval_in(g, feeds, last, Mode::Train)
}

/// [`eval_until`] in `mode`: [`Mode::Eval`] normalises with the running statistics
/// ([`Op::BatchNorm`]), as inference does.
pub fn eval_in(
    g: &OpGraph,
    feeds: &BTreeMap<String, Tensor>,
    last: NodeIndex,
    mode: Mode,
) -> Result<Values, GraphError> {
    let mut values: Vec<Option<Tensor>> = vec![None; g.len()];
    for i in g.indices().take_while(|i| i.index() <= last.index()) {
        eval_node(g, feeds, &mut values, i, mode)?;
    }
    Ok(Values { values })
}

/// Evaluates node `i` (and any input not evaluated yet) into `values`.
fn eval_node(
    g: &OpGraph,
    feeds: &BTreeMap<String, Tensor>,
    values: &mut [Option<Tensor>],
    i: NodeIndex,
    mode: Mode,
) -> Result<(), GraphError> {
    if values[i.index()].is_some() {
        return Ok(());
    }
    let node = g.node(i);
    let v = if let Op::Const { values } = &node.op {
        Tensor { shape: node.shape.clone(), data: values.clone() }
    } else if node.op.is_placeholder() {
        let kind = match node.op {
            Op::Input => "input",
            Op::Label => "label",
            Op::Step => "step",
            Op::Param => "parameter",
            _ => "optimizer state",
        };
        let t = feeds.get(&node.name).ok_or_else(|| GraphError::MissingValue {
            kind,
            name: node.name.clone(),
            expected: node.shape.clone(),
        })?;
        if t.shape != node.shape || t.data.len() != t.shape.iter().product::<usize>() {
            return Err(GraphError::ValueShape {
                name: node.name.clone(),
                expected: node.shape.clone(),
                found: t.shape.clone(),
            });
        }
        t.clone()
    } else {
        for &j in &node.inputs {
            eval_node(g, feeds, values, j, mode)?;
        }
        let ins: Vec<&Tensor> = node.inputs.iter().map(|j| values[j.index()].as_ref().expect("evaluated")).collect();
        let data = apply_in(&node.op, &ins, &node.shape, mode);
        Tensor { shape: node.shape.clone(), data }
    };
    values[i.index()] = Some(v);
    Ok(())
}

/// The sum of each of the `c` columns of a row-major `x`.
fn col_sums(x: &[f64], c: usize) -> Vec<f64> {
    let mut s = vec![0.0; c];
    for (e, v) in x.iter().enumerate() {
        s[e % c] += v;
    }
    s
}

/// The mean of each of the `c` columns of a row-major `x`.
fn col_means(x: &[f64], c: usize) -> Vec<f64> {
    let rows = (x.len() / c.max(1)) as f64;
    col_sums(x, c).iter().map(|v| v / rows).collect()
}

/// `(x - m) / sqrt(v + eps)` for the columns of a row-major `x` (`m`, `v` one per column).
fn normalized(x: &[f64], m: &[f64], v: &[f64], eps: f64) -> Vec<f64> {
    x.iter().enumerate().map(|(e, x)| (x - m[e % m.len()]) / (v[e % v.len()] + eps).sqrt()).collect()
}

/// `1 / sqrt(mean(row^2) + eps)`.
fn rms_inv(row: &[f64], eps: f64) -> f64 {
    1.0 / (row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64 + eps).sqrt()
}

fn last(t: &Tensor) -> usize {
    *t.shape.last().unwrap_or(&1)
}

fn gelu(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_grad(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let u = c * (x + 0.044715 * x * x * x);
    let t = u.tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
}

fn softmax_rows(x: &[f64], c: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(c) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| v / s));
    }
    out
}

/// `(mean, 1/sqrt(var + eps))` of a row.
fn row_stats(row: &[f64], eps: f64) -> (f64, f64) {
    let d = row.len() as f64;
    let mean = row.iter().sum::<f64>() / d;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Row-major product of `op(a) [m,k]` and `op(b) [k,n]` given raw 2-D slices.
#[allow(clippy::too_many_arguments)]
fn matmul2(a: &[f64], ar: usize, ac: usize, ta: bool, b: &[f64], br: usize, bc: usize, tb: bool, out: &mut Vec<f64>) {
    let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
    let n = if tb { br } else { bc };
    let at = |i: usize, p: usize| if ta { a[p * ac + i] } else { a[i * ac + p] };
    let bt = |p: usize, j: usize| if tb { b[j * bc + p] } else { b[p * bc + j] };
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                s += at(i, p) * bt(p, j);
            }
            out.push(s);
        }
    }
}

/// Computes one op's output data. Shapes were checked when the node was added.
pub fn apply(op: &Op, ins: &[&Tensor], out_shape: &[usize]) -> Vec<f64> {
    apply_in(op, ins, out_shape, Mode::Train)
}

/// [`apply`] in `mode` ([`Op::BatchNorm`] reads the running statistics in [`Mode::Eval`]).
pub fn apply_in(op: &Op, ins: &[&Tensor], out_shape: &[usize], mode: Mode) -> Vec<f64> {
    let n_out: usize = out_shape.iter().product();
    let x = ins.first().map(|t| t.data.as_slice()).unwrap_or(&[]);
    let zip =
        |f: &dyn Fn(f64, f64) -> f64| -> Vec<f64> { x.iter().zip(&ins[1].data).map(|(&a, &b)| f(a, b)).collect() };
    match op {
        Op::Input | Op::Label | Op::Step | Op::LearningRate | Op::Param | Op::OptState => vec![0.0; n_out],
        Op::Const { values } => values.clone(),
        Op::OneHot => {
            let c = &ins[1].data;
            (0..n_out).map(|e| if x[e / c.len()] == c[e % c.len()] { 1.0 } else { 0.0 }).collect()
        }
        Op::SwapAxes => {
            let r = ins[0].shape.len();
            let (a, b, c) = (ins[0].shape[r - 3], ins[0].shape[r - 2], ins[0].shape[r - 1]);
            let mut out = vec![0.0; n_out];
            for (e, o) in out.iter_mut().enumerate() {
                let (g, rest) = (e / (a * b * c), e % (a * b * c));
                let (bi, ai, ci) = (rest / (a * c), rest / c % a, rest % c);
                *o = x[g * a * b * c + (ai * b + bi) * c + ci];
            }
            out
        }
        Op::MatMul { trans_a, trans_b } => {
            let (a, b) = (ins[0], ins[1]);
            let r = a.shape.len();
            let g = if r == 3 { a.shape[0] } else { 1 };
            let (ar, ac, br, bc) = (a.shape[r - 2], a.shape[r - 1], b.shape[r - 2], b.shape[r - 1]);
            let mut out = Vec::with_capacity(n_out);
            for gi in 0..g {
                let sa = &a.data[gi * ar * ac..(gi + 1) * ar * ac];
                let sb = &b.data[gi * br * bc..(gi + 1) * br * bc];
                matmul2(sa, ar, ac, *trans_a, sb, br, bc, *trans_b, &mut out);
            }
            out
        }
        Op::Im2Col { window } => {
            let (cols, c) = (out_shape[1], ins[0].shape[3]);
            let mut out = vec![0.0; n_out];
            window.for_each_im2col_pixel(&ins[0].shape, |row, off, src| {
                let dst = row * cols + off * c;
                out[dst..dst + c].copy_from_slice(&x[src..src + c]);
            });
            out
        }
        Op::Col2Im { window, image } => {
            let (cols, c) = (ins[0].shape[1], image[3]);
            let mut out = vec![0.0; n_out];
            window.for_each_im2col_pixel(image, |row, off, src| {
                let from = row * cols + off * c;
                for (o, &v) in out[src..src + c].iter_mut().zip(&x[from..from + c]) {
                    *o += v;
                }
            });
            out
        }
        Op::Reshape { .. } => x.to_vec(),
        Op::BiasAdd => {
            let b = &ins[1].data;
            x.iter().enumerate().map(|(e, v)| v + b[e % b.len()]).collect()
        }
        Op::RowScale => {
            let g = &ins[1].data;
            x.iter().enumerate().map(|(e, v)| v * g[e % g.len()]).collect()
        }
        Op::Add => zip(&|a, b| a + b),
        Op::Mul => zip(&|a, b| a * b),
        Op::Scale { factor } => x.iter().map(|v| v * factor).collect(),
        Op::SumToShape { .. } => {
            let mut out = vec![0.0; n_out];
            for (e, v) in x.iter().enumerate() {
                out[e % n_out] += v;
            }
            out
        }
        Op::Relu => x.iter().map(|&v| if v > 0.0 { v } else { 0.0 }).collect(),
        Op::ReluGrad => zip(&|x, dy| if x > 0.0 { dy } else { 0.0 }),
        Op::Gelu => x.iter().map(|&v| gelu(v)).collect(),
        Op::GeluGrad => zip(&|x, dy| dy * gelu_grad(x)),
        Op::Silu => x.iter().map(|&v| v / (1.0 + (-v).exp())).collect(),
        Op::SiluGrad => zip(&|x, dy| {
            let s = 1.0 / (1.0 + (-x).exp());
            dy * s * (1.0 + x * (1.0 - s))
        }),
        Op::RmsNorm { eps } => {
            let mut out = Vec::with_capacity(n_out);
            for row in x.chunks(last(ins[0])) {
                let r = rms_inv(row, *eps);
                out.extend(row.iter().map(|v| v * r));
            }
            out
        }
        Op::RmsNormGrad { eps } => {
            let d = last(ins[0]);
            let mut out = Vec::with_capacity(n_out);
            for (row, dy) in x.chunks(d).zip(ins[1].data.chunks(d)) {
                let r = rms_inv(row, *eps);
                let mdyy = dy.iter().zip(row).map(|(g, v)| g * v * r).sum::<f64>() / d as f64;
                out.extend(dy.iter().zip(row).map(|(g, v)| (g - v * r * mdyy) * r));
            }
            out
        }
        Op::Softmax => softmax_rows(x, last(ins[0])),
        Op::SoftmaxGrad => {
            let c = last(ins[0]);
            let mut out = Vec::with_capacity(n_out);
            for (y, dy) in x.chunks(c).zip(ins[1].data.chunks(c)) {
                let s: f64 = y.iter().zip(dy).map(|(a, b)| a * b).sum();
                out.extend(y.iter().zip(dy).map(|(y, dy)| y * (dy - s)));
            }
            out
        }
        Op::LayerNorm { eps } => {
            let mut out = Vec::with_capacity(n_out);
            for row in x.chunks(last(ins[0])) {
                let (mean, rstd) = row_stats(row, *eps);
                out.extend(row.iter().map(|v| (v - mean) * rstd));
            }
            out
        }
        Op::LayerNormGrad { eps } => {
            let d = last(ins[0]);
            let mut out = Vec::with_capacity(n_out);
            for (row, dy) in x.chunks(d).zip(ins[1].data.chunks(d)) {
                let (mean, rstd) = row_stats(row, *eps);
                let y: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
                let mdy = dy.iter().sum::<f64>() / d as f64;
                let mdyy = dy.iter().zip(&y).map(|(a, b)| a * b).sum::<f64>() / d as f64;
                out.extend(dy.iter().zip(&y).map(|(g, y)| (g - mdy - y * mdyy) * rstd));
            }
            out
        }
        Op::MeanPool => {
            let (n, t, d) = (ins[0].shape[0], ins[0].shape[1], ins[0].shape[2]);
            let mut out = vec![0.0; n * d];
            for b in 0..n {
                for s in 0..t {
                    for k in 0..d {
                        out[b * d + k] += x[(b * t + s) * d + k] / t as f64;
                    }
                }
            }
            out
        }
        Op::MeanPoolGrad { len } => {
            let d = ins[0].shape[1];
            (0..n_out).map(|e| x[(e / (len * d)) * d + e % d] / *len as f64).collect()
        }
        Op::MaxPool { window } => {
            let c = ins[0].shape[3];
            let mut out = vec![f64::NEG_INFINITY; n_out];
            window.for_each_im2col_pixel(&ins[0].shape, |row, _, src| {
                for (o, &v) in out[row * c..(row + 1) * c].iter_mut().zip(&x[src..src + c]) {
                    *o = if o.is_nan() || v.is_nan() { f64::NAN } else { o.max(v) };
                }
            });
            out
        }
        Op::MaxPoolGrad { window } => {
            let c = ins[0].shape[3];
            let (y, dy) = (&ins[1].data, &ins[2].data);
            let mut out = vec![0.0; n_out];
            // Whether each window's channel has found its maximum (offsets come in order).
            let mut taken = vec![false; y.len()];
            window.for_each_im2col_pixel(&ins[0].shape, |row, _, src| {
                for ch in 0..c {
                    let o = row * c + ch;
                    if !taken[o] && x[src + ch] == y[o] {
                        taken[o] = true;
                        out[src + ch] += dy[o];
                    }
                }
            });
            out
        }
        Op::AvgPool { window } => {
            let c = ins[0].shape[3];
            let taps = (window.kh * window.kw) as f64;
            let mut out = vec![0.0; n_out];
            window.for_each_im2col_pixel(&ins[0].shape, |row, _, src| {
                for (o, &v) in out[row * c..(row + 1) * c].iter_mut().zip(&x[src..src + c]) {
                    *o += v / taps;
                }
            });
            out
        }
        Op::AvgPoolGrad { window, image } => {
            let c = image[3];
            let taps = (window.kh * window.kw) as f64;
            let mut out = vec![0.0; n_out];
            window.for_each_im2col_pixel(image, |row, _, src| {
                for (o, &v) in out[src..src + c].iter_mut().zip(&x[row * c..(row + 1) * c]) {
                    *o += v / taps;
                }
            });
            out
        }
        Op::BatchMean => col_means(x, ins[0].shape[1]),
        Op::BatchVar => {
            let m = &ins[1].data;
            let sq: Vec<f64> = x.iter().enumerate().map(|(e, v)| (v - m[e % m.len()]).powi(2)).collect();
            col_means(&sq, m.len())
        }
        Op::BatchNorm { eps } => {
            let (m, v) = match mode {
                Mode::Train => (&ins[1].data, &ins[2].data),
                Mode::Eval => (&ins[3].data, &ins[4].data),
            };
            let (gamma, beta) = (&ins[5].data, &ins[6].data);
            let y = normalized(x, m, v, *eps);
            y.iter().enumerate().map(|(e, y)| gamma[e % m.len()] * y + beta[e % m.len()]).collect()
        }
        Op::BatchNormGrad { eps } => {
            let (m, v, gamma, dy) = (&ins[1].data, &ins[2].data, &ins[3].data, &ins[4].data);
            let (dgamma, dbeta) = (&ins[5].data, &ins[6].data);
            let c = m.len();
            let rows = (x.len() / c) as f64;
            let y = normalized(x, m, v, *eps);
            (0..n_out)
                .map(|e| {
                    let k = e % c;
                    gamma[k] / (v[k] + eps).sqrt() * (dy[e] - dbeta[k] / rows - y[e] * dgamma[k] / rows)
                })
                .collect()
        }
        Op::BatchNormGammaGrad { eps } => {
            let (m, v, dy) = (&ins[1].data, &ins[2].data, &ins[3].data);
            let dyy: Vec<f64> = normalized(x, m, v, *eps).iter().zip(dy).map(|(a, b)| a * b).collect();
            col_sums(&dyy, m.len())
        }
        Op::ColSum => col_sums(x, ins[0].shape[1]),
        Op::SoftmaxCrossEntropy => {
            let (n, c) = (ins[0].shape[0], ins[0].shape[1]);
            let mut loss = 0.0;
            for (z, y) in x.chunks(c).zip(ins[1].data.chunks(c)) {
                let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                loss -= z.iter().zip(y).map(|(z, y)| y * (z - lse)).sum::<f64>();
            }
            vec![loss / n as f64]
        }
        Op::SoftmaxCrossEntropyGrad => {
            let (n, c) = (ins[0].shape[0], ins[0].shape[1]);
            let p = softmax_rows(x, c);
            let mut out = Vec::with_capacity(n_out);
            for (p, y) in p.chunks(c).zip(ins[1].data.chunks(c)) {
                let sy: f64 = y.iter().sum();
                out.extend(p.iter().zip(y).map(|(p, y)| (p * sy - y) / n as f64));
            }
            out
        }
        Op::Mse => {
            let s: f64 = zip(&|p, t| (p - t) * (p - t)).iter().sum();
            vec![s / x.len() as f64]
        }
        Op::MseGrad => {
            let n = x.len() as f64;
            zip(&|p, t| 2.0 * (p - t) / n)
        }
        Op::SgdUpdate { lr } => zip(&|w, g| w - lr * g),
        Op::MomentumVelocity { momentum } => zip(&|v, g| momentum * v + g),
        Op::AdamMoment { beta } => zip(&|m, g| beta * m + (1.0 - beta) * g),
        Op::AdamSecondMoment { beta } => zip(&|v, g| beta * v + (1.0 - beta) * g * g),
        Op::AdamUpdate { lr, beta1, beta2, eps } => adam_update(ins, *lr, (*beta1, *beta2, *eps), 0.0),
        Op::AdamWUpdate { beta1, beta2, eps, weight_decay } => {
            adam_update(ins, ins[4].data[0], (*beta1, *beta2, *eps), *weight_decay)
        }
        Op::ScaleBy => x.iter().map(|&v| v * ins[1].data[0]).collect(),
        Op::SumSquares => vec![x.iter().map(|v| v * v).sum()],
        Op::SumSquaredDiff => vec![zip(&|a, b| (a - b) * (a - b)).iter().sum()],
        Op::ClipCoef { max_norm } => vec![(max_norm / (x[0].sqrt() + CLIP_EPS)).min(1.0)],
        Op::TileSum { tile, rows } => {
            let (r, c) = (ins[0].shape[0], ins[0].shape[1]);
            let mut out = vec![0.0; n_out];
            for i in 0..r {
                for j in 0..c {
                    let o = if *rows { (i / tile) * c + j } else { i * (c / tile) + j / tile };
                    out[o] += x[i * c + j];
                }
            }
            out
        }
        Op::MaxAbs => vec![max_abs(x.iter().copied())],
        Op::MaxAbsDiff => vec![max_abs(x.iter().zip(&ins[1].data).map(|(a, b)| a - b))],
        Op::Clamp { bound } => {
            let b = f64::from(*bound);
            x.iter().map(|&v| if v.is_nan() { v } else { v.clamp(-b, b) }).collect()
        }
    }
}

/// Adam's (`weight_decay` 0) and AdamW's update of `w` (inputs `w`, `m`, `v`, `t`):
/// `w (1 - lr wd) - lr (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)`.
fn adam_update(ins: &[&Tensor], lr: f64, (beta1, beta2, eps): (f64, f64, f64), weight_decay: f64) -> Vec<f64> {
    let t = ins[3].data[0];
    let (c1, c2) = (1.0 - beta1.powf(t), 1.0 - beta2.powf(t));
    let (w, m, v) = (&ins[0].data, &ins[1].data, &ins[2].data);
    (0..w.len()).map(|e| w[e] * (1.0 - lr * weight_decay) - lr * (m[e] / c1) / ((v[e] / c2).sqrt() + eps)).collect()
}

/// What global-norm clipping adds to the norm before dividing (PyTorch's `clip_grad_norm_`).
pub const CLIP_EPS: f64 = 1e-6;

/// `max |v|`, NaN if any `v` is NaN (as the VPU's max propagates NaN).
fn max_abs(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(0.0, |m: f64, x| if m.is_nan() || x.is_nan() { f64::NAN } else { m.max(x.abs()) })
}
