//! Cross-crate behaviour of training: agreement with the f64 reference, twin bit-exactness,
//! learning of the shipped models, checkpoint resume, and errors on bad inputs.

use faultline_graph::{reference, ModelSpec, Tensor, TrainGraph};
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::{data::source, Batcher, InitWeights, MxuFormat, OptimizerKind, TrainOptions, Trainer};
use npyz::WriterBuilder;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model(name: &str) -> ModelSpec {
    ModelSpec::load(root().join(format!("models/{name}.ron"))).unwrap()
}

/// A trainer of `spec` on tpu-32x32 with the shipped data and default options.
fn default_trainer(spec: &ModelSpec) -> Trainer {
    Trainer::new(spec, &hw(), source::shipped(spec, 1, &Default::default()).unwrap(), TrainOptions::default()).unwrap()
}

fn hw() -> HwConfig {
    config("tpu-32x32")
}

fn config(name: &str) -> HwConfig {
    HwConfig::load(root().join(format!("configs/{name}.ron"))).unwrap()
}

fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) {
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let f = std::fs::File::create(path).unwrap();
    let mut w = npyz::WriteOptions::new().default_dtype().shape(&shape).writer(f).begin_nd().unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
}

/// Writes `<param>.npy` for every parameter of `tg`, uniform in [-0.3, 0.3], as PyTorch would.
fn write_weights(tg: &TrainGraph, dir: &Path, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for p in tg.params() {
        let n: usize = p.shape.iter().product();
        let data: Vec<f32> = (0..n).map(|_| rng.gen_range(-0.3f32..0.3)).collect();
        write_npy_f32(&dir.join(format!("{}.npy", p.name)), &p.shape, &data);
    }
}

fn options(optimizer: OptimizerKind, lr: f64, precision: MxuFormat, mode: ExecMode, init: InitWeights) -> TrainOptions {
    TrainOptions {
        batch: 32,
        optimizer,
        lr: Some(lr),
        precision,
        mode,
        seed: 5,
        eval_every: 0,
        init,
        ..Default::default()
    }
}

