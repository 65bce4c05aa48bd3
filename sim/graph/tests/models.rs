//! Shipped models build; bad model files give errors naming file, node and shapes; optimizer
//! nodes follow their formulas; phases and layers are tagged; the schedule adds up.

use faultline_graph::reference::eval;
use faultline_graph::{program, GraphError, ModelSpec, Op, OptimizerSpec, Phase, Tensor, TrainGraph};
use faultline_hw::isa::Instr;
use faultline_hw::HwConfig;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(name: &str) -> ModelSpec {
    ModelSpec::load(root().join("models").join(name)).unwrap_or_else(|e| panic!("{e}"))
}

const SGD: OptimizerSpec = OptimizerSpec::Sgd { lr: 0.1 };

#[test]
fn shipped_models_build_with_expected_sizes() {
    for (file, params, input, outputs) in [
        ("mlp-digits.ron", 4810, vec![16, 64], 10),
        ("cnn-small.ron", 2970, vec![16, 8, 8, 1], 10),
        ("transformer-tiny.ron", 2564, vec![16, 8, 8], 4),
    ] {
        let tg = TrainGraph::build(&load(file), 16, SGD).unwrap();
        assert_eq!(tg.param_count(), params, "{file}");
        assert_eq!(tg.graph.node(tg.input).shape, input, "{file}");
        assert_eq!(tg.graph.node(tg.output).shape, vec![16, outputs], "{file}");
        assert_eq!(tg.graph.node(tg.loss).shape, vec![1], "{file}");
        assert_eq!(tg.topo_order().unwrap().len(), tg.graph.len());
    }
}

#[test]
fn phases_are_contiguous_and_layers_tagged() {
    for opt in [SGD, OptimizerSpec::momentum(0.1), OptimizerSpec::adam(1e-3)] {
        let tg = TrainGraph::build(&load("transformer-tiny.ron"), 4, opt).unwrap();
        let phases: Vec<Phase> = tg.graph.indices().map(|i| tg.graph.node(i).phase).collect();
        assert!(phases.windows(2).all(|w| w[0] <= w[1]), "phases out of order for {opt:?}");
        for i in tg.graph.indices() {
            let n = tg.graph.node(i);
            assert!(!n.layer.is_empty(), "{}", n.name);
            assert_eq!(n.phase == Phase::Backward, n.name.starts_with("d/"), "{}", n.name);
        }
        // Backward nodes of the attention layer are tagged with it.
        assert!(tg.nodes_in_phase(Phase::Backward).iter().any(|&i| tg.graph.node(i).layer == "attn"));
        for p in tg.params() {
            assert_eq!(tg.graph.node(p.next).phase, Phase::Update);
            assert_eq!(tg.graph.node(p.next).layer, p.layer);
            assert_eq!(tg.graph.node(p.grad).shape, p.shape);
        }
    }
}

fn feeds(
    tg: &TrainGraph,
    state: &std::collections::BTreeMap<String, Tensor>,
    t: usize,
) -> std::collections::BTreeMap<String, Tensor> {
    let mut f = state.clone();
    let shape = tg.graph.node(tg.input).shape.clone();
    let n: usize = shape.iter().product();
    f.insert("input".into(), Tensor::new(&shape, (0..n).map(|i| ((i * 7 % 11) as f64 - 5.0) / 5.0).collect()).unwrap());
    let labels: Vec<usize> = (0..tg.batch).map(|i| i % 10).collect();
    f.insert("labels".into(), Tensor::one_hot(&labels, 10));
    if tg.step.is_some() {
        f.insert("step".into(), Tensor::new(&[1], vec![t as f64]).unwrap());
    }
    if tg.lr.is_some() {
        f.insert("lr".into(), Tensor::new(&[1], vec![tg.lr_at(t as u64)]).unwrap());
    }
    f
}

