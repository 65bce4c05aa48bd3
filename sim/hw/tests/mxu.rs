//! MXU behaviour across modules: the functional twin, the cycle formula and the fault hook.

use faultline_hw::fault::{FaultEvent, FaultSchedule};
use faultline_hw::fault::{FaultSite, Register};
use faultline_hw::mxu::{self, cycle_level, gemm, PeArrayState, Schedule};
use faultline_hw::{Dataflow, ExecMode, HwConfig, Matrix};
use faultline_num::{with_precision, MacFormat, NumFormat, Precision};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;

/// Random operand bits of `prec`'s input format; `specials` mixes in inf/NaN/subnormal/-0.
fn operand(rng: &mut ChaCha8Rng, prec: Precision, rows: usize, cols: usize, specials: bool) -> Matrix {
    let f = prec.input();
    Matrix::from_fn(rows, cols, |_, _| {
        if specials && rng.gen_ratio(1, 8) {
            let pick = [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -0.0, 1e-40, -3e-39];
            return f.f64_to_bits(pick[rng.gen_range(0..pick.len())]);
        }
        match f {
            NumFormat::Int8 => rng.gen_range(-128i32..=127) as u8 as u32,
            _ => f.f64_to_bits(rng.gen_range(-4.0..4.0)),
        }
    })
}

fn run(cfg: &HwConfig, a: &Matrix, w: &Matrix, mode: ExecMode, faults: &FaultSchedule) -> Matrix {
    gemm(cfg, a, w, mode, faults).unwrap().out
}

fn dataflows() -> impl Strategy<Value = Dataflow> {
    prop_oneof![Just(Dataflow::WeightStationary), Just(Dataflow::OutputStationary), Just(Dataflow::InputStationary)]
}