/// fp32 MXU + fp32 VPU from .npy weights tracks the f64 reference interpreter, fed the same
/// batches, to 1e-4 relative loss at each of 20 steps (3 for LeNet, whose reference is slow),
/// and the trace's gradient norm, update norm and largest attention logit to 1e-3.
#[test]
fn fp32_training_matches_f64_reference() {
    for (name, opt, lr, cfg, steps) in [
        ("mlp-digits", OptimizerKind::Sgd, 0.5, "tpu-32x32", 20),
        ("cnn-small", OptimizerKind::Adam, 0.01, "tpu-32x32", 20),
        ("transformer-tiny", OptimizerKind::Momentum, 0.05, "tpu-32x32", 20),
        ("lenet-mnist", OptimizerKind::Sgd, 0.1, "tpu-128x128", 3),
        ("resnet-mini", OptimizerKind::Momentum, 0.05, "tpu-128x128", 3),
        ("gpt-mini", OptimizerKind::AdamW, 0.006, "tpu-128x128", 2),
    ] {
        let spec = model(name);
        let data = source::shipped(&spec, 5, &Default::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tg = TrainGraph::build(&spec, 32, opt.spec(Some(lr))).unwrap();
        write_weights(&tg, dir.path(), 11);
        let o = options(opt, lr, MxuFormat::Fp32, ExecMode::Functional, InitWeights::NpyDir(dir.path().into()));
        let mut t = Trainer::new(&spec, &config(cfg), data.clone(), o).unwrap();

        // The f64 side: same files, same batch order, the graph crate's reference interpreter.
        let mut state: BTreeMap<String, Tensor> = tg.initial_state(0);
        for p in tg.params() {
            let a = faultline_train::data::npy::read_f32(&dir.path().join(format!("{}.npy", p.name))).unwrap();
            state.insert(p.name.clone(), Tensor::new(&a.shape, a.data.iter().map(|&v| v as f64).collect()).unwrap());
        }
        let mut batcher = Batcher::new(data.train.len(), 32, 5).unwrap();
        for step in 1..=steps {
            let (x, y) = data.train.gather(&batcher.next_indices());
            let mut feeds = state.clone();
            let mut ishape = vec![32];
            ishape.extend(&spec.input);
            feeds.insert("input".into(), Tensor::new(&ishape, x.iter().map(|&v| v as f64).collect()).unwrap());
            let labels: Vec<usize> = y.iter().map(|&l| l as usize).collect();
            feeds.insert("labels".into(), Tensor::one_hot(&labels, spec.outputs));
            feeds.insert("step".into(), Tensor::new(&[1], vec![step as f64]).unwrap());
            feeds.insert("lr".into(), Tensor::new(&[1], vec![tg.lr_at(step)]).unwrap());
            let vals = reference::eval(&tg.graph, &feeds).unwrap();
            let want = vals.get(tg.loss).unwrap().data[0];
            let before = state.clone();
            tg.apply_updates(&vals, &mut state);
            // The trace's signals, from the same f64 values.
            let sq = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>();
            let grad_norm = tg.params().iter().map(|p| sq(&vals.get(p.grad).unwrap().data)).sum::<f64>().sqrt();
            let update_norm = (tg.params().iter())
                .map(|p| {
                    let (a, b) = (&state[&p.name].data, &before[&p.name].data);
                    a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>()
                })
                .sum::<f64>()
                .sqrt();
            let logit = (tg.attention_logits.iter())
                .flat_map(|&l| vals.get(l).unwrap().data.iter().map(|x| x.abs()))
                .reduce(f64::max);

            let r = t.step().unwrap();
            let got = r.loss;
            let rel = ((got - want) / want).abs();
            assert!(rel < 1e-4, "{name} step {step}: loss {got} vs f64 reference {want} (relative {rel:e})");
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.abs();
            assert!(close(r.grad_norm, grad_norm), "{name} step {step}: grad norm {} vs {grad_norm}", r.grad_norm);
            assert!(
                close(r.update_norm, update_norm),
                "{name} step {step}: update norm {} vs {update_norm}",
                r.update_norm
            );
            match (r.max_attention_logit, logit) {
                (Some(a), Some(b)) => assert!(close(a, b), "{name} step {step}: attention logit {a} vs {b}"),
                (a, b) => assert_eq!(a.is_some(), b.is_some(), "{name}: attention logits"),
            }
        }
    }
}

/// Functional and cycle-level training give the same loss bits and the same weight bits.
#[test]
fn cycle_level_and_functional_training_are_bit_identical() {
    for (name, steps, cfg) in [
        ("mlp-digits", 3, "tpu-32x32"),
        ("cnn-small", 2, "tpu-32x32"),
        ("transformer-tiny", 1, "tpu-32x32"),
        ("lenet-mnist", 1, "tpu-128x128"),
    ] {
        let spec = model(name);
        let hw = config(cfg);
        let data = source::shipped(&spec, 1, &Default::default()).unwrap();
        let opts = |mode| options(OptimizerKind::Adam, 0.01, MxuFormat::Bf16, mode, InitWeights::Seed);
        let run = |mode| {
            let mut t = Trainer::new(&spec, &hw, data.clone(), opts(mode)).unwrap();
            let records: Vec<_> = (0..steps).map(|_| t.step().unwrap()).collect();
            let losses: Vec<u64> = records.iter().map(|r| r.loss.to_bits()).collect();
            let cycles: Vec<_> = records.iter().map(|r| (r.cycles, r.phase_cycles.clone())).collect();
            let weights: BTreeMap<String, Vec<u32>> =
                t.state.tensors.iter().map(|(k, v)| (k.clone(), v.bits())).collect();
            (losses, weights, cycles)
        };
        let (lf, wf, cf) = run(ExecMode::Functional);
        let (lc, wc, cc) = run(ExecMode::CycleLevel);
        assert_eq!(lf, lc, "{name}: loss bits differ");
        assert_eq!(wf, wc, "{name}: weight / optimizer-state bits differ");
        assert_eq!(cf, cc, "{name}: issued cycles differ between modes");
        for (total, phases) in &cf {
            // Every phase keeps some unit busy, and none for longer than the step.
            assert!(phases.values().all(|&c| c > 0 && c <= *total), "{name}: {phases:?} in {total}");
        }
        // The comparison is not vacuous: training moved every parameter.
        let t0 = Trainer::new(&spec, &hw, data.clone(), opts(ExecMode::Functional)).unwrap();
        for p in t0.exec.tg.params() {
            assert_ne!(t0.state.tensors[&p.name].bits(), wf[&p.name], "{name}: {} did not change", p.name);
        }
    }
}

/// Costing is the program's schedule and execution interprets the same program: the cycles a
/// step issues equal the static schedule exactly, in total, per phase and per unit, for every
/// shipped model on every shipped config.
#[test]
fn static_schedule_equals_issued_cycles() {
    for name in ["mlp-digits", "cnn-small", "transformer-tiny"] {
        let spec = model(name);
        for cfg in ["tpu-8x8", "tpu-32x32", "tpu-128x128"] {
            let hw = HwConfig::load(root().join(format!("configs/{cfg}.ron"))).unwrap();
            let data = source::shipped(&spec, 1, &Default::default()).unwrap();
            let opts = options(OptimizerKind::Adam, 0.01, MxuFormat::Bf16, ExecMode::Functional, InitWeights::Seed);
            let mut t = Trainer::new(&spec, &hw, data, opts).unwrap();
            let sched = t.schedule.clone();
            let r = t.step().unwrap();
            assert_eq!(r.cycles, sched.total_cycles, "{name} on {cfg}");
            let phases: BTreeMap<String, u64> =
                sched.per_phase.iter().map(|(p, &c)| (p.name().to_string(), c)).collect();
            assert_eq!(r.phase_cycles, phases, "{name} on {cfg}");
            let units = t.exec.program().timeline(&sched.instrs.iter().map(|c| c.cycles).collect::<Vec<_>>()).units;
            assert_eq!(r.unit_cycles, units, "{name} on {cfg}");
            assert_eq!((units["mxu"].busy, units["vpu"].busy), (sched.mxu_cycles, sched.vpu_cycles));
            let busy = sched.mxu_cycles + sched.vpu_cycles + sched.dma_cycles;
            assert_eq!(sched.per_phase.values().sum::<u64>(), busy, "{name} on {cfg}");
            let serial: u64 = sched.instrs.iter().map(|c| c.cycles).sum();
            assert!(sched.total_cycles < serial, "{name} on {cfg}: the units overlap");
            assert!(sched.mxu_cycles > 0 && sched.vpu_cycles > 0, "{name} on {cfg}");
        }
    }
}

/// The default run of mlp-digits (200 steps, batch 32, sgd, bf16) reaches >= 90% test accuracy.
#[test]
fn mlp_digits_default_run_reaches_ninety_percent() {
    let spec = model("mlp-digits");
    let mut t = default_trainer(&spec);
    let s = t.run(200, |_, _| Ok(())).unwrap();
    assert!(s.test_accuracy >= 0.9, "test accuracy {}", s.test_accuracy);
    assert_eq!(s.losses.len(), 200);
    assert!(s.cycles_per_step > 0 && s.phase_cycles.values().all(|&c| c > 0), "{:?}", s.phase_cycles);
}

/// cnn-small and transformer-tiny learn: the loss of the last steps is at most half the first.
#[test]
fn cnn_and_transformer_learn() {
    for name in ["cnn-small", "transformer-tiny"] {
        let spec = model(name);
        let mut t = default_trainer(&spec);
        let s = t.run(150, |_, _| Ok(())).unwrap();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (first, last) = (mean(&s.losses[..5]), mean(&s.losses[s.losses.len() - 5..]));
        assert!(last <= 0.5 * first, "{name}: loss {first} -> {last}");
    }
}

/// lenet-mnist learns the shipped MNIST digits: a third of the guide's run (100 of 300 SGD
/// steps, lr 0.1; the guide's reaches 95.1%) is already past 85% on the 1,000 held-out digits.
#[test]
fn lenet_mnist_learns_mnist() {
    let spec = model("lenet-mnist");
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    assert_eq!(data.test.len(), 1000);
    let o = TrainOptions { lr: Some(0.1), eval_every: 0, ..Default::default() };
    let mut t = Trainer::new(&spec, &config("tpu-128x128"), data, o).unwrap();
    let s = t.run(100, |_, _| Ok(())).unwrap();
    assert!(s.test_accuracy >= 0.85, "test accuracy {}", s.test_accuracy);
}

/// resnet-mini learns the shipped MNIST digits with BatchNorm: a third of the guide's run (100
/// of 300 momentum steps, lr 0.05; the guide's reaches 96.1%), evaluated with the running
/// statistics, is past 85%.
#[test]
fn resnet_mini_learns_mnist() {
    let spec = model("resnet-mini");
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    let o = TrainOptions { optimizer: OptimizerKind::Momentum, lr: Some(0.05), eval_every: 0, ..Default::default() };
    let mut t = Trainer::new(&spec, &config("tpu-128x128"), data, o).unwrap();
    let s = t.run(100, |_, _| Ok(())).unwrap();
    assert!(s.test_accuracy >= 0.85, "test accuracy {}", s.test_accuracy);
}

/// gpt-mini learns the shipped Shakespeare: a fifth of the guide's run (60 of 300 AdamW steps,
/// peak lr 0.006; the guide's reaches 40.3% and perplexity 7.63) predicts the next character of the
/// held-out text better than its letter frequencies could (a unigram model: 15.0%, perplexity
/// 27.0 on this corpus).
#[test]
fn gpt_mini_learns_shakespeare() {
    let spec = model("gpt-mini");
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    assert_eq!((data.test.label_len, data.train.num_classes), (64, 96));
    let o = TrainOptions { optimizer: OptimizerKind::AdamW, lr: Some(0.006), eval_every: 30, ..Default::default() };
    let mut t = Trainer::new(&spec, &config("tpu-128x128"), data, o).unwrap();
    let mut evals = Vec::new();
    let s = t
        .run(60, |_, r| {
            evals.extend(r.test_accuracy.map(|a| (a, r.test_perplexity)));
            Ok(())
        })
        .unwrap();
    let p = s.test_perplexity.expect("a language model reports its perplexity");
    // The evaluation steps' trace lines carry the perplexity; the summary is the last one's.
    assert_eq!(evals.len(), 2);
    assert!(evals[0].1.is_some_and(|p0| p0 > p), "perplexity falls: {evals:?}");
    assert_eq!(evals[1], (s.test_accuracy, Some(p)));
    assert!(s.test_accuracy >= 0.2 && p < 16.0, "next-token accuracy {}, perplexity {p}", s.test_accuracy);
}

/// Saving after k steps and resuming gives the same losses and bits as never stopping.
#[test]
fn resumed_run_equals_uninterrupted_run() {
    let spec = model("mlp-digits");
    let data = source::shipped(&spec, 2, &Default::default()).unwrap();
    let mk = || {
        Trainer::new(
            &spec,
            &hw(),
            data.clone(),
            options(OptimizerKind::Adam, 0.01, MxuFormat::Bf16, ExecMode::Functional, InitWeights::Seed),
        )
        .unwrap()
    };
    let mut full = mk();
    // 60 steps cross an epoch boundary (1438 / 32 = 44 batches per epoch).
    let want: Vec<u64> = (0..60).map(|_| full.step().unwrap().loss.to_bits()).collect();

    let dir = tempfile::tempdir().unwrap();
    let mut a = mk();
    let mut got: Vec<u64> = (0..25).map(|_| a.step().unwrap().loss.to_bits()).collect();
    a.checkpoint().save(dir.path()).unwrap();
    drop(a);
    let mut b = mk();
    b.restore(faultline_train::Checkpoint::load(dir.path()).unwrap(), dir.path()).unwrap();
    assert_eq!(b.state.step, 25);
    got.extend((0..35).map(|_| b.step().unwrap().loss.to_bits()));
    assert_eq!(got, want);
    assert_eq!(b.state, full.state);
    assert_eq!(b.batcher, full.batcher);
}

/// User mistakes are errors naming the file and what was expected vs found.
#[test]
fn bad_inputs_are_reported_not_panicked() {
    let spec = model("mlp-digits");
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tg = TrainGraph::build(&spec, 32, OptimizerKind::Sgd.spec(None)).unwrap();
    write_weights(&tg, dir.path(), 1);
    let init = InitWeights::NpyDir(dir.path().into());
    let new = || {
        Trainer::new(
            &spec,
            &hw(),
            data.clone(),
            options(OptimizerKind::Sgd, 0.1, MxuFormat::Bf16, ExecMode::Functional, init.clone()),
        )
    };
    assert!(new().is_ok());

    // Wrong shape, and a PyTorch-style [out, in] weight.
    let w = dir.path().join("fc1.weight.npy");
    write_npy_f32(&w, &[64, 32], &[0.0; 64 * 32]);
    let e = new().unwrap_err().to_string();
    assert!(e.contains("fc1.weight.npy") && e.contains("expected [64, 64], found [64, 32]"), "{e}");
    let w2 = dir.path().join("fc2.weight.npy");
    write_npy_f32(&w2, &[10, 64], &[0.0; 640]);
    write_npy_f32(&w, &[64, 64], &[0.0; 64 * 64]);
    let e = new().unwrap_err().to_string();
    assert!(e.contains("fc2.weight.npy") && e.contains("expected [64, 10], found [10, 64] (the transpose"), "{e}");
    write_npy_f32(&w2, &[64, 10], &[0.0; 640]);
    // Wrong dtype.
    let f = std::fs::File::create(&w).unwrap();
    let mut wr = npyz::WriteOptions::new().default_dtype().shape(&[64, 64]).writer(f).begin_nd().unwrap();
    wr.extend(vec![0i64; 64 * 64]).unwrap();
    wr.finish().unwrap();
    let e = new().unwrap_err().to_string();
    assert!(e.contains("fc1.weight.npy") && e.contains("<f4") && e.contains("<i8"), "{e}");
    // Missing file.
    std::fs::remove_file(&w).unwrap();
    let e = new().unwrap_err().to_string();
    assert!(e.contains("fc1.weight.npy") && e.contains("fc1.weight") && e.contains("[64, 64]"), "{e}");

    // Unknown optimizer and precision.
    let e = "rmsprop".parse::<OptimizerKind>().unwrap_err().to_string();
    assert!(e.contains("rmsprop") && e.contains("sgd, momentum, adam, adamw"), "{e}");
    assert!("fp16".parse::<MxuFormat>().unwrap_err().to_string().contains("bf16, fp32"));

    // Bad IDX magic in a data directory.
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("train-images-idx3-ubyte"), [0u8, 0, 9, 3, 0, 0, 0, 0]).unwrap();
    std::fs::write(d.path().join("train-labels-idx1-ubyte"), faultline_train::data::idx::encode_idx(&[0], &[]))
        .unwrap();
    let e = source::load_dir(d.path(), &spec, 1, &Default::default()).unwrap_err().to_string();
    assert!(e.contains("train-images-idx3-ubyte") && e.contains("bad magic"), "{e}");
    // An empty data directory, and x.npy with the wrong per-sample size.
    let e =
        source::load_dir(tempfile::tempdir().unwrap().path(), &spec, 1, &Default::default()).unwrap_err().to_string();
    assert!(e.contains("no dataset found"), "{e}");
    write_npy_f32(&d.path().join("x.npy"), &[3, 10], &[0.0; 30]);
    faultline_train::data::npy::write_labels(&d.path().join("y.npy"), &[0, 1, 2]).unwrap();
    let e = source::load_dir(d.path(), &spec, 1, &Default::default()).unwrap_err().to_string();
    assert!(e.contains("x.npy") && e.contains("64 values per sample") && e.contains("[3, 10]"), "{e}");
    // Batch larger than the data.
    let o = TrainOptions { batch: 100_000, ..TrainOptions::default() };
    assert!(Trainer::new(&spec, &hw(), data.clone(), o).unwrap_err().to_string().contains("batch size"));
}

