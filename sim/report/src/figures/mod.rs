//! The report's figures, drawn with plotters: each one once as an SVG string (inlined by the
//! HTML) and once as a PNG file (linked by the Markdown), by the same generic drawing code.
//!
//! Text uses the bundled DejaVu Sans (no system fonts are needed), the outcome colours are one
//! fixed palette ([`outcome_color`]) and nothing random or time-dependent enters a drawing, so
//! the same report gives byte-identical SVGs.
//!
//! One concern per file: `style.rs` (palette, colour scale, sizes, font), `chart.rs` (the
//! drawing helpers: axes, title, legend, ticks, interval series), one file per kind of figure
//! (`heatmap.rs`, `shares.rs` for the per-bit and per-step shares, `curves.rs` for loss and
//! accuracy), and this file (which figures a report gets, and drawing them to SVG and PNG).

mod chart;
mod curves;
mod heatmap;
mod shares;
mod style;
#[cfg(test)]
mod tests;

use crate::aggregate::{Heatmap, Report, MIN_CELL_TRIALS};
use crate::error::{ReportError, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

pub(crate) use chart::{tick_step, ticks, Axis};
pub(crate) use style::{font, register_font, FIGURE_SIZE, GRID};
pub use style::{heat, outcome_color};

use chart::{title, DrawError, Drawn};
use curves::{draw_accuracy, draw_loss};
pub use heatmap::block_size;
pub(crate) use heatmap::blocks;
use heatmap::draw_heatmap;
pub use heatmap::{heat_scale, HeatScale};
use shares::{draw_bits, draw_step, steps};
use style::HEATMAP_SIZE;

/// Which report section a figure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// PE-array heatmaps, one per MXU register kind.
    Heatmap,
    /// Outcome rate vs bit position, one per class.
    Bits,
    /// Outcome rate vs injection step.
    Step,
    /// Loss and test-accuracy curves.
    Curves,
    /// An exploration's residual failure rate against a protection cost ([`crate::pareto`]).
    Pareto,
}

/// One figure: written as `figures/<name>.svg` and `figures/<name>.png` under the report dir.
#[derive(Debug, Clone)]
pub struct Figure {
    /// File stem: a lowercase, filesystem-safe slug (`heatmap-psum`, `bits-ub-word`, ...).
    pub name: String,
    /// The title drawn above the plot (plain text, for captions and alt text).
    pub title: String,
    /// The report section it belongs to.
    pub section: Section,
    /// The SVG document (starts with `<svg`).
    pub svg: String,
}

/// Draws every figure of `report`, writes them under `dir/figures/`, returns them in report order.
pub fn write_figures(report: &Report, dir: &Path) -> Result<Vec<Figure>> {
    register_font()?;
    let out = dir.join("figures");
    std::fs::create_dir_all(&out).map_err(ReportError::io(&out))?;
    plan(report).iter().map(|p| render(report, p, &out)).collect()
}

/// What one figure shows.
enum Kind<'a> {
    /// A PE grid on the report's one colour scale (computed once for all grids).
    Heatmap(&'a Heatmap, HeatScale),
    Bits(usize),
    Step,
    Loss,
    Accuracy,
}

/// A figure to draw.
struct Plan<'a> {
    name: String,
    title: String,
    section: Section,
    size: (u32, u32),
    kind: Kind<'a>,
}

/// "training failure" or "inference failure": what `Outcome::failure` means in this campaign.
fn failure_word(report: &Report) -> &'static str {
    if report.outcomes.iter().any(|o| o.inference_only()) {
        "inference failure"
    } else {
        "training failure"
    }
}

/// What a trial's step is: a training step, or for inference campaigns the test batch.
fn step_word(report: &Report) -> &'static str {
    if report.outcomes.iter().any(|o| o.inference_only()) {
        "test batch"
    } else {
        "injection step"
    }
}