fn precisions() -> impl Strategy<Value = Precision> {
    prop_oneof![Just(Precision::Bf16Fp32), Just(Precision::Fp32Fp32), Just(Precision::Int8Int32)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Invariant 1 of the design: cycle-level == functional, to the bit, with no fault active.
    #[test]
    fn cycle_level_equals_functional(
        rows in 1usize..=16, cols in 1usize..=16,
        m in 1usize..=40, k in 1usize..=40, n in 1usize..=40,
        df in dataflows(), prec in precisions(), specials in any::<bool>(), seed in any::<u64>(),
    ) {
        let cfg = HwConfig::test_config(rows, cols, df, prec);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = operand(&mut rng, prec, m, k, specials);
        let w = operand(&mut rng, prec, k, n, specials);
        let f = run(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
        let c = run(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::none());
        prop_assert_eq!(f.diff(&c), vec![]);
    }

    /// A faulty weight-stationary GEMM (which [`gemm`] steps only from shortly before the
    /// first fault until the faulty array state rejoins the fault-free one) equals stepping the
    /// whole GEMM from the reset state, for one or two faults on any PE register, flips and
    /// stuck-ats, at any time, accumulating or not; in IS too (WS on the transposed problem).
    #[test]
    fn a_windowed_faulty_gemm_equals_stepping_all_of_it(
        rows in 1usize..=8, cols in 1usize..=8, m in 1usize..=20, k in 1usize..=20, n in 1usize..=20,
        prec in precisions(), accumulate in any::<bool>(), two in any::<bool>(), seed in any::<u64>(),
        is in any::<bool>(),
    ) {
        let df = if is { Dataflow::InputStationary } else { Dataflow::WeightStationary };
        let cfg = HwConfig::test_config(rows, cols, df, prec);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = operand(&mut rng, prec, m, k, true);
        let w = operand(&mut rng, prec, k, n, true);
        let acc = accumulate.then(|| Matrix::from_fn(m, n, |i, j| (i * 7 + j) as u32 * 0x0101_0101));
        let mut sched = Schedule::new(&cfg.mxu, m, k, n).unwrap();
        if accumulate {
            sched = sched.accumulating();
        }
        // Every WS PE register (the weight-valid bits exist in OS only).
        let regs = [Register::Act, Register::Valid, Register::Swap, Register::Weight, Register::WeightShadow,
            Register::Psum];
        let mut events = Vec::new();
        for _ in 0..1 + two as usize {
            let reg = regs[rng.gen_range(0..regs.len())];
            let class = FaultSite::pe(0, 0, reg, 0).class();
            let bit = rng.gen_range(0..class.width(&cfg));
            let site = FaultSite::pe(rng.gen_range(0..rows), rng.gen_range(0..cols), reg, bit);
            let at = rng.gen_range(0..sched.total_cycles);
            let e = if rng.gen_bool(0.5) {
                FaultEvent::flip(site, 0, at)
            } else {
                FaultEvent::stuck(site, rng.gen_bool(0.5), 0, at, rng.gen_range(1..=sched.total_cycles - at))
            };
            events.push(e);
        }
        let faults = FaultSchedule { events };
        let got = mxu::gemm_into(&cfg, &a, &w, acc.as_ref(), ExecMode::CycleLevel, &faults).unwrap().out;
        let want = with_precision!(prec, F => {
            cycle_level::<F>(&sched, &a, &w, acc.as_ref(), &faults, &mut PeArrayState::new(rows, cols)).0
        });
        prop_assert_eq!(got.diff(&want), vec![]);
    }

    /// An accumulating GEMM (`out += A * W`, a K tile of a GEMM cut along K) is the same in
    /// both modes, and in weight-stationary a GEMM cut along K at a multiple of the array's rows
    /// is the whole GEMM to the bit (the folds, and the order they add in, are unchanged).
    #[test]
    fn a_k_cut_gemm_accumulates_exactly(
        rows in 1usize..=8, cols in 1usize..=8, m in 1usize..=12, k1 in 1usize..=3, k2 in 1usize..=20,
        n in 1usize..=12, df in dataflows(), prec in precisions(), seed in any::<u64>(),
    ) {
        let cfg = HwConfig::test_config(rows, cols, df, prec);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let k1 = k1 * rows;
        let a = operand(&mut rng, prec, m, k1 + k2, false);
        let w = operand(&mut rng, prec, k1 + k2, n, false);
        let (a1, a2) = (Matrix::from_fn(m, k1, |i, j| a.get(i, j)), Matrix::from_fn(m, k2, |i, j| a.get(i, k1 + j)));
        let (w1, w2) = (Matrix::from_fn(k1, n, |i, j| w.get(i, j)), Matrix::from_fn(k2, n, |i, j| w.get(k1 + i, j)));
        let first = run(&cfg, &a1, &w1, ExecMode::Functional, &FaultSchedule::none());
        let add = |mode| mxu::gemm_into(&cfg, &a2, &w2, Some(&first), mode, &FaultSchedule::none()).unwrap().out;
        let (f, c) = (add(ExecMode::Functional), add(ExecMode::CycleLevel));
        prop_assert_eq!(f.diff(&c), vec![]);
        if df.stationary_operand() {
            prop_assert_eq!(f.diff(&run(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none())), vec![]);
        }
    }

    /// The closed-form cycle count equals the stepped model's measured count.
    #[test]
    fn closed_form_cycles_match_stepped_model(
        rows in 1usize..=12, cols in 1usize..=12,
        m in 1usize..=30, k in 1usize..=30, n in 1usize..=30, df in dataflows(),
    ) {
        let cfg = HwConfig::test_config(rows, cols, df, Precision::Int8Int32);
        let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
        let a = Matrix::from_fn(m, k, |i, j| ((i + j) % 5) as u32);
        let w = Matrix::from_fn(k, n, |i, j| ((i * 3 + j) % 7) as u32);
        let mut st = PeArrayState::new(rows, cols);
        let (_, rep) = cycle_level::<faultline_num::Int8Int32>(&s, &a, &w, None, &FaultSchedule::none(), &mut st);
        prop_assert_eq!(rep.measured_cycles, s.total_cycles);
        // WS and IS write every output once per k-tile (overwrite, then accumulate); OS once.
        let writes_per_output = if df.stationary_operand() { k.div_ceil(rows) } else { 1 };
        prop_assert_eq!(rep.captures, (m * n * writes_per_output) as u64);
    }
}

/// Hand-checked closed forms for a few shapes (the formulas in `mxu`'s module docs).
#[test]
fn closed_form_examples() {
    let ws = HwConfig::test_config(4, 3, Dataflow::WeightStationary, Precision::Bf16Fp32);
    // M=10, K=8 (2 k-tiles), N=5 (2 n-tiles: 3 + 2 cols) -> 4 folds, period max(10,4)=10.
    let t = mxu::gemm_timing(&ws.mxu, 10, 8, 5);
    assert_eq!(t.folds, 4);
    // Last fold starts at T_3 = 1 + 3*10 = 31 and ends at 31 + 10 + 4 + 2 - 1 = 46.
    assert_eq!(t.total_cycles, 46);
    assert_eq!(t.compute_cycles, 40);
    assert_eq!(t.macs, 400);
    // 1x1 array, 1x1x1 GEMM: load (1), MAC (1), capture (1).
    let one = HwConfig::test_config(1, 1, Dataflow::WeightStationary, Precision::Bf16Fp32);
    assert_eq!(mxu::gemm_timing(&one.mxu, 1, 1, 1).total_cycles, 3);
    let os = HwConfig::test_config(4, 3, Dataflow::OutputStationary, Precision::Bf16Fp32);
    // OS: folds = ceil(10/4)*ceil(5/3) = 6, each K + 2R + C - 2 = 8 + 8 + 3 - 2 = 17.
    let t = mxu::gemm_timing(&os.mxu, 10, 8, 5);
    assert_eq!((t.folds, t.total_cycles), (6, 102));
    assert!((t.utilization - 400.0 / (102.0 * 12.0)).abs() < 1e-12);
    let is = HwConfig::test_config(4, 3, Dataflow::InputStationary, Precision::Bf16Fp32);
    // IS: WS on 5x8x10: folds = ceil(8/4)*ceil(10/3) = 8, period max(N=5, R=4) = 5; the last
    // fold (width 10 - 9 = 1) starts at 1 + 7*5 = 36 and ends at 36 + 5 + 4 + 1 - 1 = 45.
    let t = mxu::gemm_timing(&is.mxu, 10, 8, 5);
    assert_eq!((t.folds, t.total_cycles, t.compute_cycles, t.macs), (8, 45, 40, 400));
    assert_eq!(t, mxu::gemm_timing(&ws.mxu, 5, 8, 10), "IS is WS on the transposed shape");
}

/// Functional results vs an f64 reference on the same (already rounded) inputs.
///
/// Bound: every output is a recursive sum of K products, each product exact (bf16) or rounded
/// once (fp32), each add rounded once, so |err| <= gamma_{K+1} * sum |a_i w_i| with
/// gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability, eq. 3.5). The WS
/// chunking into folds only regroups the same adds, so the bound holds for both dataflows.
#[test]
fn functional_matches_f64_reference_within_bound() {
    for (prec, df) in [
        (Precision::Bf16Fp32, Dataflow::WeightStationary),
        (Precision::Bf16Fp32, Dataflow::OutputStationary),
        (Precision::Fp32Fp32, Dataflow::WeightStationary),
        (Precision::Bf16Fp32, Dataflow::InputStationary),
        (Precision::Fp32Fp32, Dataflow::InputStationary),
    ] {
        let cfg = HwConfig::test_config(8, 8, df, prec);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (m, k, n) = (20, 300, 17);
        let a = operand(&mut rng, prec, m, k, false);
        let w = operand(&mut rng, prec, k, n, false);
        let out = run(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
        let u = 2f64.powi(-24);
        let gamma = (k + 1) as f64 * u / (1.0 - (k + 1) as f64 * u);
        let fi = prec.input();
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut mag) = (0.0f64, 0.0f64);
                for x in 0..k {
                    let p = fi.bits_to_f64(a.get(i, x)) * fi.bits_to_f64(w.get(x, j));
                    exact += p;
                    mag += p.abs();
                }
                let got = f32::from_bits(out.get(i, j)) as f64;
                assert!((got - exact).abs() <= gamma * mag, "{prec:?} {df:?} ({i},{j}): {got} vs {exact}");
            }
        }
    }
    // int8/int32 is exact.
    let cfg = HwConfig::test_config(5, 7, Dataflow::WeightStationary, Precision::Int8Int32);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let a = operand(&mut rng, Precision::Int8Int32, 9, 23, false);
    let w = operand(&mut rng, Precision::Int8Int32, 23, 11, false);
    let out = run(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
    for i in 0..9 {
        for j in 0..11 {
            let want: i64 = (0..23).map(|x| (a.get(i, x) as u8 as i8 as i64) * (w.get(x, j) as u8 as i8 as i64)).sum();
            assert_eq!(out.get(i, j) as i32 as i64, want);
        }
    }
}

// ---------------------------------------------------------------- fault hook

/// Operands with every element non-zero, so that any changed product changes the sum.
fn nonzero_int8(rows: usize, cols: usize, salt: usize) -> Matrix {
    Matrix::from_fn(rows, cols, |i, j| {
        let v = ((i * 7 + j * 3 + salt) % 11) as i32 + 1; // 1..=11
        (if (i + j) % 2 == 0 { v } else { -v }) as u8 as u32
    })
}

fn faulty_diff(cfg: &HwConfig, a: &Matrix, w: &Matrix, e: FaultEvent) -> BTreeSet<(usize, usize)> {
    let golden = run(cfg, a, w, ExecMode::CycleLevel, &FaultSchedule::none());
    let faulty = run(cfg, a, w, ExecMode::CycleLevel, &FaultSchedule::one(e));
    golden.diff(&faulty).into_iter().collect()
}

const WS_SHAPE: (usize, usize, usize) = (9, 10, 7); // on a 4x3 array: 3 k-tiles x 3 n-tiles

fn ws_cfg(prec: Precision) -> HwConfig {
    HwConfig::test_config(4, 3, Dataflow::WeightStationary, prec)
}

/// WS weight flip at PE (i, j) during fold f: every later activation of that fold passing the PE
/// multiplies by the wrong weight, so outputs (m, n0 + j) for m >= the first later wavefront
/// change, and nothing else (the next fold's swap replaces the register).
#[test]
fn ws_weight_flip_corrupts_predicted_outputs_only() {
    let cfg = ws_cfg(Precision::Int8Int32);
    let (m, k, n) = WS_SHAPE;
    let (a, w) = (nonzero_int8(m, k, 1), nonzero_int8(k, n, 2));
    let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
    for (f, i, j, off, bit) in [(0, 0, 0, 3, 2), (4, 2, 1, 6, 6), (7, 1, 2, 1 + 1 + 2 + 1, 0), (8, 1, 0, 5, 4)] {
        let fold = s.folds[f];
        let t_f = fold.start + 1; // first activation enters row 0
        let abs = fold.start + off;
        assert!(abs >= t_f + (i + j) as u64, "test flips after the swap");
        let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Weight, bit), f, off);
        let want: BTreeSet<_> = if i < fold.kr && j < fold.nc {
            (0..m).filter(|&mm| t_f + (mm + i + j) as u64 > abs).map(|mm| (mm, fold.n0 + j)).collect()
        } else {
            BTreeSet::new()
        };
        assert!(!want.is_empty() || i >= fold.kr || j >= fold.nc);
        assert_eq!(faulty_diff(&cfg, &a, &w, e), want, "fold {f} pe[{i}][{j}] bit {bit}");
    }
}

