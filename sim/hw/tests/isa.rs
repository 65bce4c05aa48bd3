//! One instruction on a table of buffers: a fault-free functional run (which computes GEMM and
//! VPU results straight into their destinations) leaves every buffer as the cycle-level run
//! (which builds each result and copies it in) does, and reports the same cycles.

use faultline_hw::isa::{execute, Dest, Instr, MatOperand, Operand, View};
use faultline_hw::vpu::{Axis, VpuOp};
use faultline_hw::{Dataflow, ExecMode, FaultSchedule, HwConfig};
use faultline_num::Precision;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Buffers: 0-2 operands, 3-5 destinations.
const BUFS: usize = 6;

fn ops() -> impl Strategy<Value = VpuOp> {
    prop_oneof![
        Just(VpuOp::Copy),
        Just(VpuOp::Add),
        Just(VpuOp::Mul),
        Just(VpuOp::Relu),
        Just(VpuOp::Exp),
        Just(VpuOp::Sgd { lr: 0.1 }),
        Just(VpuOp::Momentum { lr: 0.1, mu: 0.9 }),
        Just(VpuOp::Adam { lr: 0.01, b1: 0.9, b2: 0.999, eps: 1e-8, t: 3 }),
        (1usize..5).prop_map(|cols| VpuOp::ReduceSum { cols, axis: Axis::Row }),
        (1usize..5).prop_map(|cols| VpuOp::ReduceMax { cols, axis: Axis::Col }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_functional_instruction_writes_what_the_cycle_level_one_writes(
        op in ops(),
        rows in 1usize..40,
        gemm in any::<bool>(),
        offsets in proptest::collection::vec(0usize..7, 6),
        empty in proptest::collection::vec(any::<bool>(), 3),
        per_row in any::<bool>(),
        seed in any::<u64>(),
        fp32 in any::<bool>(),
    ) {
        let prec = if fp32 { Precision::Fp32Fp32 } else { Precision::Bf16Fp32 };
        let cfg = HwConfig::test_config(4, 4, Dataflow::WeightStationary, prec);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let cols = match op {
            VpuOp::ReduceSum { cols, .. } | VpuOp::ReduceMax { cols, .. } => cols,
            _ => 4,
        };
        let n = rows * cols;
        let instr = if gemm {
            let (m, k, nn) = (rows, cols + 1, 3);
            let at = |b: u32, t: bool| MatOperand { buf: faultline_hw::isa::BufId(b), offset: offsets[b as usize], transposed: t };
            Instr::Gemm {
                a: at(0, per_row),
                b: at(1, !per_row),
                out: Dest { buf: faultline_hw::isa::BufId(3), offset: if empty[0] { 0 } else { offsets[3] } },
                m, k, n: nn,
                acc: !empty[0] && rng.gen_bool(0.5),
            }
        } else {
            let ins = (0..op.inputs())
                .map(|i| {
                    // A per-row broadcast of the second operand, or a cycled first operand of a
                    // one-input op (gathered straight into the destination), exercises views.
                    let view = match (i, op.inputs(), per_row) {
                        (1, _, true) => View::PerRow { cols },
                        (0, 1, true) => View::Cycle { len: cols + 1 },
                        _ => View::Whole,
                    };
                    Operand { buf: faultline_hw::isa::BufId(i.min(2) as u32), offset: offsets[i.min(2)], view }
                })
                .collect();
            let outs = (0..op.outputs())
                .map(|j| Dest { buf: faultline_hw::isa::BufId(3 + j as u32), offset: if empty[j] { 0 } else { offsets[3 + j] } })
                .collect();
            Instr::Vpu { op, n, ins, outs, acc: false }
        };
        let mut bufs: Vec<Vec<u32>> = (0..BUFS)
            .map(|b| {
                if b >= 3 && empty[b - 3] {
                    return Vec::new();
                }
                (0..n * 8 + 16).map(|_| rng.gen_range(-2.0f32..2.0).to_bits()).collect()
            })
            .collect();
        if op == (VpuOp::Adam { lr: 0.01, b1: 0.9, b2: 0.999, eps: 1e-8, t: 3 }) {
            // Adam's second moment must not be negative.
            for w in &mut bufs[2] {
                *w = f32::from_bits(*w).abs().to_bits();
            }
        }
        let mut cyc = bufs.clone();
        let f = execute(&cfg, &instr, &mut bufs, ExecMode::Functional, &FaultSchedule::none()).unwrap();
        let c = execute(&cfg, &instr, &mut cyc, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap();
        prop_assert_eq!(f, c);
        prop_assert!(bufs == cyc, "{:?}", instr);
    }
}

/// A view of operand `k` (of `n` elements) over buffer words: the broadcasts, repeats and
/// col2im taps that a two-input op reads through.
fn view_for(kind: u8, n: usize) -> (View, usize) {
    use faultline_hw::isa::Window;
    match kind % 6 {
        0 => (View::Whole, n),
        1 => (View::PerRow { cols: 9 }, n),
        2 => (View::Cycle { len: 13 }, n),
        3 => (View::RepeatRows { d: 6, t: 5 }, n - n % 30),
        4 => (View::Transpose { a: 11, b: 9, c: 5 }, n),
        _ => {
            // An image [b, 9, 11, 5] whose col2im tap 4 of a 3x3 window, stride 2, padded.
            let image = [n / (9 * 11 * 5), 9, 11, 5];
            let window = Window { kh: 3, kw: 3, stride: 2, padding: 1 };
            (View::Col2ImTap { window, image, tap: kind as usize / 6 % 9 }, image.iter().product())
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A fault-free functional two-input op whose inputs are read through views, over more
    /// elements than one gathered chunk (so chunks start inside rows, repeats and pixels),
    /// writes what the cycle-level run writes.
    #[test]
    fn a_two_input_op_through_views_writes_what_the_cycle_level_one_writes(
        op in prop_oneof![Just(VpuOp::Add), Just(VpuOp::Sub), Just(VpuOp::Mul), Just(VpuOp::ReluGrad), Just(VpuOp::Sgd { lr: 0.5 })],
        kinds in (any::<u8>(), any::<u8>()),
        size in 1usize..9,
        seed in any::<u64>(),
    ) {
        let cfg = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Fp32Fp32);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Both views must agree on n: the image view fixes it when either is one.
        let n = size * 9 * 11 * 5 * 2;
        let (va, na) = view_for(kinds.0, n);
        let (vb, nb) = view_for(kinds.1, n);
        let n = na.min(nb);
        prop_assume!(n > 0 && n == na && n == nb);
        let ins = vec![
            Operand { buf: faultline_hw::isa::BufId(0), offset: 3, view: va },
            Operand { buf: faultline_hw::isa::BufId(1), offset: 1, view: vb },
        ];
        let instr = Instr::Vpu { op, n, ins, outs: vec![Dest { buf: faultline_hw::isa::BufId(3), offset: 2 }], acc: false };
        let mut bufs: Vec<Vec<u32>> = (0..BUFS).map(|_| (0..n * 4 + 16).map(|_| rng.gen_range(-2.0f32..2.0).to_bits()).collect()).collect();
        let mut cyc = bufs.clone();
        let f = execute(&cfg, &instr, &mut bufs, ExecMode::Functional, &FaultSchedule::none()).unwrap();
        let c = execute(&cfg, &instr, &mut cyc, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap();
        prop_assert_eq!(f, c);
        prop_assert!(bufs == cyc, "{:?}", instr);
    }
}
