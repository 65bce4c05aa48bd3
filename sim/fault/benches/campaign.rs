//! `campaign`: the shipped `campaign-mlp-mxu` (2,000 single-bit MXU flips in step 20 of
//! mlp-digits on tpu-32x32, 20-step follow-up) on 2 threads, read in trials per second; and
//! its first 200 trials on one thread, hybrid against fully cycle-level (every instruction of
//! every step at register level, dead faults run too), the ratio being what hybrid trials save;
//! and the 2,000 trials again under `configs/protect-parity-abft.ron`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use faultline_fault::{Campaign, CampaignSpec, RunOptions, Shard, TrialMode};
use faultline_hw::ExecMode;
use std::hint::black_box;
use std::path::Path;

/// The shipped `campaign-mlp-mxu`, under protection plan `plan` (a `configs/` file) if given.
fn campaign(plan: Option<&str>) -> Campaign {
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let file = configs.join("campaign-mlp-mxu.ron");
    let mut spec = CampaignSpec::load(&file).expect("spec");
    spec.protection = plan.map(|p| configs.join(p));
    Campaign::prepare(spec, &file, &Default::default()).expect("campaign")
}

fn bench(c: &mut Criterion) {
    let camp = campaign(None);
    let mut group = c.benchmark_group("campaign");
    group.sample_size(10);
    group.throughput(Throughput::Elements(camp.info.trials));
    // Unprotected, and with parity on the PE weights and ABFT on the forward GEMMs (its
    // detections re-execute the step).
    let protected = campaign(Some("protect-parity-abft.ron"));
    for (name, camp) in
        [("mlp-mxu/2000-trials-2-threads", &camp), ("mlp-mxu-parity-abft/2000-trials-2-threads", &protected)]
    {
        group.bench_function(name, |b| {
            b.iter(|| {
                let d = tempfile::tempdir().expect("temp dir");
                let opts = RunOptions { threads: 2, shard: Shard::ALL, resume: false, mode: TrialMode::Hybrid };
                black_box(camp.run(d.path(), opts, |_| {}).expect("run").trials)
            })
        });
    }
    let trials = 200u64;
    group.throughput(Throughput::Elements(trials));
    for (name, mode) in
        [("mlp-mxu/200-trials-hybrid", ExecMode::Functional), ("mlp-mxu/200-trials-cycle-level", ExecMode::CycleLevel)]
    {
        let mut tr = camp.trainer();
        tr.exec.mode = mode;
        group.bench_function(name, |b| {
            b.iter(|| (0..trials).map(|t| camp.trial(&mut tr, t).expect("trial").outcome as u32).sum::<u32>())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