/// AdamW with a warm-up + cosine schedule and global-norm clipping: the last layer's weight
/// matrix and bias follow the formulas (every gradient scaled by `min(1, c / (||g|| + 1e-6))`,
/// `||g||` over all gradients; the rate by the schedule; decay on the matrix only).
#[test]
fn adamw_clipping_and_schedule_follow_their_formulas() {
    use faultline_graph::spec::Schedule;
    let mut spec = load("mlp-digits.ron");
    let (c, lr, wd, b1, b2, eps) = (0.5, 0.05, 0.1, 0.9, 0.999, 1e-8);
    spec.clip_norm = Some(c);
    let sched = Schedule::WarmupCosine { warmup: 2, total: 4, floor: 0.1 };
    spec.schedule = Some(sched);
    let want_factors = [0.5, 1.0, 0.1 + 0.9 * 0.5, 0.1, 0.1];
    for (t, f) in want_factors.iter().enumerate() {
        assert!((sched.factor(t as u64 + 1) - f).abs() < 1e-12, "factor at {}", t + 1);
    }
    let tg = TrainGraph::build(&spec, 4, OptimizerSpec::adamw(lr)).unwrap();
    assert!(tg.lr.is_some() && tg.grad_sumsq.is_some());
    let n = tg.params().len();
    let (w, b) = (tg.params()[n - 2].clone(), tg.params()[n - 1].clone());
    assert_eq!((w.shape.len(), b.shape.len()), (2, 1));
    let mut state = tg.initial_state(3);
    let mut moments = std::collections::BTreeMap::new();
    let mut clipped_once = false;
    for t in 1..=5usize {
        let vals = eval(&tg.graph, &feeds(&tg, &state, t)).unwrap();
        let sumsq: f64 =
            tg.params().iter().map(|p| vals.get(p.grad).unwrap().data.iter().map(|g| g * g).sum::<f64>()).sum();
        assert!((vals.get(tg.grad_sumsq.unwrap()).unwrap().data[0] - sumsq).abs() <= 1e-12 * sumsq);
        let coef = (c / (sumsq.sqrt() + 1e-6)).min(1.0);
        clipped_once |= coef < 1.0;
        let rate = lr * sched.factor(t as u64);
        let before = state.clone();
        tg.apply_updates(&vals, &mut state);
        for (p, decay) in [(&w, wd), (&b, 0.0)] {
            let g = &vals.get(p.grad).unwrap().data;
            let (m, v) = moments.entry(p.name.clone()).or_insert_with(|| (vec![0.0; g.len()], vec![0.0; g.len()]));
            for e in 0..g.len() {
                let ge = g[e] * coef;
                m[e] = b1 * m[e] + (1.0 - b1) * ge;
                v[e] = b2 * v[e] + (1.0 - b2) * ge * ge;
                let (mh, vh) = (m[e] / (1.0 - b1.powi(t as i32)), v[e] / (1.0 - b2.powi(t as i32)));
                let want = before[&p.name].data[e] * (1.0 - rate * decay) - rate * mh / (vh.sqrt() + eps);
                let got = state[&p.name].data[e];
                assert!((got - want).abs() < 1e-12, "{} step {t} [{e}]: {got} vs {want}", p.name);
            }
        }
    }
    assert!(clipped_once, "the test must clip at least once");
}

