//! Whole-op cycle accounting: a tile pipeline of DMA loads, compute and DMA stores.
//!
//! An op is a sequence of tiles (MXU folds, or VPU chunks). Tile `f` needs some loads
//! (DRAM -> SRAM), keeps its compute unit busy for `occupancy_f` cycles (the unit can start the
//! next tile after that), has its results in SRAM `latency_f >= occupancy_f` cycles after it
//! starts, and may then store bytes back to DRAM. With `B = dma.buffers` tile buffers:
//!
//! ```text
//! DMA order (one engine, in order): loads of tiles 0..B, then for each f: loads of f+B, store of f
//! load of tile f+B may start at   cs_f + release_f              (tile f's buffer is free)
//! store of tile f may start at    ready_f = cs_f + latency_f
//! a transfer requested at dep:    data_start = max(end of the previous transfer, dep + overhead)
//!                                 end = data_start + ceil(bytes / bw)
//!                                 (requests are pipelined: one transfer's latency overlaps the
//!                                 previous one's data phase; data phases are serial)
//! compute start  cs_f = max(cs_{f-1} + occupancy_{f-1}, end of tile f's loads,
//!                           end of the store of tile f-B  if outputs are double-buffered)
//! total = max(ready_last, end of the last store)
//! ```
//!
//! (`overhead` and `bw` as in [`crate::memory::dma`]; the transfer's `start` is `data_start - overhead`.)
//! So a DMA-bound op takes `overhead + sum ceil(bytes_i / bw)` plus the compute it cannot hide
//! (before the first and after the last transfer) and any wait for a buffer to be released.
//! The whole op's cycles are this
//! critical path, not a sum. The schedule depends only on shapes and the config, so it is the
//! same in every execution mode (Invariant 4); values are computed elsewhere.
//!
//! Derived counters: `compute_cycles` is the same plan with free DMA (the compute-bound time;
//! for an MXU op it equals the MXU schedule's total cycles); `dma_cycles` counts cycles with a
//! transfer in flight (union of `[start, end)`); `stall_cycles` = `sum_f (cs_f - (cs_{f-1} + occupancy_{f-1}))`, compute waiting for
//! data; `overlap_cycles` counts cycles in which the DMA and the compute unit are both busy
//! (compute busy = union of `[cs_f, ready_f)`).

use crate::config::{HwConfig, SramConfig};
use crate::error::HwError;
use crate::memory::dma::{bandwidth, data_cycles, overhead, Direction, Transfer};
use serde::{Deserialize, Serialize};

/// What one tile needs, in bytes and cycles.
#[derive(Debug, Clone, PartialEq)]
pub struct TileWork {
    /// Loads before the tile may compute: (bytes, destination SRAM config).
    pub loads: Vec<(u64, SramConfig)>,
    /// Cycles the compute unit is busy before it may start the next tile.
    pub occupancy: u64,
    /// Cycles from compute start until the tile's results are in SRAM (`>= occupancy`).
    pub latency: u64,
    /// Cycles from compute start after which the tile's input buffer may be refilled.
    pub release: u64,
    /// Stores to DRAM once the results are ready: (bytes, source SRAM config).
    pub stores: Vec<(u64, SramConfig)>,
}

/// The timing of one tile.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TileTiming {
    /// Start of the tile's first load (its compute start if it has none); the origin of
    /// fault times on non-MXU sites.
    pub origin: u64,
    /// End of the tile's last load.
    pub loaded: u64,
    /// Compute start.
    pub compute_start: u64,
    /// Results in SRAM.
    pub ready: u64,
    /// End of the tile's store (= `ready` when it stores nothing).
    pub stored: u64,
}