/// WS psum flip at PE (i, j) at absolute cycle t hits exactly the one partial sum in flight
/// there: output m = t - T_f - i - j of fold f.
#[test]
fn ws_psum_flip_corrupts_one_output() {
    let cfg = ws_cfg(Precision::Int8Int32);
    let (m, k, n) = WS_SHAPE;
    let (a, w) = (nonzero_int8(m, k, 3), nonzero_int8(k, n, 4));
    let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
    for (f, i, j, mm, bit) in [(0, 0, 0, 0, 0), (2, 3, 2, 8, 31), (5, 2, 1, 4, 17), (8, 3, 0, 6, 9)] {
        let fold = s.folds[f];
        let off = 1 + (mm + i + j) as u64; // cycle T_f + m + i + j, relative to the fold start
        let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Psum, bit), f, off);
        let want: BTreeSet<_> = if j < fold.nc { [(mm, fold.n0 + j)].into() } else { BTreeSet::new() };
        assert_eq!(faulty_diff(&cfg, &a, &w, e), want, "fold {f} pe[{i}][{j}] m {mm}");
    }
}

/// A valid bit travels right with its activation: clearing it at PE (i, j) makes every PE to
/// the right skip that activation's MAC: outputs (m, n0 + j') for j' > j.
#[test]
fn ws_valid_flip_propagates_right() {
    let cfg = HwConfig::test_config(4, 5, Dataflow::WeightStationary, Precision::Int8Int32);
    let (m, k, n) = (6, 4, 5);
    let (a, w) = (nonzero_int8(m, k, 5), nonzero_int8(k, n, 6));
    let (i, j, mm) = (2, 1, 3);
    let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Valid, 0), 0, 1 + (mm + i + j) as u64);
    let want: BTreeSet<_> = (j + 1..n).map(|jj| (mm, jj)).collect();
    assert_eq!(faulty_diff(&cfg, &a, &w, e), want);
}