/// Runs two steps and checks the last parameter against the optimizer formula.
#[test]
fn optimizer_updates_follow_their_formulas() {
    let spec = load("mlp-digits.ron");
    let (lr, mu, b1, b2, eps) = (0.05, 0.9, 0.9, 0.999, 1e-8);
    for opt in [
        OptimizerSpec::Sgd { lr },
        OptimizerSpec::Momentum { lr, momentum: mu },
        OptimizerSpec::Adam { lr, beta1: b1, beta2: b2, eps },
    ] {
        let tg = TrainGraph::build(&spec, 4, opt).unwrap();
        let p = tg.params().last().unwrap().clone();
        let mut state = tg.initial_state(3);
        let (mut m, mut v) = (vec![0.0; 10], vec![0.0; 10]);
        for t in 1..=2 {
            let w0 = state[&p.name].data.clone();
            let vals = eval(&tg.graph, &feeds(&tg, &state, t)).unwrap();
            let g = vals.get(p.grad).unwrap().data.clone();
            tg.apply_updates(&vals, &mut state);
            for e in 0..10 {
                let want = match opt {
                    OptimizerSpec::Sgd { .. } => w0[e] - lr * g[e],
                    OptimizerSpec::Momentum { .. } => {
                        m[e] = mu * m[e] + g[e];
                        w0[e] - lr * m[e]
                    }
                    OptimizerSpec::Adam { .. } | OptimizerSpec::AdamW { .. } => {
                        m[e] = b1 * m[e] + (1.0 - b1) * g[e];
                        v[e] = b2 * v[e] + (1.0 - b2) * g[e] * g[e];
                        let (mh, vh) = (m[e] / (1.0 - b1.powi(t as i32)), v[e] / (1.0 - b2.powi(t as i32)));
                        w0[e] - lr * mh / (vh.sqrt() + eps)
                    }
                };
                assert!((state[&p.name].data[e] - want).abs() < 1e-12, "{opt:?} step {t}");
            }
        }
        assert_eq!(
            tg.opt_state.len(),
            match opt {
                OptimizerSpec::Sgd { .. } => 0,
                OptimizerSpec::Momentum { .. } => 4,
                _ => 8,
            }
        );
    }
}

#[test]
fn reference_training_lowers_the_loss() {
    let tg = TrainGraph::build(&load("mlp-digits.ron"), 8, SGD).unwrap();
    let mut state = tg.initial_state(1);
    let mut losses = vec![];
    for t in 1..=20 {
        let vals = eval(&tg.graph, &feeds(&tg, &state, t)).unwrap();
        losses.push(vals.get(tg.loss).unwrap().data[0]);
        tg.apply_updates(&vals, &mut state);
    }
    assert!(losses[19] < 0.5 * losses[0], "{losses:?}");
}

#[test]
fn initial_state_is_deterministic() {
    let tg = TrainGraph::build(&load("cnn-small.ron"), 2, SGD).unwrap();
    assert_eq!(tg.initial_state(9), tg.initial_state(9));
    assert_ne!(tg.initial_state(9), tg.initial_state(10));
}

fn bad(text: &str) -> String {
    let spec = ModelSpec::from_ron(text, "models/bad.ron");
    match spec.and_then(|s| TrainGraph::build(&s, 4, SGD)) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

const MLP: &str = r#"(
    name: "m",
    input: [64],
    outputs: 10,
    loss: SoftmaxCrossEntropy,
    layers: [
        (name: "fc1", op: Dense(units: 64)),
        (name: "relu1", op: Relu),
        (name: "fc2", op: Dense(units: 10)),
    ],
)"#;

#[test]
fn bad_model_files_name_file_node_and_shapes() {
    let e = bad(&MLP.replace("Relu", "Swish"));
    assert!(e.starts_with("models/bad.ron:8:") && e.contains("Swish") && e.contains("Relu"), "{e}");
    let e = bad(&MLP.replace("units: 64", "units: 64, unitz: 3"));
    assert!(e.starts_with("models/bad.ron:7:") && e.contains("unitz"), "{e}");
    let e = bad(&MLP.replace("outputs: 10", "outputz: 10"));
    assert!(e.starts_with("models/bad.ron:") && e.contains("outputz"), "{e}");
    let e = bad(&MLP.replace("units: 10", "units: 5"));
    assert!(e.contains("models/bad.ron") && e.contains("fc2") && e.contains("[4, 10]") && e.contains("[4, 5]"), "{e}");
    let e = bad(&MLP.replace("op: Relu)", "op: Relu, inputs: [\"fc0\"])"));
    assert!(e.contains("relu1") && e.contains("fc0") && e.contains("fc1"), "{e}");
    let e = bad(&MLP.replace("\"relu1\"", "\"fc1\""));
    assert!(e.contains("duplicate") && e.contains("fc1"), "{e}");
    let e = bad(&MLP.replace("op: Relu)", "op: Add, inputs: [\"input\", \"fc1\"])").replace("units: 64", "units: 32"));
    assert!(e.contains("relu1.add") && e.contains("[4, 64]") && e.contains("[4, 32]"), "{e}");
    let e = bad(&MLP.replace("Dense(units: 64)", "Conv2d(filters: 2, kernel: 3)"));
    assert!(e.contains("fc1") && e.contains("[B, H, W, C]") && e.contains("[4, 64]"), "{e}");
    let e = bad(&MLP.replace("(name: \"relu1\", op: Relu),", "(name: \"r\", op: Reshape(shape: [7, 9])),"));
    assert!(e.contains("r.reshape") && e.contains("[4, 7, 9]") && e.contains("[4, 64]"), "{e}");
    // A layer without its required field (the model's "missing parameter").
    let e = bad(&MLP.replace("Dense(units: 10)", "Dense()"));
    assert!(e.starts_with("models/bad.ron:9:") && e.contains("units"), "{e}");
    let e = ModelSpec::load("models/none.ron").unwrap_err().to_string();
    assert!(e.contains("models/none.ron"), "{e}");
}

