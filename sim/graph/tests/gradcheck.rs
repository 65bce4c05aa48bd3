//! Autodiff gradients against central finite differences of the f64 reference, per op and per
//! shipped model.
//!
//! Tolerance: `|autodiff - fd| <= 1e-7 + 1e-5 * max(|autodiff|, |fd|)` with `h = 1e-5`. Central
//! differences are `O(h^2)` accurate (~1e-10 here) with round-off ~1e-11, so this is loose enough
//! to be robust and tight enough to catch any wrong factor, sign or index.

use faultline_graph::autodiff::backward;
use faultline_graph::reference::{eval, eval_until};
use faultline_graph::{ModelSpec, NodeIndex, Op, OpGraph, OptimizerSpec, Phase, Tensor, TrainGraph, Window};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::path::Path;

const H: f64 = 1e-5;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-7 + 1e-5 * a.abs().max(b.abs())
}

fn random(rng: &mut ChaCha8Rng, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    Tensor { shape: shape.to_vec(), data: (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect() }
}

/// Checks `d loss / d p` for every element (or `max_per_param` sampled elements) of `params`.
fn check_grads(
    g: &OpGraph,
    loss: NodeIndex,
    params: &[NodeIndex],
    grads: &[NodeIndex],
    feeds: &BTreeMap<String, Tensor>,
    max_per_param: usize,
    seed: u64,
) {
    let values = eval(g, feeds).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37);
    for (&p, &d) in params.iter().zip(grads) {
        let name = &g.node(p).name;
        let auto = values.get(d).unwrap();
        assert_eq!(auto.shape, g.node(p).shape, "gradient shape of {name}");
        let n = auto.len();
        let idx: Vec<usize> = if n <= max_per_param {
            (0..n).collect()
        } else {
            (0..max_per_param).map(|_| rng.gen_range(0..n)).collect()
        };
        for e in idx {
            let mut f = feeds.clone();
            let at = |f: &BTreeMap<String, Tensor>| eval_until(g, f, loss).unwrap().get(loss).unwrap().data[0];
            f.get_mut(name).unwrap().data[e] += H;
            let up = at(&f);
            f.get_mut(name).unwrap().data[e] -= 2.0 * H;
            let down = at(&f);
            let fd = (up - down) / (2.0 * H);
            assert!(close(auto.data[e], fd), "{name}[{e}]: autodiff {} vs finite difference {fd}", auto.data[e]);
        }
    }
}

/// One op test: `op(params...)` then `Mse` against a random target; every input is a parameter.
fn check_op(op: Op, shapes: &[&[usize]], seed: u64) {
    check_op_with(shapes, seed, |g, ps| g.add(op.clone(), "y", "op", Phase::Forward, ps).unwrap());
}

fn check_op_with(shapes: &[&[usize]], seed: u64, body: impl Fn(&mut OpGraph, &[NodeIndex]) -> NodeIndex) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut g = OpGraph::new("<test>");
    let mut feeds = BTreeMap::new();
    let mut params = vec![];
    for (i, s) in shapes.iter().enumerate() {
        let name = format!("p{i}");
        params.push(g.placeholder(Op::Param, &name, "op", Phase::Forward, s.to_vec()).unwrap());
        feeds.insert(name, random(&mut rng, s));
    }
    let y = body(&mut g, &params);
    let ys = g.node(y).shape.clone();
    let t = g.placeholder(Op::Label, "target", "loss", Phase::Forward, ys.clone()).unwrap();
    feeds.insert("target".into(), random(&mut rng, &ys));
    let loss = g.add(Op::Mse, "loss", "loss", Phase::Forward, &[y, t]).unwrap();
    let grads = backward(&mut g, loss, &params).unwrap();
    assert!(grads.iter().all(|&d| g.node(d).phase == Phase::Backward));
    check_grads(&g, loss, &params, &grads, &feeds, usize::MAX, seed);
}

#[test]
fn matmul_rank2_all_transposes() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a: &[usize] = if ta { &[4, 3] } else { &[3, 4] };
        let b: &[usize] = if tb { &[5, 4] } else { &[4, 5] };
        check_op(Op::MatMul { trans_a: ta, trans_b: tb }, &[a, b], 1);
    }
}

