//! The MXU's entry points: checked GEMMs ([`gemm`], [`gemm_into`], [`gemm_observed`])
//! dispatched to the functional twin or the stepped array by mode.

use super::cycle::windowed_ws;
use super::functional::{functional, functional_raw, Raw};
use super::{cycle_level, cycle_level_observed, CycleReport, GemmStats, PeArrayState, Schedule};
use crate::config::{Dataflow, HwConfig};
use crate::error::HwError;
use crate::fault::{FaultSchedule, FaultSite, FaultWindow, Unit};
use crate::matrix::Matrix;
use crate::ExecMode;
use faultline_num::with_precision;

/// Result of a GEMM: output bits (accumulator format, `M x N`) and its timing.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmOutput {
    /// `M x N` accumulator-format bits.
    pub out: Matrix,
    /// Cycle counts (from the schedule; identical across modes).
    pub stats: GemmStats,
    /// The fault-free result, when the run computed it on the way (a windowed faulty GEMM
    /// does), so a caller comparing against it need not run the GEMM again.
    pub golden: Option<Matrix>,
}

fn check_shapes(cfg: &HwConfig, a: &Matrix, w: &Matrix) -> Result<(), HwError> {
    let shape = |detail: String| HwError::Shape { op: "gemm".into(), detail };
    if a.cols != w.rows {
        return Err(shape(format!(
            "A is {}x{} but W is {}x{}: A.cols must equal W.rows",
            a.rows, a.cols, w.rows, w.cols
        )));
    }
    if a.data.len() != a.rows * a.cols || w.data.len() != w.rows * w.cols {
        return Err(shape("matrix data length does not match its shape".into()));
    }
    if a.rows == 0 || a.cols == 0 || w.cols == 0 {
        return Err(shape(format!("empty GEMM {}x{}x{}", a.rows, a.cols, w.cols)));
    }
    let mask = cfg.mxu.precision().input().mask();
    // An OR over every word (vectorises; no early exit needed on valid operands).
    let or = |d: &[u32]| d.iter().fold(0, |acc, &v| acc | v);
    if (or(&a.data) | or(&w.data)) & !mask != 0 {
        return Err(shape(format!("operand bits wider than the {} input format", cfg.mxu.input_format.name())));
    }
    Ok(())
}

