//! `train_step`: one training step of mlp-digits (batch 32, bf16 MXU, sgd) on tpu-32x32 in
//! functional and cycle-level mode, and in functional mode with one fault (the hit GEMM at cycle
//! level: a hybrid step; a unified-buffer word; the sequencer's tile counter; a DMA address
//! register); restoring a `TrainState` snapshot, as a campaign trial does. The throughput line
//! of the step benchmarks is steps per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use faultline_graph::ModelSpec;
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::{data::source, StepFault, TrainOptions, Trainer};
use std::hint::black_box;
use std::path::Path;

fn trainer(mode: ExecMode) -> Trainer {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec = ModelSpec::load(root.join("models/mlp-digits.ron")).expect("model");
    let hw = HwConfig::load(root.join("configs/tpu-32x32.ron")).expect("config");
    let data = source::shipped(&spec, 1, &Default::default()).expect("data");
    let options = TrainOptions { mode, eval_every: 0, ..TrainOptions::default() };
    Trainer::new(&spec, &hw, data, options).expect("trainer")
}

fn train_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("train_step");
    // One element = one step, so criterion's throughput line reads in steps per second.
    group.throughput(Throughput::Elements(1));
    for (name, mode) in
        [("mlp-digits/functional", ExecMode::Functional), ("mlp-digits/cycle-level", ExecMode::CycleLevel)]
    {
        let mut t = trainer(mode);
        group.bench_function(name, |b| b.iter(|| black_box(t.step().expect("step").loss)));
    }
    // A psum flip 100 cycles into the forward fc1 GEMM (the step's first): a snapshot restored,
    // then the step replayed with the fault, as a campaign trial does.
    let mut t = trainer(ExecMode::Functional);
    let snap = t.snapshot();
    let gemm = t.exec.program().instrs.iter().position(|i| i.name() == "gemm").expect("a GEMM");
    let at = t.schedule.instrs[gemm].start + 100;
    let fault: StepFault = format!("flip:mxu.pe[31][0].psum[30]@step=1,cycle={at}").parse().expect("fault");
    group.bench_function("mlp-digits/hybrid-one-fault", |b| {
        b.iter(|| {
            t.restore_snapshot(&snap);
            black_box(t.step_with(Some(&fault)).expect("step").loss)
        })
    });
    // A unified-buffer flip in the batch's first word while the fc1 GEMM reads it (its first
    // column tile's fold has read it, the second's has not), and a tile-counter flip before the
    // GEMM's second fold: the memory and sequencer paths of a campaign trial.
    for (name, fault) in [
        ("mlp-digits/ub-word-fault", format!("flip:ub.word[0x0][30]@step=1,cycle={}", at - 100 + 8)),
        ("mlp-digits/seq-tile-fault", format!("flip:seq.tile[0]@step=1,cycle={}", at - 100 + 8)),
    ] {
        let fault: StepFault = fault.parse().expect("fault");
        group.bench_function(name, |b| {
            b.iter(|| {
                t.restore_snapshot(&snap);
                let r = t.step_with(Some(&fault)).expect("step");
                assert!(r.injection.as_ref().is_some_and(|i| !i.masked()), "{name}: a live fault");
                black_box(r.loss)
            })
        });
    }
    // A destination-address flip early in the step's longest transfer: every later word of it
    // lands at a wrong address (what dma_hits resolves word by word; issue 27 bounded it).
    let p = t.exec.program();
    let longest = (0..p.instrs.len())
        .filter(|&i| matches!(p.instrs[i], faultline_hw::isa::Instr::Dma { .. }))
        .max_by_key(|&i| p.instrs[i].out_len())
        .expect("a DMA transfer");
    let at = t.schedule.instrs[longest].start + p.dma_overhead + 1;
    let fault: StepFault = format!("flip:dma.dst_addr[5]@step=1,cycle={at}").parse().expect("fault");
    group.bench_function("mlp-digits/dma-address-fault", |b| {
        b.iter(|| {
            t.restore_snapshot(&snap);
            let r = t.step_with(Some(&fault)).expect("step");
            assert!(r.injection.as_ref().is_some_and(|i| !i.masked()), "dma-address-fault: a live fault");
            black_box(r.loss)
        })
    });
    group.bench_function("mlp-digits/restore-snapshot", |b| b.iter(|| t.restore_snapshot(black_box(&snap))));
    group.finish();
}

criterion_group!(benches, train_step);
criterion_main!(benches);