/// Whole-op timing breakdown, identical in every execution mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpTiming {
    /// Critical-path cycles of the whole op.
    pub total_cycles: u64,
    /// Compute-bound cycles (the same plan with free DMA).
    pub compute_cycles: u64,
    /// Cycles with at least one DMA transfer in flight.
    pub dma_cycles: u64,
    /// Cycles the compute unit waited for data.
    pub stall_cycles: u64,
    /// Cycles with DMA and compute both busy.
    pub overlap_cycles: u64,
    /// Bytes loaded from DRAM.
    pub load_bytes: u64,
    /// Bytes stored to DRAM.
    pub store_bytes: u64,
    /// `compute_cycles / total_cycles`: 1 when compute-bound.
    pub compute_fraction: f64,
    /// Useful work / (total cycles x unit width): PE-cycles (MXU) or lane-cycles (VPU).
    pub utilization: f64,
    /// `"compute"` or `"dma"`: which resource the op is bound by.
    pub bound: String,
    /// Per-tile timing.
    pub tiles: Vec<TileTiming>,
    /// Every transfer, in DMA order.
    pub transfers: Vec<Transfer>,
}

/// Plans a tile pipeline. `outputs_double_buffered`: tile `f`'s output buffer is reused by tile
/// `f + B` (VPU chunks); otherwise outputs have their own space (the accumulator).
/// `work_units` and `width` set `utilization = work_units / (total * width)`.
/// `buffers` is the number of tile buffers `B` (at most `dma.buffers`; fewer if they do not fit).
///
/// Every cycle and byte count is checked: one that does not fit 64 bits (possible only for a
/// config outside its documented ranges, or an absurdly large op) is an [`HwError::Overflow`]
/// naming `what` (the op) and the fields it grows with, never a wrapped number.
pub fn plan(
    cfg: &HwConfig,
    what: &str,
    tiles: &[TileWork],
    buffers: usize,
    outputs_double_buffered: bool,
    work_units: f64,
    width: f64,
) -> Result<OpTiming, HwError> {
    let mut t = plan_inner(cfg, what, tiles, buffers, outputs_double_buffered, false)?;
    let ideal = plan_inner(cfg, what, tiles, buffers, outputs_double_buffered, true)?;
    t.compute_cycles = ideal.total_cycles;
    t.compute_fraction = if t.total_cycles == 0 { 1.0 } else { t.compute_cycles as f64 / t.total_cycles as f64 };
    t.bound = if t.total_cycles > t.compute_cycles { "dma" } else { "compute" }.into();
    t.utilization = if t.total_cycles == 0 { 0.0 } else { work_units / (t.total_cycles as f64 * width) };
    Ok(t)
}

/// The config fields every DMA-driven cycle count grows with (besides the op's size).
const DMA_FIELDS: &str =
    "the op's size, `dma.setup_cycles`, `dram.latency_cycles` and `dram.bandwidth_bytes_per_cycle`";

