//! Tests of the vector unit across its models: values, cycle counts and fault effects.

use super::*;
use crate::config::{Dataflow, HwConfig};
use crate::fault::{FaultEvent, FaultSchedule, FaultSite, Register};
use crate::ExecMode;
use faultline_num::Precision;
use proptest::prelude::*;

fn cfg(lanes: usize, depth: u64) -> HwConfig {
    let mut c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
    c.vpu.lanes = lanes;
    c.vpu.pipeline_depth = depth;
    c
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn both(c: &HwConfig, op: VpuOp, inputs: &[&[u32]]) -> Vec<Vec<u32>> {
    let f = run(c, op, inputs, ExecMode::Functional, &FaultSchedule::none()).unwrap();
    let s = run(c, op, inputs, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap();
    assert_eq!(f, s, "{op:?}");
    f.out
}

#[test]
fn elementwise_values() {
    let c = cfg(4, 2);
    let a = bits(&[1.0, -2.0, 3.0, 0.0, f32::NAN, 4.0]);
    let b = bits(&[2.0, 2.0, -1.0, -0.0, 1.0, 0.5]);
    let f = |v: &[u32]| v.iter().map(|&x| f32::from_bits(x)).collect::<Vec<_>>();
    assert_eq!(f(&both(&c, VpuOp::Add, &[&a, &b])[0])[..4], [3.0, 0.0, 2.0, 0.0]);
    let r = both(&c, VpuOp::Relu, &[&a])[0].clone();
    assert_eq!(r, vec![1f32.to_bits(), 0, 3f32.to_bits(), 0, faultline_num::CANONICAL_NAN, 4f32.to_bits()]);
    let g = both(&c, VpuOp::ReluGrad, &[&a, &b])[0].clone();
    assert_eq!(f(&g), [2.0, 0.0, -1.0, 0.0, 0.0, 0.5]);
    let m = both(&c, VpuOp::Max, &[&bits(&[0.0]), &bits(&[-0.0])])[0].clone();
    assert_eq!(m, vec![0]);
    let s = both(&c, VpuOp::CmpSelect(Cmp::Gt), &[&a, &b, &bits(&[9.0; 6]), &bits(&[7.0; 6])])[0].clone();
    assert_eq!(f(&s), [7.0, 7.0, 9.0, 7.0, 7.0, 9.0]); // 0 > -0 is false
    let o = both(&c, VpuOp::Momentum { lr: 0.5, mu: 0.9 }, &[&bits(&[1.0]), &bits(&[2.0]), &bits(&[4.0])]);
    let v2 = 0.9f32 * 4.0 + 2.0;
    assert_eq!(f(&o[1]), [v2]);
    assert_eq!(f(&o[0]), [1.0 - 0.5 * v2]);
}

/// Clamp: the lanes and the twin agree bit for bit; values in `[-b, b]` (signed zeros,
/// subnormals, the bounds themselves) come back unchanged, the rest saturate, NaN stays NaN.
#[test]
fn clamp_is_exact_in_range_and_the_twins_agree() {
    let c = cfg(3, 2);
    let b = 2.5f32;
    let inside = [0.0, -0.0, 1.0, -2.5, 2.5, 1e-40, -1e-40, 2.4999998, -0.1, f32::from_bits(1)];
    let x = bits(&inside);
    assert_eq!(both(&c, VpuOp::Clamp(b), &[&x])[0], x, "in range: bit for bit");
    let outside = bits(&[3.0, -1e30, f32::INFINITY, f32::NEG_INFINITY, 2.5000002, f32::NAN]);
    let got = both(&c, VpuOp::Clamp(b), &[&outside])[0].clone();
    let want = [b, -b, b, -b, b].map(f32::to_bits);
    assert_eq!(got[..5], want);
    assert_eq!(got[5], faultline_num::CANONICAL_NAN);
    // f32::MAX as the bound: the identity on every finite value.
    let wide = bits(&[f32::MAX, -f32::MAX, 3.4e38, -7.0, 0.0]);
    assert_eq!(both(&c, VpuOp::Clamp(f32::MAX), &[&wide])[0], wide);
    // Many lanes' worth of raw bit patterns: the cycle-level lanes equal the twin.
    let raw: Vec<u32> = (0..97u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
    let got = both(&c, VpuOp::Clamp(b), &[&raw])[0].clone();
    for (&r, &g) in raw.iter().zip(&got) {
        assert_eq!(g, lane_op(&VpuOp::Clamp(b), 0, [r, 0, 0, 0]));
        let v = f32::from_bits(r);
        if v.abs() <= b {
            assert_eq!(g, r);
        }
    }
}

#[test]
fn reductions_match_a_reference_order() {
    let c = cfg(4, 1);
    // 2 rows x 6 cols.
    let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let xb = bits(&x);
    let rows = both(&c, VpuOp::ReduceSum { cols: 6, axis: Axis::Row }, &[&xb])[0].clone();
    // Lane partials: l0 = x0 + x4, l1 = x1 + x5, l2 = x2, l3 = x3; tree: (l0+l1) + (l2+l3).
    let r = |o: usize| ((x[o] + x[o + 4]) + (x[o + 1] + x[o + 5])) + (x[o + 2] + x[o + 3]);
    assert_eq!(rows, bits(&[r(0), r(6)]));
    let colsum = both(&c, VpuOp::ReduceSum { cols: 6, axis: Axis::Col }, &[&xb])[0].clone();
    assert_eq!(colsum, bits(&(0..6).map(|j| x[j] + x[6 + j]).collect::<Vec<_>>()));
    let mx = both(&c, VpuOp::ReduceMax { cols: 6, axis: Axis::Row }, &[&xb])[0].clone();
    assert_eq!(mx, bits(&[x[5], x[11]]));
}

#[test]
fn cycle_counts_follow_the_documented_formulas() {
    let c = cfg(4, 3);
    assert_eq!(timing(&c, &VpuOp::Add, 10).cycles, 3 + 3 + 1);
    assert_eq!(timing(&c, &VpuOp::Adam { lr: 1.0, b1: 0.9, b2: 0.99, eps: 1e-8, t: 1 }, 8).cycles, 2 * 3 + 3 + 1);
    // 3 rows x 6 cols: nv = 2, S = 2 -> 3 * 4 + 3.
    assert_eq!(timing(&c, &VpuOp::ReduceSum { cols: 6, axis: Axis::Row }, 18).cycles, 15);
    // Col: 3 rows x 2 groups + 3.
    assert_eq!(timing(&c, &VpuOp::ReduceSum { cols: 6, axis: Axis::Col }, 18).cycles, 9);
}

#[test]
fn operand_flip_hits_only_outputs_read_after_it() {
    let c = cfg(4, 1);
    let adam = VpuOp::Adam { lr: 0.1, b1: 0.9, b2: 0.99, eps: 1e-8, t: 3 };
    let ins: Vec<Vec<u32>> = (0..4).map(|i| bits(&[1.0 + i as f32; 8])).collect();
    let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
    let golden = run(&c, adam, &refs, ExecMode::Functional, &FaultSchedule::none()).unwrap().out;
    // Vector 1 issues at 3; its outputs read operands at 4, 5, 6. Flip g (operand b) of lane
    // 2 at cycle 3 + 1 = 4: outputs 1 and 2 (m', v') of element 6 change, p' does not.
    let e = FaultEvent::flip(FaultSite::lane(2, Register::OpB, 30), 1, 1);
    let got = run(&c, adam, &refs, ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().out;
    let diff: Vec<(usize, usize)> =
        (0..3).flat_map(|j| (0..8).map(move |i| (j, i))).filter(|&(j, i)| got[j][i] != golden[j][i]).collect();
    assert_eq!(diff, vec![(1, 6), (2, 6)]);
    let mut x = [ins[0][6], ins[1][6], ins[2][6], ins[3][6]];
    x[1] ^= 1 << 30;
    assert_eq!(got[1][6], lane_op(&adam, 1, x));
}

#[test]
fn out_flip_corrupts_one_written_value() {
    let c = cfg(4, 2);
    let a = bits(&[1.0; 8]);
    // Vector 1 issues at 1; out latches at 1 + 0 + 2 = 3 and is written back at 4.
    let e = FaultEvent::flip(FaultSite::lane(1, Register::LaneOut, 31), 1, 2);
    let got = run(&c, VpuOp::Copy, &[&a], ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().into_first();
    let mut want = a.clone();
    want[5] ^= 1 << 31;
    assert_eq!(got, want);
    // A flip of an idle register (after its last write-back, at 4) changes nothing.
    let e = FaultEvent::flip(FaultSite::lane(1, Register::LaneOut, 31), 1, 3);
    let got = run(&c, VpuOp::Copy, &[&a], ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().into_first();
    assert_eq!(got, a);
    // One after the op (5 cycles: 2 vectors + D + 1) could only report "nothing changed":
    // an error naming the cycle and the op's length instead.
    let e = FaultEvent::flip(FaultSite::lane(1, Register::LaneOut, 31), 1, 4);
    let err = run(&c, VpuOp::Copy, &[&a], ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap_err().to_string();
    assert!(
        err.contains("cycle 4 of vector 1 (cycle 5 of the copy instruction)") && err.contains("ends at cycle 5"),
        "{err}"
    );
}

#[test]
fn reduction_acc_flip_changes_that_row_only() {
    let c = cfg(4, 1);
    let x = bits(&[1.0; 16]);
    let op = VpuOp::ReduceSum { cols: 8, axis: Axis::Row };
    // Row 1 issues vectors at 4, 5 (per = 2 + 2); acc of lane 3 latches at 5 and 6; flip the
    // exponent MSB at cycle 6 (after the last combine, before the tree's stage 0 at 7).
    let e = FaultEvent::flip(FaultSite::lane(3, Register::LaneAcc, 30), 2, 2);
    let got = run(&c, op, &[&x], ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().into_first();
    let l3 = f32::from_bits(2f32.to_bits() ^ 1 << 30);
    assert_eq!(got, bits(&[8.0, (2.0 + 2.0) + (2.0 + l3)]));
}

#[test]
fn cycle_counts_past_64_bits_are_errors_not_wrapped() {
    let c = cfg(1, 64);
    // Adam issues one vector every 3 cycles: 3 * (2^64 - 1) overflows (it used to wrap).
    let adam = VpuOp::Adam { lr: 1.0, b1: 0.9, b2: 0.99, eps: 1e-8, t: 1 };
    let e = try_timing(&c, &adam, usize::MAX).unwrap_err().to_string();
    assert!(e.contains("vpu.adam") && e.contains("does not fit 64 bits"), "{e}");
    assert_eq!(timing(&c, &adam, usize::MAX).cycles, u64::MAX, "saturates, never wraps");
    assert!(try_timing(&c, &VpuOp::Relu, usize::MAX).is_err(), "2^64 - 1 vectors + D + 1");
    // Costing a huge (valid) op allocates nothing: 2^40 vectors in closed form.
    assert_eq!(try_timing(&c, &VpuOp::Relu, 1 << 40).unwrap().cycles, (1 << 40) + 65);
    let rows = VpuOp::ReduceSum { cols: 1, axis: Axis::Row };
    assert_eq!(try_timing(&c, &rows, 1 << 40).unwrap().cycles, (1 << 40) + 3);
}

#[test]
fn bad_inputs_are_errors() {
    let c = cfg(4, 1);
    assert!(run(&c, VpuOp::Add, &[&[1]], ExecMode::Functional, &FaultSchedule::none()).is_err());
    assert!(run(&c, VpuOp::Add, &[&[1], &[1, 2]], ExecMode::Functional, &FaultSchedule::none()).is_err());
    let e = run(
        &c,
        VpuOp::ReduceSum { cols: 3, axis: Axis::Row },
        &[&[1, 2]],
        ExecMode::Functional,
        &FaultSchedule::none(),
    );
    assert!(e.unwrap_err().to_string().contains("reduce_sum"));
    let f = FaultSchedule::one(FaultEvent::flip(FaultSite::lane(9, Register::OpA, 0), 0, 0));
    assert!(run(&c, VpuOp::Copy, &[&[1]], ExecMode::CycleLevel, &f).is_err());
}

/// The observed run is the stepped one: the same bits as `run` at cycle level, one
/// observation per cycle, the flipped register visible from its cycle on.
#[test]
fn an_observed_run_is_the_stepped_run_seen_every_cycle() {
    let c = cfg(4, 2);
    let (a, b) = (bits(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), bits(&[0.5; 6]));
    // Vector 1 issues at cycle 1; flip lane 1's operand b at cycle 1 of it (cycle 2).
    let site = FaultSite::lane(1, Register::OpB, 30);
    let faults = FaultSchedule::one(FaultEvent::flip(site, 1, 1));
    let want = run(&c, VpuOp::Mul, &[&a, &b], ExecMode::CycleLevel, &faults).unwrap();
    let (mut seen, mut reg) = (Vec::new(), Vec::new());
    let got = run_observed(&c, VpuOp::Mul, &[&a, &b], &faults, |t, st| {
        seen.push(t);
        reg.push(st.read(&site));
    })
    .unwrap();
    assert_eq!(got, want);
    assert_eq!(seen, (0..want.stats.cycles).collect::<Vec<_>>());
    let mut clean = Vec::new();
    run_observed(&c, VpuOp::Mul, &[&a, &b], &FaultSchedule::none(), |_, st| clean.push(st.read(&site))).unwrap();
    assert_eq!((reg[1], reg[2] ^ clean[2]), (clean[1], 1 << 30));
}

fn any_op() -> impl Strategy<Value = VpuOp> {
    let cmp = prop_oneof![Just(Cmp::Lt), Just(Cmp::Ge), Just(Cmp::Eq), Just(Cmp::Ne)];
    prop_oneof![
        Just(VpuOp::Add),
        Just(VpuOp::Sub),
        Just(VpuOp::Mul),
        Just(VpuOp::Max),
        Just(VpuOp::Relu),
        Just(VpuOp::ReluGrad),
        Just(VpuOp::Exp),
        Just(VpuOp::Recip),
        Just(VpuOp::Rsqrt),
        Just(VpuOp::MulScalar(0.3)),
        Just(VpuOp::Clamp(4.5)),
        cmp.clone().prop_map(VpuOp::Compare),
        cmp.prop_map(VpuOp::CmpSelect),
        (1usize..7, any::<bool>())
            .prop_map(|(cols, r)| VpuOp::ReduceSum { cols, axis: if r { Axis::Row } else { Axis::Col } }),
        (1usize..7, any::<bool>())
            .prop_map(|(cols, r)| VpuOp::ReduceMax { cols, axis: if r { Axis::Row } else { Axis::Col } }),
        Just(VpuOp::Sgd { lr: 0.01 }),
        Just(VpuOp::Momentum { lr: 0.01, mu: 0.9 }),
        Just(VpuOp::Adam { lr: 1e-3, b1: 0.9, b2: 0.999, eps: 1e-8, t: 7 }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn twins_are_bit_identical(op in any_op(), lanes in 1usize..6, depth in 1u64..4, rows in 1usize..5,
                               seed in proptest::collection::vec(any::<u32>(), 4 * 6 * 4)) {
        let c = cfg(lanes, depth);
        let n = match op.reduction() { Some((cols, _, _)) => cols * rows, None => rows * 5 };
        let ins: Vec<Vec<u32>> = (0..op.inputs()).map(|i| (0..n).map(|e| {
            // Mix of ordinary values and raw bit patterns (NaN, inf, subnormals).
            let r = seed[(i * 24 + e) % seed.len()];
            if r % 3 == 0 { r } else { ((r % 2000) as f32 / 100.0 - 10.0).to_bits() }
        }).collect()).collect();
        let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
        let f = run(&c, op, &refs, ExecMode::Functional, &FaultSchedule::none()).unwrap();
        let s = run(&c, op, &refs, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap();
        prop_assert_eq!(f, s);
    }
}
