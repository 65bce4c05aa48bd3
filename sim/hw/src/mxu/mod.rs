//! The matrix unit: an R x C systolic array of PEs, stepped one clock at a time, and its
//! bit-exact functional twin.
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
//! Both paths perform, for every output, the same sequence of [`MacFormat::mac_value`] calls in
//! the same order (`k` ascending within a fold, folds in schedule order) starting from `+0`, and
//! the same accumulator adds; NaN results are stored as one canonical NaN. So the functional
//! twin equals the cycle-level model bit for bit when no fault is active.

use crate::budget::{product, sum};
use crate::config::{Dataflow, HwConfig, MxuConfig};
use crate::error::HwError;
use crate::fault::{ActiveFault, FaultEvent, FaultSchedule, FaultWindow};
use crate::fault::{FaultSite, Register, Unit};
use crate::matrix::Matrix;
use crate::ExecMode;
use faultline_num::{with_precision, MacFormat, Precision};
use serde::{Deserialize, Serialize};

/// Cycle and work counts of one GEMM, identical in every execution mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GemmStats {
    /// Cycles from the first weight/activation entering the array to the last accumulator write.
    pub total_cycles: u64,
    /// Cycles in which new operands are fed (WS: `M` per fold; OS: `K`; IS: `N`); the rest of
    /// `total_cycles` is fill, drain and weight-load stall.
    pub compute_cycles: u64,
    /// Number of folds (tiles).
    pub folds: u64,
    /// Useful multiply-accumulates, `M * K * N`.
    pub macs: u64,
    /// `macs / (total_cycles * R * C)`: fraction of PE-cycles doing useful work.
    pub utilization: f64,
}

/// One fold of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fold {
    /// First output row (OS, IS) or 0 (WS streams all rows).
    pub m0: usize,
    /// Output rows in this fold.
    pub mr: usize,
    /// First reduction index.
    pub k0: usize,
    /// Reduction length in this fold.
    pub kr: usize,
    /// First output column (0 in IS, which streams all columns).
    pub n0: usize,
    /// Output columns in this fold.
    pub nc: usize,
    /// Whether this fold's results overwrite the accumulators (else they are added).
    pub overwrite: bool,
    /// Cycle at which the fold's first data enters the array (the origin of fault times).
    pub start: u64,
}

/// The fold schedule of a GEMM on an array: the one timing source for every mode.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Dataflow used.
    pub dataflow: Dataflow,
    /// Array rows.
    pub rows: usize,
    /// Array columns.
    pub cols: usize,
    /// GEMM M.
    pub m: usize,
    /// GEMM K.
    pub k: usize,
    /// GEMM N.
    pub n: usize,
    /// Folds in execution order.
    pub folds: Vec<Fold>,
    /// Cycles from one fold's start to the next's.
    pub period: u64,
    /// Total cycles of the GEMM.
    pub total_cycles: u64,
}

impl Schedule {
    /// Builds the schedule of an `m x k x n` GEMM (closed form; see the module docs). A shape
    /// whose cycle or work counts do not fit 64 bits is an [`HwError::Shape`] error.
    pub fn new(cfg: &MxuConfig, m: usize, k: usize, n: usize) -> Result<Schedule, HwError> {
        let (stats, period) = closed_form(cfg, m, k, n)?;
        let (r, c) = (cfg.rows, cfg.cols);
        let mut folds = Vec::with_capacity(stats.folds as usize);
        // Every fold starts before `total_cycles`, which fits 64 bits: the products below do too.
        match cfg.dataflow {
            Dataflow::WeightStationary => {
                for n0 in (0..n).step_by(c) {
                    for k0 in (0..k).step_by(r) {
                        folds.push(Fold {
                            m0: 0,
                            mr: m,
                            k0,
                            kr: r.min(k - k0),
                            n0,
                            nc: c.min(n - n0),
                            overwrite: k0 == 0,
                            // The fold's weights start entering one cycle before its activations
                            // (`T_f = start + 1`).
                            start: folds.len() as u64 * period,
                        });
                    }
                }
            }
            Dataflow::InputStationary => {
                // WS on `out^T = W^T * A^T`: its n-tiles are tiles of M, its weight tiles are
                // `A^T[k0..k0+kr][m0..m0+mc]`, and all N columns of W stream through each.
                for m0 in (0..m).step_by(c) {
                    for k0 in (0..k).step_by(r) {
                        folds.push(Fold {
                            m0,
                            mr: c.min(m - m0),
                            k0,
                            kr: r.min(k - k0),
                            n0: 0,
                            nc: n,
                            overwrite: k0 == 0,
                            start: folds.len() as u64 * period,
                        });
                    }
                }
            }
            Dataflow::OutputStationary => {
                for m0 in (0..m).step_by(r) {
                    for n0 in (0..n).step_by(c) {
                        let start = folds.len() as u64 * period;
                        folds.push(Fold {
                            m0,
                            mr: r.min(m - m0),
                            k0: 0,
                            kr: k,
                            n0,
                            nc: c.min(n - n0),
                            overwrite: true,
                            start,
                        });
                    }
                }
            }
        }
        Ok(Schedule {
            dataflow: cfg.dataflow,
            rows: r,
            cols: c,
            m,
            k,
            n,
            folds,
            period,
            total_cycles: stats.total_cycles,
        })
    }

    /// Cycle and work counts of the schedule.
    pub fn stats(&self) -> GemmStats {
        let per_fold = match self.dataflow {
            Dataflow::WeightStationary => self.m,
            Dataflow::OutputStationary => self.k,
            Dataflow::InputStationary => self.n,
        } as u64;
        // `Schedule::new` checked that these products fit 64 bits.
        let macs = (self.m * self.k * self.n) as u64;
        GemmStats {
            total_cycles: self.total_cycles,
            compute_cycles: per_fold * self.folds.len() as u64,
            folds: self.folds.len() as u64,
            macs,
            utilization: utilization(macs, self.total_cycles, self.rows, self.cols),
        }
    }

    /// The weight-stationary schedule of the transposed GEMM `out^T = W^T * A^T` that an IS
    /// schedule runs on the array: the same folds in the same order at the same times, fold
    /// `(m0, mr, k0, kr)` of IS being WS fold `(k0, kr, n0 = m0, nc = mr)` streaming all `N`
    /// rows of `W^T`. Any other schedule is returned as it is.
    pub fn as_ws(&self) -> Schedule {
        if self.dataflow != Dataflow::InputStationary {
            return self.clone();
        }
        let folds = self
            .folds
            .iter()
            .map(|f| Fold { m0: 0, mr: self.n, k0: f.k0, kr: f.kr, n0: f.m0, nc: f.mr, ..*f })
            .collect();
        Schedule { dataflow: Dataflow::WeightStationary, m: self.n, n: self.m, folds, ..self.clone() }
    }