#[test]
fn attention_shape_mismatch_names_the_layer() {
    let mut spec = load("transformer-tiny.ron");
    spec.layers.iter_mut().find(|l| l.name == "k").unwrap().op =
        faultline_graph::LayerOp::Dense { units: 8, bias: true };
    let e = TrainGraph::build(&spec, 2, SGD).unwrap_err().to_string();
    assert!(
        e.contains("transformer-tiny.ron") && e.contains("attn") && e.contains("[2, 8, 16]") && e.contains("[2, 8, 8]"),
        "{e}"
    );
}

#[test]
fn missing_or_misshaped_values_are_named() {
    let tg = TrainGraph::build(&load("mlp-digits.ron"), 2, SGD).unwrap();
    let mut f = feeds(&tg, &tg.initial_state(0), 1);
    f.remove("fc2.bias");
    let e = eval(&tg.graph, &f).unwrap_err();
    assert!(matches!(e, GraphError::MissingValue { kind: "parameter", .. }), "{e}");
    assert!(e.to_string().contains("fc2.bias") && e.to_string().contains("[10]"), "{e}");
    f.insert("fc2.bias".into(), Tensor::zeros(&[9]));
    let e = eval(&tg.graph, &f).unwrap_err().to_string();
    assert!(e.contains("fc2.bias") && e.contains("[10]") && e.contains("[9]"), "{e}");
}

#[test]
fn bad_optimizer_and_batch_are_rejected() {
    let spec = load("mlp-digits.ron");
    assert!(TrainGraph::build(&spec, 0, SGD).is_err());
    let e = TrainGraph::build(&spec, 2, OptimizerSpec::Momentum { lr: 0.1, momentum: 1.5 }).unwrap_err().to_string();
    assert!(e.contains("momentum") && e.contains("1.5"), "{e}");
}

