//! `train_step`: one training step of mlp-digits (batch 32, bf16 MXU, sgd) on tpu-32x32, in
//! functional and cycle-level mode; the throughput line is steps per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use faultline_graph::ModelSpec;
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::{source, TrainOptions, Trainer};
use std::hint::black_box;
use std::path::Path;

fn train_step(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec = ModelSpec::load(root.join("models/mlp-digits.ron")).expect("model");
    let hw = HwConfig::load(root.join("configs/tpu-32x32.ron")).expect("config");
    let data = source::shipped(&spec, 1, &Default::default()).expect("data");
    let mut group = c.benchmark_group("train_step");
    // One element = one step, so criterion's throughput line reads in steps per second.
    group.throughput(Throughput::Elements(1));
    for (name, mode) in
        [("mlp-digits/functional", ExecMode::Functional), ("mlp-digits/cycle-level", ExecMode::CycleLevel)]
    {
        let options = TrainOptions { mode, eval_every: 0, ..TrainOptions::default() };
        let mut t = Trainer::new(&spec, &hw, data.clone(), options).expect("trainer");
        group.bench_function(name, |b| b.iter(|| black_box(t.step().expect("step").loss)));
    }
    group.finish();
}

criterion_group!(benches, train_step);
criterion_main!(benches);