#[test]
fn matmul_rank3_all_transposes() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a: &[usize] = if ta { &[2, 4, 3] } else { &[2, 3, 4] };
        let b: &[usize] = if tb { &[2, 5, 4] } else { &[2, 4, 5] };
        check_op(Op::MatMul { trans_a: ta, trans_b: tb }, &[a, b], 2);
    }
}

#[test]
fn im2col_and_convolution() {
    for (window, img) in [
        (Window { kh: 3, kw: 3, stride: 1, padding: 1 }, [2usize, 5, 5, 2]),
        (Window { kh: 2, kw: 3, stride: 2, padding: 0 }, [1, 5, 6, 3]),
    ] {
        check_op(Op::Im2Col { window }, &[&img], 3);
        let cols = window.kh * window.kw * img[3];
        check_op_with(&[&img, &[cols, 4]], 4, |g, p| {
            let c = g.add(Op::Im2Col { window }, "cols", "conv", Phase::Forward, &[p[0]]).unwrap();
            g.add(Op::MatMul { trans_a: false, trans_b: false }, "y", "conv", Phase::Forward, &[c, p[1]]).unwrap()
        });
    }
}

#[test]
fn col2im_is_the_adjoint_of_im2col_and_differentiates() {
    let window = Window { kh: 3, kw: 2, stride: 2, padding: 1 };
    let img = [2usize, 5, 4, 3];
    let mut g = OpGraph::new("<test>");
    let x = g.placeholder(Op::Input, "x", "t", Phase::Forward, img.to_vec()).unwrap();
    let cols = g.add(Op::Im2Col { window }, "cols", "t", Phase::Forward, &[x]).unwrap();
    let cs = g.node(cols).shape.clone();
    let c = g.placeholder(Op::Input, "c", "t", Phase::Forward, cs.clone()).unwrap();
    let back = g.add(Op::Col2Im { window, image: img.to_vec() }, "back", "t", Phase::Forward, &[c]).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let feeds = BTreeMap::from([("x".to_string(), random(&mut rng, &img)), ("c".to_string(), random(&mut rng, &cs))]);
    let v = eval(&g, &feeds).unwrap();
    let dot = |a: &Tensor, b: &Tensor| a.data.iter().zip(&b.data).map(|(x, y)| x * y).sum::<f64>();
    let lhs = dot(v.get(cols).unwrap(), &feeds["c"]);
    let rhs = dot(&feeds["x"], v.get(back).unwrap());
    assert!((lhs - rhs).abs() < 1e-12, "{lhs} vs {rhs}");
    check_op(Op::Col2Im { window, image: img.to_vec() }, &[&cs], 6);
}

#[test]
fn shape_and_broadcast_ops() {
    check_op(Op::Reshape { shape: vec![6, 4] }, &[&[2, 3, 4]], 7);
    check_op(Op::BiasAdd, &[&[2, 3, 4], &[4]], 8);
    check_op(Op::BiasAdd, &[&[2, 3, 4], &[3, 4]], 9);
    check_op(Op::RowScale, &[&[2, 3, 4], &[4]], 10);
    check_op(Op::RowScale, &[&[5, 4], &[5, 4]], 11);
    check_op(Op::Add, &[&[3, 4], &[3, 4]], 12);
    check_op(Op::Mul, &[&[3, 4], &[3, 4]], 13);
    check_op(Op::Scale { factor: -0.7 }, &[&[3, 4]], 14);
    check_op(Op::MeanPool, &[&[2, 5, 3]], 15);
    // A node used twice: gradients must be summed.
    check_op_with(&[&[3, 4]], 16, |g, p| g.add(Op::Mul, "y", "op", Phase::Forward, &[p[0], p[0]]).unwrap());
}

#[test]
fn pooling() {
    // Side by side, overlapping, and (average) padded windows; random inputs have no ties.
    for (window, seed) in [
        (Window { kh: 2, kw: 2, stride: 2, padding: 0 }, 30),
        (Window { kh: 3, kw: 3, stride: 1, padding: 0 }, 31),
        (Window { kh: 2, kw: 3, stride: 2, padding: 0 }, 32),
    ] {
        check_op(Op::MaxPool { window }, &[&[2, 5, 6, 3]], seed);
        check_op(Op::AvgPool { window }, &[&[2, 5, 6, 3]], seed + 10);
    }
    check_op(Op::AvgPool { window: Window { kh: 3, kw: 3, stride: 2, padding: 1 } }, &[&[2, 5, 6, 3]], 43);
}

