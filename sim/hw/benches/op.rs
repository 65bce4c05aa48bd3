//! Whole-op throughput: conv2d 3x3, 14x14x64 -> 64 on the 32x32 config, through DMA, SRAM and
//! the MXU (cycle-level) and via the functional twin. Throughput is in MACs (elements).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use faultline_hw::fault::{FaultEvent, FaultSchedule};
use faultline_hw::fault::{FaultSite, Register};
use faultline_hw::op::{self, ConvShape, OpKind};
use faultline_hw::{ExecMode, HwConfig};
use faultline_num::f32_to_bf16_bits;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;
use std::path::Path;

fn conv(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tpu-32x32.ron");
    let cfg = HwConfig::load(&path).expect("configs/tpu-32x32.ron");
    let shape = ConvShape { batch: 1, h: 14, w: 14, c_in: 64, c_out: 64, kh: 3, kw: 3, stride: 1, pad: 1 };
    let kind = OpKind::Conv2d(shape);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let ins: Vec<Vec<u32>> = kind
        .input_lens()
        .iter()
        .map(|&l| (0..l).map(|_| f32_to_bf16_bits(rng.gen_range(-1.0..1.0))).collect())
        .collect();
    let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
    let (m, k, n) = shape.gemm();
    let mut g = c.benchmark_group("op/conv2d_3x3_14x14x64_64/tpu-32x32");
    g.throughput(Throughput::Elements((m * k * n) as u64));
    g.sample_size(10);
    for (name, mode) in [("cycle_level", ExecMode::CycleLevel), ("functional", ExecMode::Functional)] {
        g.bench_function(name, |b| {
            b.iter(|| black_box(op::run(&cfg, &kind, black_box(&refs), mode, &FaultSchedule::none()).unwrap()))
        });
    }
    // One psum flip in fold 17: the memory path is simulated, only that fold is stepped.
    let f = FaultSchedule::one(FaultEvent::flip(FaultSite::pe(5, 7, Register::Psum, 30), 17, 100));
    g.bench_function("hybrid_one_fault", |b| {
        b.iter(|| black_box(op::run_hybrid(&cfg, &kind, black_box(&refs), &f).unwrap()))
    });
    g.bench_function("timing_only", |b| b.iter(|| black_box(op::timing(&cfg, black_box(&kind)).unwrap())));
    g.finish();
}

criterion_group!(benches, conv);
criterion_main!(benches);