#[test]
fn program_lowers_matmuls_to_gemms_and_its_schedule_adds_up() {
    use faultline_hw::isa::ExecUnit;
    for (file, hw) in ["mlp-digits.ron", "cnn-small.ron", "transformer-tiny.ron"]
        .into_iter()
        .flat_map(|f| ["tpu-8x8", "tpu-32x32", "tpu-128x128"].map(|h| (f, h)))
    {
        let cfg = HwConfig::load(root().join(format!("configs/{hw}.ron"))).unwrap();
        let tg = TrainGraph::build(&load(file), 32, SGD).unwrap();
        let p = program::Program::step(&tg).place(&cfg).unwrap();
        let s = p.schedule(&tg.graph, &cfg);
        let file = format!("{file} on {hw}");
        let overhead = faultline_hw::memory::dma::overhead(&cfg).unwrap();
        // Busy cycles add up per phase, layer and unit; the step is the critical path.
        let busy = s.mxu_cycles + s.vpu_cycles + s.dma_cycles;
        assert_eq!(s.per_phase.values().sum::<u64>(), busy);
        assert_eq!(s.per_layer.values().sum::<u64>(), busy);
        let lp: u64 = s.per_layer_phase.values().flat_map(|m| m.values()).sum();
        assert_eq!(lp, busy);
        assert_eq!(
            s.instrs.iter().map(|c| faultline_hw::isa::occupancy(c.unit, c.cycles, overhead)).sum::<u64>(),
            busy
        );
        // Run back to back, the instructions would take the sum of their cycles.
        let serial: u64 = s.instrs.iter().map(|c| c.cycles).sum();
        assert!(s.total_cycles >= s.mxu_cycles.max(s.vpu_cycles).max(s.dma_cycles) && s.total_cycles <= serial);
        assert_eq!(s.instrs.iter().map(|c| c.start + c.cycles).max(), Some(s.total_cycles));
        // The timing rule: a unit runs one instruction at a time, in program order (a DMA
        // transfer occupies the engine for its data phase), an instruction starts after every
        // instruction writing a buffer it reads has ended, and after every instruction touching
        // a buffer whose SRAM words its outputs reuse has ended.
        let busy_of = |c: &program::InstrCost| faultline_hw::isa::occupancy(c.unit, c.cycles, overhead);
        for (i, (ins, c)) in p.instrs.iter().zip(&s.instrs).enumerate() {
            assert_eq!(c.unit, ins.unit());
            let reused: Vec<_> = ins.writes().iter().flat_map(|b| p.reuses[b.index()].clone()).collect();
            let earlier = p.instrs[..i].iter().zip(&s.instrs[..i]);
            for (prev, pc) in earlier {
                if pc.unit == c.unit {
                    assert!(
                        pc.start + busy_of(pc) <= c.start,
                        "{file}: instruction {i} overlaps its unit's previous one"
                    );
                }
                if prev.reads().iter().chain(&prev.writes()).any(|b| reused.contains(b)) {
                    assert!(pc.start + pc.cycles <= c.start, "{file}: instruction {i} overwrites words still in use");
                }
                if prev.writes().iter().any(|b| ins.reads().contains(b)) {
                    assert!(
                        pc.start + pc.cycles <= c.start,
                        "{file}: instruction {i} starts before its input is written"
                    );
                }
            }
            // ... and no earlier than that: it waits for its unit or an input, or starts at 0.
            let waited = c.start == 0
                || s.instrs[..i].iter().zip(&p.instrs[..i]).any(|(pc, prev)| {
                    (pc.unit == c.unit && pc.start + busy_of(pc) == c.start)
                        || (pc.start + pc.cycles == c.start
                            && prev
                                .reads()
                                .iter()
                                .chain(&prev.writes())
                                .any(|b| ins.reads().contains(b) || reused.contains(b)))
                });
            assert!(waited, "{file}: instruction {i} starts later than its unit and inputs allow");
        }
        // A unit's busy and stall cycles fill its time up to its last instruction's end, and
        // the per-phase and per-layer breakdowns add up to the unit's totals.
        let t = p.timeline(&s.instrs.iter().map(|c| c.cycles).collect::<Vec<_>>());
        let (total, units) = (t.total, t.units);
        assert_eq!(total, s.total_cycles);
        for u in ExecUnit::ALL {
            let last = s.instrs.iter().filter(|c| c.unit == u).map(|c| c.start + busy_of(c)).max().unwrap();
            let t = units[u.name()];
            assert_eq!(t.busy + t.stall, last, "{file}: {}", u.name());
            for split in [s.per_phase_unit.values().collect::<Vec<_>>(), s.per_layer_unit.values().collect()] {
                let (b, st) =
                    split.iter().filter_map(|m| m.get(u.name())).fold((0, 0), |a, c| (a.0 + c.busy, a.1 + c.stall));
                assert_eq!((b, st), (t.busy, t.stall), "{file}: {}", u.name());
            }
        }
        // The units overlap somewhere in every model's step (backward GEMMs beside VPU work).
        assert!(s.total_cycles < serial, "{file}: no overlap");
        assert_eq!(s.nodes.iter().map(|n| n.instructions).sum::<usize>(), p.instrs.len());
        for (ins, (tag, cost)) in p.instrs.iter().zip(p.tags.iter().zip(&s.instrs)) {
            let node = tg.graph.node(tag.node);
            assert_eq!((tag.phase, tag.layer.as_str()), (node.phase, node.layer.as_str()));
            match (&node.op, ins) {
                (Op::MatMul { .. }, Instr::Gemm { m, k, n, .. }) => {
                    assert_eq!(cost.cycles, faultline_hw::mxu::gemm_timing(&cfg.mxu, *m, *k, *n).total_cycles);
                    let out = &node.shape;
                    assert_eq!((*m, *n), (out[out.len() - 2], out[out.len() - 1]), "{}", node.name);
                }
                (_, Instr::Dma { .. }) => {}
                (Op::MatMul { .. }, other) => panic!("{} lowered to {other:?}", node.name),
                (op, Instr::Vpu { .. }) => assert!(!op.is_placeholder() && !matches!(op, Op::Reshape { .. })),
                (op, other) => panic!("{op:?} lowered to {other:?}"),
            }
        }
        // Placeholders and reshapes issue nothing; every other node issues on one unit.
        for n in &s.nodes {
            let op = &tg.graph.node(n.node).op;
            assert!(!op.is_placeholder() && !matches!(op, Op::Reshape { .. }), "{}", n.name);
            assert_eq!(n.unit == ExecUnit::Mxu, matches!(op, Op::MatMul { .. }), "{}", n.name);
        }
        assert!(s.per_phase[&Phase::Backward] > 0 && s.per_phase[&Phase::Update] > 0);
        assert_eq!(s.to_csv().lines().count(), s.nodes.len() + 1);
        // A step cycle belongs to at most one instruction per unit.
        assert_eq!(s.locate(s.instrs[0].unit, 0), Some((0, 0)), "{file}");
        for u in [ExecUnit::Mxu, ExecUnit::Vpu] {
            assert_eq!(s.locate(u, s.total_cycles), None);
            for (i, c) in s.instrs.iter().enumerate().filter(|(_, c)| c.unit == u) {
                assert_eq!(s.locate(u, c.start), Some((i, 0)));
                assert_eq!(s.locate(u, c.start + c.cycles - 1), Some((i, c.cycles - 1)));
            }
        }
    }
    // The mlp's forward fc1 matmul is one 32 x 64 x 64 GEMM; the transformer's attention
    // products are one GEMM per batch element.
    let tg = TrainGraph::build(&load("mlp-digits.ron"), 32, SGD).unwrap();
    let p = program::Program::step(&tg);
    let fc1 = tg.graph.find("fc1.matmul").unwrap();
    let gemms: Vec<_> = p.instrs.iter().zip(&p.tags).filter(|(_, t)| t.node == fc1).map(|(i, _)| i).collect();
    assert!(matches!(gemms[..], [Instr::Gemm { m: 32, k: 64, n: 64, .. }]), "{gemms:?}");
    let tg = TrainGraph::build(&load("transformer-tiny.ron"), 4, SGD).unwrap();
    let p = program::Program::step(&tg);
    for i in tg.graph.indices() {
        let node = tg.graph.node(i);
        if matches!(node.op, Op::MatMul { .. }) && node.shape.len() == 3 {
            let n = p.tags.iter().filter(|t| t.node == i).count();
            assert_eq!(n, node.shape[0], "{}", node.name);
        }
    }
}

