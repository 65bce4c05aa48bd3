//! `vpu` benchmark: fault-free functional VPU instructions that read an operand through a view,
//! as a training step's backward and forward passes run them: one col2im tap added into the
//! image gradient (a 3x3 window over 4 images of 14x14x32, as the 16-32-64 CNN's tiles on
//! tpu-32x32), and a bias added through its broadcast (ResNet-20's first stage, batch 32:
//! 32x32x32x16). Throughput in elements.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use faultline_hw::isa::{execute, BufId, Dest, Instr, Operand, View, Window};
use faultline_hw::vpu::VpuOp;
use faultline_hw::{Dataflow, ExecMode, FaultSchedule, HwConfig};
use faultline_num::Precision;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Buffers 0 and 1 hold the operands (`span` random words each), 2 the destination.
fn table(span: [usize; 2], n: usize) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut words = |len: usize| (0..len).map(|_| rng.gen_range(-1.0f32..1.0).to_bits()).collect::<Vec<u32>>();
    vec![words(span[0]), words(span[1]), vec![0; n]]
}

fn bench(c: &mut Criterion) {
    let cfg = HwConfig::test_config(32, 32, Dataflow::WeightStationary, Precision::Fp32Fp32);
    let mut g = c.benchmark_group("vpu");
    let image = [4, 14, 14, 32];
    let window = Window { kh: 3, kw: 3, stride: 1, padding: 1 };
    let tap = View::Col2ImTap { window, image, tap: 4 };
    let bias = View::Cycle { len: 16 };
    let cases = [
        ("col2im_tap_add_4x14x14x32", image.iter().product::<usize>(), tap),
        ("bias_add_32x32x32x16", 32 * 32 * 32 * 16, bias),
    ];
    for (name, n, view) in cases {
        let span = view.span(n);
        let instr = Instr::Vpu {
            op: VpuOp::Add,
            n,
            ins: vec![
                Operand { buf: BufId(0), offset: 0, view: View::Whole },
                Operand { buf: BufId(1), offset: 0, view },
            ],
            outs: vec![Dest { buf: BufId(2), offset: 0 }],
            acc: false,
        };
        let mut bufs = table([n, span], n);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(name, |b| {
            b.iter(|| execute(&cfg, &instr, &mut bufs, ExecMode::Functional, &FaultSchedule::none()).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
