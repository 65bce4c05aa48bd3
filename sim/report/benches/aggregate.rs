//! Aggregating a large campaign: 1,000,000 records (the fixture's 360 trials repeated with new
//! ids) loaded and folded into a report, on one core. Target: under 10 s.

use criterion::{criterion_group, criterion_main, Criterion};
use faultline_hw::budget::HostMemory;
use faultline_report::aggregate::aggregate;
use faultline_report::load::load;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

const RECORDS: u64 = 1_000_000;

/// Writes a trace of `RECORDS` trials into `dir` from the fixture's records.
fn big_trace(dir: &Path) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny");
    let info = std::fs::read_to_string(fixture.join("campaign.json")).unwrap();
    let trials = info.lines().find(|l| l.trim_start().starts_with("\"trials\":")).unwrap().trim().to_string();
    std::fs::write(dir.join("campaign.json"), info.replacen(&trials, &format!("\"trials\": {RECORDS},"), 1)).unwrap();
    // More trials make another campaign: its records carry its identity.
    let id = faultline_fault::store::read_info(dir).unwrap().id;
    let records = std::fs::read_to_string(fixture.join("records.jsonl")).unwrap();
    // Each line is `{"schema":3,"campaign":ID,"trial":N,...`: the tail after the id is reused.
    let tails: Vec<&str> = records.lines().map(|l| &l[l.find(",\"fault\"").unwrap()..]).collect();
    let mut out = String::with_capacity(tails.iter().map(|t| t.len() + 32).sum::<usize>() * 2800);
    for t in 0..RECORDS {
        let _ = writeln!(out, "{{\"schema\":3,\"campaign\":\"{id}\",\"trial\":{t}{}", tails[t as usize % tails.len()]);
    }
    std::fs::write(dir.join("records.jsonl"), out).unwrap();
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    big_trace(dir.path());
    let mut g = c.benchmark_group("report");
    g.sample_size(10).measurement_time(Duration::from_secs(15)).warm_up_time(Duration::from_secs(1));
    g.bench_function("load_and_aggregate_1M_records", |b| {
        b.iter(|| {
            let trace = load(dir.path(), &HostMemory::default(), |_, _| {}).unwrap();
            assert_eq!(trace.trials.len() as u64, RECORDS);
            aggregate(&trace)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