    /// The schedule of a GEMM that adds its result to what the accumulators hold (`out +=
    /// A * W`, a later K tile of a GEMM cut along K): no fold overwrites.
    pub fn accumulating(mut self) -> Schedule {
        self.folds.iter_mut().for_each(|f| f.overwrite = false);
        self
    }

    /// `faults` on this schedule's clock (each from its fold's start); an event naming a fold
    /// the schedule lacks is left out.
    pub fn active(&self, faults: &FaultSchedule) -> Vec<ActiveFault> {
        faults.events.iter().filter_map(|e| self.folds.get(e.at.tile).map(|f| e.activate(f.start))).collect()
    }

    /// Absolute cycle of `cycle` within fold `tile`, if the fold exists (and the sum fits 64 bits).
    pub fn absolute_cycle(&self, tile: usize, cycle: u64) -> Option<u64> {
        self.folds.get(tile).and_then(|f| f.start.checked_add(cycle))
    }
}

/// `macs / (total * rows * cols)`, with the PE-cycle product in floating point so it cannot
/// overflow; for a total below 2^53 (every real run) it equals converting the integer product.
fn utilization(macs: u64, total: u64, rows: usize, cols: usize) -> f64 {
    let pe_cycles = total as f64 * (rows * cols) as f64;
    if pe_cycles == 0.0 {
        0.0
    } else {
        macs as f64 / pe_cycles
    }
}

/// The schedule's counts and fold period in closed form, with checked arithmetic.
fn closed_form(cfg: &MxuConfig, m: usize, k: usize, n: usize) -> Result<(GemmStats, u64), HwError> {
    let (r, c) = (cfg.rows as u64, cfg.cols as u64);
    let err = |what: &str| HwError::Shape {
        op: format!("gemm {m}x{k}x{n}"),
        detail: format!("its {what} does not fit 64 bits on a {r}x{c} array"),
    };
    if r == 0 || c == 0 {
        return Err(HwError::Shape { op: format!("gemm {m}x{k}x{n}"), detail: format!("the array is {r}x{c}") });
    }
    let cycles = || err("cycle count");
    let (mu, ku, nu) = (m as u64, k as u64, n as u64);
    let nt = nu.div_ceil(c);
    // WS of an `m x k x n` GEMM: (folds, period, total, rows streamed per fold).
    let ws = |mu: u64, ku: u64, nu: u64| -> Result<(u64, u64, u64, u64), HwError> {
        let nt = nu.div_ceil(c);
        let kt = ku.div_ceil(r);
        let folds = kt.checked_mul(nt).ok_or_else(cycles)?;
        let p = mu.max(r);
        // Fold `i` (width `nc`) starts at `i * p` and ends at `i * p + M + R + nc`.
        let end = |i: u64, nc: u64| i.checked_mul(p)?.checked_add(mu)?.checked_add(r + nc);
        let total = if folds == 0 {
            0
        } else {
            // Within an n-tile the last fold ends last; a narrower last n-tile can end before
            // the last full-width fold (whose results take `c - nc` more cycles to leave).
            let mut t = end(folds - 1, nu - (nt - 1) * c).ok_or_else(cycles)?;
            if nt >= 2 {
                t = t.max(end((nt - 1) * kt - 1, c).ok_or_else(cycles)?);
            }
            t
        };
        Ok((folds, p, total, mu))
    };
    let (folds, period, total, per_fold) = match cfg.dataflow {
        Dataflow::WeightStationary => ws(mu, ku, nu)?,
        // WS on the transposed problem: `N x K x M`.
        Dataflow::InputStationary => ws(nu, ku, mu)?,
        Dataflow::OutputStationary => {
            let folds = mu.div_ceil(r).checked_mul(nt).ok_or_else(cycles)?;
            let p = ku.checked_add(2 * r + c - 2).ok_or_else(cycles)?;
            (folds, p, folds.checked_mul(p).ok_or_else(cycles)?, ku)
        }
    };
    let compute = per_fold.checked_mul(folds).ok_or_else(cycles)?;
    let macs = mu.checked_mul(ku).and_then(|x| x.checked_mul(nu)).ok_or_else(|| err("MAC count"))?;
    let stats = GemmStats {
        total_cycles: total,
        compute_cycles: compute,
        folds,
        macs,
        utilization: utilization(macs, total, cfg.rows, cfg.cols),
    };
    Ok((stats, period))
}

/// Closed-form cycle counts of an `m x k x n` GEMM on `cfg`'s array; an [`HwError::Shape`] error
/// if a count does not fit 64 bits. Allocates nothing, whatever the shape.
pub fn try_gemm_timing(cfg: &MxuConfig, m: usize, k: usize, n: usize) -> Result<GemmStats, HwError> {
    closed_form(cfg, m, k, n).map(|(s, _)| s)
}

/// [`try_gemm_timing`] for shapes known to fit; a shape whose counts do not fit 64 bits gets
/// `u64::MAX` for every count (never a wrapped, plausible-looking number) and utilization 0.
pub fn gemm_timing(cfg: &MxuConfig, m: usize, k: usize, n: usize) -> GemmStats {
    try_gemm_timing(cfg, m, k, n).unwrap_or(GemmStats {
        total_cycles: u64::MAX,
        compute_cycles: u64::MAX,
        folds: u64::MAX,
        macs: u64::MAX,
        utilization: 0.0,
    })
}