/// A bf16 exponent-bit flip in a WS shadow register before the swap corrupts the whole fold
/// column that loads it; after the swap (shadow already consumed, next fold not yet loaded) it
/// is overwritten by the next load and is masked.
#[test]
fn ws_shadow_flip_before_swap_corrupts_column_after_is_masked() {
    let cfg = ws_cfg(Precision::Bf16Fp32);
    let (m, k, n) = (5, 4, 3); // one fold
    let a = Matrix::from_fn(m, k, |i, j| Precision::Bf16Fp32.input().f64_to_bits(1.0 + (i + j) as f64 / 8.0));
    let w = Matrix::from_fn(k, n, |i, j| Precision::Bf16Fp32.input().f64_to_bits(0.5 + (i * j) as f64 / 16.0));
    // Shadow of PE (2, 1) is written at cycle j - 1 + i + 1 = 2 (fold start 0) and swapped at 1 + 3 = 4.
    let site = FaultSite::pe(2, 1, Register::WeightShadow, 13);
    let before = FaultEvent::flip(site, 0, 3);
    let want: BTreeSet<_> = (0..m).map(|mm| (mm, 1)).collect();
    assert_eq!(faulty_diff(&cfg, &a, &w, before), want);
    let after = FaultEvent::flip(site, 0, 5);
    assert_eq!(faulty_diff(&cfg, &a, &w, after), BTreeSet::new());
}

/// OS psum flip during the compute window corrupts exactly the output that PE owns; OS weight
/// flip corrupts the outputs of the PEs below it in the column (the weight moves down).
#[test]
fn os_psum_and_weight_flips() {
    let cfg = HwConfig::test_config(4, 3, Dataflow::OutputStationary, Precision::Int8Int32);
    let (m, k, n) = (7, 6, 5); // 2 x 2 output tiles, the last ones ragged
    let (a, w) = (nonzero_int8(m, k, 7), nonzero_int8(k, n, 8));
    let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
    for (f, i, j, off, bit) in [(0, 1, 2, 4, 3), (3, 2, 1, 9, 30), (1, 3, 0, 2, 12)] {
        let fold = s.folds[f];
        let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Psum, bit), f, off);
        let want: BTreeSet<_> =
            if i < fold.mr && j < fold.nc { [(fold.m0 + i, fold.n0 + j)].into() } else { BTreeSet::new() };
        assert_eq!(faulty_diff(&cfg, &a, &w, e), want, "psum fold {f} pe[{i}][{j}]");
    }
    // Weight register of PE (1, 1) at cycle S + kk + 1 + 1 holds W[kk][n0+1]; PEs (2,1), (3,1) use it next.
    let (f, i, j, kk) = (0, 1, 1, 2);
    let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Weight, 5), f, (kk + i + j) as u64);
    let want: BTreeSet<_> = (i + 1..4).map(|ii| (ii, j)).collect();
    assert_eq!(faulty_diff(&cfg, &a, &w, e), want);
}

