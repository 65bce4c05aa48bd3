//! Checks computed beside training ([`faultline_graph::checks`]) on the machine: they leave
//! training bit-identical, the twins agree on their residuals, fault-free ABFT residuals stay
//! within the accumulation bound, a psum exponent flip in a guarded GEMM drives the residual
//! far past it, and a flip in the checksum GEMM itself never reaches training.

use faultline_graph::checks::{abft_bound, CheckKind, Side};
use faultline_graph::op::Op;
use faultline_graph::{ModelSpec, TrainGraph};
use faultline_hw::isa::Instr;
use faultline_hw::{ExecMode, FaultSite, HwConfig, Register};
use faultline_num::BitFault;
use faultline_train::{data::source, inject, ModelState, MxuFormat, StepFault, TrainOptions, Trainer};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// mlp-digits on `config` (batch `batch`, SGD), its graph changed by `protect`.
fn trainer(config: &str, batch: usize, protect: impl FnOnce(&mut TrainGraph)) -> Trainer {
    let spec = ModelSpec::load(root().join("models/mlp-digits.ron")).unwrap();
    let hw = HwConfig::load(root().join(format!("configs/{config}.ron"))).unwrap();
    let opts = TrainOptions { batch, eval_every: 0, ..TrainOptions::default() };
    let mut tg = TrainGraph::build(&spec, batch, opts.optimizer.spec(opts.lr)).unwrap();
    protect(&mut tg);
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    let precision =
        if hw.mxu.input_format == faultline_num::NumFormat::Fp32 { MxuFormat::Fp32 } else { MxuFormat::Bf16 };
    Trainer::from_graph(&spec, tg, &hw, data, TrainOptions { precision, ..opts }).unwrap()
}

/// Every check the tests use: global and per-tile ABFT on both sides of the forward GEMMs and
/// of two gradient GEMMs (one with `A`, one with `B` stored transposed), a range check of the
/// hidden activations and a duplicated ReLU.
fn protect_all(tg: &mut TrainGraph) {
    let find = |tg: &TrainGraph, name: &str| tg.graph.find(name).unwrap_or_else(|| panic!("no node {name}"));
    for (name, side, tile) in [
        ("fc1.matmul", Side::Rows, None),
        ("fc1.matmul", Side::Rows, Some(8)),
        ("fc2.matmul", Side::Cols, None),
        ("fc2.matmul", Side::Cols, Some(4)),
        ("d/fc1.matmul:b", Side::Cols, None),
        ("d/fc2.matmul:a", Side::Rows, None),
    ] {
        let i = find(tg, name);
        tg.add_abft(i, side, tile).unwrap();
    }
    let relu = find(tg, "relu1.relu");
    tg.add_range_check(relu).unwrap();
    tg.add_duplicate(relu).unwrap();
}

/// A residual over its bound, or not a number at all, fires the check.
fn fires(r: f64, bound: f64) -> bool {
    r.is_nan() || r > bound
}

fn same_bits(a: &ModelState, b: &ModelState) -> bool {
    a.tensors
        .iter()
        .zip(&b.tensors)
        .all(|((n, x), (m, y))| n == m && x.data.iter().zip(&y.data).all(|(p, q)| p.to_bits() == q.to_bits()))
}

#[test]
fn checks_leave_training_bit_identical_and_the_twins_agree_on_residuals() {
    let mut plain = trainer("tpu-8x8", 8, |_| {});
    let mut fast = trainer("tpu-8x8", 8, protect_all);
    let mut slow = fast.clone();
    slow.exec.mode = ExecMode::CycleLevel;
    assert_eq!(fast.exec.tg.checks().len(), 8);
    // The checks cost cycles: the protected step is longer.
    assert!(fast.schedule.total_cycles > plain.schedule.total_cycles);
    for _ in 0..3 {
        let (p, f, s) = (plain.step().unwrap(), fast.step().unwrap(), slow.step().unwrap());
        assert_eq!(p.loss.to_bits(), f.loss.to_bits());
        assert!(same_bits(&plain.state, &fast.state), "a check changed training");
        assert_eq!(f.checks.len(), 8);
        let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&f.checks), bits(&s.checks), "functional and cycle-level residuals differ");
        assert!(same_bits(&fast.state, &slow.state));
        // The duplicate is bit-exact; the range check is the activations' largest magnitude.
        assert_eq!(f.checks[7], 0.0);
        assert!(f.checks[6] > 0.0 && f.checks[6].is_finite());
    }
}

