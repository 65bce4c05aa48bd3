//! Random (mostly wrong) models never panic: they build or give an error; what builds evaluates
//! and schedules.

use faultline_graph::reference::eval;
use faultline_graph::{program, LayerOp, LayerSpec, LossSpec, ModelSpec, OptimizerSpec, Tensor, TrainGraph};
use faultline_hw::{Dataflow, HwConfig};
use proptest::prelude::*;

fn layer_op() -> impl Strategy<Value = LayerOp> {
    prop_oneof![
        (0usize..5, any::<bool>()).prop_map(|(units, bias)| LayerOp::Dense { units, bias }),
        (0usize..3, 0usize..4, 0usize..3, 0usize..2, any::<bool>()).prop_map(
            |(filters, kernel, stride, padding, bias)| LayerOp::Conv2d { filters, kernel, stride, padding, bias }
        ),
        (0usize..4, prop::option::of(0usize..3)).prop_map(|(size, stride)| LayerOp::MaxPool { size, stride }),
        (0usize..4, prop::option::of(0usize..3), 0usize..2).prop_map(|(size, stride, padding)| LayerOp::AvgPool {
            size,
            stride,
            padding
        }),
        Just(LayerOp::GlobalAvgPool),
        (0.0f64..0.1, 0.0f64..1.2).prop_map(|(eps, momentum)| LayerOp::BatchNorm { eps, momentum }),
        Just(LayerOp::Relu),
        Just(LayerOp::Gelu),
        Just(LayerOp::Silu),
        (0usize..4, 0usize..3).prop_map(|(vocab, dim)| LayerOp::Embedding { vocab, dim }),
        Just(LayerOp::TiedOutput { embedding: "l0".into() }),
        Just(LayerOp::RmsNorm { eps: 1e-5 }),
        Just(LayerOp::Mul),
        Just(LayerOp::Softmax),
        Just(LayerOp::LayerNorm { eps: 1e-5 }),
        Just(LayerOp::Flatten),
        prop::collection::vec(0usize..6, 0..3).prop_map(|shape| LayerOp::Reshape { shape }),
        Just(LayerOp::Add),
        Just(LayerOp::Positional),
        (1usize..3, any::<bool>()).prop_map(|(heads, causal)| LayerOp::Attention { heads, causal }),
        Just(LayerOp::MeanPool),
    ]
}

fn model() -> impl Strategy<Value = ModelSpec> {
    let input = prop_oneof![Just(vec![6]), Just(vec![4, 5]), Just(vec![5, 5, 2])];
    let inputs = prop_oneof![4 => Just(vec![]), 2 => prop::collection::vec(0usize..8, 1..4)];
    let layers = prop::collection::vec((layer_op(), inputs, 0usize..20), 1..7);
    // Clipping and schedules, valid or not, so that their checks meet every body.
    let clip = prop::option::of(-1.0f64..3.0);
    let schedule = prop::option::of((0u64..5, 0u64..8, -0.5f64..1.5));
    (input, layers, 1usize..5, any::<bool>(), clip, schedule).prop_map(|(input, layers, outputs, mse, clip_norm, s)| {
        let mut layers: Vec<LayerSpec> = layers
            .into_iter()
            .enumerate()
            .map(|(i, (op, ins, wild))| LayerSpec {
                name: format!("l{i}"),
                op,
                // Mostly earlier layers; sometimes (wild == 0) an unknown one on purpose.
                inputs: ins
                    .into_iter()
                    .map(|j| match (j % (i + 1), wild) {
                        (_, 0) => format!("l{}", i + j),
                        (0, _) => "input".to_string(),
                        (k, _) => format!("l{}", k - 1),
                    })
                    .collect(),
            })
            .collect();
        // A classifier head, so that many random bodies reach the loss.
        let n = layers.len();
        layers.push(LayerSpec { name: format!("l{n}"), op: LayerOp::Flatten, inputs: vec![] });
        layers.push(LayerSpec {
            name: format!("l{}", n + 1),
            op: LayerOp::Dense { units: outputs, bias: true },
            inputs: vec![],
        });
        ModelSpec {
            name: "random".into(),
            description: String::new(),
            input,
            outputs,
            loss: if mse { LossSpec::Mse } else { LossSpec::SoftmaxCrossEntropy },
            layers,
            clip_norm,
            schedule: s.map(|(warmup, total, floor)| faultline_graph::spec::Schedule::WarmupCosine {
                warmup,
                total,
                floor,
            }),
            file: "<random>".into(),
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_models_build_or_fail_cleanly(spec in model()) {
        let opt = OptimizerSpec::adam(1e-3);
        let Ok(tg) = TrainGraph::build(&spec, 2, opt) else { return Ok(()) };
        let mut feeds = tg.initial_state(1);
        let xs = tg.graph.node(tg.input).shape.clone();
        let n: usize = xs.iter().product();
        feeds.insert("input".into(), Tensor::new(&xs, (0..n).map(|i| (i % 7) as f64 / 7.0 - 0.4).collect()).unwrap());
        feeds.insert("labels".into(), Tensor::one_hot(&[0, spec.outputs - 1], spec.outputs));
        feeds.insert("step".into(), Tensor::new(&[1], vec![1.0]).unwrap());
        if tg.lr.is_some() {
            feeds.insert("lr".into(), Tensor::new(&[1], vec![tg.lr_at(1)]).unwrap());
        }
        let v = eval(&tg.graph, &feeds).unwrap();
        for i in tg.graph.indices() {
            prop_assert_eq!(&v.get(i).unwrap().shape, &tg.graph.node(i).shape);
        }
        let cfg = HwConfig::test_config(4, 4, Dataflow::WeightStationary, faultline_num::Precision::Fp32Fp32);
        let s = program::schedule(&tg, &cfg).unwrap();
        let computing = tg.graph.indices().filter(|&i| {
            let op = &tg.graph.node(i).op;
            !op.is_placeholder() && !matches!(op, faultline_graph::Op::Reshape { .. })
        });
        prop_assert_eq!(s.nodes.len(), computing.count());
    }
}

/// Model files as a fuzzer would write them: mutated shipped models and random bytes. The
/// parser (and what builds on it) never panics; an error is one line; what parses builds a
/// graph or fails with a one-line error.
mod model_parser {
    use super::*;
    use faultline_hw::fuzz::{apply, edit};

    fn shipped() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        ["mlp-digits.ron", "cnn-small.ron", "transformer-tiny.ron"]
            .iter()
            .map(|m| std::fs::read_to_string(dir.join(m)).unwrap())
            .collect()
    }

    fn check(text: &str) -> Result<(), TestCaseError> {
        match ModelSpec::from_ron(text, "fuzz.ron") {
            Err(e) => prop_assert!(!e.to_string().contains('\n'), "multi-line error: {e}"),
            Ok(spec) => {
                let opt = OptimizerSpec::Sgd { lr: 0.1 };
                if let Err(e) = TrainGraph::build(&spec, 2, opt) {
                    prop_assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn mutated_shipped_models_never_panic(file in 0usize..3, edits in prop::collection::vec(edit(), 1..5)) {
            check(&apply(&shipped()[file], &edits))?;
        }

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            check(&String::from_utf8_lossy(&bytes))?;
        }
    }
}