/// A stuck-at-1 on a psum bit for a cycle range hits every partial sum passing that PE in the
/// range (operands are small and positive, so bit 20 is 0 in every golden partial sum).
#[test]
fn stuck_at_covers_its_cycle_range() {
    let cfg = HwConfig::test_config(3, 2, Dataflow::WeightStationary, Precision::Int8Int32);
    let (m, k, n) = (8, 3, 2);
    let a = Matrix::from_fn(m, k, |i, j| (1 + (i + j) % 9) as u32);
    let w = Matrix::from_fn(k, n, |i, j| (1 + (2 * i + j) % 5) as u32);
    // PE (1, 0): output mm is there after cycle T + mm + 1 (T = 1). Stick for cycles 4..=6.
    let e = FaultEvent::stuck(FaultSite::pe(1, 0, Register::Psum, 20), true, 0, 4, 3);
    let want: BTreeSet<_> = [2usize, 3, 4].into_iter().map(|mm| (mm, 0)).collect();
    assert_eq!(faulty_diff(&cfg, &a, &w, e), want);
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let cfg = ws_cfg(Precision::Bf16Fp32);
    let a = Matrix::zeros(2, 3);
    let w = Matrix::zeros(4, 2);
    let e = gemm(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none()).unwrap_err();
    assert!(e.to_string().contains("A.cols must equal W.rows"), "{e}");
    let w = Matrix::zeros(3, 2);
    let site = FaultSite::pe(9, 0, Register::Psum, 0);
    let e = gemm(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::one(FaultEvent::flip(site, 0, 0))).unwrap_err();
    assert!(e.to_string().contains("mxu.pe[9][0].psum[0]"), "{e}");
    let site = FaultSite::pe(0, 0, Register::Psum, 0);
    let e = gemm(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::one(FaultEvent::flip(site, 5, 0))).unwrap_err();
    assert!(e.to_string().contains("tile 5"), "{e}");
    let e = gemm(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::one(FaultEvent::flip(site, 0, 0))).unwrap_err();
    assert!(e.to_string().contains("cycle-level"), "{e}");
}

/// The generic entry agrees with a direct monomorphised call (guards `with_precision!`).
#[test]
fn precision_dispatch_uses_the_configured_format() {
    for p in Precision::ALL {
        let name = with_precision!(p, F => format!("{:?}", F::PRECISION));
        assert_eq!(name, format!("{p:?}"));
    }
}

/// The observer sees the committed state every cycle, faults included: a psum flip shows up in
/// the observed register at exactly the faulted cycle.
#[test]
fn observer_sees_committed_faulty_state() {
    let cfg = HwConfig::test_config(2, 2, Dataflow::WeightStationary, Precision::Int8Int32);
    let s = Schedule::new(&cfg.mxu, 3, 2, 2).unwrap();
    let (a, w) = (nonzero_int8(3, 2, 1), nonzero_int8(2, 2, 2));
    let site = FaultSite::pe(1, 1, Register::Psum, 4);
    let e = FaultEvent::flip(site, 0, 5);
    let (mut golden, mut faulty) = (Vec::new(), Vec::new());
    let mut st = PeArrayState::new(2, 2);
    mxu::cycle_level_observed::<faultline_num::Int8Int32>(&s, &a, &w, None, &FaultSchedule::none(), &mut st, |_, x| {
        golden.push(x.read(&site))
    });
    let mut st = PeArrayState::new(2, 2);
    mxu::cycle_level_observed::<faultline_num::Int8Int32>(&s, &a, &w, None, &FaultSchedule::one(e), &mut st, |_, x| {
        faulty.push(x.read(&site))
    });
    assert_eq!(golden.len(), s.total_cycles as usize);
    let differs: Vec<usize> = (0..golden.len()).filter(|&t| golden[t] != faulty[t]).collect();
    assert_eq!(differs, vec![5], "the flipped value lives one cycle, then the next partial sum replaces it");
    assert_eq!(golden[5] ^ faulty[5], 1 << 4);
}

// ---------------------------------------------------------------- hostile shapes and times

