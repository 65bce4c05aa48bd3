//! Every op's lowering to machine instructions computes the op: a one-node program, run by the
//! executor's interpreter in both modes, gives identical bits in both and agrees with the f64
//! reference op to fp32 accuracy. Also covers the MXU lowering (transposes, batches).

use faultline_graph::program::Program;
use faultline_graph::{reference, Mode, Op, OpGraph, Phase, Tensor, Window};
use faultline_hw::{Dataflow, ExecMode, HwConfig};
use faultline_train::exec::run_program;

type Args = Vec<(Vec<f32>, Vec<usize>)>;

/// Runs `op` on `ins` as a one-node program lowered for `graph_mode`; returns the output bits.
fn run(cfg: &HwConfig, op: &Op, ins: &Args, mode: ExecMode, graph_mode: Mode) -> Vec<u32> {
    let mut g = OpGraph::new("<test>");
    let mut nodes = Vec::new();
    for (k, (_, shape)) in ins.iter().enumerate() {
        nodes.push(g.placeholder(Op::Param, &format!("in{k}"), "l", Phase::Forward, shape.clone()).unwrap());
    }
    let out = g.add(op.clone(), "out", "l", Phase::Forward, &nodes).unwrap();
    let mut order = nodes.clone();
    order.push(out);
    let p = Program::lower_in(&g, &order, &[out], graph_mode);
    let mut bufs = vec![Vec::new(); p.buffers.len()];
    for (k, (data, _)) in ins.iter().enumerate() {
        bufs[p.buffer_of(nodes[k]).unwrap().index()] = data.iter().map(|v| v.to_bits()).collect();
    }
    let o = run_program(cfg, mode, &p, &mut bufs, None).unwrap();
    assert_eq!(o.cycles, p.schedule(&g, cfg).total_cycles, "{op:?}: issued vs scheduled cycles");
    std::mem::take(&mut bufs[p.buffer_of(out).unwrap().index()])
}