#[test]
fn summary_lists_parameters() {
    let tg = TrainGraph::build(&load("mlp-digits.ron"), 2, SGD).unwrap();
    let s = tg.summary();
    assert!(s.contains("fc1.weight") && s.contains("[64, 64]") && s.contains("4810"), "{s}");
    assert!(tg.graph.to_dot().starts_with("digraph"));
}

/// Layer names may hold commas and quotes (only spaces and control characters are refused):
/// the schedule's CSV quotes them, so a CSV reader gets every row at the header's width and the
/// names back.
#[test]
fn schedule_csv_quotes_layer_names() {
    let mut spec = load("mlp-digits.ron");
    spec.layers[0].name = "fc,1".into();
    spec.layers[2].name = "fc\"2".into();
    let cfg = HwConfig::load(root().join("configs/tpu-8x8.ron")).unwrap();
    let tg = TrainGraph::build(&spec, 4, SGD).unwrap();
    let s = program::Program::step(&tg).place(&cfg).unwrap().schedule(&tg.graph, &cfg);
    let csv = s.to_csv();
    let mut rd = csv::Reader::from_reader(csv.as_bytes());
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), s.nodes.len());
    assert!(rows.iter().all(|r| r.len() == 9), "{csv}");
    for (r, n) in rows.iter().zip(&s.nodes) {
        assert_eq!((&r[0], &r[1], r[8].parse::<u64>().unwrap()), (n.name.as_str(), n.layer.as_str(), n.cycles));
    }
    let layers: std::collections::BTreeSet<&str> = rows.iter().map(|r| &r[1]).collect();
    assert!(layers.contains("fc,1") && layers.contains("fc\"2"), "{layers:?}");
}