/// Each ABFT check's fault-free residual and its bound, on the step the trainer runs next.
fn residuals_and_bounds(t: &Trainer) -> Vec<(String, f64, f64)> {
    let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
    let bufs = t.exec.step_buffers(&t.state, &x, &y).unwrap();
    let (p, g) = (t.exec.program(), &t.exec.tg.graph);
    let value = |i| -> Vec<f32> { bufs[p.buffer_of(i).unwrap().index()].iter().map(|&b| f32::from_bits(b)).collect() };
    let unit = if t.exec.format == MxuFormat::Fp32 { 2f64.powi(-24) } else { 2f64.powi(-8) };
    let mut out = vec![];
    for c in t.exec.tg.checks() {
        let CheckKind::Abft { side, tile } = c.kind else { continue };
        let node = g.node(c.guarded);
        let Op::MatMul { trans_a, trans_b } = node.op else { unreachable!() };
        let (a, b) = (value(node.inputs[0]), value(node.inputs[1]));
        let (m, n) = (node.shape[0], node.shape[1]);
        let k = a.len() / m;
        let bound = abft_bound(&a, &b, trans_a, trans_b, [m, k, n], side, tile, unit);
        out.push((c.name.clone(), value(c.residual)[0] as f64, bound));
    }
    out
}

#[test]
fn fault_free_abft_residuals_stay_within_the_accumulation_bound() {
    for config in ["tpu-8x8", "tpu-8x8-fp32"] {
        let mut t = trainer(config, 16, protect_all);
        let mut worst: f64 = 0.0;
        for _ in 0..30 {
            for (name, r, bound) in residuals_and_bounds(&t) {
                assert!(
                    r.is_finite() && r <= bound,
                    "{config} step {}: {name} residual {r:e} > bound {bound:e}",
                    t.state.step + 1
                );
                worst = worst.max(r / bound);
            }
            t.step().unwrap();
        }
        eprintln!("{config}: largest fault-free ABFT residual is {worst:.2e} of its bound");
        assert!(worst > 0.0, "{config}: every residual was 0: the check computes nothing");
    }
}

/// The first cycle of the GEMM computing `node` at which flipping `bit` of the psum of the
/// bottom-left PE corrupts its outputs, with the faulty step's residuals and state.
fn first_corrupting_psum_flip(t: &Trainer, node: &str, bit: u32) -> (StepFault, Vec<f32>, ModelState) {
    let (p, g) = (t.exec.program(), &t.exec.tg.graph);
    let i = (0..p.instrs.len())
        .find(|&i| matches!(p.instrs[i], Instr::Gemm { .. }) && g.node(p.tags[i].node).name == node)
        .unwrap_or_else(|| panic!("no GEMM of {node}"));
    let cost = t.schedule.instrs[i];
    let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
    let site = FaultSite::pe(t.exec.hw.mxu.rows - 1, 0, Register::Psum, bit);
    for cycle in cost.start..cost.start + cost.cycles {
        let f = StepFault { kind: BitFault::Flip, site, step: t.state.step + 1, cycle, duration: 1 };
        let (inj, report) = inject::resolve(&t.exec, &t.schedule, &f).unwrap();
        let mut s = t.state.clone();
        let out = t.exec.step_with_fault(&mut s, &x, &y, inj.as_ref()).unwrap();
        if !inject::complete(report, out.effect.as_ref()).masked() {
            return (f, out.checks, s);
        }
    }
    panic!("no psum flip in {node}'s GEMM corrupts it");
}