/// Counts that do not fit 64 bits are `Shape` errors naming the GEMM (the old schedule
/// multiplied in wrapping `u64`), found in closed form before any fold list is built.
#[test]
fn shapes_past_64_bits_are_errors_not_wrapped_counts() {
    let ws = HwConfig::test_config(1, 1, Dataflow::WeightStationary, Precision::Bf16Fp32);
    let big = 1usize << 32;
    // 2^64 folds of 2^32 cycles each.
    let e = mxu::try_gemm_timing(&ws.mxu, big, big, big).unwrap_err().to_string();
    assert!(e.contains("gemm 4294967296x4294967296x4294967296") && e.contains("does not fit 64 bits"), "{e}");
    assert!(Schedule::new(&ws.mxu, big, big, big).is_err());
    // The infallible form saturates instead of wrapping to a small, plausible count.
    assert_eq!(mxu::gemm_timing(&ws.mxu, big, big, big).total_cycles, u64::MAX);
    let os = HwConfig::test_config(4, 4, Dataflow::OutputStationary, Precision::Bf16Fp32);
    assert!(mxu::try_gemm_timing(&os.mxu, 1, usize::MAX, 1).unwrap_err().to_string().contains("cycle count"));
    // Cycles fit (2^24 folds of 2^22) but M*K*N = 2^66 MACs does not.
    let wide = HwConfig::test_config(1024, 1024, Dataflow::WeightStationary, Precision::Bf16Fp32);
    let e = mxu::try_gemm_timing(&wide.mxu, 1 << 22, 1 << 22, 1 << 22).unwrap_err().to_string();
    assert!(e.contains("MAC count"), "{e}");
    // In range, both forms agree with the schedule.
    let s = Schedule::new(&ws.mxu, 70000, 3, 5).unwrap();
    assert_eq!(mxu::try_gemm_timing(&ws.mxu, 70000, 3, 5).unwrap(), s.stats());
}

/// A fault time after the GEMM's last cycle is an error naming the site, the time given and the
/// GEMM's length (it used to run and report nothing corrupted); the last cycle of the GEMM is
/// accepted from every fold.
#[test]
fn a_fault_after_the_gemm_is_an_error_and_its_last_cycle_is_not() {
    for df in [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary] {
        let cfg = HwConfig::test_config(4, 3, df, Precision::Int8Int32);
        let (m, k, n) = (9, 10, 7);
        let (a, w) = (nonzero_int8(m, k, 1), nonzero_int8(k, n, 2));
        let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
        let site = FaultSite::pe(3, 2, Register::Psum, 30);
        for (f, fold) in s.folds.iter().enumerate() {
            let last = s.total_cycles - 1 - fold.start;
            let ok = FaultSchedule::one(FaultEvent::flip(site, f, last));
            gemm(&cfg, &a, &w, ExecMode::CycleLevel, &ok).unwrap_or_else(|e| panic!("{df:?} fold {f}: {e}"));
            let late = FaultSchedule::one(FaultEvent::stuck(site, true, f, last + 1, 3));
            let e = gemm(&cfg, &a, &w, ExecMode::CycleLevel, &late).unwrap_err().to_string();
            let want = format!("cycle {} of fold {f}", last + 1);
            assert!(e.contains("mxu.pe[3][2].psum[30]") && e.contains(&want), "{e}");
            assert!(e.contains(&format!("is after the GEMM ends at cycle {}", s.total_cycles)), "{e}");
        }
    }
}

// ---------------------------------------------------------------- input stationary

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// IS (WS on the transposed problem) at cycle level equals its functional twin, and both
    /// equal WS, bit for bit: out[m][n] accumulates the same products `A[m][k] * W[k][n]`
    /// (IEEE products commute) in the same K chunks of R, `k` ascending, chunks added in order.
    /// Ragged shapes, M below the columns, N below the rows, specials, every precision; the
    /// schedule has ceil(K/R) * ceil(M/C) folds of N streamed rows each.
    #[test]
    fn input_stationary_equals_its_twin_and_weight_stationary(
        rows in 1usize..=9, cols in 1usize..=9,
        m in 1usize..=30, k in 1usize..=30, n in 1usize..=30,
        prec in precisions(), specials in any::<bool>(), accumulate in any::<bool>(), seed in any::<u64>(),
    ) {
        let is = HwConfig::test_config(rows, cols, Dataflow::InputStationary, prec);
        let ws = HwConfig::test_config(rows, cols, Dataflow::WeightStationary, prec);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = operand(&mut rng, prec, m, k, specials);
        let w = operand(&mut rng, prec, k, n, specials);
        let acc = accumulate.then(|| operand(&mut rng, Precision::Fp32Fp32, m, n, false));
        let acc = acc.map(|c| if prec == Precision::Int8Int32 { Matrix::from_fn(m, n, |i, j| c.get(i, j) >> 7) } else { c });
        let go = |cfg: &HwConfig, mode| mxu::gemm_into(cfg, &a, &w, acc.as_ref(), mode, &FaultSchedule::none()).unwrap();
        let (f, c) = (go(&is, ExecMode::Functional), go(&is, ExecMode::CycleLevel));
        prop_assert_eq!(f.out.diff(&c.out), vec![]);
        prop_assert_eq!(f.out.diff(&go(&ws, ExecMode::CycleLevel).out), vec![]);
        let folds = (k.div_ceil(rows) * m.div_ceil(cols)) as u64;
        prop_assert_eq!((c.stats.folds, c.stats.compute_cycles), (folds, folds * n as u64));
        let s = Schedule::new(&is.mxu, m, k, n).unwrap();
        prop_assert_eq!(s.folds.len() as u64, folds);
        for fold in &s.folds {
            prop_assert!(fold.kr <= rows && fold.mr <= cols && (fold.n0, fold.nc) == (0, n), "{:?}", fold);
        }
        // The cycle counts are those of WS on the transposed shape.
        let t = mxu::gemm_timing(&ws.mxu, n, k, m);
        prop_assert_eq!((c.stats.total_cycles, c.stats.folds), (t.total_cycles, t.folds));
        let mut st = PeArrayState::new(rows, cols);
        let (_, rep) = with_precision!(prec, F => cycle_level::<F>(&s, &a, &w, acc.as_ref(), &FaultSchedule::none(), &mut st));
        prop_assert_eq!(rep.measured_cycles, s.total_cycles);
    }
}