/// Host bytes one GEMM needs, estimated from its shape before anything is allocated (`None`:
/// more than 2^64): the operand and output matrices, the fold schedule, and per `mode` the
/// functional twin's decoded operands and results or the stepped array's registers. With
/// `compare`, also a golden run in the functional twin and the diff of the two outputs (what a
/// fault-injection trial does). Check it with [`crate::budget::HostMemory::check`] before
/// generating the operands.
pub fn gemm_host_bytes(cfg: &HwConfig, m: usize, k: usize, n: usize, mode: ExecMode, compare: bool) -> Option<u64> {
    let (r, c) = (cfg.mxu.rows.max(1), cfg.mxu.cols.max(1));
    let folds = match cfg.mxu.dataflow {
        Dataflow::WeightStationary => product(&[k.div_ceil(r), n.div_ceil(c)]),
        Dataflow::OutputStationary => product(&[m.div_ceil(r), n.div_ceil(c)]),
        Dataflow::InputStationary => product(&[k.div_ceil(r), m.div_ceil(c)]),
    };
    let is = cfg.mxu.dataflow == Dataflow::InputStationary;
    // IS runs WS on the transposed problem (`n x k x m`), on transposed copies of the operands
    // and the accumulators, and transposes the result back.
    let (m, n) = if is { (n, m) } else { (m, n) };
    let word = size_of::<u32>();
    let transposes =
        if is { sum(&[product(&[m, k, word]), product(&[k, n, word]), product(&[2, m, n, word])]) } else { Some(0) };
    // Every format's decoded value (f32 or i32) is 4 bytes today; take the real size anyway.
    let value = match Precision::from_formats(cfg.mxu.input_format, cfg.mxu.acc_format) {
        Some(p) => with_precision!(p, F => size_of::<<F as MacFormat>::Value>()),
        None => size_of::<f32>(),
    };
    let operands = sum(&[product(&[m, k, word]), product(&[k, n, word])]);
    let output = product(&[m, n, word]);
    let schedule = folds.and_then(|f| f.checked_mul(size_of::<Fold>() as u64));
    // Decoded copies of both operands (weights padded to whole column blocks), the result
    // values (padded too), the encoded output and 1 KiB for the small allocations around them.
    let np = n.div_ceil(B).saturating_mul(B);
    let twin = sum(&[product(&[m, k, value]), product(&[k, np, value]), product(&[m, np, value]), output, Some(1024)]);
    // Current and next register state (four 32-bit and three 1-byte registers per PE) and the
    // edge drivers, plus the output matrix the accumulators write.
    let pe = size_of::<u32>() * 4 + 3;
    let stepped = sum(&[product(&[2, r, c, pe]), product(&[r + c, 32]), output]);
    // A faulty WS run steps a fault-free copy beside the faulty one, starts from the functional
    // twin's result and lists at most one changed capture per output (then steps the whole GEMM).
    let changed = size_of::<ChangedCapture>();
    let windowed = sum(&[stepped, product(&[2, r, c, pe]), twin, product(&[2, m, n, changed])]);
    let run = |mode: ExecMode| {
        match mode {
            ExecMode::Functional => sum(&[schedule, twin]),
            ExecMode::CycleLevel if compare && cfg.mxu.dataflow.stationary_operand() => sum(&[schedule, windowed]),
            ExecMode::CycleLevel => sum(&[schedule, stepped]),
        }
        .and_then(|x| x.checked_add(transposes?))
    };
    let golden = if compare {
        sum(&[run(ExecMode::Functional), product(&[m, n, size_of::<(usize, usize)>()])])
    } else {
        Some(0)
    };
    sum(&[operands, run(mode), golden])
}

/// Register state of the PE array, one flat row-major array per register class.
///
/// `Clone + PartialEq`, so a golden state is a cheap checkpoint and "faulty vs golden" is a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeArrayState {
    /// Array rows.
    pub rows: usize,
    /// Array columns.
    pub cols: usize,
    /// Activation registers (input-format bits).
    pub act: Vec<u32>,
    /// Activation-valid bits.
    pub valid: Vec<u8>,
    /// WS weight-swap strobes.
    pub swap: Vec<u8>,
    /// Weight registers (input-format bits).
    pub weight: Vec<u32>,
    /// WS shadow weight registers.
    pub shadow: Vec<u32>,
    /// OS weight-valid bits.
    pub wvalid: Vec<u8>,
    /// Partial sums (accumulator-format bits).
    pub psum: Vec<u32>,
}

impl PeArrayState {
    /// The reset state: every register zero.
    pub fn new(rows: usize, cols: usize) -> PeArrayState {
        let n = rows * cols;
        PeArrayState {
            rows,
            cols,
            act: vec![0; n],
            valid: vec![0; n],
            swap: vec![0; n],
            weight: vec![0; n],
            shadow: vec![0; n],
            wvalid: vec![0; n],
            psum: vec![0; n],
        }
    }

    /// Current bits of an MXU site's register (the whole register, not just the site's bit).
    pub fn read(&self, site: &FaultSite) -> u32 {
        let i = site.instance[0] as usize * self.cols + site.instance[1] as usize;
        match site.register {
            Register::Act => self.act[i],
            Register::Valid => self.valid[i] as u32,
            Register::Swap => self.swap[i] as u32,
            Register::Weight => self.weight[i],
            Register::WeightShadow => self.shadow[i],
            Register::WeightValid => self.wvalid[i] as u32,
            Register::Psum => self.psum[i],
            // Not a PE register (`gemm` rejects non-MXU sites before this is reached).
            _ => 0,
        }
    }

    /// Applies a fault event's bit operation to the committed state.
    fn apply(&mut self, e: &FaultEvent) {
        let s = &e.site;
        let i = s.instance[0] as usize * self.cols + s.instance[1] as usize;
        let k = e.kind;
        let b = s.bit;
        let bit8 = |v: &mut u8| *v = k.apply(*v as u32, b) as u8 & 1;
        match s.register {
            Register::Act => self.act[i] = k.apply(self.act[i], b),
            Register::Valid => bit8(&mut self.valid[i]),
            Register::Swap => bit8(&mut self.swap[i]),
            Register::Weight => self.weight[i] = k.apply(self.weight[i], b),
            Register::WeightShadow => self.shadow[i] = k.apply(self.shadow[i], b),
            Register::WeightValid => bit8(&mut self.wvalid[i]),
            Register::Psum => self.psum[i] = k.apply(self.psum[i], b),
            // Not a PE register (`gemm` rejects non-MXU sites before this is reached).
            _ => {}
        }
    }
}

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
/// ([`Fold::start`]) and must fall before the GEMM ends (`total_cycles`). A faulty
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
    let (out, golden) = if sched.dataflow == Dataflow::InputStationary {
        // WS on `out^T = W^T * A^T` (accumulators transposed alike), the result transposed back.
        let (at, wt, acct) = (w.transpose(), a.transpose(), acc.map(Matrix::transpose));
        let (out, golden) = run_gemm(cfg, &sched.as_ws(), &at, &wt, acct.as_ref(), mode, faults);
        (out.transpose(), golden.map(|g| g.transpose()))
    } else {
        run_gemm(cfg, &sched, a, w, acc, mode, faults)
    };
    Ok(GemmOutput { out, stats: sched.stats(), golden })
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