/// A `.npy` data directory (x, y, and a test pair) trains end to end.
#[test]
fn trains_from_npy_data_directory() {
    let spec = model("mlp-digits");
    let src = faultline_train::data::digits::digits().subset(&(0..400).collect::<Vec<_>>());
    let d = tempfile::tempdir().unwrap();
    write_npy_f32(&d.path().join("x.npy"), &[300, 8, 8], &src.x[..300 * 64]);
    faultline_train::data::npy::write_labels(&d.path().join("y.npy"), &src.y[..300]).unwrap();
    write_npy_f32(&d.path().join("x_test.npy"), &[100, 64], &src.x[300 * 64..]);
    faultline_train::data::npy::write_labels(&d.path().join("y_test.npy"), &src.y[300..]).unwrap();
    let split = source::load_dir(d.path(), &spec, 1, &Default::default()).unwrap();
    assert_eq!((split.train.len(), split.test.len()), (300, 100));
    let mut t = Trainer::new(&spec, &hw(), split, TrainOptions::default()).unwrap();
    let s = t.run(60, |_, _| Ok(())).unwrap();
    assert!(s.final_loss < s.losses[0], "{:?}", s.losses);
}

/// Injection into one instruction: an empty schedule changes nothing and reports a masked
/// effect; a high-bit flip in one GEMM's partial sum or one VPU instruction's operand corrupts
/// that instruction's output and the step; a bad instruction index is an error.
#[test]
fn injection_hits_one_instruction_and_reports_its_effect() {
    use faultline_graph::{Op, Phase};
    use faultline_hw::isa::Instr;
    use faultline_hw::{FaultEvent, FaultSchedule, FaultSite};
    use faultline_train::Injection;
    let spec = model("mlp-digits");
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    let t = Trainer::new(&spec, &hw(), data.clone(), TrainOptions::default()).unwrap();
    let (x, y) = data.train.gather(&(0..32).collect::<Vec<_>>());
    let g = &t.exec.tg.graph;
    let p = t.exec.program();
    let first = |pred: &dyn Fn(&Op, &Instr) -> bool| {
        (0..p.instrs.len())
            .find(|&i| p.tags[i].phase == Phase::Forward && pred(&g.node(p.tags[i].node).op, &p.instrs[i]))
            .unwrap()
    };
    let mm = first(&|op, ins| matches!(op, Op::MatMul { .. }) && matches!(ins, Instr::Gemm { .. }));
    let relu = first(&|op, _| matches!(op, Op::Relu));

    let mut golden = t.state.clone();
    let out = t.exec.step(&mut golden, &x, &y).unwrap();
    assert_eq!(out.instructions, p.instrs.len());
    assert!(out.effect.is_none());

    let run = |instr, faults: FaultSchedule| {
        let mut s = t.state.clone();
        let r = t.exec.step_with_fault(&mut s, &x, &y, Some(&Injection::register(instr, faults)));
        r.map(|o| (o.loss.to_bits(), s, o.effect.unwrap()))
    };
    let (loss, s, e) = run(mm, FaultSchedule::none()).unwrap();
    assert_eq!((loss, &s), (out.loss.to_bits(), &golden));
    assert!(e.masked() && e.elements == 32 * 64, "{e:?}");

    let psum: FaultSite = "mxu.pe[31][0].psum[30]".parse().unwrap();
    let (loss, s, e) = run(mm, FaultSchedule::one(FaultEvent::flip(psum, 0, 40))).unwrap();
    assert!(loss != out.loss.to_bits() || s != golden, "an exponent flip in a psum must show");
    assert_eq!(e.corrupted, 1, "a psum flip corrupts exactly one output: {e:?}");
    let lane: FaultSite = "vpu.lane[0].a[30]".parse().unwrap();
    let (loss, s, e) = run(relu, FaultSchedule::one(FaultEvent::flip(lane, 0, 0))).unwrap();
    assert!(loss != out.loss.to_bits() || s != golden, "an exponent flip in a relu operand must show");
    assert_eq!((e.corrupted, e.buffer.as_str()), (1, g.node(p.tags[relu].node).name.as_str()), "{e:?}");

    let e = run(p.instrs.len(), FaultSchedule::none()).unwrap_err().to_string();
    assert!(e.contains(&format!("instruction {}", p.instrs.len())), "{e}");
    let e = run(relu, FaultSchedule::one(FaultEvent::flip(psum, 0, 0))).unwrap_err().to_string();
    assert!(e.contains("mxu"), "an MXU site in a VPU instruction is refused: {e}");
}

