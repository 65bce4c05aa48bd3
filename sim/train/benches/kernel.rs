//! One op run as a training step runs it (`faultline op`): conv2d 3x3, 14x14x64 -> 64 on the
//! 32x32 config, through its program's DMA transfers, SRAM and the MXU, functionally, at cycle
//! level, and with one fault (the GEMM it strikes at cycle level). Throughput is in MACs.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use faultline_hw::kernel::{ConvShape, KernelSpec};
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::kernel::Kernel;
use faultline_train::{MxuFormat, StepFault};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::hint::black_box;
use std::path::Path;

fn conv(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tpu-32x32.ron");
    let cfg = HwConfig::load(&path).expect("configs/tpu-32x32.ron");
    let shape = ConvShape { batch: 1, h: 14, w: 14, c_in: 64, c_out: 64, kh: 3, kw: 3, stride: 1, pad: 1 };
    let kind = KernelSpec::Conv2d(shape);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let ins: Vec<Vec<u32>> =
        kind.input_lens().iter().map(|&l| (0..l).map(|_| rng.gen_range(-1.0f32..1.0).to_bits()).collect()).collect();
    let (m, k, n) = shape.gemm();
    let mut g = c.benchmark_group("op/conv2d_3x3_14x14x64_64/tpu-32x32");
    g.throughput(Throughput::Elements((m * k * n) as u64));
    g.sample_size(10);
    for (name, mode) in [("cycle_level", ExecMode::CycleLevel), ("functional", ExecMode::Functional)] {
        let kern = Kernel::new(&kind, &cfg, mode, MxuFormat::Bf16).unwrap();
        g.bench_function(name, |b| b.iter(|| black_box(kern.run(black_box(&ins), &[]).unwrap())));
    }
    // One psum flip in the GEMM: the rest runs functionally, the GEMM it strikes at cycle level.
    let kern = Kernel::new(&kind, &cfg, ExecMode::Functional, MxuFormat::Bf16).unwrap();
    let sched = kern.schedule();
    let gemm = sched.instrs.iter().find(|c| c.unit == faultline_hw::isa::ExecUnit::Mxu).unwrap();
    let f: StepFault =
        StepFault::parse_on_op(&format!("flip:mxu.pe[5][7].psum[30]@cycle={}", gemm.start + 3000)).unwrap();
    g.bench_function("one_fault", |b| b.iter(|| black_box(kern.run(black_box(&ins), &[f]).unwrap())));
    g.finish();
}

criterion_group!(benches, conv);
criterion_main!(benches);