#[test]
fn global_and_per_tile_abft_on_either_side_detect_a_psum_exponent_flip() {
    let t = trainer("tpu-8x8", 8, protect_all);
    let bounds = residuals_and_bounds(&t);
    for gemm in ["fc1.matmul", "fc2.matmul"] {
        let (f, checks, _) = first_corrupting_psum_flip(&t, gemm, 30);
        let mut fired = 0;
        for (k, c) in t.exec.tg.checks().iter().enumerate() {
            let Some((_, _, bound)) = bounds.iter().find(|(n, _, _)| *n == c.name) else { continue };
            let r = checks[k] as f64;
            if t.exec.tg.graph.node(c.guarded).name == gemm {
                assert!(fires(r, *bound), "{f}: {} residual {r:e} within bound {bound:e}: not detected", c.name);
                fired += 1;
            }
        }
        assert_eq!(fired, 2, "global and per-tile ABFT of {gemm}");
    }
}

#[test]
fn a_flip_in_the_checksum_gemm_is_detected_or_benign_never_silent() {
    let t = trainer("tpu-8x8", 8, protect_all);
    let mut golden = t.state.clone();
    let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
    t.exec.step(&mut golden, &x, &y).unwrap();
    let bounds = residuals_and_bounds(&t);
    let (f, checks, state) = first_corrupting_psum_flip(&t, "fc1.matmul.abft.check", 30);
    // It corrupted the checksum, which nothing in training reads ...
    assert!(same_bits(&state, &golden), "{f} in the checksum GEMM changed training");
    // ... and the corrupted checksum is caught.
    let k = t.exec.tg.checks().iter().position(|c| c.name == "fc1.matmul.abft").unwrap();
    let bound = bounds.iter().find(|(n, _, _)| n == "fc1.matmul.abft").unwrap().2;
    assert!(fires(checks[k] as f64, bound), "{f}: residual {:e} within {bound:e}", checks[k]);
}

