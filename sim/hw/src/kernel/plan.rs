//! An op's tiling and its costs, from the shapes alone: [`Plan`], [`Geometry`], the whole-op
//! [`timing()`] and its host-memory estimate ([`timing_host_bytes`]).

use crate::budget::{product, sum};
use crate::config::{Dataflow, HwConfig, SramConfig};
use crate::error::HwError;
use crate::memory::dma::Transfer;
use crate::mxu::{self, Fold, Schedule};
use crate::timing::{self, OpTiming, TileTiming, TileWork};
use crate::vpu;

use super::spec::{shape_err, vpu_ops};
use super::KernelSpec;

/// The op's tiling: its tiles' work and the tile buffers the DMA cycles through.
struct Plan {
    tiles: Vec<TileWork>,
    buffers: usize,
}

fn overflow(kind: &KernelSpec, memory: &str, field: &str, what: String, needed: u64, available: u64) -> HwError {
    HwError::SramOverflow {
        op: kind.describe(),
        memory: memory.into(),
        field: field.into(),
        what,
        needed_bytes: needed,
        available_bytes: available,
    }
}

/// VPU cycles of each sub-op of a chunk of `len` elements (`len / cols` rows for softmax).
fn vpu_chunk_cycles(cfg: &HwConfig, kind: &KernelSpec, len: usize) -> Result<Vec<u64>, HwError> {
    match *kind {
        KernelSpec::Softmax { cols, .. } => {
            let rows = len / cols;
            let ops = vpu_ops(kind, cols);
            let lens = [len, len, len, len, rows, len];
            ops.iter().zip(lens).map(|(o, n)| Ok(vpu::try_timing(cfg, o, n)?.cycles)).collect()
        }
        _ => vpu_ops(kind, 1).iter().map(|o| Ok(vpu::try_timing(cfg, o, len)?.cycles)).collect(),
    }
}

/// An op's tiling on a machine in numbers, found without allocating anything proportional to
/// the op: what [`build_plan`] builds from and what [`timing_host_bytes`] estimates from.
struct Geometry {
    /// Tiles: MXU folds or VPU chunks.
    count: usize,
    /// Tile buffers `B` (at most `dma.buffers`; fewer if they do not fit).
    buffers: usize,
    /// VPU ops: units (elements, or rows for softmax) per chunk; 0 for MXU ops.
    chunk: usize,
    /// VPU ops: elements per unit (softmax: `cols`, else 1).
    unit: usize,
}