fn plan_inner(
    cfg: &HwConfig,
    what: &str,
    tiles: &[TileWork],
    buffers: usize,
    out_db: bool,
    free_dma: bool,
) -> Result<OpTiming, HwError> {
    let overflow = |quantity: &str, drivers: &str| HwError::Overflow {
        what: what.to_string(),
        quantity: quantity.to_string(),
        drivers: drivers.to_string(),
    };
    let cycles = || overflow("the tile pipeline's cycle count", DMA_FIELDS);
    let add = |a: u64, b: u64| a.checked_add(b).ok_or_else(cycles);
    let oh = if free_dma {
        0
    } else {
        overhead(cfg)
            .ok_or_else(|| overflow("a transfer's fixed cost", "`dma.setup_cycles` + `dram.latency_cycles`"))?
    };
    let nb = buffers.max(1);
    let n = tiles.len();
    let mut dma_free = 0u64;
    let mut transfers = Vec::with_capacity(tiles.iter().map(|t| t.loads.len() + t.stores.len()).sum());
    let mut origin = vec![None::<u64>; n];
    let mut loaded = vec![0u64; n];
    let mut stored = vec![0u64; n];
    let (mut load_bytes, mut store_bytes) = (0u64, 0u64);
    let bytes_overflow = || overflow("the DRAM traffic in bytes", "the op's size");
    let issue = |dir: Direction,
                 bytes: u64,
                 sram: &SramConfig,
                 dep: u64,
                 who: (usize, usize),
                 dma_free: &mut u64,
                 tr: &mut Vec<Transfer>|
     -> Result<(u64, u64), HwError> {
        if bytes == 0 {
            return Ok((dep, dep));
        }
        let dc = if free_dma {
            0
        } else {
            data_cycles(bytes, bandwidth(cfg, sram, dir)).ok_or_else(|| {
                overflow(
                    &format!("the data phase of a {bytes}-byte transfer"),
                    "`dram.bandwidth_bytes_per_cycle` (bytes / bandwidth)",
                )
            })?
        };
        // The request goes out at `dep` at the earliest; its data phase follows the previous one.
        let data_start = (*dma_free).max(add(dep, oh)?);
        let (start, end) = (data_start - oh, add(data_start, dc)?);
        *dma_free = end;
        tr.push(Transfer { dir, bytes, start, end, tile: who.0, part: who.1 });
        Ok((start, end))
    };
    let mut load = |f: usize,
                    dep: u64,
                    dma_free: &mut u64,
                    tr: &mut Vec<Transfer>,
                    origin: &mut [Option<u64>],
                    loaded: &mut [u64]|
     -> Result<(), HwError> {
        loaded[f] = dep;
        for (part, (bytes, sram)) in tiles[f].loads.iter().enumerate() {
            let (s, e) = issue(Direction::Load, *bytes, sram, dep, (f, part), dma_free, tr)?;
            origin[f].get_or_insert(s);
            loaded[f] = e;
            load_bytes = load_bytes.checked_add(*bytes).ok_or_else(bytes_overflow)?;
        }
        Ok(())
    };
    for f in 0..n.min(nb) {
        load(f, 0, &mut dma_free, &mut transfers, &mut origin, &mut loaded)?;
    }
    let mut cs = vec![0u64; n];
    let mut ready = vec![0u64; n];
    let mut stall = 0u64;
    for f in 0..n {
        let earliest = if f == 0 { 0 } else { add(cs[f - 1], tiles[f - 1].occupancy)? };
        let mut start = earliest.max(loaded[f]);
        if out_db && f >= nb {
            start = start.max(stored[f - nb]);
        }
        // Each stall ends before `start`, and stalls do not overlap, so the sum is <= `start`.
        stall += start - earliest;
        cs[f] = start;
        ready[f] = add(start, tiles[f].latency)?;
        if f + nb < n {
            load(f + nb, add(start, tiles[f].release)?, &mut dma_free, &mut transfers, &mut origin, &mut loaded)?;
        }
        stored[f] = ready[f];
        for (part, (bytes, sram)) in tiles[f].stores.iter().enumerate() {
            let (_, e) = issue(Direction::Store, *bytes, sram, ready[f], (f, part), &mut dma_free, &mut transfers)?;
            stored[f] = e;
            store_bytes = store_bytes.checked_add(*bytes).ok_or_else(bytes_overflow)?;
        }
    }
    let total = ready.iter().chain(&stored).copied().max().unwrap_or(0);
    // Unions of intervals inside [0, total]: their lengths sum to at most `total`.
    let dma = merge(transfers.iter().map(|t| (t.start, t.end)).collect());
    let dma_cycles = dma.iter().map(|(s, e)| e - s).sum();
    let busy = merge((0..n).map(|f| (cs[f], ready[f])).collect());
    let overlap =
        dma.iter().map(|&(a, b)| busy.iter().map(|&(s, e)| e.min(b).saturating_sub(s.max(a))).sum::<u64>()).sum();
    Ok(OpTiming {
        total_cycles: total,
        compute_cycles: 0,
        dma_cycles,
        stall_cycles: stall,
        overlap_cycles: overlap,
        load_bytes,
        store_bytes,
        compute_fraction: 0.0,
        utilization: 0.0,
        bound: String::new(),
        tiles: (0..n)
            .map(|f| TileTiming {
                origin: origin[f].unwrap_or(cs[f]).min(cs[f]),
                loaded: loaded[f],
                compute_start: cs[f],
                ready: ready[f],
                stored: stored[f],
            })
            .collect(),
        transfers,
    })
}

