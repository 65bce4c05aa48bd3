//! The matrix unit: an R x C systolic array of PEs, stepped one clock at a time, and its
//! bit-exact functional twin.
//!
//! One model per file: `schedule.rs` (the fold [`Schedule`] and its closed-form counts),
//! `functional.rs` (the functional twin), `outer.rs` (the twin for an `A` that memory holds
//! transposed, read in place), `cycle.rs` (the stepped array, [`PeArrayState`]) and
//! `gemm.rs` (the checked entry points, [`gemm`], that pick one by [`ExecMode`](crate::ExecMode)).
//!
//! # Dataflows and the tile schedule
//!
//! A GEMM `out[M][N] = A[M][K] * W[K][N]` is cut into folds (tiles) that fit the array.
//!
//! **Weight stationary (WS).** A fold is a weight tile `W[k0..k0+kr][n0..n0+nc]` (`kr <= R`,
//! `nc <= C`); PE `(i, j)` holds `W[k0+i][n0+j]`. Folds run n-tile-major, k-tile-minor, and all
//! `M` rows of `A` stream through each fold: `A[m][k0+i]` enters row `i` at cycle
//! `T_f + m + i` (skewed feed) and moves one PE right per cycle; partial sums move one PE down
//! per cycle, so output `(m, j)` leaves the bottom of column `j` after cycle `T_f + m + R-1 + j`
//! and the accumulator captures it one cycle later. The first k-tile of an n-tile overwrites the
//! accumulators, later ones add (`acc + psum`, one rounding).
//!
//! Weights are double-buffered: a per-column weight bus writes fold `f`'s weights into the shadow
//! registers, row `i` of column `j` at cycle `T_f + j - 1 + i`, and a `swap` strobe riding with
//! the fold's first activation copies shadow to weight as it passes each PE (at `T_f + i + j`).
//! The write of row `i` lands one cycle before its swap and after the previous fold's swap of the
//! same PE, so loading overlaps computing. The bus writes one row per cycle (R cycles per fold)
//! and the activation port feeds one row of `A` per cycle (M cycles per fold), hence
//!
//! ```text
//! T_0 = 1,   T_{f+1} = T_f + max(M, R)                     (fold start = first activation in)
//! total_cycles = max_f (T_f + M + R + nc_f - 1)           (last accumulator capture, + 1)
//! ```
//!
//! **Output stationary (OS).** A fold is an output tile `out[m0..m0+mr][n0..n0+nc]`; PE `(i, j)`
//! accumulates `out[m0+i][n0+j]` over the whole of `K`. `A[m0+i][k]` enters row `i` at
//! `S_f + k + i` moving right; `W[k][n0+j]` enters column `j` at `S_f + k + j` moving down; PE
//! `(i, j)` sees both at `S_f + k + i + j`. After the last MAC (`S_f + K-1 + R-1 + C-1`) the
//! array drains for R cycles: partial sums shift down one row per cycle into the accumulators
//! (zeros shift in, clearing the array for the next fold); the next fold starts after the drain:
//!
//! ```text
//! S_f = f * (K + 2R + C - 2),   total_cycles = F * (K + 2R + C - 2)
//! ```
//!
//! **Input stationary (IS).** The stationary operand is the input: IS is WS applied to the
//! transposed problem `out^T[N][M] = W^T[N][K] * A^T[K][M]` (SCALE-Sim's
//! `systolic_compute_is.py` mapping), run on the same registers by [`Schedule::as_ws`]: `A`
//! and `W` are transposed, the WS path (stepped or functional) runs, the result is transposed
//! back. A fold is `A[m0..m0+mr][k0..k0+kr]` (`kr <= R` rows along K, `mr <= C` columns along
//! M; [`Fold`] keeps the IS coordinates, `n0 = 0`, `nc = N`); PE `(i, j)`'s `weight` and
//! `weight_shadow` registers hold the input `A[m0+j][k0+i]` and its `act` register carries
//! weights: column `nn` of `W` enters row `i` at `T_f + nn + i` and meets PE `(i, j)` at
//! `T_f + nn + i + j`; column `j` of the accumulators captures `out[m0+j][nn]`. Folds run
//! m-tile-major, k-tile-minor: `ceil(K/R) * ceil(M/C)` folds of `N` streamed rows, and every
//! count is WS's for the shape `N x K x M` (`T_{f+1} = T_f + max(N, R)`). Each output gets the
//! same products `A[m][k] * W[k][n]` (IEEE products commute) in the same K chunks of `R` as in
//! WS, so IS's results equal WS's bit for bit.
//!
//! What the totals count: cycles from the first operand entering the array (WS: fold 0's first
//! weight row, one cycle before its first activation) to the last accumulator write, inclusive.
//! WS folds pipeline, so only the last fold's fill and drain show: with `M >= R` and full
//! tiles, `total = 1 + F*M + (R-1) + (C-1) + 1` (weight lead, streaming, partial sums down the
//! rows, skew across the columns, accumulator capture); with `M < R` each fold after the first
//! waits `R - M` cycles for its weights. OS folds do not overlap: each pays `K` streaming,
//! `(R-1) + (C-1)` skew and `R` drain. Memory (DMA, SRAM ports) is not counted here; see
//! [`crate::timing`].
//!
//! # Compared with SCALE-Sim
//!
//! These are not SCALE-Sim's formulas. SCALE-Sim v2 (scalesim-project/scale-sim-v2 at
//! 22f88b1, 2025-02-25) builds per-fold demand matrices, one row per cycle
//! (`scalesim/compute/systolic_compute_{ws,os,is}.py`), and its "Total Cycles" is the 0-based
//! index of the last row (`scalesim/memory/double_buffered_scratchpad_mem.py`, line 209:
//! `total_cycles = ofmap_serviced_cycles[-1]`), plus memory stalls, which are 0 in its default
//! `CALC` bandwidth mode (`read_buffer_estimate_bw.py` line 96). Every fold is padded to the
//! full `R x C` and folds never overlap. Per fold:
//!
//! ```text
//! OS: K + (R-1) + (C-1)        total = ceil(M/R)*ceil(N/C) * (K + R + C - 2) - 1
//! WS: R + M + (R-1) + (C-1)    total = ceil(K/R)*ceil(N/C) * (M + 2R + C - 2) - 1
//! IS: R + N + (R-1) + (C-1)    total = ceil(K/R)*ceil(M/C) * (N + 2R + C - 2) - 1
//! ```
//!
//! (OS: `systolic_compute_os.py` lines 224, 271, 316 and 341-370 (the `T-1` prefix before the
//! `R` output rows), skewed by `skew_matrix`, which adds `cols - 1` rows; WS:
//! `systolic_compute_ws.py` lines 181-212 (an `R`-row weight-load prefix), 226 and 284.)
//! Checked by running SCALE-Sim on several GEMM shapes on 32x32 and 8x4 arrays. Term by term:
//!
//! | term | Faultline | SCALE-Sim |
//! |---|---|---|
//! | folds, streaming | WS `ceil(K/R)*ceil(N/C)` of `M`; OS `ceil(M/R)*ceil(N/C)` of `K`; IS `ceil(K/R)*ceil(M/C)` of `N` | same |
//! | WS weight load | `R`/fold, double-buffered: exposed 1 before fold 0, `R - M`/fold if `M < R` | `R`/fold, serial |
//! | fill/skew | WS once, `(R-1) + (nc_f-1)` of the fold ending last; OS `(R-1) + (C-1)`/fold | `(R-1) + (C-1)`/fold |
//! | OS drain | `R`/fold after the last MAC | none: outputs are written within the fold's rows |
//! | ragged tiles | full-array latencies; the WS tail uses the real width `nc` | padded to `R x C` |
//! | counted as | a count (last accumulator write + 1) | the last cycle's index (count - 1) |
//! | memory | not counted here | stall cycles (0 in `CALC` mode) |
//!
//! Why: Faultline double-buffers weights (TPU-style) and so pipelines WS folds; SCALE-Sim loads
//! weights before each fold and never overlaps folds; Faultline's OS shifts the finished sums
//! out through the array (`R` cycles), SCALE-Sim places the output writes inside the fold's
//! `K + R + C - 2` rows, the last one on the last MAC's cycle.
//!
//! Example, `M = K = N = 64` on 32x32 (`F = 4`): WS here `1 + 4*64 + 31 + 31 + 1 = 320`,
//! SCALE-Sim `4 * 158 - 1 = 631`; OS here `4 * 158 = 632`, SCALE-Sim `4 * 126 - 1 = 503`
//! (OS differs by `F*R + 1` for every non-empty shape). IS is WS of the transposed shape in both
//! simulators (here `max` of WS's formula over `N x K x M`, SCALE-Sim the IS line above): for
//! `64^3` the same 320 and 631.
//!
//! Ragged folds use the physical array: unused rows/columns carry `valid = 0` and zero weights,
//! so latencies are those of the full array. A PE whose incoming activation is not valid passes
//! its partial sum through unchanged (it never computes `x + 0 * a`, which would turn `-0` into
//! `+0` or `inf` into NaN).
//!
//! # Bit-exactness
//!
//! Both paths perform, for every output, the same sequence of [`MacFormat::mac_value`](faultline_num::MacFormat::mac_value) calls in
//! the same order (`k` ascending within a fold, folds in schedule order) starting from `+0`, and
//! the same accumulator adds; NaN results are stored as one canonical NaN. So the functional
//! twin equals the cycle-level model bit for bit when no fault is active.

