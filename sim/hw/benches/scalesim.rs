//! `scalesim` benchmark: the whole ResNet-18 topology (`topologies/resnet18.csv`, 21 layers,
//! 1.8 G MACs) as `faultline scalesim` runs it, every layer's GEMM stepped at cycle level on a
//! 32x32 weight-stationary array, for the side-by-side with SCALE-Sim's wall time (the issue's
//! target: report the ratio). Throughput is in PE-cycles.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use faultline_hw::fault::FaultSchedule;
use faultline_hw::interop::scalesim::load_topology;
use faultline_hw::mxu::{gemm, gemm_timing};
use faultline_hw::{Dataflow, ExecMode, HwConfig, Matrix};
use faultline_num::{NumFormat, Precision};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;

fn bench(c: &mut Criterion) {
    let topo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topologies/resnet18.csv");
    let layers = load_topology(&topo).expect("the shipped topology parses");
    let cfg = HwConfig::test_config(32, 32, Dataflow::WeightStationary, Precision::Bf16Fp32);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut gen = |r, c| Matrix::from_fn(r, c, |_, _| NumFormat::Bf16.f64_to_bits(rng.gen_range(-1.0..1.0)));
    let operands: Vec<(Matrix, Matrix)> = layers
        .iter()
        .map(|l| {
            let [m, k, n] = l.gemm();
            (gen(m, k), gen(k, n))
        })
        .collect();
    let pe_cycles: u64 = layers
        .iter()
        .map(|l| {
            let [m, k, n] = l.gemm();
            gemm_timing(&cfg.mxu, m, k, n).total_cycles * 32 * 32
        })
        .sum();
    let mut g = c.benchmark_group("scalesim");
    g.sample_size(10);
    g.throughput(Throughput::Elements(pe_cycles));
    g.bench_function("resnet18_32x32_ws_cycle_level", |b| {
        b.iter(|| {
            for (a, w) in &operands {
                gemm(&cfg, a, w, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap();
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