#[test]
fn every_op_lowering_matches_the_reference_in_both_modes() {
    let cfg = HwConfig::test_config(4, 4, Dataflow::WeightStationary, faultline_num::Precision::Fp32Fp32);
    let vals =
        |n: usize, s: u32| -> Vec<f32> { (0..n).map(|i| (((i as u32 * 7 + s) % 13) as f32 - 6.0) / 4.0).collect() };
    let win = Window { kh: 2, kw: 2, stride: 1, padding: 1 };
    let probs: Vec<f32> = {
        let p = vals(12, 1).iter().map(|v| v.exp()).collect::<Vec<_>>();
        p.chunks(4)
            .flat_map(|r| {
                let s: f32 = r.iter().sum();
                r.iter().map(move |v| v / s)
            })
            .collect()
    };
    let onehot: Vec<f32> = (0..12).map(|i| if i % 4 == i / 4 { 1.0 } else { 0.0 }).collect();
    let positive = |n: usize, s: u32| -> Vec<f32> { vals(n, s).iter().map(|v| v.abs() + 0.25).collect() };
    let mm = |ta, tb| Op::MatMul { trans_a: ta, trans_b: tb };
    // Side-by-side 2x2 windows, and overlapping 3x3 ones of stride 1 (pixels in several windows).
    let pool2 = Window { kh: 2, kw: 2, stride: 2, padding: 0 };
    let pool3 = Window { kh: 3, kw: 3, stride: 1, padding: 0 };
    // Inputs after a ReLU (windows of zeros tie), the forward's max, and an upstream gradient.
    let max_pool_grad = |window: Window, image: [usize; 4]| {
        let x: Vec<f32> = vals(image.iter().product(), 3).iter().map(|v| v.max(0.0)).collect();
        let xt = Tensor::new(&image, x.iter().map(|&v| v as f64).collect()).unwrap();
        let pooled = Op::MaxPool { window }.output_shape(&[&image]).unwrap();
        let y: Vec<f32> =
            reference::apply(&Op::MaxPool { window }, &[&xt], &pooled).iter().map(|&v| v as f32).collect();
        let dy = vals(y.len(), 5);
        (Op::MaxPoolGrad { window }, vec![(x, image.to_vec()), (y, pooled.clone()), (dy, pooled)])
    };
    let cases: Vec<(Op, Args)> = vec![
        (mm(false, false), vec![(vals(15, 0), vec![3, 5]), (vals(10, 1), vec![5, 2])]),
        (mm(true, false), vec![(vals(15, 0), vec![5, 3]), (vals(10, 1), vec![5, 2])]),
        (mm(false, true), vec![(vals(15, 0), vec![3, 5]), (vals(10, 1), vec![2, 5])]),
        (mm(true, true), vec![(vals(30, 0), vec![2, 5, 3]), (vals(20, 1), vec![2, 2, 5])]),
        (Op::BiasAdd, vec![(vals(12, 0), vec![3, 4]), (vals(4, 1), vec![4])]),
        (Op::RowScale, vec![(vals(12, 0), vec![3, 4]), (vals(4, 1), vec![4])]),
        (Op::Scale { factor: 0.3 }, vec![(vals(12, 0), vec![3, 4])]),
        (Op::SumToShape { shape: vec![4] }, vec![(vals(12, 0), vec![3, 4])]),
        (Op::Relu, vec![(vals(12, 0), vec![3, 4])]),
        (Op::ReluGrad, vec![(vals(12, 0), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
        (Op::Gelu, vec![(vals(12, 0), vec![3, 4])]),
        (Op::GeluGrad, vec![(vals(12, 0), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
        (Op::Silu, vec![(vals(12, 0), vec![3, 4])]),
        (Op::SiluGrad, vec![(vals(12, 0), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
        (Op::RmsNorm { eps: 1e-5 }, vec![(vals(12, 0), vec![3, 4])]),
        (Op::RmsNormGrad { eps: 1e-5 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
        (Op::Softmax, vec![(vals(12, 0), vec![3, 4])]),
        (Op::SoftmaxGrad, vec![(probs.clone(), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
        (Op::LayerNorm { eps: 1e-5 }, vec![(vals(12, 0), vec![3, 4])]),
        (Op::LayerNormGrad { eps: 1e-5 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
        (Op::MeanPool, vec![(vals(24, 0), vec![2, 3, 4])]),
        (Op::MeanPoolGrad { len: 3 }, vec![(vals(8, 0), vec![2, 4])]),
        (Op::SoftmaxCrossEntropy, vec![(vals(12, 0), vec![3, 4]), (onehot.clone(), vec![3, 4])]),
        (Op::SoftmaxCrossEntropyGrad, vec![(vals(12, 0), vec![3, 4]), (onehot, vec![3, 4])]),
        (Op::Mse, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
        (Op::MseGrad, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
        (Op::SgdUpdate { lr: 0.1 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
        (Op::ScaleBy, vec![(vals(12, 0), vec![3, 4]), (vec![0.375], vec![1])]),
        (Op::SumSquares, vec![(vals(12, 0), vec![3, 4])]),
        (Op::SumSquaredDiff, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
        // Clipped (factor 2 / 3.0 below 1), not clipped (factor capped at 1), a zero norm.
        (Op::ClipCoef { max_norm: 2.0 }, vec![(vec![9.0], vec![1])]),
        (Op::ClipCoef { max_norm: 2.0 }, vec![(vec![0.25], vec![1])]),
        (Op::ClipCoef { max_norm: 1.0 }, vec![(vec![0.0], vec![1])]),
        (
            Op::AdamWUpdate { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1 },
            vec![
                (vals(12, 0), vec![3, 4]),
                (vals(12, 5), vec![3, 4]),
                (vals(12, 2).iter().map(|v| v * v).collect(), vec![3, 4]),
                (vec![3.0], vec![1]),
                (vec![0.01], vec![1]),
            ],
        ),
        (Op::MomentumVelocity { momentum: 0.9 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
        (Op::AdamMoment { beta: 0.9 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
        (Op::AdamSecondMoment { beta: 0.999 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
        (
            Op::AdamUpdate { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            vec![
                (vals(12, 0), vec![3, 4]),
                (vals(12, 5), vec![3, 4]),
                (vals(12, 2).iter().map(|v| v * v).collect(), vec![3, 4]),
                (vec![3.0], vec![1]),
            ],
        ),
        (Op::Im2Col { window: win }, vec![(vals(18, 0), vec![1, 3, 3, 2])]),
        (Op::Col2Im { window: win, image: vec![1, 3, 3, 2] }, vec![(vals(16 * 8, 0), vec![16, 8])]),
        (
            Op::Col2Im { window: Window { kh: 1, kw: 1, stride: 1, padding: 0 }, image: vec![1, 2, 2, 2] },
            vec![(vals(8, 0), vec![4, 2])],
        ),
        (Op::MaxPool { window: pool2 }, vec![(vals(2 * 4 * 5 * 3, 0), vec![2, 4, 5, 3])]),
        (Op::MaxPool { window: pool3 }, vec![(vals(2 * 4 * 5 * 3, 1), vec![2, 4, 5, 3])]),
        (Op::AvgPool { window: pool2 }, vec![(vals(2 * 4 * 5 * 3, 0), vec![2, 4, 5, 3])]),
        (Op::AvgPool { window: win }, vec![(vals(2 * 4 * 5 * 3, 2), vec![2, 4, 5, 3])]),
        (Op::AvgPoolGrad { window: win, image: vec![2, 4, 5, 3] }, vec![(vals(2 * 5 * 6 * 3, 2), vec![2, 5, 6, 3])]),
        max_pool_grad(pool2, [2, 4, 5, 3]),
        max_pool_grad(pool3, [2, 4, 5, 3]),
        (Op::BatchMean, vec![(vals(24, 0), vec![6, 4])]),
        (Op::BatchVar, vec![(vals(24, 0), vec![6, 4]), (vals(4, 3), vec![4])]),
        (Op::ColSum, vec![(vals(24, 0), vec![6, 4])]),
        (Op::SwapAxes, vec![(vals(120, 0), vec![2, 3, 4, 5])]),
        // Ids in range, one out of range and one not a whole number (rows of zeros).
        (
            Op::OneHot,
            vec![(vec![2.0, 0.0, 4.0, 1.0, 7.0, 2.5], vec![2, 3]), ((0..5).map(|c| c as f32).collect(), vec![5])],
        ),
        (
            Op::BatchNormGammaGrad { eps: 1e-5 },
            vec![
                (vals(24, 0), vec![6, 4]),
                (vals(4, 3), vec![4]),
                (positive(4, 1), vec![4]),
                (vals(24, 5), vec![6, 4]),
            ],
        ),
        (
            Op::BatchNormGrad { eps: 1e-5 },
            vec![
                (vals(24, 0), vec![6, 4]),
                (vals(4, 3), vec![4]),
                (positive(4, 1), vec![4]),
                (vals(4, 6), vec![4]),
                (vals(24, 5), vec![6, 4]),
                (vals(4, 8), vec![4]),
                (vals(4, 9), vec![4]),
            ],
        ),
    ];
    // Batch normalisation reads the batch's statistics (inputs 1, 2) in a training step and
    // the running ones (3, 4) in inference.
    let bn = |mode| {
        let ins = vec![
            (vals(24, 0), vec![6, 4]),
            (vals(4, 3), vec![4]),
            (positive(4, 1), vec![4]),
            (vals(4, 7), vec![4]),
            (positive(4, 2), vec![4]),
            (vals(4, 10), vec![4]),
            (vals(4, 11), vec![4]),
        ];
        (Op::BatchNorm { eps: 1e-5 }, ins, mode)
    };
    let cases = cases.into_iter().map(|(op, ins)| (op, ins, Mode::Train)).chain([bn(Mode::Train), bn(Mode::Eval)]);
    for (op, ins, graph_mode) in cases {
        let shapes: Vec<&[usize]> = ins.iter().map(|(_, s)| s.as_slice()).collect();
        let out_shape = op.output_shape(&shapes).unwrap();
        let tens: Vec<Tensor> =
            ins.iter().map(|(d, s)| Tensor::new(s, d.iter().map(|&v| v as f64).collect()).unwrap()).collect();
        let want = reference::apply_in(&op, &tens.iter().collect::<Vec<_>>(), &out_shape, graph_mode);
        let got = run(&cfg, &op, &ins, ExecMode::Functional, graph_mode);
        assert_eq!(got, run(&cfg, &op, &ins, ExecMode::CycleLevel, graph_mode), "{op:?}: modes differ");
        assert_eq!(got.len(), want.len(), "{op:?}");
        for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let g = f32::from_bits(g) as f64;
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{op:?} ({graph_mode:?})[{k}]: {g} vs {w}");
        }
    }
}