/// An IS fold holds `A[m0+j][k0+i]` in PE (i, j)'s weight register and streams column `nn` of
/// W through row `i` at `T_f + nn + i` (`T_f = start + 1`), reaching PE (i, j) at
/// `T_f + nn + i + j`. A weight flip there after the swap corrupts out[m0 + j][nn] for every
/// `nn` that passes the PE after the flip, and nothing else (the next fold's swap replaces it).
#[test]
fn is_weight_flip_corrupts_one_output_row_from_the_flip_on() {
    let cfg = HwConfig::test_config(4, 3, Dataflow::InputStationary, Precision::Int8Int32);
    let (m, k, n) = (7, 10, 9); // on a 4x3 array: 3 k-tiles x 3 m-tiles (3, 3, 1 rows), 9 streamed
    let (a, w) = (nonzero_int8(m, k, 1), nonzero_int8(k, n, 2));
    let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
    assert_eq!(s.folds.len(), 9);
    for (f, i, j, off, bit) in [(0, 0, 0, 1, 2), (0, 3, 2, 8, 6), (4, 2, 1, 6, 6), (7, 1, 0, 4, 0), (8, 1, 0, 5, 4)] {
        let fold = s.folds[f];
        let t_f = fold.start + 1;
        let abs = fold.start + off;
        assert!(abs >= t_f + (i + j) as u64, "test flips after the swap");
        let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Weight, bit), f, off);
        let want: BTreeSet<_> = if i < fold.kr && j < fold.mr {
            (0..n).filter(|&nn| t_f + (nn + i + j) as u64 > abs).map(|nn| (fold.m0 + j, nn)).collect()
        } else {
            BTreeSet::new()
        };
        assert!(!want.is_empty() || i >= fold.kr || j >= fold.mr, "fold {f}: the flip should matter");
        assert_eq!(faulty_diff(&cfg, &a, &w, e), want, "fold {f} pe[{i}][{j}] bit {bit}");
    }
    // Fold 0, PE (0, 0) flipped in its swap cycle (the flip lands after that cycle's MAC, on
    // column 0): every later column of output row 0 is corrupted.
    let e = FaultEvent::flip(FaultSite::pe(0, 0, Register::Weight, 3), 0, 1);
    assert_eq!(faulty_diff(&cfg, &a, &w, e), (1..n).map(|nn| (0, nn)).collect());
}

/// An IS psum flip at PE (i, j) at `T_f + nn + i + j` hits the one partial sum in flight
/// there: out[m0 + j][nn]; the IS observer sees the physical array (the flip at its cycle).
#[test]
fn is_psum_flip_corrupts_one_output_and_is_observed() {
    let cfg = HwConfig::test_config(4, 3, Dataflow::InputStationary, Precision::Int8Int32);
    let (m, k, n) = (7, 10, 9);
    let (a, w) = (nonzero_int8(m, k, 3), nonzero_int8(k, n, 4));
    let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
    for (f, i, j, nn, bit) in [(0, 0, 0, 0, 0), (2, 1, 2, 8, 31), (5, 3, 1, 4, 17), (8, 1, 0, 6, 9)] {
        let fold = s.folds[f];
        let off = 1 + (nn + i + j) as u64;
        let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Psum, bit), f, off);
        let want: BTreeSet<_> = if j < fold.mr && i < s.rows { [(fold.m0 + j, nn)].into() } else { BTreeSet::new() };
        assert_eq!(faulty_diff(&cfg, &a, &w, e), want, "fold {f} pe[{i}][{j}] nn {nn}");
        let site = e.site;
        let mut seen = Vec::new();
        let faulty = mxu::gemm_observed(&cfg, &a, &w, None, &FaultSchedule::one(e), |_, st| seen.push(st.read(&site)));
        let mut clean = Vec::new();
        mxu::gemm_observed(&cfg, &a, &w, None, &FaultSchedule::none(), |_, st| clean.push(st.read(&site))).unwrap();
        let t = (fold.start + off) as usize;
        assert_eq!(faulty.unwrap().0, run(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::one(e)));
        assert_eq!(seen[..t], clean[..t]);
        assert_eq!(seen[t] ^ clean[t], 1 << bit);
    }
}

