//! int8 ABFT with exact integer checksums (`faultline_hw::protect::abft`) on the MXU: fault-free
//! residuals are exactly zero, the digits reconstruct the row sums, every single-element error
//! in `C` is caught, and faults injected at cycle level land in the outcome they should.

use faultline_hw::fault::{FaultEvent, FaultSchedule};
use faultline_hw::fault::{FaultSite, Register};
use faultline_hw::mxu::{gemm, Schedule};
use faultline_hw::protect::abft::{self, AbftOutcome};
use faultline_hw::{Dataflow, ExecMode, HwConfig, Matrix};
use faultline_num::Precision;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const I8: Precision = Precision::Int8Int32;

/// How an int8 operand is filled.
#[derive(Debug, Clone, Copy)]
enum Fill {
    Random,
    AllMin,
    AllMax,
    /// Random picks of -128 and 127 only.
    Extremes,
}

fn fills() -> impl Strategy<Value = Fill> {
    prop_oneof![Just(Fill::Random), Just(Fill::AllMin), Just(Fill::AllMax), Just(Fill::Extremes)]
}

fn int8(rng: &mut ChaCha8Rng, fill: Fill, rows: usize, cols: usize) -> Matrix {
    Matrix::from_fn(rows, cols, |_, _| {
        let v: i32 = match fill {
            Fill::Random => rng.gen_range(-128..=127),
            Fill::AllMin => -128,
            Fill::AllMax => 127,
            Fill::Extremes => [-128, 127][rng.gen_range(0..2)],
        };
        v as u8 as u32
    })
}

fn dataflows() -> impl Strategy<Value = Dataflow> {
    prop_oneof![Just(Dataflow::WeightStationary), Just(Dataflow::OutputStationary)]
}

fn fused(cfg: &HwConfig, a: &Matrix, w: &Matrix, mode: ExecMode, faults: &FaultSchedule) -> (Matrix, usize) {
    let (wf, d) = abft::augment(w);
    (gemm(cfg, a, &wf, mode, faults).unwrap().out, d)
}