#[test]
fn activations_and_normalisation() {
    check_op(Op::Relu, &[&[4, 6]], 17);
    check_op(Op::Gelu, &[&[4, 6]], 18);
    check_op(Op::Softmax, &[&[4, 6]], 19);
    check_op(Op::Softmax, &[&[2, 3, 5]], 20);
    check_op(Op::LayerNorm { eps: 1e-5 }, &[&[4, 6]], 21);
    check_op(Op::LayerNorm { eps: 1e-2 }, &[&[2, 3, 5]], 22);
    check_op(Op::Silu, &[&[4, 6]], 23);
    check_op(Op::RmsNorm { eps: 1e-5 }, &[&[4, 6]], 24);
    check_op(Op::RmsNorm { eps: 1e-2 }, &[&[2, 3, 5]], 25);
}

fn check_loss(op: Op, soft_labels: bool, target_is_param: bool, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let shape = vec![4, 5];
    let mut g = OpGraph::new("<test>");
    let z = g.placeholder(Op::Param, "z", "loss", Phase::Forward, shape.clone()).unwrap();
    let mut params = vec![z];
    let y = if target_is_param {
        let y = g.placeholder(Op::Param, "y", "loss", Phase::Forward, shape.clone()).unwrap();
        params.push(y);
        y
    } else {
        g.placeholder(Op::Label, "y", "loss", Phase::Forward, shape.clone()).unwrap()
    };
    let labels = if soft_labels {
        // Rows that are not distributions exercise the general `p * sum(y) - y` form.
        Tensor { shape: shape.clone(), data: (0..20).map(|_| rng.gen_range(0.0..1.0)).collect() }
    } else {
        Tensor::one_hot(&[0, 3, 4, 1], 5)
    };
    let loss = g.add(op, "loss", "loss", Phase::Forward, &[z, y]).unwrap();
    let grads = backward(&mut g, loss, &params).unwrap();
    let feeds = BTreeMap::from([("z".to_string(), random(&mut rng, &shape)), ("y".to_string(), labels)]);
    check_grads(&g, loss, &params, &grads, &feeds, usize::MAX, seed);
}

#[test]
fn losses() {
    check_loss(Op::SoftmaxCrossEntropy, false, false, 23);
    check_loss(Op::SoftmaxCrossEntropy, true, false, 24);
    check_loss(Op::Mse, true, false, 25);
    check_loss(Op::Mse, true, true, 26);
}

#[test]
fn attention_block_composition() {
    // q k^T / sqrt(d), softmax, times v, with q = k = v sharing one parameter.
    check_op_with(&[&[2, 4, 3]], 27, |g, p| {
        let s = g.add(Op::MatMul { trans_a: false, trans_b: true }, "s", "a", Phase::Forward, &[p[0], p[0]]).unwrap();
        let s = g.add(Op::Scale { factor: 0.5 }, "sc", "a", Phase::Forward, &[s]).unwrap();
        let pr = g.add(Op::Softmax, "p", "a", Phase::Forward, &[s]).unwrap();
        g.add(Op::MatMul { trans_a: false, trans_b: false }, "y", "a", Phase::Forward, &[pr, p[0]]).unwrap()
    });
}