/// Checks that `kind` can run on `cfg` (shape, DRAM and SRAM fit) and sizes its tiling.
fn geometry(cfg: &HwConfig, kind: &KernelSpec) -> Result<Geometry, HwError> {
    kind.check_on(cfg)?;
    let lens = kind.input_lens();
    // From here every length is below the DRAM's 2^31 words, so products below fit 64 bits.
    let m = &cfg.memory;
    let nb = cfg.dma.buffers.max(1);
    if let Some((mm, kk, nn)) = kind.gemm_dims() {
        let (r, c) = (cfg.mxu.rows, cfg.mxu.cols);
        let ub = &m.unified_buffer;
        let need = lens[0] as u64 * ub.word_bytes();
        if need > ub.bytes {
            return Err(overflow(
                kind,
                "unified buffer",
                "memory.unified_buffer.bytes",
                format!("the whole activation input, {} elements", lens[0]),
                need,
                ub.bytes,
            ));
        }
        let acc = &m.accumulator;
        let need = (mm * nn) as u64 * acc.word_bytes();
        if need > acc.bytes {
            return Err(overflow(
                kind,
                "accumulator",
                "memory.accumulator.bytes",
                format!("the {mm}x{nn} output"),
                need,
                acc.bytes,
            ));
        }
        let wb = &m.weight_buffer;
        // IS streams the fold's `kr x N` rows of W (the stationary A tile comes from the UB).
        let slot_words = mxu::access::weight_slot_words(&cfg.mxu, kk, nn) as u64;
        let buffers = (wb.words() / slot_words).min(nb as u64) as usize;
        if buffers == 0 {
            return Err(overflow(
                kind,
                "weight buffer",
                "memory.weight_buffer.bytes",
                format!("one weight tile of {slot_words} elements"),
                slot_words * wb.word_bytes(),
                wb.bytes,
            ));
        }
        let count = match cfg.mxu.dataflow {
            Dataflow::WeightStationary => kk.div_ceil(r) * nn.div_ceil(c),
            Dataflow::OutputStationary => mm.div_ceil(r) * nn.div_ceil(c),
            Dataflow::InputStationary => kk.div_ceil(r) * mm.div_ceil(c),
        };
        return Ok(Geometry { count, buffers, chunk: 0, unit: 0 });
    }
    // VPU ops.
    let ub = &m.unified_buffer;
    if ub.word_bits < 32 {
        return Err(HwError::Shape {
            op: kind.describe(),
            detail: format!("VPU ops keep fp32 data in the unified buffer, which has {}-bit words (memory.unified_buffer.word_bits must be 32)", ub.word_bits),
        });
    }
    let (ni, no) = (lens.len() as u64, kind.output_lens().len() as u64);
    let per_elem = (ni + no) * nb as u64;
    let (unit, total) = match *kind {
        KernelSpec::Softmax { rows, cols } => (cols, rows),
        _ => (1, lens[0]),
    };
    let cap_units = (ub.words() / (per_elem * unit as u64)) as usize;
    let lanes = cfg.vpu.lanes;
    // Whole vectors per chunk where possible (rows for softmax).
    let chunk = if unit == 1 && cap_units >= lanes { cap_units / lanes * lanes } else { cap_units };
    if chunk == 0 {
        return Err(overflow(
            kind,
            "unified buffer",
            "memory.unified_buffer.bytes",
            format!(
                "{nb} buffers of {ni} inputs + {no} outputs for one {}",
                if unit == 1 { "element".to_string() } else { format!("row of {unit}") }
            ),
            per_elem * unit as u64 * ub.word_bytes(),
            ub.bytes,
        ));
    }
    let chunk = chunk.min(total);
    Ok(Geometry { count: total.div_ceil(chunk), buffers: nb, chunk, unit })
}

fn build_plan(cfg: &HwConfig, kind: &KernelSpec) -> Result<Plan, HwError> {
    let g = geometry(cfg, kind)?;
    let lens = kind.input_lens();
    let m = &cfg.memory;
    if let Some((mm, kk, nn)) = kind.gemm_dims() {
        let (r, c) = (cfg.mxu.rows, cfg.mxu.cols);
        let (ub, acc, wb) = (&m.unified_buffer, &m.accumulator, &m.weight_buffer);
        let sched = Schedule::new(&cfg.mxu, mm, kk, nn)?;
        let eb = cfg.mxu.input_format.bits() as u64 / 8;
        let tiles = sched
            .folds
            .iter()
            .enumerate()
            .map(|(f, fold)| {
                let mut loads = Vec::new();
                if f == 0 {
                    loads.push((lens[0] as u64 * eb, ub.clone()));
                }
                let wrows = match cfg.mxu.dataflow {
                    Dataflow::WeightStationary | Dataflow::InputStationary => fold.kr,
                    Dataflow::OutputStationary => kk,
                };
                loads.push(((wrows * fold.nc) as u64 * eb, wb.clone()));
                let (latency, release) = match cfg.mxu.dataflow {
                    Dataflow::WeightStationary => ((mm + r + fold.nc) as u64, (r + c - 1) as u64),
                    Dataflow::OutputStationary => (sched.period, (kk + c - 1) as u64),
                    // The last row of W enters the array's last row at `N + R - 1`.
                    Dataflow::InputStationary => ((nn + r + fold.mr) as u64, (nn + r) as u64),
                };
                let stores = match store_rows(cfg, &sched, f) {
                    Some(rows) => vec![((rows * fold.nc) as u64 * acc.word_bytes(), acc.clone())],
                    None => vec![],
                };
                TileWork { loads, occupancy: sched.period, latency: latency.max(sched.period), release, stores }
            })
            .collect();
        return Ok(Plan { tiles, buffers: g.buffers });
    }
    // VPU ops.
    let ub = &m.unified_buffer;
    let (ni, no) = (lens.len(), kind.output_lens().len());
    let (chunk, unit) = (g.chunk, g.unit);
    let total = lens[0] / unit;
    let tiles = (0..g.count)
        .map(|f| {
            let units = chunk.min(total - f * chunk);
            let elems = (units * unit) as u64;
            let cyc = vpu_chunk_cycles(cfg, kind, elems as usize)?.iter().try_fold(0u64, |a, &c| a.checked_add(c));
            let cyc = cyc.ok_or_else(|| shape_err(kind, "a chunk's cycle count does not fit 64 bits".into()))?;
            Ok(TileWork {
                loads: (0..ni).map(|_| (elems * 4, ub.clone())).collect(),
                occupancy: cyc,
                latency: cyc,
                release: cyc,
                stores: (0..no).map(|_| (elems * 4, ub.clone())).collect(),
            })
        })
        .collect::<Result<_, HwError>>()?;
    Ok(Plan { tiles, buffers: g.buffers })
}