/// Exact row sums of an int8 matrix, in i64 (no wrapping).
fn exact_row_sums(w: &Matrix) -> Vec<i64> {
    (0..w.rows).map(|r| (0..w.cols).map(|c| w.get(r, c) as u8 as i8 as i64).sum()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The exactness claim: with no fault, every residual is exactly 0, for every input
    /// (extremes, shapes whose row sums need 2-3 digits, row sums of `C` that wrap int32), and
    /// the fused GEMM's first `n` columns are the plain GEMM.
    #[test]
    fn fault_free_residuals_are_zero(
        rows in 1usize..=8, cols in 1usize..=8, df in dataflows(),
        m in 1usize..=4, k in 1usize..=256, n in 1usize..=800,
        fa in fills(), fw in fills(), seed in any::<u64>(),
    ) {
        let cfg = HwConfig::test_config(rows, cols, df, I8);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (a, w) = (int8(&mut rng, fa, m, k), int8(&mut rng, fw, k, n));
        let (out, d) = fused(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
        prop_assert_eq!(out.cols, n + d);
        prop_assert!(abft::residuals(&out, n, d).iter().all(|&r| r == 0), "{:?}", abft::residuals(&out, n, d));
        let plain = gemm(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none()).unwrap().out;
        prop_assert_eq!(abft::data_part(&out, n), plain);
    }

    /// The same at cycle level, on small shapes (the stepped array is bit-exact with the twin,
    /// but this checks the fused operands go through it unchanged).
    #[test]
    fn fault_free_residuals_are_zero_at_cycle_level(
        rows in 1usize..=6, cols in 1usize..=6, df in dataflows(),
        m in 1usize..=10, k in 1usize..=20, n in 1usize..=20,
        fa in fills(), fw in fills(), seed in any::<u64>(),
    ) {
        let cfg = HwConfig::test_config(rows, cols, df, I8);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (a, w) = (int8(&mut rng, fa, m, k), int8(&mut rng, fw, k, n));
        let (out, d) = fused(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::none());
        prop_assert!(abft::residuals(&out, n, d).iter().all(|&r| r == 0));
    }

    /// The digit columns reconstruct every row sum (exactly, i.e. mod 2^32 equal to the i64
    /// sum), every digit is a valid int8, and `d` is the fewest that do.
    #[test]
    fn digits_reconstruct_the_row_sums(k in 1usize..=8, n in 1usize..=2000, fw in fills(), seed in any::<u64>()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let w = int8(&mut rng, fw, k, n);
        let (wf, d) = abft::augment(&w);
        prop_assert!((1..=4).contains(&d));
        prop_assert_eq!((wf.rows, wf.cols), (k, n + d));
        let exact = exact_row_sums(&w);
        let mut fewer_fails = d == 1;
        for (r, &sum) in exact.iter().enumerate() {
            prop_assert!((0..n).all(|c| wf.get(r, c) == w.get(r, c)));
            prop_assert!((n..n + d).all(|c| wf.get(r, c) <= 0xff));
            let dig: Vec<i8> = (n..n + d).map(|c| wf.get(r, c) as u8 as i8).collect();
            prop_assert_eq!(abft::reconstruct(&dig) as i64, sum);
            if d > 1 && abft::reconstruct(&dig[..d - 1]) as i64 != sum {
                fewer_fails = true;
            }
        }
        prop_assert!(fewer_fails, "d = {} is not the fewest digits", d);
    }

    /// Changing any one element of `C` by any nonzero amount (mod 2^32) makes that row's
    /// residual nonzero and leaves the others 0.
    #[test]
    fn any_single_change_in_c_is_detected(
        m in 1usize..=6, k in 1usize..=30, n in 1usize..=40, fa in fills(), fw in fills(),
        seed in any::<u64>(), pick in any::<(u32, u32)>(), delta in 1u32..,
    ) {
        let cfg = HwConfig::test_config(4, 4, Dataflow::WeightStationary, I8);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (a, w) = (int8(&mut rng, fa, m, k), int8(&mut rng, fw, k, n));
        let (golden, d) = fused(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
        let (i, j) = (pick.0 as usize % m, pick.1 as usize % n);
        let mut bad = golden.clone();
        bad.set(i, j, bad.get(i, j).wrapping_add(delta));
        let r = abft::residuals(&bad, n, d);
        for (row, &x) in r.iter().enumerate() {
            prop_assert_eq!(x != 0, row == i, "row {} residual {}", row, x);
        }
        prop_assert_eq!(abft::classify(&golden, &bad, n, d), AbftOutcome::Detected);
    }
}

/// Row sums of 300 columns of -128 need 3 digits; an int32 output that wraps (k = 140000
/// products of (-128)^2 = 2^14 is 2^31 + 145,000,000-ish) still gives residual 0.
#[test]
fn wrapping_outputs_and_three_digit_sums_check_exactly() {
    let cfg = HwConfig::test_config(8, 8, Dataflow::WeightStationary, I8);
    let min = |r: usize, c: usize| Matrix::from_fn(r, c, |_, _| (-128i32) as u8 as u32);
    let (wf, d) = abft::augment(&min(4, 300));
    assert_eq!(d, 3, "row sum -38400 needs 3 base-256 digits");
    assert_eq!(
        abft::reconstruct(&[wf.get(0, 300) as u8 as i8, wf.get(0, 301) as u8 as i8, wf.get(0, 302) as u8 as i8]),
        -38400
    );
    let (a, w) = (min(2, 140_000), min(140_000, 3));
    let (out, d) = fused(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
    let exact = 140_000i64 * 16384;
    assert!(exact > i32::MAX as i64);
    assert_eq!(out.get(0, 0) as i32 as i64, exact - (1i64 << 32), "the accumulation wraps");
    assert_eq!(abft::residuals(&out, 3, d), vec![0, 0]);
}

/// A small WS GEMM on an 8x8 array whose fused weights span two column tiles: n = 13 puts the
/// checksum columns in the second tile.
fn ws_case() -> (HwConfig, Matrix, Matrix, usize, usize, usize) {
    let cfg = HwConfig::test_config(8, 8, Dataflow::WeightStationary, I8);
    let (m, k, n) = (12, 20, 13);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (a, w) = (int8(&mut rng, Fill::Random, m, k), int8(&mut rng, Fill::Random, k, n));
    (cfg, a, w, m, k, n)
}

/// A WS psum flip of bit 31 at PE (i, j) at cycle `1 + mm + i + j` of fold f hits the partial
/// sum of output (mm, n0 + j): in `C`, so `C` differs from the golden run and the check
/// flags it.
#[test]
fn psum_high_bit_flip_in_c_is_detected() {
    let (cfg, a, w, _, _, n) = ws_case();
    let (golden, d) = fused(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
    let (i, j, mm) = (5, 2, 4);
    let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Psum, 31), 0, 1 + (mm + i + j) as u64);
    let (out, _) = fused(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::one(e));
    assert_eq!(golden.diff(&out), vec![(mm, j)], "the flip corrupts exactly C[{mm}][{j}]");
    let r = abft::residuals(&out, n, d);
    assert_eq!(r[mm], i32::MIN, "the residual is the flip's 2^31");
    assert_eq!(abft::classify(&golden, &out, n, d), AbftOutcome::Detected);
}

/// A psum flip in digit column 0 (output column n = 13: second column tile, PE column 5, fold
/// 3 = the n-tile's first k fold) leaves `C` intact and the residual nonzero: a false alarm,
/// never a silent error.
#[test]
fn psum_flip_in_checksum_column_is_a_false_alarm() {
    let (cfg, a, w, _, k, n) = ws_case();
    let (golden, d) = fused(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
    let s = Schedule::new(&cfg.mxu, a.rows, k, n + d).unwrap();
    let f = k.div_ceil(8); // first fold of the second column tile
    assert_eq!(s.folds[f].n0, 8);
    let (i, j, mm) = (3, n - 8, 7);
    let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Psum, 3), f, 1 + (mm + i + j) as u64);
    let (out, _) = fused(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::one(e));
    assert_eq!(golden.diff(&out), vec![(mm, n)], "only checksum column 0 changes");
    assert_eq!(abft::data_part(&out, n), abft::data_part(&golden, n));
    assert_eq!(abft::residuals(&out, n, d)[mm].abs(), 8, "the residual is the flip's +-8");
    assert_eq!(abft::classify(&golden, &out, n, d), AbftOutcome::FalseAlarm);
}

/// Every psum flip changes one output by 2^b, so it is never silent: swept over every PE,
/// every cycle of the fused GEMM and two bits, in both dataflows; and some flips do corrupt
/// `C` (the sweep is not vacuous).
#[test]
fn no_psum_flip_is_silent() {
    for df in [Dataflow::WeightStationary, Dataflow::OutputStationary] {
        let cfg = HwConfig::test_config(4, 4, df, I8);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (m, k, n) = (6, 7, 5);
        let (a, w) = (int8(&mut rng, Fill::Random, m, k), int8(&mut rng, Fill::Random, k, n));
        let (golden, d) = fused(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none());
        let total = Schedule::new(&cfg.mxu, m, k, n + d).unwrap().total_cycles;
        let mut detected = 0;
        for (i, j) in (0..4).flat_map(|i| (0..4).map(move |j| (i, j))) {
            for t in 0..total {
                for bit in [0, 31] {
                    let e = FaultEvent::flip(FaultSite::pe(i, j, Register::Psum, bit), 0, t);
                    let (out, _) = fused(&cfg, &a, &w, ExecMode::CycleLevel, &FaultSchedule::one(e));
                    let o = abft::classify(&golden, &out, n, d);
                    assert_ne!(o, AbftOutcome::Silent, "{df:?} {e}");
                    detected += (o == AbftOutcome::Detected) as u32;
                }
            }
        }
        assert!(detected > 0, "{df:?}: no psum flip corrupted C");
    }
}