/// Runs `out = A * W` on the MXU of `cfg`.
///
/// `a` is `M x K` and `w` is `K x N`, both raw input-format bits. In [`ExecMode::CycleLevel`]
/// every register is stepped and `faults` are injected; in [`ExecMode::Functional`] faults must
/// be empty (a fault needs registers to live in). A fault's time counts from its fold's start
/// ([`Fold::start`](super::Fold::start)) and must fall before the GEMM ends (`total_cycles`). A faulty
/// weight-stationary GEMM steps only the cycles from shortly before the first fault until the
/// array is fault-free again, with the same bits as stepping all of it (see `windowed_ws`).
pub fn gemm(
    cfg: &HwConfig,
    a: &Matrix,
    w: &Matrix,
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<GemmOutput, HwError> {
    gemm_into(cfg, a, w, None, mode, faults)
}

/// [`gemm`], adding to `acc` (the accumulators' contents, `M x N` accumulator-format bits) if
/// given: every fold adds, the first K fold included ([`Schedule::accumulating`]).
pub fn gemm_into(
    cfg: &HwConfig,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<GemmOutput, HwError> {
    let sched = checked_schedule(cfg, a, w, acc, mode, faults)?;
    let (out, golden) = if sched.dataflow == Dataflow::InputStationary && mode == ExecMode::CycleLevel {
        // WS on `out^T = W^T * A^T` (accumulators transposed alike), the result transposed back.
        let (at, wt, acct) = (w.transpose(), a.transpose(), acc.map(Matrix::transpose));
        let (out, golden) = run_gemm(cfg, &sched.as_ws(), &at, &wt, acct.as_ref(), mode, faults);
        (out.transpose(), golden.map(|g| g.transpose()))
    } else {
        run_gemm(cfg, &sched, a, w, acc, mode, faults)
    };
    Ok(GemmOutput { out, stats: sched.stats(), golden })
}

/// [`gemm_into`] in [`ExecMode::Functional`] on operands as memory holds them: `a` (`m x k`)
/// and `w` (`k x n`) are fp32 words that the MXU's input converters round to its input format
/// as they are read, and the result is written into `out` (`m x n` words; with `acc`, what it
/// holds are the accumulators' values the result adds to). The same bits as converting the
/// operands first and calling [`gemm_into`], without copying operands or result. Returns the
/// GEMM's cycle counts.
pub fn functional_in_place(
    cfg: &HwConfig,
    a: Raw<'_>,
    w: Raw<'_>,
    (m, k, n): (usize, usize, usize),
    out: &mut [u32],
    acc: bool,
) -> Result<GemmStats, HwError> {
    let shape = |detail: String| HwError::Shape { op: "gemm".into(), detail };
    if m == 0 || k == 0 || n == 0 {
        return Err(shape(format!("empty GEMM {m}x{k}x{n}")));
    }
    if a.words.len() < m * k || w.words.len() < k * n || out.len() < m * n {
        return Err(shape(format!(
            "a {m}x{k}x{n} GEMM needs {} words of A, {} of W and {} of output; it has {}, {} and {}",
            m * k,
            k * n,
            m * n,
            a.words.len(),
            w.words.len(),
            out.len()
        )));
    }
    let mut sched = Schedule::new(&cfg.mxu, m, k, n)?;
    if acc {
        sched = sched.accumulating();
    }
    let out = &mut out[..m * n];
    with_precision!(cfg.mxu.precision(), F => super::with_input_converter!(cfg.mxu.input_format, convert => {
        functional_raw::<F>(&sched, a, w, (convert, cfg.mxu.input_format == faultline_num::NumFormat::Fp32), out, acc)
    }));
    Ok(sched.stats())
}

/// The result of a checked WS or OS schedule `sched` in `mode`, and the fault-free result if
/// the run computed it on the way.
fn run_gemm(
    cfg: &HwConfig,
    sched: &Schedule,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    mode: ExecMode,
    faults: &FaultSchedule,
) -> (Matrix, Option<Matrix>) {
    match mode {
        ExecMode::Functional => (with_precision!(cfg.mxu.precision(), F => functional::<F>(sched, a, w, acc)), None),
        ExecMode::CycleLevel => with_precision!(cfg.mxu.precision(), F => {
            if !faults.is_empty() && sched.dataflow == Dataflow::WeightStationary {
                let (out, fault_free) = windowed_ws::<F>(sched, a, w, acc, faults);
                (out, Some(fault_free))
            } else {
                let mut st = PeArrayState::new(cfg.mxu.rows, cfg.mxu.cols);
                (cycle_level::<F>(sched, a, w, acc, faults, &mut st).0, None)
            }
        }),
    }
}

/// The schedule of `out (+)= a * w` (accumulating into `acc` if given) after checking the
/// shapes and that `faults` can be placed in it ([`check_faults`]).
fn checked_schedule(
    cfg: &HwConfig,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<Schedule, HwError> {
    check_shapes(cfg, a, w)?;
    let mut sched = Schedule::new(&cfg.mxu, a.rows, a.cols, w.cols)?;
    if let Some(c) = acc {
        if (c.rows, c.cols) != (a.rows, w.cols) {
            return Err(HwError::Shape {
                op: "GEMM".into(),
                detail: format!("accumulators hold {}x{}, the result is {}x{}", c.rows, c.cols, a.rows, w.cols),
            });
        }
        sched = sched.accumulating();
    }
    check_faults(cfg, &sched, mode, faults)?;
    Ok(sched)
}

/// [`gemm_into`] stepped in full at cycle level from the reset state, with `observe` called
/// after every commit (faults applied) with the cycle (from the GEMM's first cycle, the clock
/// fault times count on) and the array's registers: [`cycle_level_observed`] for a caller that
/// knows the MXU's precision only at run time (waveform export). The same checks and bits as
/// [`gemm_into`] in [`ExecMode::CycleLevel`], but never windowed: every cycle is observed.
/// Returns the result and what the stepping measured.
pub fn gemm_observed(
    cfg: &HwConfig,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    faults: &FaultSchedule,
    observe: impl FnMut(u64, &PeArrayState),
) -> Result<(Matrix, CycleReport), HwError> {
    let s = checked_schedule(cfg, a, w, acc, ExecMode::CycleLevel, faults)?;
    let mut st = PeArrayState::new(cfg.mxu.rows, cfg.mxu.cols);
    Ok(with_precision!(cfg.mxu.precision(), F => cycle_level_observed::<F>(&s, a, w, acc, faults, &mut st, observe)))
}

/// Checks that `faults` can be placed in GEMM `sched` (see [`FaultSchedule::check`]): MXU sites,
/// in a fold, before the GEMM ends.
fn check_faults(cfg: &HwConfig, sched: &Schedule, mode: ExecMode, faults: &FaultSchedule) -> Result<(), HwError> {
    if faults.is_empty() {
        return Ok(());
    }
    let origin = |tile: usize, _: &FaultSite| sched.folds[tile].start;
    let window = FaultWindow {
        op: "GEMM".into(),
        tile_name: "fold",
        tiles: sched.folds.len(),
        end: sched.total_cycles,
        origin: &origin,
    };
    faults.check(cfg, mode, &[Unit::Mxu], &window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{FaultEvent, FaultSite, Register};
    use faultline_num::Precision;

    /// The observed GEMM is the stepped one: the same bits as `gemm_into` at cycle level with
    /// and without a fault, one observation per cycle, and the fault visible in the observed
    /// state at its cycle and not before.
    #[test]
    fn an_observed_gemm_is_the_stepped_gemm_seen_every_cycle() {
        for df in [Dataflow::WeightStationary, Dataflow::OutputStationary] {
            let cfg = HwConfig::test_config(4, 3, df, Precision::Bf16Fp32);
            let bits = |i: usize| ((i as u32).wrapping_mul(2654435761) >> 16) & 0x3f7f;
            let (a, w) =
                (Matrix::from_fn(5, 7, |i, j| bits(i * 7 + j)), Matrix::from_fn(7, 5, |i, j| bits(99 + i * 5 + j)));
            let site = FaultSite::pe(0, 1, Register::Psum, 30);
            let fault = FaultSchedule::one(FaultEvent::flip(site, 0, 3));
            let at = Schedule::new(&cfg.mxu, 5, 7, 5).unwrap().absolute_cycle(0, 3).unwrap();
            for faults in [FaultSchedule::none(), fault] {
                let want = gemm_into(&cfg, &a, &w, None, ExecMode::CycleLevel, &faults).unwrap();
                let (mut seen, mut psum) = (Vec::new(), Vec::new());
                let (got, report) = gemm_observed(&cfg, &a, &w, None, &faults, |t, st| {
                    seen.push(t);
                    psum.push(st.read(&site));
                })
                .unwrap();
                assert_eq!(got, want.out, "{df:?}");
                assert_eq!(seen, (0..report.measured_cycles).collect::<Vec<_>>());
                assert_eq!(report.measured_cycles, want.stats.total_cycles);
                if !faults.is_empty() {
                    let golden = gemm_observed(&cfg, &a, &w, None, &FaultSchedule::none(), |_, _| {}).unwrap().0;
                    assert_ne!(got, golden, "{df:?}: the flip reaches the outputs");
                    let mut clean = Vec::new();
                    gemm_observed(&cfg, &a, &w, None, &FaultSchedule::none(), |_, st| clean.push(st.read(&site)))
                        .unwrap();
                    let t = at as usize;
                    assert_eq!(psum[..t], clean[..t], "{df:?}: equal before the fault");
                    assert_eq!(psum[t] ^ clean[t], 1 << 30, "{df:?}: the flipped bit at its cycle");
                }
            }
        }
    }
}
