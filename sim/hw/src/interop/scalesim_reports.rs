//! SCALE-Sim's three reports (COMPUTE_REPORT.csv, BANDWIDTH_REPORT.csv,
//! DETAILED_ACCESS_REPORT.csv) of a topology run on Faultline's array: SCALE-Sim's column
//! names, filled by its conventions or Faultline's, then Faultline's own columns.

use super::scalesim::{Layer, ScaleSimConfig, ScaleSimCounts};
use crate::mxu::Schedule;
use crate::HwConfig;
use std::path::{Path, PathBuf};

/// Whose conventions fill SCALE-Sim's columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Convention {
    /// SCALE-Sim's: folds padded to the array, never overlapping, weights loaded before each
    /// fold, no OS drain, the last cycle's index (its numbers, exactly).
    Scalesim,
    /// Faultline's: the register-level array's cycles (overlapped WS folds, OS drain, ragged
    /// tails), DMA stalls, and its own access counts.
    Faultline,
}

/// A report that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The output directory could not be created.
    #[error("cannot create {}", .0.display())]
    Create(PathBuf, #[source] std::io::Error),
    /// A report file could not be written.
    #[error("cannot write {}", .0.display())]
    Write(PathBuf, #[source] csv::Error),
    /// A report file could not be flushed (an I/O error, kept as it is: the chain of causes
    /// then reads as a write error's does).
    #[error("cannot write {}", .0.display())]
    Flush(PathBuf, #[source] std::io::Error),
}

/// One layer's results: SCALE-Sim's counts for its mapping beside Faultline's measurements.
pub struct LayerResult {
    /// The layer.
    pub layer: Layer,
    /// Its GEMM, `[M, K, N]`.
    pub gemm: [usize; 3],
    /// SCALE-Sim's counts ([`super::scalesim::counts`]).
    pub ss: ScaleSimCounts,
    /// The register-level array's cycles (a count, from first operand in to last accumulator
    /// write).
    pub array_cycles: u64,
    /// The array's operand-feeding cycles.
    pub feed_cycles: u64,
    /// The op through DMA and SRAM on the machine.
    pub dma: DmaCycles,
    /// Whether the operands fit the .cfg's SRAMs (else it was timed with SRAMs grown to fit,
    /// [`grown`]).
    pub fits: bool,
    /// Faultline's SRAM accesses ([`access`]).
    pub access: Access,
}

/// What is kept of a layer's op timing (its tiles and transfers are not: a row per layer is
/// held for the whole topology).
pub struct DmaCycles {
    /// Cycles in all.
    pub total: u64,
    /// Cycles the array waited for DMA.
    pub stall: u64,
    /// DMA cycles overlapped with compute.
    pub overlap: u64,
}

/// Faultline's SRAM accesses for one GEMM, from its fold schedule.
#[derive(Default, Clone, Copy)]
pub struct Access {
    /// Input words read.
    pub ifmap_reads: u64,
    /// Weight words read.
    pub filter_reads: u64,
    /// Accumulator words written.
    pub acc_writes: u64,
    /// Accumulator words read back (folds that add to them).
    pub acc_reads: u64,
}

/// Accesses of schedule `s`: each fold reads its `mr x kr` tile of the input and its `kr x nc`
/// tile of the weights once (whichever of them stays in the PEs and whichever streams), writes
/// its `mr x nc` outputs to the accumulators, and reads them back first when it adds to them.
pub fn access(s: &Schedule) -> Access {
    let mut a = Access::default();
    for f in &s.folds {
        let outs = (f.mr * f.nc) as u64;
        a.ifmap_reads += (f.mr * f.kr) as u64;
        a.filter_reads += (f.kr * f.nc) as u64;
        a.acc_writes += outs;
        if !f.overwrite {
            a.acc_reads += outs;
        }
    }
    a
}

/// `hw` with every SRAM at its largest (1 GiB), for timing a layer whose operands the .cfg's
/// SRAMs cannot hold whole (Faultline keeps a GEMM's operands resident).
pub fn grown(hw: &HwConfig) -> HwConfig {
    let mut g = hw.clone();
    for s in [&mut g.memory.unified_buffer, &mut g.memory.weight_buffer, &mut g.memory.accumulator] {
        s.bytes = 1 << 30;
    }
    g
}

/// A report in SCALE-Sim's style, `, `-separated with each row ending in a comma, written by
/// the csv crate so a field that needs quotes (a layer named `a,b`) gets them: each field after
/// the first starts with its space, and an empty field ends the row.
struct Report {
    path: PathBuf,
    w: csv::Writer<std::fs::File>,
}

impl Report {
    fn create(path: PathBuf) -> Result<Report, ReportError> {
        match csv::Writer::from_path(&path) {
            Ok(w) => Ok(Report { path, w }),
            Err(e) => Err(ReportError::Write(path, e)),
        }
    }

    fn row(&mut self, cells: &[String]) -> Result<(), ReportError> {
        let fields = cells
            .iter()
            .enumerate()
            .map(|(i, c)| if i == 0 { c.clone() } else { format!(" {c}") })
            .chain([String::new()]);
        self.w.write_record(fields).map_err(|e| ReportError::Write(self.path.clone(), e))
    }

    fn finish(mut self) -> Result<(), ReportError> {
        self.w.flush().map_err(|e| ReportError::Flush(self.path, e))
    }
}

/// Writes SCALE-Sim's three reports of `rows` (one per layer, in order) into `dir` (created if
/// needed), SCALE-Sim's columns filled by `conv`, then Faultline's own.
pub fn write_reports(
    dir: &Path,
    cfg: &ScaleSimConfig,
    conv: Convention,
    rows: &[LayerResult],
) -> Result<(), ReportError> {
    std::fs::create_dir_all(dir).map_err(|e| ReportError::Create(dir.to_path_buf(), e))?;
    let pe = (cfg.rows * cfg.cols) as f64;
    let faultline_cols = [
        "Layer",
        "M",
        "K",
        "N",
        "Faultline Array Cycles",
        "Faultline Cycles (with DMA)",
        "Faultline DMA Stall Cycles",
        "Faultline DMA Overlap Cycles",
        "Faultline SRAMs Fit",
    ];
    let (mut compute, mut bandwidth, mut detail) = (
        Report::create(dir.join("COMPUTE_REPORT.csv"))?,
        Report::create(dir.join("BANDWIDTH_REPORT.csv"))?,
        Report::create(dir.join("DETAILED_ACCESS_REPORT.csv"))?,
    );
    let header = |scalesim: &[&str]| {
        let mut h: Vec<String> = vec!["LayerID".into()];
        h.extend(scalesim.iter().map(|s| s.to_string()));
        h.extend(faultline_cols.iter().map(|s| s.to_string()));
        h
    };
    compute.row(&header(&[
        "Total Cycles (incl. prefetch)",
        "Total Cycles",
        "Stall Cycles",
        "Overall Util %",
        "Mapping Efficiency %",
        "Compute Util %",
    ]))?;
    bandwidth.row(&header(&[
        "Avg IFMAP SRAM BW",
        "Avg FILTER SRAM BW",
        "Avg OFMAP SRAM BW",
        "Avg IFMAP DRAM BW",
        "Avg FILTER DRAM BW",
        "Avg OFMAP DRAM BW",
    ]))?;
    let mut dh = header(&[
        "SRAM IFMAP Start Cycle",
        "SRAM IFMAP Stop Cycle",
        "SRAM IFMAP Reads",
        "SRAM Filter Start Cycle",
        "SRAM Filter Stop Cycle",
        "SRAM Filter Reads",
        "SRAM OFMAP Start Cycle",
        "SRAM OFMAP Stop Cycle",
        "SRAM OFMAP Writes",
        "DRAM IFMAP Start Cycle",
        "DRAM IFMAP Stop Cycle",
        "DRAM IFMAP Reads",
        "DRAM Filter Start Cycle",
        "DRAM Filter Stop Cycle",
        "DRAM Filter Reads",
        "DRAM OFMAP Start Cycle",
        "DRAM OFMAP Stop Cycle",
        "DRAM OFMAP Writes",
    ]);
    dh.extend(["Faultline Accumulator Reads".to_string()]);
    detail.row(&dh)?;
    for (id, r) in rows.iter().enumerate() {
        let [m, k, n] = r.gemm;
        let macs = (m * k * n) as f64;
        let ours: Vec<String> = vec![
            r.layer.name.clone(),
            m.to_string(),
            k.to_string(),
            n.to_string(),
            r.array_cycles.to_string(),
            r.dma.total.to_string(),
            r.dma.stall.to_string(),
            r.dma.overlap.to_string(),
            if r.fits { "yes" } else { "no" }.to_string(),
        ];
        let blank = String::new;
        // What SCALE-Sim's columns hold under each convention. Columns Faultline does not
        // model in SCALE-Sim's terms (its DRAM trace, per-operand start and stop cycles) are
        // left empty rather than filled with numbers of another meaning.
        let (total, stall, prefetch, util, map, cu, reads) = match conv {
            Convention::Scalesim => (
                r.ss.total_cycles,
                0,
                blank(),
                r.ss.overall_util,
                r.ss.mapping_efficiency,
                r.ss.compute_util,
                [r.ss.ifmap_reads, r.ss.filter_reads, r.ss.ofmap_writes],
            ),
            Convention::Faultline => (
                r.array_cycles,
                r.dma.stall,
                r.dma.total.to_string(),
                100.0 * macs / (r.array_cycles as f64 * pe),
                r.ss.mapping_efficiency,
                100.0 * macs / (r.feed_cycles.max(1) as f64 * pe),
                [r.access.ifmap_reads, r.access.filter_reads, r.access.acc_writes],
            ),
        };
        let mut c = vec![id.to_string(), prefetch, total.to_string(), stall.to_string()];
        c.extend([util, map, cu].iter().map(|x| format!("{x}")));
        c.extend(ours.iter().cloned());
        compute.row(&c)?;
        let mut b = vec![id.to_string()];
        b.extend(reads.iter().map(|&x| format!("{}", x as f64 / total.max(1) as f64)));
        b.extend([blank(), blank(), blank()]);
        b.extend(ours.iter().cloned());
        bandwidth.row(&b)?;
        let mut d = vec![id.to_string()];
        for x in reads {
            d.extend([blank(), blank(), x.to_string()]);
        }
        d.extend((0..9).map(|_| blank()));
        d.extend(ours.iter().cloned());
        d.push(r.access.acc_reads.to_string());
        detail.row(&d)?;
    }
    compute.finish()?;
    bandwidth.finish()?;
    detail.finish()
}