/// Each fold's partial sums as the continuously pipelined array computes them with `faults` (times
/// from each fold's start, as in [`gemm`]): fold `f` of [`Schedule::new`] gives the `mr x nc`
/// sums its rows leave for the accumulators (WS: every row of `A` times its `kr` rows of `W`;
/// OS: its output tile over all of `K`). For a caller that does the accumulator adds itself
/// (`op`): the same fault means the same thing here as in [`gemm`] and in training. Faults need
/// [`ExecMode::CycleLevel`].
pub fn fold_psums(
    cfg: &HwConfig,
    a: &Matrix,
    w: &Matrix,
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<Vec<Matrix>, HwError> {
    check_shapes(cfg, a, w)?;
    let sched = Schedule::new(&cfg.mxu, a.rows, a.cols, w.cols)?;
    check_faults(cfg, &sched, mode, faults)?;
    with_precision!(cfg.mxu.precision(), F => fold_psums_typed::<F>(cfg, &sched, a, w, faults))
}

fn fold_psums_typed<F: MacFormat>(
    cfg: &HwConfig,
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    faults: &FaultSchedule,
) -> Result<Vec<Matrix>, HwError> {
    // Fault-free: each fold's sums alone, as its own GEMM (one fold: not added to anything).
    let mut psums = Vec::with_capacity(s.folds.len());
    for f in &s.folds {
        let fa = Matrix::from_fn(f.mr, f.kr, |i, j| a.get(f.m0 + i, f.k0 + j));
        let fw = Matrix::from_fn(f.kr, f.nc, |i, j| w.get(f.k0 + i, f.n0 + j));
        psums.push(twin::<F>(&Schedule::new(&cfg.mxu, f.mr, f.kr, f.nc)?, &fa, &fw, None));
    }
    if faults.is_empty() {
        return Ok(psums);
    }
    match s.dataflow {
        Dataflow::WeightStationary => {
            let changed = ws_changed_captures::<F>(s, a, w, faults, usize::MAX).expect("no budget");
            for ((f, m, col), v) in changed {
                psums[f].set(m, col - s.folds[f].n0, v);
            }
        }
        Dataflow::InputStationary => {
            // The WS view's captures: row `nn` of its fold `f` is column `nn` of IS fold `f`,
            // its column `m0 + j` the fold's row `j`.
            let (ws, at, wt) = (s.as_ws(), w.transpose(), a.transpose());
            let changed = ws_changed_captures::<F>(&ws, &at, &wt, faults, usize::MAX).expect("no budget");
            for ((f, nn, m), v) in changed {
                psums[f].set(m - s.folds[f].m0, nn, v);
            }
        }
        Dataflow::OutputStationary => {
            // Every output is captured once, by its fold, with nothing added.
            let out = cycle_level::<F>(s, a, w, None, faults, &mut PeArrayState::new(s.rows, s.cols)).0;
            for (p, f) in psums.iter_mut().zip(&s.folds) {
                *p = Matrix::from_fn(f.mr, f.nc, |i, j| out.get(f.m0 + i, f.n0 + j));
            }
        }
    }
    Ok(psums)
}

/// Functional twin of any schedule: [`functional`], an IS schedule through its WS view on the
/// transposed operands (so the MACs see their operands in the array's order), the result
/// transposed back.
fn twin<F: MacFormat>(s: &Schedule, a: &Matrix, w: &Matrix, acc: Option<&Matrix>) -> Matrix {
    if s.dataflow == Dataflow::InputStationary {
        let acct = acc.map(Matrix::transpose);
        functional::<F>(&s.as_ws(), &w.transpose(), &a.transpose(), acct.as_ref()).transpose()
    } else {
        functional::<F>(s, a, w, acc)
    }
}

/// Functional twin (WS and OS; IS through [`twin`]): the same per-output operation sequence, without registers or clocks.
/// Compiled for AVX2 as well as the baseline and picked at run time: wider vectors, the same
/// IEEE multiplies and adds in the same order (Rust never fuses them), so the same bits.
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn functional<F: MacFormat>(s: &Schedule, a: &Matrix, w: &Matrix, acc: Option<&Matrix>) -> Matrix {
    let (m, k, n) = (s.m, s.k, s.n);
    // Columns are padded to whole blocks of `B` (zero weights, results dropped), so every block
    // takes the vectorised path; a column's own sequence of operations is unchanged.
    let np = n.div_ceil(B) * B;
    // Plain loops, not `map().collect()` (compiled without AVX2, it would not inline these).
    let mut av = vec![F::Value::default(); a.data.len()];
    for (d, &b) in av.iter_mut().zip(&a.data) {
        *d = F::decode_in(b);
    }
    let mut wv = vec![F::Value::default(); k * np];
    for (row, src) in wv.chunks_exact_mut(np).zip(w.data.chunks_exact(n)) {
        for (d, &b) in row.iter_mut().zip(src) {
            *d = F::decode_in(b);
        }
    }
    let mut out = vec![F::Value::default(); m * np];
    if let Some(c) = acc {
        for (row, src) in out.chunks_exact_mut(np).zip(c.data.chunks_exact(n)) {
            for (d, &b) in row.iter_mut().zip(src) {
                *d = F::decode_acc(b);
            }
        }
    }
    // Whether the first K fold overwrites the accumulators (else every fold adds).
    let overwrite = s.folds.first().is_some_and(|f| f.overwrite);
    // K is reduced in chunks of R in WS (one chunk per fold) and in one piece in OS (IS comes
    // here as its WS view, see [`twin`]).
    let chunk = match s.dataflow {
        Dataflow::WeightStationary | Dataflow::InputStationary => s.rows,
        Dataflow::OutputStationary => k,
    }
    .max(1);
    let g = Gemm { a: &av, w: &wv, k, np, overwrite };
    for m0 in (0..m - m % MR).step_by(MR) {
        g.rows::<F, MR>(m0, chunk, &mut out[m0 * np..(m0 + MR) * np]);
    }
    for m0 in m - m % MR..m {
        g.rows::<F, 1>(m0, chunk, &mut out[m0 * np..(m0 + 1) * np]);
    }
    let mut data = vec![0; m * n];
    for (dst, row) in data.chunks_exact_mut(n).zip(out.chunks_exact(np)) {
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = F::encode_acc(v);
        }
    }
    Matrix { rows: m, cols: n, data }
}

/// Output columns per register block of the functional GEMM.
const B: usize = 16;
/// Output rows per register block (with `B`, 8 AVX2 accumulators: enough independent adds to
/// hide the add latency, and each weight load serves `MR` rows).
const MR: usize = 4;

