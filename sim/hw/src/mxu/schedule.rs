//! The fold schedule of a GEMM: the one timing source for every mode ([`Schedule`]), its counts
//! in closed form ([`gemm_timing`]) and the host memory a run needs ([`gemm_host_bytes`]).

use super::cycle::ChangedCapture;
use super::functional::NR;
use crate::budget::{product, sum};
use crate::config::{Dataflow, HwConfig, MxuConfig};
use crate::error::HwError;
use crate::fault::{ActiveFault, FaultSchedule};
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

    /// The `K` rows each partial sum of an output runs over before it joins the accumulator
    /// (WS and IS: one fold's array rows; OS: all of `K`), and whether the first of them
    /// overwrites the accumulator (else every one adds): what the functional twins reproduce.
    pub(super) fn k_chunks(&self) -> (usize, bool) {
        let chunk = match self.dataflow {
            Dataflow::WeightStationary | Dataflow::InputStationary => self.rows,
            Dataflow::OutputStationary => self.k,
        };
        (chunk.max(1), self.folds.first().is_some_and(|f| f.overwrite))
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
    // Decoded copies of both operands (the weights packed into whole panels of columns), the
    // encoded output and 1 KiB for the small allocations around them.
    let np = n.div_ceil(NR).saturating_mul(NR);
    let twin = sum(&[product(&[m, k, value]), product(&[k, np, value]), output, Some(1024)]);
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