/// Sorted union of half-open intervals.
fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in v {
        match out.last_mut() {
            Some(l) if s <= l.1 => l.1 = l.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dataflow;
    use faultline_num::Precision;

    fn work(n: usize, load: u64, occ: u64) -> Vec<TileWork> {
        let c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        let s = c.memory.unified_buffer.clone();
        (0..n)
            .map(|_| TileWork {
                loads: vec![(load, s.clone())],
                occupancy: occ,
                latency: occ + 2,
                release: occ,
                stores: vec![],
            })
            .collect()
    }

    #[test]
    fn free_dma_gives_compute_time() {
        let c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        let t = plan(&c, "test", &work(5, 1000, 10), 2, false, 1.0, 1.0).unwrap();
        assert_eq!(t.total_cycles, 4 * 10 + 12);
        assert_eq!(t.stall_cycles, 0);
        assert_eq!(t.bound, "compute");
    }

    #[test]
    fn double_buffering_hides_loads_when_compute_bound() {
        let mut c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        c.dram.bandwidth_bytes_per_cycle = 10.0;
        // Each load takes 8 cycles, each tile computes for 10: only the first load is exposed.
        let t = plan(&c, "test", &work(6, 80, 10), 2, false, 1.0, 1.0).unwrap();
        assert_eq!(t.total_cycles, 8 + 5 * 10 + 12);
        assert_eq!(t.stall_cycles, 8);
        let t1 = plan(&c, "test", &work(6, 80, 10), 1, false, 1.0, 1.0).unwrap();
        // Without a second buffer every load waits for the previous tile's compute.
        assert_eq!(t1.total_cycles, 6 * (8 + 10) + 2);
    }

    #[test]
    fn counts_past_64_bits_are_errors_naming_the_fields() {
        let mut c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        // Outside the config's range (validate refuses it): the old code wrapped to a tiny total.
        c.dram.latency_cycles = u64::MAX;
        c.dma.setup_cycles = 8;
        c.dram.bandwidth_bytes_per_cycle = 16.0;
        let e = plan(&c, "op matmul 16x8x8", &work(3, 100, 10), 2, false, 1.0, 1.0).unwrap_err().to_string();
        assert!(
            e.contains("op matmul 16x8x8") && e.contains("dram.latency_cycles") && e.contains("dma.setup_cycles"),
            "{e}"
        );
        c.dram.latency_cycles = u64::MAX - 100;
        c.dma.setup_cycles = 0;
        let e = plan(&c, "x", &work(3, 100, 10), 2, false, 1.0, 1.0).unwrap_err().to_string();
        assert!(e.contains("overflows 64 bits") && e.contains("dram.latency_cycles"), "{e}");
        c.dram.latency_cycles = 0;
        c.dram.bandwidth_bytes_per_cycle = 1e-17;
        let e = plan(&c, "x", &work(1, 1 << 40, 10), 2, false, 1.0, 1.0).unwrap_err().to_string();
        assert!(e.contains("dram.bandwidth_bytes_per_cycle"), "{e}");
        // Compute alone can overflow too (a tile occupying the unit for 2^63 cycles, twice).
        c.dram.bandwidth_bytes_per_cycle = f64::INFINITY;
        let e = plan(&c, "x", &work(3, 8, 1 << 63), 2, false, 1.0, 1.0).unwrap_err().to_string();
        assert!(e.contains("cycle count overflows"), "{e}");
    }

    #[test]
    fn dma_bound_time_is_bytes_over_bandwidth() {
        let mut c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        c.dram.bandwidth_bytes_per_cycle = 1.0;
        let t = plan(&c, "test", &work(6, 100, 10), 2, false, 1.0, 1.0).unwrap();
        assert_eq!(t.dma_cycles, 600);
        assert_eq!(t.total_cycles, 600 + 12);
        assert_eq!(t.bound, "dma");
    }
}