/// Decoded operands of the functional GEMM (weights padded to `np` columns).
struct Gemm<'a, V> {
    a: &'a [V],
    w: &'a [V],
    k: usize,
    np: usize,
    overwrite: bool,
}

impl<V: Copy + Default> Gemm<'_, V> {
    /// Output rows `m0..m0 + R` (`out`, `R x np`): per block of `B` columns and per K chunk,
    /// partial sums in registers over `k` ascending, then written or added to `out`.
    #[inline(always)]
    fn rows<F: MacFormat<Value = V>, const R: usize>(&self, m0: usize, chunk: usize, out: &mut [V]) {
        let (k, np) = (self.k, self.np);
        for j0 in (0..np).step_by(B) {
            for k0 in (0..k).step_by(chunk) {
                let mut acc = [[V::default(); B]; R];
                for ki in k0..(k0 + chunk).min(k) {
                    let w: &[V; B] = self.w[ki * np + j0..ki * np + j0 + B].try_into().expect("B columns");
                    let x: [V; R] = std::array::from_fn(|r| self.a[(m0 + r) * k + ki]);
                    for r in 0..R {
                        for t in 0..B {
                            acc[r][t] = F::mac_value(acc[r][t], x[r], w[t]);
                        }
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    let o = &mut out[r * np + j0..r * np + j0 + B];
                    if k0 == 0 && self.overwrite {
                        o.copy_from_slice(acc);
                    } else {
                        for (o, &t) in o.iter_mut().zip(acc) {
                            *o = F::add_value(*o, t);
                        }
                    }
                }
            }
        }
    }
}

/// What the stepped model observed, besides the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleReport {
    /// Cycles stepped until the last accumulator write (measured, not taken from the formula).
    pub measured_cycles: u64,
    /// Accumulator writes performed.
    pub captures: u64,
}

/// Steps the array cycle by cycle from `st` (normally the reset state) through the schedule.
///
/// The sequencer drives edges and the accumulator captures at the times the schedule gives;
/// stepping stops when every output element has been written, so the cycle count is measured
/// and can be checked against the closed form.
pub fn cycle_level<F: MacFormat>(
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    faults: &FaultSchedule,
    st: &mut PeArrayState,
) -> (Matrix, CycleReport) {
    cycle_level_observed::<F>(s, a, w, acc, faults, st, |_, _| {})
}

/// [`cycle_level`] with an observer called after every commit (faults applied) with the cycle
/// number and the state: the hook for waveform (VCD) export and propagation tracing.
///
/// `faults` should have passed [`FaultSchedule::check`] (as [`gemm`] does); an event naming a
/// fold the schedule lacks is ignored rather than indexing out of bounds.
pub fn cycle_level_observed<F: MacFormat>(
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    faults: &FaultSchedule,
    st: &mut PeArrayState,
    mut observe: impl FnMut(u64, &PeArrayState),
) -> (Matrix, CycleReport) {
    if s.dataflow == Dataflow::InputStationary {
        // The array runs the WS view on the transposed operands; the accumulators hold the
        // transposed result, read back as `M x N`.
        let acct = acc.map(Matrix::transpose);
        let (out, report) =
            cycle_level_observed::<F>(&s.as_ws(), &w.transpose(), &a.transpose(), acct.as_ref(), faults, st, observe);
        return (out.transpose(), report);
    }
    let faults = s.active(faults);
    let mut out = acc.cloned().unwrap_or_else(|| Matrix::zeros(s.m, s.n));
    let mut next = st.clone();
    let mut edge = Edge::new(s.rows, s.cols);
    let expected: u64 = s.folds.iter().map(|f| (f.mr * f.nc) as u64).sum();
    let mut captures = 0u64;
    let mut t = 0u64;
    // Generous bound: a schedule bug must end in a wrong count, not an endless loop.
    let limit = s.total_cycles.saturating_mul(2).saturating_add(16);
    while captures < expected && t < limit {
        match s.dataflow {
            // IS was turned into its WS view above.
            Dataflow::WeightStationary | Dataflow::InputStationary => {
                captures += capture_ws::<F>(s, t, st, &mut out);
                edge.drive_ws(s, a, w, t);
                step_ws::<F>(st, &mut next, &edge);
            }
            Dataflow::OutputStationary => {
                let drain = os_drain_row(s, t);
                if let Some((f, d)) = drain {
                    captures += capture_os::<F>(s, f, d, st, &mut out);
                }
                edge.drive_os(s, a, w, t);
                step_os::<F>(st, &mut next, &edge, drain.is_some());
            }
        }
        std::mem::swap(st, &mut next);
        for f in faults.iter().filter(|f| f.acts_at(t)) {
            st.apply(&f.event);
        }
        observe(t, st);
        t += 1;
    }
    (out, CycleReport { measured_cycles: t, captures })
}

/// `(u / p, u % p)` for `u = top, top - 1, ...` (`None` once below zero, and for `top`
/// `None`), with one division in all: schedule positions along a row or diagonal of the array.
fn countdown(top: Option<u64>, p: u64) -> impl Iterator<Item = Option<(u64, u64)>> {
    let mut cur = top.map(|u| (u / p, u % p));
    std::iter::repeat_with(move || {
        let now = cur;
        cur = match cur {
            Some((f, 0)) => f.checked_sub(1).map(|f| (f, p - 1)),
            Some((f, m)) => Some((f, m - 1)),
            None => None,
        };
        now
    })
}

/// WS: what row `i`'s edge gets when output row `m` of fold `f` enters it (`fm`; `None`:
/// before the first fold): activation bits, valid, swap strobe.
fn ws_input(s: &Schedule, a: &Matrix, fm: Option<(u64, u64)>, i: usize) -> (u32, u8, u8) {
    match fm.and_then(|(f, m)| Some((s.folds.get(f as usize)?, m as usize))) {
        Some((fold, m)) if m < s.m => {
            let swap = (m == 0) as u8;
            if i < fold.kr {
                (a.get(m, fold.k0 + i), 1, swap)
            } else {
                (0, 0, swap)
            }
        }
        _ => (0, 0, 0),
    }
}

/// WS: the weight fold `f` puts in PE `(i, j)` (zero outside the fold's tile).
fn ws_weight(s: &Schedule, w: &Matrix, f: usize, i: usize, j: usize) -> u32 {
    let fold = &s.folds[f];
    if i < fold.kr && j < fold.nc {
        w.get(fold.k0 + i, fold.n0 + j)
    } else {
        0
    }
}

