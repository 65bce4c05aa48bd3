//! What an instruction costs: its cycles from the unit's own schedule, how long it occupies the
//! unit, and where a cycle of it falls in the unit's folds or vectors (fault times).

use super::{ExecUnit, Instr};
use crate::error::HwError;
use crate::fault::FaultTime;
use crate::memory::dma::{self, Direction};
use crate::{mxu, vpu, HwConfig};

/// Cycles of `instr` on `cfg`, from the unit's schedule (the same in every mode, and what
/// [`execute`](super::execute) reports): from issue until its last result is written. Saturates at `u64::MAX`
/// for shapes whose count does not fit.
pub fn cycles(cfg: &HwConfig, instr: &Instr) -> u64 {
    match instr {
        Instr::Gemm { m, k, n, .. } => mxu::gemm_timing(&cfg.mxu, *m, *k, *n).total_cycles,
        Instr::Vpu { op, .. } => vpu::timing(cfg, op, instr.lane_elements()).cycles,
        Instr::Dma { dir, sram, len, .. } => {
            dma::transfer_cycles(cfg, (*len as u64).saturating_mul(4), dma_bandwidth(cfg, *dir, *sram))
                .unwrap_or(u64::MAX)
        }
    }
}

/// Cycles an instruction of `cycles` cycles on `unit` keeps the unit from issuing the next one.
/// The MXU and VPU are busy throughout; the DMA engine pipelines requests, so a transfer's
/// fixed overhead (`dma_overhead`, [`dma::overhead`] of the config) overlaps the previous
/// transfer's data phase and only the data phase occupies the engine.
pub fn occupancy(unit: ExecUnit, cycles: u64, dma_overhead: u64) -> u64 {
    match unit {
        ExecUnit::Dma => cycles.saturating_sub(dma_overhead),
        _ => cycles,
    }
}

/// Bandwidth of a transfer to or from `sram` (the accumulator's ports for `Acc`, else the
/// unified buffer's).
fn dma_bandwidth(cfg: &HwConfig, dir: Direction, sram: crate::Unit) -> f64 {
    let s = cfg.memory.sram(sram).unwrap_or(&cfg.memory.unified_buffer);
    dma::bandwidth(cfg, s, dir)
}

/// For a DMA instruction of `len` words issued at `start`: the cycle word `i` moves (read from
/// the source and written to the destination, [`dma::word_cycle`]).
pub fn dma_word_cycle(cfg: &HwConfig, instr: &Instr, start: u64, i: u64) -> Option<u64> {
    match instr {
        Instr::Dma { dir, sram, .. } => Some(dma::word_cycle(cfg, start, i, 4, dma_bandwidth(cfg, *dir, *sram))),
        _ => None,
    }
}

/// Where cycle `cycle` of `instr` (counted from the instruction's first cycle) falls in its
/// unit's tiles: the last MXU fold (GEMM) or VPU vector that started at or before it, and the
/// offset from that tile's origin, as a [`FaultTime`] the unit's fault hook takes. `None` past
/// the instruction's end, or before the first fold of a GEMM starts (no MXU register holds an
/// operand yet).
pub fn fault_time(cfg: &HwConfig, instr: &Instr, cycle: u64) -> Result<Option<FaultTime>, HwError> {
    Ok(match instr {
        Instr::Gemm { m, k, n, .. } => {
            let s = mxu::Schedule::new(&cfg.mxu, *m, *k, *n)?;
            let tile = s.folds.partition_point(|f| f.start <= cycle).checked_sub(1);
            tile.filter(|_| cycle < s.total_cycles).map(|t| FaultTime { tile: t, cycle: cycle - s.folds[t].start })
        }
        Instr::Vpu { op, .. } => vpu::vector_at(cfg, op, instr.lane_elements(), cycle)?
            .map(|(v, origin)| FaultTime { tile: usize::try_from(v).unwrap_or(usize::MAX), cycle: cycle - origin }),
        Instr::Dma { .. } => (cycle < cycles(cfg, instr)).then_some(FaultTime { tile: 0, cycle }),
    })
}
