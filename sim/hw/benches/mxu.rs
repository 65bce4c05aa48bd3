//! `mxu` benchmark: a 512x512x512 bf16 GEMM on a 128x128 array, cycle-level and functional, and
//! the same in fp32, functional.
//!
//! Throughput is reported in elements/s: PE-cycles for the cycle-level model (target >= 200 M
//! per core), MACs for the functional twin (target >= 1 G per core). Also a faulty GEMM of a
//! training step (mlp-digits' first, 32x64x64 on a 32x32 WS array, one psum flip), which steps
//! only the cycles the fault matters in, next to the same GEMM functional and stepped whole; and
//! ResNet-20's first weight gradient (144x32768x16, its `A` the im2col matrix held transposed)
//! in place, fp32, on a 128x128 array: what a training step runs.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use faultline_hw::fault::{FaultEvent, FaultSchedule};
use faultline_hw::fault::{FaultSite, Register};
use faultline_hw::mxu::{functional_in_place, gemm, gemm_timing, Raw};
use faultline_hw::{Dataflow, ExecMode, HwConfig, Matrix};
use faultline_num::{NumFormat, Precision};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;

fn operands(m: usize, k: usize, n: usize) -> (Matrix, Matrix) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut gen = |r, c| Matrix::from_fn(r, c, |_, _| NumFormat::Bf16.f64_to_bits(rng.gen_range(-1.0..1.0)));
    (gen(m, k), gen(k, n))
}

fn bench(c: &mut Criterion) {
    let (m, k, n) = (512, 512, 512);
    let (a, w) = operands(m, k, n);
    let mut g = c.benchmark_group("mxu");
    g.sample_size(10);
    for df in [Dataflow::WeightStationary, Dataflow::OutputStationary] {
        let cfg = HwConfig::test_config(128, 128, df, Precision::Bf16Fp32);
        let t = gemm_timing(&cfg.mxu, m, k, n);
        g.throughput(Throughput::Elements(t.total_cycles * 128 * 128));
        g.bench_function(format!("cycle_level_{}_128x128_512cubed_pe_cycles", df.short()), |b| {
            b.iter(|| gemm(&cfg, black_box(&a), black_box(&w), ExecMode::CycleLevel, &FaultSchedule::none()).unwrap())
        });
        g.throughput(Throughput::Elements(t.macs));
        g.bench_function(format!("functional_{}_128x128_512cubed_macs", df.short()), |b| {
            b.iter(|| gemm(&cfg, black_box(&a), black_box(&w), ExecMode::Functional, &FaultSchedule::none()).unwrap())
        });
    }
    // fp32 x fp32 (never fused: its products round), against the machine's single-thread sgemm
    // (issue 27's target: >= 30% of it with RAYON_NUM_THREADS=1).
    let cfg = HwConfig::test_config(128, 128, Dataflow::WeightStationary, Precision::Fp32Fp32);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut gen = |r, c| Matrix::from_fn(r, c, |_, _| (rng.gen_range(-1.0..1.0f32)).to_bits());
    let (a32, w32) = (gen(m, k), gen(k, n));
    g.throughput(Throughput::Elements(gemm_timing(&cfg.mxu, m, k, n).macs));
    g.bench_function("functional_fp32_ws_128x128_512cubed_macs", |b| {
        b.iter(|| gemm(&cfg, black_box(&a32), black_box(&w32), ExecMode::Functional, &FaultSchedule::none()).unwrap())
    });
    g.finish();
    let mut g = c.benchmark_group("mxu");
    let cfg = HwConfig::test_config(32, 32, Dataflow::WeightStationary, Precision::Bf16Fp32);
    let (a, w) = operands(32, 64, 64);
    let flip = FaultSchedule::one(FaultEvent::flip(FaultSite::pe(31, 0, Register::Psum, 30), 0, 100));
    for (name, mode, faults) in [
        ("functional", ExecMode::Functional, FaultSchedule::none()),
        ("cycle_level", ExecMode::CycleLevel, FaultSchedule::none()),
        ("one_fault", ExecMode::CycleLevel, flip),
    ] {
        g.bench_function(format!("{name}_ws_32x32_32x64x64"), |b| {
            b.iter(|| gemm(&cfg, black_box(&a), black_box(&w), mode, &faults).unwrap())
        });
    }
    // A weight gradient: A (144x32768) held transposed, as the im2col matrix lies in memory.
    let cfg = HwConfig::test_config(128, 128, Dataflow::WeightStationary, Precision::Fp32Fp32);
    let (m, k, n) = (144, 32768, 16);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut words = |len: usize| -> Vec<u32> { (0..len).map(|_| rng.gen_range(-1.0..1.0f32).to_bits()).collect() };
    let (at, dy, mut out) = (words(m * k), words(k * n), vec![0u32; m * n]);
    g.throughput(Throughput::Elements((m * k * n) as u64));
    g.bench_function("functional_fp32_transposed_a_128x128_144x32768x16_macs", |b| {
        b.iter(|| {
            let (a, w) = (Raw { words: &at, transposed: true }, Raw { words: &dy, transposed: false });
            functional_in_place(&cfg, a, w, (m, k, n), black_box(&mut out), false).unwrap()
        })
    });
    // A batch of 32 through an MNIST-sized dense layer, forward (fp32: operands read in place).
    let (m, k, n) = (32, 784, 256);
    let (x, wt) = (words(m * k), words(k * n));
    let mut out = vec![0u32; m * n];
    g.throughput(Throughput::Elements((m * k * n) as u64));
    g.bench_function("functional_fp32_dense_128x128_32x784x256_macs", |b| {
        b.iter(|| {
            let (a, w) = (Raw { words: &x, transposed: false }, Raw { words: &wt, transposed: false });
            functional_in_place(&cfg, a, w, (m, k, n), black_box(&mut out), false).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