/// WS: the fault-free array state at the start of cycle `t`, in closed form, except the partial
/// sums (left zero: stepping `i + 1` cycles from here makes row `i`'s exact, as each is
/// computed from the row above's one cycle earlier and row 0 adds to zero). Activations, valid
/// bits and swap strobes are the edge inputs of `j + 1` cycles ago; the shadow register holds
/// the last fold whose bus write (at `f * p + i + j`) has landed, the weight register the last
/// fold whose swap (committed at `f * p + i + j + 1`) has passed.
fn ws_state_at(s: &Schedule, a: &Matrix, w: &Matrix, t: u64) -> PeArrayState {
    let (r, c, p) = (s.rows, s.cols, s.period);
    let mut st = PeArrayState::new(r, c);
    let last = s.folds.len().saturating_sub(1) as u64;
    // Everything but the activation's row index depends on the anti-diagonal `d = i + j` only:
    // `(f, m)` of `t - 2 - d` (the row passing, and the last swap) and of `t - 1 - d` (the
    // last bus write).
    let passing: Vec<_> = countdown(t.checked_sub(2), p).take(r + c).collect();
    let written: Vec<_> = countdown(t.checked_sub(1), p).take(r + c).collect();
    for i in 0..r {
        for j in 0..c {
            let (x, d) = (i * c + j, i + j);
            (st.act[x], st.valid[x], st.swap[x]) = ws_input(s, a, passing[d], i);
            if let Some((f, _)) = passing[d] {
                st.weight[x] = ws_weight(s, w, f.min(last) as usize, i, j);
            }
            if let Some((f, _)) = written[d] {
                st.shadow[x] = ws_weight(s, w, f.min(last) as usize, i, j);
            }
        }
    }
    st
}

/// Whether two WS array states hold the same values in every register a WS clock uses (the OS
/// weight-valid bits are not among them).
fn same_ws(x: &PeArrayState, y: &PeArrayState) -> bool {
    x.psum == y.psum
        && x.act == y.act
        && x.weight == y.weight
        && x.shadow == y.shadow
        && x.valid == y.valid
        && x.swap == y.swap
}

/// WS: the fold, output row and column that column `j` of the accumulators captures at cycle
/// `t` (`t = 1 + f * p + m + R + j`), if any.
fn ws_capture(s: &Schedule, t: u64, j: usize) -> Option<(usize, usize, usize)> {
    let u = t.checked_sub(1 + s.rows as u64 + j as u64)?;
    let (f, m) = ((u / s.period) as usize, (u % s.period) as usize);
    let fold = s.folds.get(f)?;
    (m < s.m && j < fold.nc).then_some((f, m, fold.n0 + j))
}

/// An accumulator capture a fault changed: ((fold, output row, output column), faulty sum).
type ChangedCapture = ((usize, usize, usize), u32);

/// The accumulator captures `faults` change in a WS GEMM at cycle level, as ((fold, row,
/// column), faulty partial sum) sorted by key, stepping only the cycles the faults can matter
/// in (see [`windowed_ws`]); `None` if more than `budget` change.
fn ws_changed_captures<F: MacFormat>(
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    faults: &FaultSchedule,
    budget: usize,
) -> Option<Vec<ChangedCapture>> {
    let active = s.active(faults);
    let (Some(first), Some(over)) = (active.iter().map(|f| f.start).min(), active.iter().map(|f| f.end).max()) else {
        return Some(Vec::new());
    };
    // A fault in row `i` never reaches the rows above it, whose sums it meets as they flow
    // down: those must be exact from its time on. Row `i`'s sums are exact `i + 1` cycles after
    // stepping starts; until then they are equally wrong in both copies and flow out unchanged.
    let from = active.iter().map(|f| f.start.saturating_sub(f.event.site.instance[0] as u64)).min().unwrap_or(first);
    let mut edge = Edge::new(s.rows, s.cols);
    let mut golden = ws_state_at(s, a, w, from);
    let mut next = golden.clone();
    for t in from..first {
        edge.drive_ws(s, a, w, t);
        step_ws::<F>(&golden, &mut next, &edge);
        std::mem::swap(&mut golden, &mut next);
    }
    let (mut faulty, mut faulty_next) = (golden.clone(), next.clone());
    let mut changed = Vec::new();
    let bottom = (s.rows - 1) * s.cols;
    let mut t = first;
    while t < s.total_cycles {
        for j in 0..s.cols {
            let (fv, gv) = (faulty.psum[bottom + j], golden.psum[bottom + j]);
            if fv != gv {
                if let Some(key) = ws_capture(s, t, j) {
                    changed.push((key, fv));
                }
            }
        }
        edge.drive_ws(s, a, w, t);
        step_ws::<F>(&golden, &mut next, &edge);
        step_ws::<F>(&faulty, &mut faulty_next, &edge);
        std::mem::swap(&mut golden, &mut next);
        std::mem::swap(&mut faulty, &mut faulty_next);
        for f in active.iter().filter(|f| f.acts_at(t)) {
            faulty.apply(&f.event);
        }
        t += 1;
        if changed.len() > budget {
            return None;
        }
        if t >= over && same_ws(&faulty, &golden) {
            break;
        }
    }
    // In capture order; sorted by key for lookups (keys are unique).
    changed.sort_unstable_by_key(|&(k, _)| k);
    Some(changed)
}

/// A faulty WS GEMM at cycle level, stepping only the cycles the faults can matter in; the
/// same bits as [`cycle_level`] from the reset state.
///
/// Before the first fault the array is fault-free, so its state there is rebuilt in closed
/// form ([`ws_state_at`]; the partial sums by stepping from as many cycles earlier as the
/// faulted row is deep). From the first fault a faulty
/// and a fault-free copy step side by side and every accumulator capture is compared; once the
/// faults are over and the two states are equal, every later capture is fault-free too.
/// Returns the result and the fault-free one. The result is the functional twin's, with each
/// output whose captures differed recomputed through its folds in order from the faulty
/// captures and fault-free fold sums.
fn windowed_ws<F: MacFormat>(
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    faults: &FaultSchedule,
) -> (Matrix, Matrix) {
    let fault_free = functional::<F>(s, a, w, acc);
    // More changed captures than outputs (a fault changing most of the result for a long
    // time): stepping the whole GEMM is as cheap, and bounds the memory this needs.
    let Some(changed) = ws_changed_captures::<F>(s, a, w, faults, s.m.saturating_mul(s.n)) else {
        return (cycle_level::<F>(s, a, w, acc, faults, &mut PeArrayState::new(s.rows, s.cols)).0, fault_free);
    };
    let mut out = fault_free.clone();
    let mut elements: Vec<(usize, usize)> = changed.iter().map(|&((_, m, n), _)| (m, n)).collect();
    elements.sort_unstable();
    elements.dedup();
    for (m, n) in elements {
        let mut v = acc.map_or(0, |c| c.get(m, n));
        for (f, fold) in s.folds.iter().enumerate().filter(|(_, f)| (f.n0..f.n0 + f.nc).contains(&n)) {
            let hit = changed.binary_search_by_key(&(f, m, n), |&(k, _)| k).ok();
            let ps = hit.map(|x| changed[x].1).unwrap_or_else(|| {
                (0..fold.kr).fold(PSUM_ZERO, |ps, i| F::mac(ps, a.get(m, fold.k0 + i), w.get(fold.k0 + i, n)))
            });
            v = if fold.overwrite { ps } else { F::add(v, ps) };
        }
        out.set(m, n, v);
    }
    (out, fault_free)
}