/// BatchNorm as PyTorch defines it, on the machine: a training step normalises with the
/// batch's statistics and moves the running ones towards the batch's mean and *unbiased*
/// variance by `momentum`; inference normalises with the running ones. The layer reads the
/// input directly, so the statistics can be computed here from the batch.
#[test]
fn batchnorm_trains_on_batch_statistics_and_infers_on_running_ones() {
    let spec = ModelSpec::from_ron(
        r#"(name: "bn", input: [6], outputs: 3, loss: SoftmaxCrossEntropy,
            layers: [(name: "bn", op: BatchNorm(momentum: 0.25)), (name: "fc", op: Dense(units: 3))])"#,
        "<bn>",
    )
    .unwrap();
    let data = source::shipped(&spec, 5, &Default::default()).unwrap();
    let o = options(OptimizerKind::Sgd, 0.1, MxuFormat::Fp32, ExecMode::Functional, InitWeights::Seed);
    let mut t = Trainer::new(&spec, &hw(), data.clone(), o).unwrap();
    let mut batcher = Batcher::new(data.train.len(), 32, 5).unwrap();
    let mut want_mean = [0.0f64; 6];
    let mut want_var = [1.0f64; 6];
    for _ in 0..3 {
        let (x, _) = data.train.gather(&batcher.next_indices());
        t.step().unwrap();
        for c in 0..6 {
            let col: Vec<f64> = x.iter().skip(c).step_by(6).map(|&v| v as f64).collect();
            let m = col.iter().sum::<f64>() / 32.0;
            let unbiased = col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 31.0;
            want_mean[c] = 0.75 * want_mean[c] + 0.25 * m;
            want_var[c] = 0.75 * want_var[c] + 0.25 * unbiased;
        }
        let (rm, rv) = (&t.state.tensors["bn.running_mean"].data, &t.state.tensors["bn.running_var"].data);
        for c in 0..6 {
            assert!((rm[c] as f64 - want_mean[c]).abs() <= 1e-5 * (1.0 + want_mean[c].abs()), "mean[{c}]");
            assert!((rv[c] as f64 - want_var[c]).abs() <= 1e-5 * (1.0 + want_var[c].abs()), "var[{c}]");
        }
    }
    // Inference on one test batch: the running statistics, gamma and beta, then the dense layer.
    let (x, _) = data.test.gather(&(0..32).collect::<Vec<_>>());
    let got = t.exec.forward(&t.state, &x).unwrap().output;
    let s = |n: &str| t.state.tensors[n].data.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let (rm, rv, gamma, beta, w, b) =
        (s("bn.running_mean"), s("bn.running_var"), s("bn.gamma"), s("bn.beta"), s("fc.weight"), s("fc.bias"));
    for n in 0..32 {
        let h: Vec<f64> =
            (0..6).map(|c| gamma[c] * (x[n * 6 + c] as f64 - rm[c]) / (rv[c] + 1e-5).sqrt() + beta[c]).collect();
        for o in 0..3 {
            let want = b[o] + (0..6).map(|c| h[c] * w[c * 3 + o]).sum::<f64>();
            let g = got[n * 3 + o] as f64;
            assert!((g - want).abs() <= 1e-4 * (1.0 + want.abs()), "output [{n}][{o}]: {g} vs {want}");
        }
    }
}