fn models_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// Whole-model check on a random batch; samples up to 24 elements of each parameter.
fn check_model(file: &str, batch: usize, seed: u64) {
    let spec = ModelSpec::load(models_dir().join(file)).unwrap();
    let tg = TrainGraph::build(&spec, batch, OptimizerSpec::Sgd { lr: 0.1 }).unwrap();
    let mut feeds = tg.initial_state(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let in_shape = tg.graph.node(tg.input).shape.clone();
    feeds.insert("input".into(), random(&mut rng, &in_shape));
    let labels: Vec<usize> = (0..batch).map(|_| rng.gen_range(0..spec.outputs)).collect();
    feeds.insert("labels".into(), Tensor::one_hot(&labels, spec.outputs));
    // Non-zero biases and shifted norms, so that every gradient path is exercised.
    for p in tg.params() {
        for v in &mut feeds.get_mut(&p.name).unwrap().data {
            *v += rng.gen_range(-0.1..0.1);
        }
    }
    let params: Vec<NodeIndex> = tg.params().iter().map(|p| p.node).collect();
    let grads: Vec<NodeIndex> = tg.params().iter().map(|p| p.grad).collect();
    check_grads(&tg.graph, tg.loss, &params, &grads, &feeds, 24, seed);
}

#[test]
fn model_mlp_digits() {
    check_model("mlp-digits.ron", 3, 31);
}

#[test]
fn model_cnn_small() {
    check_model("cnn-small.ron", 2, 32);
}

#[test]
fn model_transformer_tiny() {
    check_model("transformer-tiny.ron", 2, 33);
}

/// Layer paths the shipped models do not take: strided padded conv, GELU, Reshape, Softmax
/// layer, rank-3 Dense without bias, Positional after LayerNorm, and an Mse loss.
#[test]
fn model_kitchen_sink_with_mse() {
    let text = r#"(
        name: "sink",
        input: [6, 6, 2],
        outputs: 3,
        loss: Mse,
        layers: [
            (name: "conv", op: Conv2d(filters: 3, kernel: 3, stride: 2, padding: 1)),
            (name: "act", op: Gelu),
            (name: "seq", op: Reshape(shape: [9, 3])),
            (name: "ln", op: LayerNorm(eps: 1e-3)),
            (name: "pos", op: Positional),
            (name: "mix", op: Dense(units: 4, bias: false)),
            (name: "sm", op: Softmax),
            (name: "res", op: Add, inputs: ["sm", "sm"]),
            (name: "pool", op: MeanPool),
            (name: "out", op: Dense(units: 3)),
        ],
    )"#;
    let spec = ModelSpec::from_ron(text, "<sink>").unwrap();
    let tg = TrainGraph::build(&spec, 2, OptimizerSpec::Sgd { lr: 0.1 }).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let mut feeds = tg.initial_state(41);
    for p in tg.params() {
        for v in &mut feeds.get_mut(&p.name).unwrap().data {
            *v += rng.gen_range(-0.1..0.1);
        }
    }
    feeds.insert("input".into(), random(&mut rng, &[2, 6, 6, 2]));
    feeds.insert("labels".into(), random(&mut rng, &[2, 3]));
    let params: Vec<NodeIndex> = tg.params().iter().map(|p| p.node).collect();
    let grads: Vec<NodeIndex> = tg.params().iter().map(|p| p.grad).collect();
    check_grads(&tg.graph, tg.loss, &params, &grads, &feeds, usize::MAX, 41);
}

/// BatchNorm after a bias-free convolution (per channel over batch and pixels) and after a
/// dense layer (per feature over the batch), with pooling between: every parameter's gradient
/// through the batch statistics, which depend on the parameters before them.
#[test]
fn model_batchnorm_conv_and_dense() {
    let text = r#"(
        name: "bn",
        input: [6, 6, 2],
        outputs: 3,
        loss: SoftmaxCrossEntropy,
        layers: [
            (name: "conv", op: Conv2d(filters: 3, kernel: 3, padding: 1, bias: false)),
            (name: "bn1", op: BatchNorm()),
            (name: "act", op: Relu),
            (name: "pool", op: MaxPool(size: 2)),
            (name: "avg", op: AvgPool(size: 2, stride: 1)),
            (name: "flat", op: Flatten),
            (name: "fc", op: Dense(units: 5, bias: false)),
            (name: "bn2", op: BatchNorm(eps: 1e-3, momentum: 0.5)),
            (name: "out", op: Dense(units: 3)),
        ],
    )"#;
    let spec = ModelSpec::from_ron(text, "<bn>").unwrap();
    let tg = TrainGraph::build(&spec, 3, OptimizerSpec::Sgd { lr: 0.1 }).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    let mut feeds = tg.initial_state(43);
    for p in tg.params() {
        for v in &mut feeds.get_mut(&p.name).unwrap().data {
            *v += rng.gen_range(-0.1..0.1);
        }
    }
    feeds.insert("input".into(), random(&mut rng, &[3, 6, 6, 2]));
    feeds.insert("labels".into(), Tensor::one_hot(&[0, 2, 1], 3));
    let params: Vec<NodeIndex> = tg.params().iter().map(|p| p.node).collect();
    let grads: Vec<NodeIndex> = tg.params().iter().map(|p| p.grad).collect();
    check_grads(&tg.graph, tg.loss, &params, &grads, &feeds, usize::MAX, 43);
}