/// `$body` with `$convert` bound to the MXU's input converter for input format `$format`: a
/// closure from a raw fp32 word to input-format bits (the identity for fp32, round to nearest
/// even for bf16, the format's rounding otherwise). Matched once, so a loop over words in
/// `$body` runs on one literal converter. The one definition every operand load uses.
macro_rules! with_input_converter {
    ($format:expr, $convert:ident => $body:expr) => {
        match $format {
            faultline_num::NumFormat::Fp32 => {
                let $convert = |x: u32| x;
                $body
            }
            faultline_num::NumFormat::Bf16 => {
                let $convert = |x: u32| faultline_num::f32_to_bf16_bits(f32::from_bits(x));
                $body
            }
            other => {
                let $convert = move |x: u32| other.f64_to_bits(f32::from_bits(x) as f64);
                $body
            }
        }
    };
}
pub(crate) use with_input_converter;

/// `$call` with `$c` the const generic for a register block's extent: `$left` (the rows or
/// columns left) when fewer than 6, else 6 (`MR` and `NT`), so that every block is unrolled.
macro_rules! ragged {
    ($left:expr, |$c:ident| $call:expr) => {
        match $left {
            1 => {
                const $c: usize = 1;
                $call
            }
            2 => {
                const $c: usize = 2;
                $call
            }
            3 => {
                const $c: usize = 3;
                $call
            }
            4 => {
                const $c: usize = 4;
                $call
            }
            5 => {
                const $c: usize = 5;
                $call
            }
            _ => {
                const $c: usize = 6;
                $call
            }
        }
    };
}
pub(crate) use ragged;

pub mod access;
mod cycle;
mod functional;
mod gemm;
mod microkernel;
mod outer;
mod schedule;

pub use cycle::{cycle_level, cycle_level_observed, CycleReport, PeArrayState};
pub use functional::Raw;
pub use gemm::{functional_in_place, gemm, gemm_into, gemm_observed, GemmOutput};
pub use schedule::{gemm_host_bytes, gemm_timing, try_gemm_timing, Fold, GemmStats, Schedule};