/// bf16 operand bits with exponents spread over `-lo..=hi` (and some zeros): products near
/// the edges of fp32's range, where only an unfused multiply-add gives the stepped array's bits.
fn wide_bf16(rng: &mut ChaCha8Rng, rows: usize, cols: usize, lo: i32, hi: i32) -> Matrix {
    Matrix::from_fn(rows, cols, |_, _| {
        if rng.gen_ratio(1, 16) {
            return 0;
        }
        let e = (rng.gen_range(-lo..=hi) + 127).clamp(1, 254) as u32;
        (rng.gen_range(0..2u32) << 15) | (e << 7) | rng.gen_range(0..128u32)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The functional kernels (register blocks, packed operands, fused multiply-adds where
    /// products are exact, row blocks spread over threads) equal the stepped array bit for bit
    /// on shapes past the threads' threshold and ragged against every block size, in every
    /// dataflow and precision, with 1, 2 and 3 threads; bf16 operands also with exponents near
    /// fp32's overflow and underflow edges.
    #[test]
    fn functional_kernels_equal_the_array_for_any_thread_count(
        rows in 1usize..=24, cols in 1usize..=24,
        m in 1usize..=150, k in 1usize..=150, n in 1usize..=150,
        df in dataflows(), prec in precisions(), wide in 0usize..3, seed in any::<u64>(),
    ) {
        let cfg = HwConfig::test_config(rows, cols, df, prec);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (a, w) = match (prec, wide) {
            // Overflow edge: exponent sums around 127; underflow edge: around -126.
            (Precision::Bf16Fp32, 1) => (wide_bf16(&mut rng, m, k, 0, 66), wide_bf16(&mut rng, k, n, 0, 63)),
            (Precision::Bf16Fp32, 2) => (wide_bf16(&mut rng, m, k, 66, 0), wide_bf16(&mut rng, k, n, 62, 0)),
            _ => (operand(&mut rng, prec, m, k, false), operand(&mut rng, prec, k, n, false)),
        };
        let want = run(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::none());
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let f = pool.install(|| run(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none()));
            prop_assert_eq!(f.diff(&want), vec![], "{} threads", threads);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The in-place functional GEMM (operands read where memory holds them, transposed or not,
    /// rounded by the input converters as they are decoded; the result written over the
    /// accumulators or over whatever the output held) gives the bits of converting the
    /// operands first ([`faultline_hw::isa::to_input`]) and running [`mxu::gemm_into`], in
    /// every dataflow and precision, past the threads' threshold too, on 1 and 3 threads.
    #[test]
    fn the_in_place_functional_gemm_equals_converting_first(
        rows in 1usize..=16, cols in 1usize..=16,
        m in 1usize..=140, k in 1usize..=300, n in 1usize..=140,
        at in any::<bool>(), wt in any::<bool>(), acc in any::<bool>(),
        df in dataflows(), prec in precisions(), seed in any::<u64>(),
    ) {
        let cfg = HwConfig::test_config(rows, cols, df, prec);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut words = |len: usize| -> Vec<u32> {
            (0..len).map(|_| (rng.gen_range(-300.0f32..300.0) * rng.gen_range(0.0f32..1.0).powi(8)).to_bits()).collect()
        };
        let (araw, wraw, start) = (words(m * k), words(k * n), words(m * n));
        // The logical matrices, converted word by word.
        let logical = |raw: &[u32], r: usize, c: usize, t: bool| {
            Matrix::from_fn(r, c, |i, j| faultline_hw::isa::to_input(cfg.mxu.input_format, raw[if t { j * r + i } else { i * c + j }]))
        };
        let (a, w) = (logical(&araw, m, k, at), logical(&wraw, k, n, wt));
        let accs = Matrix { rows: m, cols: n, data: start.clone() };
        let want = mxu::gemm_into(&cfg, &a, &w, acc.then_some(&accs), ExecMode::Functional, &FaultSchedule::none()).unwrap();
        // A transposed A runs its own kernel (outer products along K): any thread count too.
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut out = start.clone();
            let stats = pool.install(|| mxu::functional_in_place(
                &cfg,
                mxu::Raw { words: &araw, transposed: at },
                mxu::Raw { words: &wraw, transposed: wt },
                (m, k, n),
                &mut out,
                acc,
            ))
            .unwrap();
            prop_assert_eq!(&out, &want.out.data, "{} threads", threads);
            prop_assert_eq!(stats, want.stats);
        }
    }
}