/// A clamp (Ranger's restriction) on the hidden activations, added after ABFT of the next
/// GEMM and a range check and duplicate of the activations themselves: every former reader
/// but the activations' own checks reads the clamp (forward and backward nodes, and the
/// other GEMM's checksums), it runs right after the activations, the f64 reference and both
/// executor twins agree with it, and with the widest bound training is bit-identical.
#[test]
fn a_clamp_is_read_by_every_former_reader_and_restricts_training() {
    let mut tg = {
        let t = trainer("tpu-8x8", 8, protect_all);
        t.exec.tg.clone()
    };
    let relu = tg.graph.find("relu1.relu").unwrap();
    let own: Vec<_> = tg.checks().iter().filter(|c| c.guarded == relu).flat_map(|c| c.nodes.clone()).collect();
    let before = tg.graph.readers(relu);
    let moved: Vec<_> = before.iter().copied().filter(|r| !own.contains(r)).collect();
    let phases = |ns: &[_]| ns.iter().map(|&n| tg.graph.node(n).phase).collect::<std::collections::BTreeSet<_>>();
    assert!(phases(&moved).len() >= 2, "relu1.relu has forward and backward readers: {:?}", phases(&moved));
    assert!(moved.iter().any(|&n| tg.graph.node(n).name.starts_with("fc2.matmul.abft")), "ABFT reads it");
    assert!(!own.is_empty());

    let clamp = tg.add_clamp(relu, f32::MAX).unwrap();
    assert_eq!(tg.graph.node(clamp).name, "relu1.relu.clamp");
    assert_eq!(tg.graph.node(clamp).phase, tg.graph.node(relu).phase);
    assert_eq!(tg.graph.node(clamp).layer, tg.graph.node(relu).layer);
    for &r in &moved {
        let ins = &tg.graph.node(r).inputs;
        assert!(ins.contains(&clamp) && !ins.contains(&relu), "{} still reads relu1.relu", tg.graph.node(r).name);
    }
    let mut now = tg.graph.readers(relu);
    now.retain(|&r| r != clamp);
    let raw: Vec<_> = before.iter().copied().filter(|r| own.contains(r)).collect();
    assert!(!raw.is_empty());
    assert_eq!(now, raw, "only the activations' own checks read them raw");
    assert_eq!(tg.graph.readers(clamp), moved);
    let order = tg.execution_order();
    let at = order.iter().position(|&n| n == relu).unwrap();
    assert_eq!(order[at + 1], clamp, "the clamp runs right after its node");
    assert_eq!(order.len(), tg.graph.len());
    tg.topo_order().unwrap();
    // Twice, or on a check's node: errors.
    assert!(tg.add_clamp(relu, 1.0).is_err());
    assert!(tg.add_clamp(own[0], 1.0).is_err());
    assert!(tg.set_clamp_bound(relu, 1.0).is_err());
    assert!(tg.set_clamp_bound(clamp, -1.0).is_err());

    // The widest bound: training bit-identical to the unprotected run.
    let mut plain = trainer("tpu-8x8", 8, |_| {});
    let tg_wide = tg.clone();
    let mut wide = trainer("tpu-8x8", 8, move |g| *g = tg_wide);
    for _ in 0..3 {
        assert_eq!(plain.step().unwrap().loss.to_bits(), wide.step().unwrap().loss.to_bits());
        assert!(same_bits(&plain.state, &wide.state), "a clamp at f32::MAX changed training");
    }
    // A tight bound restricts: training changes, both twins agree, and the executor's clamp
    // agrees with the f64 reference of the same step.
    tg.set_clamp_bound(clamp, 0.05).unwrap();
    let tight_tg = tg.clone();
    let tight = trainer("tpu-8x8", 8, move |g| *g = tight_tg);
    let (x, y) = tight.data.train.gather(&tight.batcher.clone().next_indices());
    let bufs = tight.exec.step_buffers(&tight.state, &x, &y).unwrap();
    let p = tight.exec.program();
    let value = |i| -> Vec<f32> { bufs[p.buffer_of(i).unwrap().index()].iter().map(|&b| f32::from_bits(b)).collect() };
    let (raw, clamped) = (value(relu), value(clamp));
    assert!(raw.iter().any(|v| v.abs() > 0.05), "the bound restricts something");
    for (r, c) in raw.iter().zip(&clamped) {
        assert_eq!(c.to_bits(), r.clamp(-0.05, 0.05).to_bits());
    }
    let mut slow = tight.clone();
    slow.exec.mode = ExecMode::CycleLevel;
    let (mut a, mut b) = (tight.clone(), slow);
    assert_eq!(a.step().unwrap().loss.to_bits(), b.step().unwrap().loss.to_bits());
    assert!(same_bits(&a.state, &b.state));
    let mut p2 = trainer("tpu-8x8", 8, |_| {});
    p2.step().unwrap();
    assert!(!same_bits(&a.state, &p2.state), "a tight clamp changed nothing");
    // The f64 reference evaluates the clamped graph (its clamp reads a lower-indexed node).
    let mut feeds: std::collections::BTreeMap<String, faultline_graph::Tensor> = tight
        .state
        .tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                faultline_graph::Tensor { shape: t.shape.clone(), data: t.data.iter().map(|&v| v as f64).collect() },
            )
        })
        .collect();
    let g = &tg.graph;
    feeds.insert(
        "input".into(),
        faultline_graph::Tensor { shape: g.node(tg.input).shape.clone(), data: x.iter().map(|&v| v as f64).collect() },
    );
    feeds.insert(
        "labels".into(),
        faultline_graph::Tensor::one_hot(&y.iter().map(|&l| l as usize).collect::<Vec<_>>(), 10),
    );
    let vals = faultline_graph::reference::eval(g, &feeds).unwrap();
    let (rv, cv) = (vals.get(relu).unwrap(), vals.get(clamp).unwrap());
    let b = f64::from(0.05f32);
    assert!(rv.data.iter().any(|r| r.abs() > b));
    assert!(rv.data.iter().zip(&cv.data).all(|(r, c)| *c == r.clamp(-b, b)));
}