/// Values the sequencer drives into the array's edges in one cycle.
struct Edge {
    /// Per row: activation bits, valid, swap.
    act: Vec<u32>,
    valid: Vec<u8>,
    swap: Vec<u8>,
    /// Per column: weight-bus write (row to write, bits) in WS; top weight input in OS.
    wrow: Vec<Option<usize>>,
    wbits: Vec<u32>,
    wvalid: Vec<u8>,
    /// The partial sums entering row 0: all zero.
    zero_row: Vec<u32>,
}

impl Edge {
    fn new(rows: usize, cols: usize) -> Edge {
        Edge {
            act: vec![0; rows],
            valid: vec![0; rows],
            swap: vec![0; rows],
            wrow: vec![None; cols],
            wbits: vec![0; cols],
            wvalid: vec![0; cols],
            zero_row: vec![PSUM_ZERO; cols],
        }
    }

    /// WS: row `i` gets `A[m][k0+i]` at `T_f + m + i`; column `j`'s bus writes row `i` at
    /// `T_f + j - 1 + i` (with `T_f = fold.start + 1`).
    fn drive_ws(&mut self, s: &Schedule, a: &Matrix, w: &Matrix, t: u64) {
        // Row i: (f, m) of t - 1 - i; column j's bus: (f, row) of t - j.
        for (i, fm) in countdown(t.checked_sub(1), s.period).take(s.rows).enumerate() {
            (self.act[i], self.valid[i], self.swap[i]) = ws_input(s, a, fm, i);
        }
        for (j, fi) in countdown(Some(t), s.period).take(s.cols).enumerate() {
            self.wrow[j] = None;
            if let Some((f, i)) = fi.map(|(f, i)| (f as usize, i as usize)) {
                if f < s.folds.len() && i < s.rows {
                    self.wrow[j] = Some(i);
                    self.wbits[j] = ws_weight(s, w, f, i, j);
                }
            }
        }
    }

    /// OS: row `i` gets `A[m0+i][k]` and column `j` gets `W[k][n0+j]` at `S_f + k + i` / `+ j`.
    fn drive_os(&mut self, s: &Schedule, a: &Matrix, w: &Matrix, t: u64) {
        let p = s.period;
        let (f, off) = ((t / p) as usize, t % p);
        let fold = s.folds.get(f);
        for i in 0..s.rows {
            self.act[i] = 0;
            self.valid[i] = 0;
            if let Some(fold) = fold {
                if off >= i as u64 && i < fold.mr {
                    let k = (off - i as u64) as usize;
                    if k < s.k {
                        self.act[i] = a.get(fold.m0 + i, k);
                        self.valid[i] = 1;
                    }
                }
            }
        }
        for j in 0..s.cols {
            self.wbits[j] = 0;
            self.wvalid[j] = 0;
            if let Some(fold) = fold {
                if off >= j as u64 && j < fold.nc {
                    let k = (off - j as u64) as usize;
                    if k < s.k {
                        self.wbits[j] = w.get(k, fold.n0 + j);
                        self.wvalid[j] = 1;
                    }
                }
            }
        }
    }
}

/// Canonical bits of the zero partial sum entering row 0 (`+0` / `0`).
const PSUM_ZERO: u32 = 0;

/// `next` = `cur` moved one PE right (row-major rows of `c`), column 0 of row `i` taking
/// `edge[i]`: one copy of the whole array, then the edge column.
#[inline(always)]
fn shift_right<T: Copy>(cur: &[T], next: &mut [T], edge: &[T], c: usize) {
    if let Some(last) = cur.len().checked_sub(1) {
        next[1..].copy_from_slice(&cur[..last]);
        for (i, &v) in edge.iter().enumerate() {
            next[i * c] = v;
        }
    }
}

/// One WS clock: next state from current state and edge inputs (D/Q). Compiled for AVX2 as
/// well (same IEEE operations per PE, so the same bits), picked at run time.
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn step_ws<F: MacFormat>(cur: &PeArrayState, next: &mut PeArrayState, e: &Edge) {
    let c = cur.cols;
    // Activations, valid bits and swap strobes move one PE right; the edge feeds column 0.
    // Whole-array shifts: three copies a clock instead of three per row.
    shift_right(&cur.act, &mut next.act, &e.act, c);
    shift_right(&cur.valid, &mut next.valid, &e.valid, c);
    shift_right(&cur.swap, &mut next.swap, &e.swap, c);
    for i in 0..cur.rows {
        let r = i * c..(i + 1) * c;
        let above: &[u32] = if i == 0 { &e.zero_row } else { &cur.psum[(i - 1) * c..i * c] };
        let (na, nv, ns) = (&next.act[r.clone()], &next.valid[r.clone()], &next.swap[r.clone()]);
        let (cw, csh) = (&cur.weight[r.clone()], &cur.shadow[r.clone()]);
        let nw = &mut next.weight[r.clone()];
        let np = &mut next.psum[r];
        // Two loops of few slices each: LLVM vectorises a loop only if it can rule out aliasing
        // between its slices with a bounded number of run-time checks. Branch-free selects
        // (masks from the 0/1 control bits) keep both loops straight-line.
        ws_row::<F>(nw, np, cw, csh, ns, above, na, nv);
    }
    // Shadow registers hold their value unless the weight bus writes them (next state; the swap
    // above read the current one).
    next.shadow.copy_from_slice(&cur.shadow);
    for (j, row) in e.wrow.iter().enumerate() {
        if let Some(i) = *row {
            next.shadow[i * c + j] = e.wbits[j];
        }
    }
}