/// The global average pooling layer is the mean over pixels, and differentiates.
#[test]
fn model_global_average_pooling() {
    let text = r#"(
        name: "gap",
        input: [4, 5, 3],
        outputs: 2,
        loss: SoftmaxCrossEntropy,
        layers: [
            (name: "conv", op: Conv2d(filters: 4, kernel: 3, padding: 1)),
            (name: "gap", op: GlobalAvgPool),
            (name: "out", op: Dense(units: 2)),
        ],
    )"#;
    let spec = ModelSpec::from_ron(text, "<gap>").unwrap();
    let tg = TrainGraph::build(&spec, 2, OptimizerSpec::Sgd { lr: 0.1 }).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(44);
    let mut feeds = tg.initial_state(44);
    feeds.insert("input".into(), random(&mut rng, &[2, 4, 5, 3]));
    feeds.insert("labels".into(), Tensor::one_hot(&[1, 0], 2));
    let params: Vec<NodeIndex> = tg.params().iter().map(|p| p.node).collect();
    let grads: Vec<NodeIndex> = tg.params().iter().map(|p| p.grad).collect();
    check_grads(&tg.graph, tg.loss, &params, &grads, &feeds, usize::MAX, 44);
    let v = eval(&tg.graph, &feeds).unwrap();
    let (conv, gap) = (v.by_name(&tg.graph, "conv.bias_add").unwrap(), v.by_name(&tg.graph, "gap.mean").unwrap());
    for (b, c) in [(0, 0), (1, 3)] {
        let want: f64 = (0..20).map(|p| conv.data[(b * 20 + p) * 4 + c]).sum::<f64>() / 20.0;
        assert!((gap.data[b * 4 + c] - want).abs() < 1e-12);
    }
}

/// Two causal heads: gradients through the head split and merge (`SwapAxes`) and the mask.
#[test]
fn model_causal_multi_head_attention() {
    check_op(Op::SwapAxes, &[&[2, 3, 4, 5]], 45);
    let text = r#"(
        name: "mha",
        input: [5, 6],
        outputs: 3,
        loss: SoftmaxCrossEntropy,
        layers: [
            (name: "q", op: Dense(units: 4), inputs: ["input"]),
            (name: "k", op: Dense(units: 4), inputs: ["input"]),
            (name: "v", op: Dense(units: 4), inputs: ["input"]),
            (name: "attn", op: Attention(heads: 2, causal: true), inputs: ["q", "k", "v"]),
            (name: "pool", op: MeanPool),
            (name: "out", op: Dense(units: 3)),
        ],
    )"#;
    let spec = ModelSpec::from_ron(text, "<mha>").unwrap();
    let tg = TrainGraph::build(&spec, 2, OptimizerSpec::Sgd { lr: 0.1 }).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(46);
    let mut feeds = tg.initial_state(46);
    feeds.insert("input".into(), random(&mut rng, &[2, 5, 6]));
    feeds.insert("labels".into(), Tensor::one_hot(&[2, 0], 3));
    let params: Vec<NodeIndex> = tg.params().iter().map(|p| p.node).collect();
    let grads: Vec<NodeIndex> = tg.params().iter().map(|p| p.grad).collect();
    check_grads(&tg.graph, tg.loss, &params, &grads, &feeds, usize::MAX, 46);

    // Causal: changing the last position's input changes no earlier position's output.
    let ctx = |f: &BTreeMap<String, Tensor>| {
        eval(&tg.graph, f).unwrap().by_name(&tg.graph, "attn.context_merged").unwrap().clone()
    };
    let before = ctx(&feeds);
    let mut later = feeds.clone();
    for v in &mut later.get_mut("input").unwrap().data[4 * 6..5 * 6] {
        *v += 1.0;
    }
    let after = ctx(&later);
    let per_sample = 5 * 4;
    assert_eq!(before.data[..4 * 4], after.data[..4 * 4], "an earlier position saw a later one");
    assert_ne!(before.data[4 * 4..per_sample], after.data[4 * 4..per_sample], "the last position changed");
}