/// Causal multi-head attention on the machine: the mask is a constant in memory, the heads are
/// split and merged by VPU copies; fp32 training tracks the f64 reference, and functional and
/// cycle-level steps give the same bits.
#[test]
fn causal_multi_head_attention_trains_on_the_machine() {
    let spec = ModelSpec::from_ron(
        r#"(name: "mha", input: [8, 10], outputs: 4, loss: SoftmaxCrossEntropy, layers: [
            (name: "embed", op: Dense(units: 16)),
            (name: "q", op: Dense(units: 16), inputs: ["embed"]),
            (name: "k", op: Dense(units: 16), inputs: ["embed"]),
            (name: "v", op: Dense(units: 16), inputs: ["embed"]),
            (name: "attn", op: Attention(heads: 4, causal: true), inputs: ["q", "k", "v"]),
            (name: "pool", op: MeanPool),
            (name: "out", op: Dense(units: 4)),
        ])"#,
        "<mha>",
    )
    .unwrap();
    let data = source::shipped(&spec, 5, &Default::default()).unwrap();
    sgd_tracks_the_reference_in_both_modes(&spec, data, 0.1, 13);
}

/// Five fp32 SGD steps of `spec` (batch 32, `.npy` weights seeded by `seed`): the loss of each
/// is the f64 reference's within 1e-4, and functional and cycle-level steps give the same bits.
fn sgd_tracks_the_reference_in_both_modes(
    spec: &ModelSpec,
    data: faultline_train::data::dataset::Split,
    lr: f64,
    seed: u64,
) {
    let tg = TrainGraph::build(spec, 32, OptimizerKind::Sgd.spec(Some(lr))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_weights(&tg, dir.path(), seed);
    let o = |mode| options(OptimizerKind::Sgd, lr, MxuFormat::Fp32, mode, InitWeights::NpyDir(dir.path().into()));
    let mut t = Trainer::new(spec, &hw(), data.clone(), o(ExecMode::Functional)).unwrap();
    let mut c = Trainer::new(spec, &hw(), data.clone(), o(ExecMode::CycleLevel)).unwrap();
    let mut state = tg.initial_state(0);
    for p in tg.params() {
        let a = faultline_train::data::npy::read_f32(&dir.path().join(format!("{}.npy", p.name))).unwrap();
        state.insert(p.name.clone(), Tensor::new(&a.shape, a.data.iter().map(|&v| v as f64).collect()).unwrap());
    }
    let mut batcher = Batcher::new(data.train.len(), 32, 5).unwrap();
    let mut in_shape = vec![32];
    in_shape.extend(&spec.input);
    for step in 1..=5 {
        let (x, y) = data.train.gather(&batcher.next_indices());
        let mut feeds = state.clone();
        feeds.insert("input".into(), Tensor::new(&in_shape, x.iter().map(|&v| v as f64).collect()).unwrap());
        let labels: Vec<usize> = y.iter().map(|&l| l as usize).collect();
        feeds.insert("labels".into(), Tensor::one_hot(&labels, spec.outputs));
        let vals = reference::eval(&tg.graph, &feeds).unwrap();
        let want = vals.get(tg.loss).unwrap().data[0];
        tg.apply_updates(&vals, &mut state);
        let (got, cyc) = (t.step().unwrap().loss, c.step().unwrap().loss);
        assert_eq!(got.to_bits(), cyc.to_bits(), "step {step}: functional and cycle-level losses differ");
        assert!(((got - want) / want).abs() < 1e-4, "step {step}: loss {got} vs f64 reference {want}");
    }
}

/// An embedding model on token ids: the lookup (a VPU one-hot against a constant, then a GEMM)
/// and the tied output projection train as the f64 reference does, bit-identically in both
/// modes.
#[test]
fn an_embedding_with_a_tied_output_trains_on_the_machine() {
    let spec = ModelSpec::from_ron(
        r#"(name: "tied", input: [8], outputs: 6, loss: SoftmaxCrossEntropy, layers: [
            (name: "embed", op: Embedding(vocab: 6, dim: 16)),
            (name: "mix", op: Dense(units: 16)),
            (name: "act", op: Relu),
            (name: "head", op: TiedOutput(embedding: "embed")),
            (name: "pool", op: MeanPool),
        ])"#,
        "<tied>",
    )
    .unwrap();
    let data = faultline_train::data::synth::majority_tokens(600, 6, 6, 8, 3).split(0.2, 3);
    sgd_tracks_the_reference_in_both_modes(&spec, data, 0.5, 17);
}

/// What a campaign's memory check counts per golden snapshot is what a training state holds:
/// every parameter and optimizer-state tensor, in fp32.
#[test]
fn state_bytes_is_what_a_training_state_holds() {
    for (name, opt, cfg) in [
        ("mlp-digits", OptimizerKind::Sgd, "tpu-32x32"),
        ("resnet-mini", OptimizerKind::Momentum, "tpu-128x128"),
        ("gpt-mini", OptimizerKind::AdamW, "tpu-128x128"),
    ] {
        let spec = model(name);
        let data = source::shipped(&spec, 1, &Default::default()).unwrap();
        let o = TrainOptions { optimizer: opt, eval_every: 0, ..Default::default() };
        let t = Trainer::new(&spec, &config(cfg), data, o).unwrap();
        let held: usize = t.state.tensors.values().map(|x| x.data.len() * 4).sum();
        assert_eq!(faultline_train::exec::state_bytes(&t.exec.tg), Some(held as u64), "{name}");
    }
}