/// One WS row's clock. The slices are arguments (so the compiler knows they do not alias) and
/// the loops are branch-free selects (masks from the 0/1 control bits), so both vectorise.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn ws_row<F: MacFormat>(
    nw: &mut [u32],
    np: &mut [u32],
    cw: &[u32],
    csh: &[u32],
    ns: &[u8],
    above: &[u32],
    na: &[u32],
    nv: &[u8],
) {
    for (((w, &cw), &csh), &ns) in nw.iter_mut().zip(cw).zip(csh).zip(ns) {
        // The arriving swap strobe makes this clock's MAC use the shadow weight.
        let swap = 0u32.wrapping_sub(ns as u32);
        *w = (csh & swap) | (cw & !swap);
    }
    for ((((p, &above), &a), &w), &v) in np.iter_mut().zip(above).zip(na).zip(&*nw).zip(nv) {
        let valid = 0u32.wrapping_sub(v as u32);
        let mac = F::mac(above, a, w);
        *p = (mac & valid) | (above & !valid);
    }
}

/// One OS clock. In drain cycles partial sums shift down and nothing is computed. Compiled for
/// AVX2 as well, like [`step_ws`].
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn step_os<F: MacFormat>(cur: &PeArrayState, next: &mut PeArrayState, e: &Edge, drain: bool) {
    let (c, n) = (cur.cols, cur.psum.len());
    shift_right(&cur.act, &mut next.act, &e.act, c);
    shift_right(&cur.valid, &mut next.valid, &e.valid, c);
    // Weights (and their valid bits) come from the row above, or from the top edge.
    next.weight[c..].copy_from_slice(&cur.weight[..n - c]);
    next.weight[..c].copy_from_slice(&e.wbits);
    next.wvalid[c..].copy_from_slice(&cur.wvalid[..n - c]);
    next.wvalid[..c].copy_from_slice(&e.wvalid);
    if drain {
        next.psum[c..].copy_from_slice(&cur.psum[..n - c]);
        next.psum[..c].fill(PSUM_ZERO);
        return;
    }
    for i in 0..cur.rows {
        let r = i * c..(i + 1) * c;
        let (na, nv) = (&next.act[r.clone()], &next.valid[r.clone()]);
        let (w_above, wv_above) = (&next.weight[r.clone()], &next.wvalid[r.clone()]);
        let cp = &cur.psum[r.clone()];
        let np = &mut next.psum[r];
        for j in 0..c {
            // Branch-free select, as in `step_ws`.
            let go = 0u32.wrapping_sub((nv[j] & wv_above[j]) as u32);
            let mac = F::mac(cp[j], na[j], w_above[j]);
            np[j] = (mac & go) | (cp[j] & !go);
        }
    }
}

/// WS accumulator: at cycle `t` column `j` captures output `m = t - T_f - R - j` of fold `f`.
fn capture_ws<F: MacFormat>(s: &Schedule, t: u64, st: &PeArrayState, out: &mut Matrix) -> u64 {
    let mut n = 0;
    let bottom = &st.psum[(s.rows - 1) * s.cols..];
    for (j, &ps) in bottom.iter().enumerate() {
        let Some((f, m, col)) = ws_capture(s, t, j) else { continue };
        let v = if s.folds[f].overwrite { ps } else { F::add(out.get(m, col), ps) };
        out.set(m, col, v);
        n += 1;
    }
    n
}

/// OS: the drain of fold `f` occupies the last R cycles of its period; returns `(f, d)` for
/// drain cycle `d`.
fn os_drain_row(s: &Schedule, t: u64) -> Option<(usize, usize)> {
    let p = s.period;
    let (f, off) = ((t / p) as usize, t % p);
    let drain_start = p - s.rows as u64;
    (f < s.folds.len() && off >= drain_start).then(|| (f, (off - drain_start) as usize))
}

/// OS accumulator: drain cycle `d` captures the bottom row, which holds original row `R-1-d`.
fn capture_os<F: MacFormat>(s: &Schedule, f: usize, d: usize, st: &PeArrayState, out: &mut Matrix) -> u64 {
    let fold = &s.folds[f];
    let i = s.rows - 1 - d;
    if i >= fold.mr {
        return 0;
    }
    let bottom = &st.psum[(s.rows - 1) * s.cols..];
    for (j, &ps) in bottom.iter().enumerate().take(fold.nc) {
        let (m, n) = (fold.m0 + i, fold.n0 + j);
        let v = if fold.overwrite { ps } else { F::add(out.get(m, n), ps) };
        out.set(m, n, v);
    }
    fold.nc as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultline_num::Bf16Fp32;
    use proptest::prelude::*;

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

    proptest! {
        /// The closed-form WS state equals the stepped one at every cycle of a GEMM, every
        /// register of every PE but the partial sums, and those too in rows `0..d` after `d`
        /// cycles of stepping from it (what lets a faulty run start at its fault).
        #[test]
        fn the_closed_form_ws_state_is_the_stepped_state(
            rows in 1usize..=6, cols in 1usize..=6, m in 1usize..=12, k in 1usize..=14, n in 1usize..=14,
            seed in any::<u32>(), d in 0usize..=6,
        ) {
            let cfg = HwConfig::test_config(rows, cols, Dataflow::WeightStationary, Precision::Bf16Fp32);
            let bits = |i: usize, salt: u32| ((i as u32).wrapping_mul(2654435761) ^ salt ^ seed) >> 16 & 0x7fff;
            let a = Matrix::from_fn(m, k, |i, j| bits(i * k + j, 1));
            let w = Matrix::from_fn(k, n, |i, j| bits(i * n + j, 2));
            let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
            let step = |st: &mut PeArrayState, t: u64| {
                let (mut edge, mut next) = (Edge::new(rows, cols), st.clone());
                edge.drive_ws(&s, &a, &w, t);
                step_ws::<Bf16Fp32>(st, &mut next, &edge);
                *st = next;
            };
            let d = d.min(rows);
            let mut st = PeArrayState::new(rows, cols);
            for t in 0..s.total_cycles {
                let mut want = ws_state_at(&s, &a, &w, t);
                want.psum.clone_from(&st.psum);
                prop_assert!(same_ws(&st, &want), "cycle {t}: stepped {st:?}, closed form {want:?}");
                if t >= d as u64 {
                    let mut warm = ws_state_at(&s, &a, &w, t - d as u64);
                    (t - d as u64..t).for_each(|u| step(&mut warm, u));
                    prop_assert_eq!(&warm.psum[..d * cols], &st.psum[..d * cols], "cycle {}", t);
                }
                step(&mut st, t);
            }
        }
    }
}