/// Lowercase, filesystem-safe slug: runs of other characters become one `-`.
pub(crate) fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// The figures `report` has data for, in report order, with unique names.
fn plan(report: &Report) -> Vec<Plan<'_>> {
    let failure = failure_word(report);
    let mut plans = Vec::new();
    let scale = heat_scale(report);
    for h in &report.heatmaps {
        if h.cells.iter().all(|c| c.trials == 0) {
            continue;
        }
        let block = block_size(h);
        let per = if block > 1 { format!("per {block}x{block} PE block") } else { "per PE".into() };
        plans.push(Plan {
            name: format!("heatmap-{}", slug(&h.register)),
            title: format!("{} \u{2014} {failure} rate {per} (grey: under {MIN_CELL_TRIALS} trials)", h.class),
            section: Section::Heatmap,
            size: HEATMAP_SIZE,
            kind: Kind::Heatmap(h, scale.clone()),
        });
    }
    for (i, b) in report.bit_profiles.iter().enumerate() {
        if b.bits.iter().all(|c| c.trials() == 0) {
            continue;
        }
        let format = b.format.as_deref().map(|f| format!(" ({f})")).unwrap_or_default();
        plans.push(Plan {
            name: format!("bits-{}", slug(&b.class)),
            title: format!("{}{format} \u{2014} outcome share per bit position", b.class),
            section: Section::Bits,
            size: FIGURE_SIZE,
            kind: Kind::Bits(i),
        });
    }
    if !steps(report).is_empty() {
        plans.push(Plan {
            name: "outcome-vs-step".into(),
            title: format!("Outcome share vs {}", step_word(report)),
            section: Section::Step,
            size: FIGURE_SIZE,
            kind: Kind::Step,
        });
    }
    if !report.curves.is_empty() && !report.golden_losses.is_empty() {
        plans.push(Plan {
            name: "loss-curves".into(),
            title: "Training loss: golden and sampled faulty trials by outcome".into(),
            section: Section::Curves,
            size: FIGURE_SIZE,
            kind: Kind::Loss,
        });
    }
    if !report.accuracy.is_empty() {
        plans.push(Plan {
            name: "test-accuracy".into(),
            title: "Test accuracy at the end of the follow-up window".into(),
            section: Section::Curves,
            size: FIGURE_SIZE,
            kind: Kind::Accuracy,
        });
    }
    // Two classes could slug alike (`a.b_c`, `a.b.c`): number the later ones.
    let mut seen = std::collections::HashSet::new();
    for p in &mut plans {
        let base = p.name.clone();
        let mut k = 2;
        while !seen.insert(p.name.clone()) {
            p.name = format!("{base}-{k}");
            k += 1;
        }
    }
    plans
}

/// Draws one figure to SVG and PNG and writes both.
fn render(report: &Report, p: &Plan, out: &Path) -> Result<Figure> {
    let fail = |e: DrawError| ReportError::Figure { name: p.name.clone(), why: e.to_string() };
    let mut svg = String::new();
    draw(SVGBackend::with_string(&mut svg, p.size).into_drawing_area(), report, p).map_err(fail)?;
    let png = out.join(format!("{}.png", p.name));
    draw(BitMapBackend::new(&png, p.size).into_drawing_area(), report, p)
        .map_err(|e| ReportError::Figure { name: p.name.clone(), why: format!("{}: {e}", png.display()) })?;
    let path = out.join(format!("{}.svg", p.name));
    std::fs::write(&path, &svg).map_err(ReportError::io(&path))?;
    Ok(Figure { name: p.name.clone(), title: p.title.clone(), section: p.section, svg })
}

/// The one generic drawing function: title, then the figure's body, on any backend.
fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, report: &Report, p: &Plan) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let body = title(&root, &p.title)?;
    match p.kind {
        Kind::Heatmap(h, ref scale) => draw_heatmap(&body, h, scale)?,
        Kind::Bits(i) => draw_bits(&body, report, i)?,
        Kind::Step => draw_step(&body, report)?,
        Kind::Loss => draw_loss(&body, report)?,
        Kind::Accuracy => draw_accuracy(&body, report)?,
    }
    root.present()?;
    Ok(())
}