/// Rows stored after fold `f` if its output tile is complete (WS: last K fold of an N tile;
/// IS: last K fold of an M tile).
fn store_rows(cfg: &HwConfig, s: &Schedule, f: usize) -> Option<usize> {
    let fold = &s.folds[f];
    match cfg.mxu.dataflow {
        Dataflow::WeightStationary => (fold.k0 + fold.kr == s.k).then_some(s.m),
        Dataflow::OutputStationary => Some(fold.mr),
        Dataflow::InputStationary => (fold.k0 + fold.kr == s.k).then_some(fold.mr),
    }
}

/// Whole-op timing of `kind` on `cfg` (errors if the shape is invalid, a tile cannot fit, or a
/// count does not fit 64 bits; never panics).
pub fn timing(cfg: &HwConfig, kind: &KernelSpec) -> Result<OpTiming, HwError> {
    let p = build_plan(cfg, kind)?;
    plan_timing(cfg, kind, &p)
}

fn plan_timing(cfg: &HwConfig, kind: &KernelSpec, p: &Plan) -> Result<OpTiming, HwError> {
    let (work, width, out_db) = match kind.gemm_dims() {
        // Below 2^62 (each of M*K and K*N fits the DRAM); saturating all the same.
        Some((m, k, n)) => (m.saturating_mul(k).saturating_mul(n) as f64, (cfg.mxu.rows * cfg.mxu.cols) as f64, false),
        None => {
            let n = kind.input_lens()[0] * kind.output_lens().len();
            (n as f64, cfg.vpu.lanes as f64, true)
        }
    };
    timing::plan(cfg, &kind.describe(), &p.tiles, p.buffers, out_db, work, width)
}

/// Host bytes [`timing()`] needs for `kind` on `cfg` (its tile plan and timing), estimated
/// before anything is allocated; errors as [`timing()`]'s, `Ok(None)` beyond 2^64.
pub fn timing_host_bytes(cfg: &HwConfig, kind: &KernelSpec) -> Result<Option<u64>, HwError> {
    Ok(plan_bytes(kind, &geometry(cfg, kind)?))
}

/// Host bytes of the tile plan of `kind` with geometry `g` and of its two timings.
fn plan_bytes(kind: &KernelSpec, g: &Geometry) -> Option<u64> {
    let (ins, outs) = (kind.input_lens(), kind.output_lens());
    let gemm = kind.gemm_dims();
    // Per tile: its work (loads and stores listed inline), and in each of the two timing plans
    // (with and without DMA) its timing and five per-tile scratch vectors; per transfer: its
    // record, its interval in the DMA-busy union and its entry in the run's action list.
    let parts = match gemm {
        Some(_) => 3,
        None => ins.len() + outs.len(),
    };
    let transfers = product(&[g.count, parts]).and_then(|t| t.checked_add(1));
    let per_tile = size_of::<TileWork>() + parts * size_of::<(u64, SramConfig)>();
    let per_timing_tile = size_of::<TileTiming>() + 5 * size_of::<u64>() + size_of::<Option<u64>>() + 16;
    let per_transfer = size_of::<Transfer>() + 16 + 24;
    sum(&[
        product(&[g.count, per_tile]),
        product(&[g.count, 2 * per_timing_tile]),
        transfers.and_then(|t| t.checked_mul(2 * per_transfer as u64)),
        // The fold schedule, and the copy the gemm path runs from.
        if gemm.is_some() { product(&[g.count, 2 * size_of::<Fold>()]) } else { Some(0) },
    ])
}
