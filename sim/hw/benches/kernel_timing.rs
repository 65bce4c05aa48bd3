//! One op's whole-op tile timing (`kernel::timing`, the SCALE-Sim comparison's cost model):
//! conv2d 3x3, 14x14x64 -> 64 on the 32x32 config. Running the op is `train`'s `kernel` bench.

use criterion::{criterion_group, criterion_main, Criterion};
use faultline_hw::kernel::{self, ConvShape, KernelSpec};
use faultline_hw::HwConfig;
use std::hint::black_box;
use std::path::Path;

fn conv(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tpu-32x32.ron");
    let cfg = HwConfig::load(&path).expect("configs/tpu-32x32.ron");
    let shape = ConvShape { batch: 1, h: 14, w: 14, c_in: 64, c_out: 64, kh: 3, kw: 3, stride: 1, pad: 1 };
    let kind = KernelSpec::Conv2d(shape);
    let mut g = c.benchmark_group("op/conv2d_3x3_14x14x64_64/tpu-32x32");
    g.bench_function("timing_only", |b| b.iter(|| black_box(kernel::timing(&cfg, black_box(&kind)).unwrap())));
    g.finish();
}

criterion_group!(benches, conv);
criterion_main!(benches);
