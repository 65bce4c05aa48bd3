//! The VPU's issue schedule in closed form: the one timing source for every mode ([`timing`],
//! [`vector_at`], [`element_cycles`]).

use super::{Axis, VpuOp};
use crate::config::HwConfig;
use crate::error::HwError;
use serde::{Deserialize, Serialize};

/// Cycle and work counts of one VPU op, identical in every execution mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VpuStats {
    /// Cycles from the first operand latch to the last write-back, + 1.
    pub cycles: u64,
    /// Vector instructions issued.
    pub vectors: u64,
    /// Elements read per input (`n`).
    pub elements: u64,
    /// `elements * outputs / (cycles * lanes)`: fraction of lane-cycles producing a result.
    pub utilization: f64,
}

/// Closed-form cycle counts of `op` on `n` elements (see the module docs); an
/// [`HwError::Shape`] error if the cycle count does not fit 64 bits. Allocates nothing.
pub fn try_timing(cfg: &HwConfig, op: &VpuOp, n: usize) -> Result<VpuStats, HwError> {
    Ok(VpuSchedule::new(cfg, op, n.max(1))?.stats(cfg, op, n))
}

/// [`try_timing`] for sizes known to fit; one whose cycle count does not fit 64 bits gets
/// `u64::MAX` cycles (never a wrapped, plausible-looking number) and utilization 0.
pub fn timing(cfg: &HwConfig, op: &VpuOp, n: usize) -> VpuStats {
    try_timing(cfg, op, n).unwrap_or(VpuStats {
        cycles: u64::MAX,
        vectors: n.div_ceil(cfg.vpu.lanes.max(1)) as u64,
        elements: n as u64,
        utilization: 0.0,
    })
}

/// The vector of `op` on `n` elements a fault at `cycle` (from the op's first issue) is
/// reported against: the last one issued at or before it, with its issue cycle (the fault's
/// origin). `None` past the op's end.
pub fn vector_at(cfg: &HwConfig, op: &VpuOp, n: usize, cycle: u64) -> Result<Option<(u64, u64)>, HwError> {
    let s = VpuSchedule::new(cfg, op, n.max(1))?;
    if cycle >= s.cycles {
        return Ok(None);
    }
    let stride = s.stride.max(1);
    let v = (cycle / stride).saturating_mul(s.group).saturating_add((cycle % stride).min(s.group - 1));
    let v = v.min(s.vectors.saturating_sub(1));
    Ok(Some((v, s.issue(v))))
}

/// For an elementwise/optimizer op on `n` elements: the cycle (from the op's first issue) at
/// which element `e`'s operands are read into the operand registers (its vector's issue cycle
/// `t_v`), and the cycle at which output `j` of element `e` is written back (`t_v + j + D + 1`).
/// `None` for reductions (their operands are read per the schedule in the module docs).
pub fn element_cycles(cfg: &HwConfig, op: &VpuOp, n: usize) -> Option<(Vec<u64>, Vec<Vec<u64>>)> {
    let read: Vec<u64> = (0..n).map(|e| element_cycle(cfg, op, e, None)).collect::<Option<_>>()?;
    let write =
        (0..op.outputs()).map(|j| (0..n).map(|e| element_cycle(cfg, op, e, Some(j)).unwrap_or(0)).collect()).collect();
    Some((read, write))
}

/// One entry of [`element_cycles`], without building the whole table: the cycle element `e`'s
/// operands are read (`output` `None`) or its output `j` is written back (`Some(j)`); `None`
/// for reductions.
pub fn element_cycle(cfg: &HwConfig, op: &VpuOp, e: usize, output: Option<usize>) -> Option<u64> {
    if op.reduction().is_some() {
        return None;
    }
    let read = (e / cfg.vpu.lanes) as u64 * op.outputs() as u64;
    Some(output.map_or(read, |j| read + j as u64 + cfg.vpu.pipeline_depth + 1))
}

/// The issue schedule of one op, in closed form (nothing proportional to the op is stored, so
/// costing a huge op allocates nothing): vector `v` issues at
/// `(v / group) * stride + v % group` (elementwise: `group = 1`, `stride = k`; column
/// reductions: `1, 1`; row reductions: `nv`, `nv + S`).
#[derive(Debug, Clone)]
pub(super) struct VpuSchedule {
    /// Vector instructions issued.
    pub(super) vectors: u64,
    /// Vectors issued back to back, one per cycle.
    group: u64,
    /// Cycles from one group's first issue to the next's.
    stride: u64,
    /// Total cycles.
    pub(super) cycles: u64,
    /// Tree stages per row (Axis::Row reductions).
    pub(super) stages: u32,
}

impl VpuSchedule {
    /// The cycle and work counts of this schedule for `op` on `n` elements.
    pub(super) fn stats(&self, cfg: &HwConfig, op: &VpuOp, n: usize) -> VpuStats {
        // In floating point, as `n * outputs` may not fit `usize`; for `n` below 2^53 (every real
        // op) it equals converting the integer product.
        let useful = n as f64 * op.outputs() as f64;
        VpuStats {
            cycles: self.cycles,
            vectors: self.vectors,
            elements: n as u64,
            utilization: useful / (self.cycles as f64 * cfg.vpu.lanes as f64),
        }
    }

    /// Issue cycle of vector `v` (`v < vectors`, so it is below `cycles`: no overflow).
    pub(super) fn issue(&self, v: u64) -> u64 {
        (v / self.group) * self.stride + v % self.group
    }

    /// The schedule of `op` on `n` elements; an [`HwError::Shape`] error if its cycle count does
    /// not fit 64 bits.
    pub(super) fn new(cfg: &HwConfig, op: &VpuOp, n: usize) -> Result<VpuSchedule, HwError> {
        let l = cfg.vpu.lanes.max(1);
        let d = cfg.vpu.pipeline_depth;
        let err = || HwError::Shape {
            op: format!("vpu.{}", op.name()),
            detail: format!("{n} elements: the cycle count does not fit 64 bits"),
        };
        let lin = |v: u64, k: u64, tail: u64| v.checked_mul(k).and_then(|x| x.checked_add(tail)).ok_or_else(err);
        Ok(match op.reduction() {
            None => {
                let k = op.outputs() as u64;
                let v = n.div_ceil(l) as u64;
                let tail = d.checked_add(1).ok_or_else(err)?;
                VpuSchedule { vectors: v, group: 1, stride: k, cycles: lin(v, k, tail)?, stages: 0 }
            }
            Some((cols, Axis::Col, _)) => {
                let rows = (n / cols.max(1)) as u64;
                let v = rows.checked_mul(cols.div_ceil(l) as u64).ok_or_else(err)?;
                VpuSchedule { vectors: v, group: 1, stride: 1, cycles: lin(v, 1, 3)?, stages: 0 }
            }
            Some((cols, Axis::Row, _)) => {
                let rows = (n / cols.max(1)) as u64;
                let nv = cols.div_ceil(l) as u64;
                let stages = tree_stages(cols.min(l));
                let per = nv + stages as u64;
                let vectors = rows.checked_mul(nv).ok_or_else(err)?;
                VpuSchedule { vectors, group: nv.max(1), stride: per, cycles: lin(rows, per, 3)?, stages }
            }
        })
    }
}

/// `ceil(log2(k))` for `k >= 1`.
pub(super) fn tree_stages(k: usize) -> u32 {
    usize::BITS - k.saturating_sub(1).leading_zeros()
}