/// Names are printed in errors, listings and traces: one with a newline, a space or nothing in
/// it is refused by a one-line error that shows it escaped (a fuzzed model named a layer
/// "ln1\n" and made a two-line error).
#[test]
fn unprintable_names_are_refused_on_one_line() {
    for bad in ["ln1\n", "fc 1", "", "a\tb"] {
        for which in 0..3 {
            let mut spec = load("transformer-tiny.ron");
            match which {
                0 => spec.name = bad.into(),
                1 => spec.layers[2].name = bad.into(),
                _ => spec.layers[3].inputs = vec![bad.into()],
            }
            let e = TrainGraph::build(&spec, 2, SGD).unwrap_err().to_string();
            assert!(!e.contains('\n') && e.contains(&format!("{bad:?}")) && e.contains("without spaces"), "{e}");
        }
    }
}

/// A bad clipping norm, schedule or weight decay is refused with the field and the rule.
#[test]
fn bad_clipping_schedules_and_weight_decay_name_their_field() {
    use faultline_graph::spec::Schedule;
    let err = |spec: &faultline_graph::ModelSpec, opt: OptimizerSpec| {
        TrainGraph::build(spec, 4, opt).unwrap_err().to_string()
    };
    let mut spec = load("mlp-digits.ron");
    for c in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        spec.clip_norm = Some(c);
        let e = err(&spec, OptimizerSpec::adamw(0.01));
        assert!(e.contains("clip_norm") && e.contains("positive"), "{e}");
    }
    spec.clip_norm = Some(1.0);
    for (s, why) in [
        (Schedule::WarmupCosine { warmup: 0, total: 10, floor: 0.1 }, "1 <= warmup < total"),
        (Schedule::WarmupCosine { warmup: 10, total: 10, floor: 0.1 }, "1 <= warmup < total"),
        (Schedule::WarmupCosine { warmup: 2, total: 10, floor: 1.5 }, "[0, 1]"),
        (Schedule::WarmupCosine { warmup: 2, total: 10, floor: f64::NAN }, "[0, 1]"),
    ] {
        spec.schedule = Some(s);
        let e = err(&spec, OptimizerSpec::Sgd { lr: 0.1 });
        assert!(e.contains("schedule") && e.contains(why), "{e}");
    }
    spec.schedule = None;
    let mut opt = OptimizerSpec::adamw(0.01);
    if let OptimizerSpec::AdamW { weight_decay, .. } = &mut opt {
        *weight_decay = 200.0;
    }
    let e = err(&spec, opt);
    assert!(e.contains("weight_decay = 200") && e.contains("lr * weight_decay < 1"), "{e}");
}
