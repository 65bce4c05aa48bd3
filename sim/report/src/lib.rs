//! Reports: a campaign's records folded back onto the hardware. Reads `fault::record` files
//! only and never runs the simulator itself: [`vcd`] has [`faultline_fault::replay`] replay one
//! trial and writes what it kept as a waveform.
//!
//! - [`pareto`]: the report of a protection-placement exploration (`explore.json`): residual
//!   failure FIT against check bits and cycle overhead per plan, and per-layer ABFT costs.

pub mod aggregate;
pub mod diff;
pub mod document;
pub mod error;
pub mod figures;
pub mod html;
pub mod load;
pub mod markdown;
pub mod pareto;
pub mod tables;
pub mod vcd;

pub use error::{ReportError, Result};

use std::path::{Path, PathBuf};

/// What [`write_report`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// `index.html`.
    pub html: PathBuf,
    /// `report.md`.
    pub markdown: PathBuf,
    /// `summary.csv` and `trials.csv`.
    pub csv: [PathBuf; 2],
    /// Figure files (SVG and PNG each).
    pub figures: usize,
}

/// Writes the report of `trace` into `out` (created if missing): `index.html`, `report.md`,
/// `summary.csv`, `trials.csv` and `figures/*.{svg,png}`.
pub fn write_report(trace: &load::Trace, report: &aggregate::Report, out: &Path) -> Result<Written> {
    std::fs::create_dir_all(out).map_err(ReportError::io(out))?;
    let figures = figures::write_figures(report, out)?;
    let blocks = document::build(trace, report, &figures);
    let markdown = write_file(out, "report.md", markdown::render(&blocks))?;
    let html =
        write_file(out, "index.html", html::render(&format!("Faultline report: {}", trace.info.spec.name), &blocks))?;
    let csv = [out.join("summary.csv"), out.join("trials.csv")];
    tables::write_summary(report, trace.info.spec.fit_per_bit, &csv[0])?;
    tables::write_trials(trace, &csv[1])?;
    Ok(Written { html, markdown, csv, figures: figures.len() })
}

/// Writes `text` to `out/name` and returns the path.
pub(crate) fn write_file(out: &Path, name: &str, text: String) -> Result<PathBuf> {
    let p = out.join(name);
    std::fs::write(&p, text).map_err(ReportError::io(&p))?;
    Ok(p)
}