/// A LLaMA-style block: RMSNorm, then a SwiGLU MLP (`silu(x W1) * (x W2)`, then `W3`), with a
/// residual connection.
#[test]
fn model_rmsnorm_and_swiglu() {
    let text = r#"(
        name: "swiglu",
        input: [4, 6],
        outputs: 3,
        loss: SoftmaxCrossEntropy,
        layers: [
            (name: "norm", op: RmsNorm()),
            (name: "gate", op: Dense(units: 8, bias: false)),
            (name: "act", op: Silu),
            (name: "up", op: Dense(units: 8, bias: false), inputs: ["norm"]),
            (name: "glu", op: Mul, inputs: ["act", "up"]),
            (name: "down", op: Dense(units: 6, bias: false)),
            (name: "res", op: Add, inputs: ["down", "input"]),
            (name: "pool", op: MeanPool),
            (name: "out", op: Dense(units: 3)),
        ],
    )"#;
    let spec = ModelSpec::from_ron(text, "<swiglu>").unwrap();
    let tg = TrainGraph::build(&spec, 2, OptimizerSpec::Sgd { lr: 0.1 }).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(47);
    let mut feeds = tg.initial_state(47);
    for p in tg.params() {
        for v in &mut feeds.get_mut(&p.name).unwrap().data {
            *v += rng.gen_range(-0.1..0.1);
        }
    }
    feeds.insert("input".into(), random(&mut rng, &[2, 4, 6]));
    feeds.insert("labels".into(), Tensor::one_hot(&[1, 2], 3));
    let params: Vec<NodeIndex> = tg.params().iter().map(|p| p.node).collect();
    let grads: Vec<NodeIndex> = tg.params().iter().map(|p| p.grad).collect();
    check_grads(&tg.graph, tg.loss, &params, &grads, &feeds, usize::MAX, 47);
}

/// An embedding lookup (one-hot rows times the table) and the output projection tied to its
/// table: the table's gradient sums both uses.
#[test]
fn model_embedding_with_tied_output() {
    let text = r#"(
        name: "tied",
        input: [5],
        outputs: 7,
        loss: SoftmaxCrossEntropy,
        layers: [
            (name: "embed", op: Embedding(vocab: 7, dim: 4)),
            (name: "mix", op: Dense(units: 4)),
            (name: "act", op: Gelu),
            (name: "head", op: TiedOutput(embedding: "embed")),
            (name: "pool", op: MeanPool),
        ],
    )"#;
    let spec = ModelSpec::from_ron(text, "<tied>").unwrap();
    let tg = TrainGraph::build(&spec, 3, OptimizerSpec::Sgd { lr: 0.1 }).unwrap();
    assert_eq!(tg.params().iter().filter(|p| p.name == "embed.table").count(), 1);
    let mut rng = ChaCha8Rng::seed_from_u64(48);
    let mut feeds = tg.initial_state(48);
    let ids: Vec<f64> = (0..15).map(|_| rng.gen_range(0..7) as f64).collect();
    feeds.insert("input".into(), Tensor::new(&[3, 5], ids.clone()).unwrap());
    feeds.insert("labels".into(), Tensor::one_hot(&[1, 6, 3], 7));
    let params: Vec<NodeIndex> = tg.params().iter().map(|p| p.node).collect();
    let grads: Vec<NodeIndex> = tg.params().iter().map(|p| p.grad).collect();
    check_grads(&tg.graph, tg.loss, &params, &grads, &feeds, usize::MAX, 48);
    // The lookup is the table's rows.
    let v = eval(&tg.graph, &feeds).unwrap();
    let (table, looked) = (&feeds["embed.table"], v.by_name(&tg.graph, "embed.unflatten").unwrap());
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(looked.data[i * 4..(i + 1) * 4], table.data[id as usize * 4..(id as usize + 1) * 4]);
    }
    // A TiedOutput must name an Embedding layer.
    let bad = text.replace(r#"TiedOutput(embedding: "embed")"#, r#"TiedOutput(embedding: "mix")"#);
    let e = TrainGraph::build(&ModelSpec::from_ron(&bad, "<bad>").unwrap(), 3, OptimizerSpec::Sgd { lr: 0.1 });
    assert!(e.unwrap_err().to_string().contains("no earlier Embedding layer"));
}
