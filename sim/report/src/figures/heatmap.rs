//! Figure 1: the PE-array heatmap, per PE or per block of PEs.

use crate::aggregate::{Heatmap, Report, MIN_CELL_TRIALS};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::chart::{chart, legend, percent, share_axis, Axis, Drawn, Swatch};
use super::style::{font, heat, CELL_EDGE, TOO_FEW, TOO_FEW_HATCH};

/// Heatmaps of larger arrays are drawn in blocks of PEs, so that a drawn cell stays visible
/// and the SVG small (a 128x128 array would otherwise be 16384 rectangles).
const MAX_HEATMAP_CELLS: usize = 64;

/// PEs per side of a drawn heatmap cell. A campaign spreads its trials over the whole array,
/// so per-PE cells rarely reach [`MIN_CELL_TRIALS`]: the side doubles (keeping at least 4
/// cells per side) until at least half the cells have enough trials to colour. Arrays larger
/// than 64 cells per side start at a block size that fits. The HTML grids pool the same blocks.
pub fn block_size(h: &Heatmap) -> usize {
    let mut b = h.rows.max(h.cols).div_ceil(MAX_HEATMAP_CELLS).max(1);
    let largest = (h.rows.min(h.cols) / 4).max(b);
    loop {
        let cells = blocks(h, b);
        let enough = cells.iter().filter(|c| c.trials >= MIN_CELL_TRIALS).count();
        if 2 * enough >= cells.len() || 2 * b > largest {
            return b;
        }
        b *= 2;
    }
}

/// A drawn heatmap cell: PE rows `r0..r1`, columns `c0..c1`, summed trials, unmasked and
/// failures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeBlock {
    pub(crate) r0: usize,
    pub(crate) r1: usize,
    pub(crate) c0: usize,
    pub(crate) c1: usize,
    pub(crate) trials: u64,
    pub(crate) unmasked: u64,
    pub(crate) failures: u64,
}

impl PeBlock {
    /// Its failure rate (only meaningful with trials).
    pub(crate) fn rate(&self) -> f64 {
        self.failures as f64 / self.trials.max(1) as f64
    }
}

/// The one colour scale of a report's PE grids: 0 to `top`, labelled at `ticks` (`step`
/// apart). Every grid of a report, in its SVG, PNG and HTML, uses it, so one colour is one
/// failure rate across the whole report.
#[derive(Debug, Clone, PartialEq)]
pub struct HeatScale {
    /// The rate drawn darkest (a round share: 5%, 10%, 20%, 25%, 50% or 100%).
    pub top: f64,
    /// Labelled rates, from 0 to `top`.
    pub ticks: Vec<f64>,
    /// Their spacing.
    pub step: f64,
}

/// The colour scale of every PE grid of `report`: up to the highest failure rate of any cell
/// drawn with enough trials in any grid (at least 5%), rounded up, so low rates still differ.
pub fn heat_scale(report: &Report) -> HeatScale {
    let highest = report
        .heatmaps
        .iter()
        .flat_map(|h| blocks(h, block_size(h)))
        .filter(|c| c.trials >= MIN_CELL_TRIALS)
        .map(|c| c.rate())
        .fold(0.0, f64::max);
    let (top, ticks, step) = share_axis(highest.max(0.05), 0.0);
    HeatScale { top, ticks, step }
}

/// The heatmap's cells summed over `b` x `b` blocks of PEs (smaller at the far edges), row
/// by row.
pub(crate) fn blocks(h: &Heatmap, b: usize) -> Vec<PeBlock> {
    let mut out = Vec::new();
    for r0 in (0..h.rows).step_by(b) {
        for c0 in (0..h.cols).step_by(b) {
            let (r1, c1) = ((r0 + b).min(h.rows), (c0 + b).min(h.cols));
            let (mut trials, mut unmasked, mut failures) = (0, 0, 0);
            for r in r0..r1 {
                for c in c0..c1 {
                    if let Some(cell) = h.cells.get(r * h.cols + c) {
                        trials += cell.trials;
                        unmasked += cell.unmasked;
                        failures += cell.failures;
                    }
                }
            }
            out.push(PeBlock { r0, r1, c0, c1, trials, unmasked, failures });
        }
    }
    out
}

/// Tick positions on an axis of `n` PEs drawn in blocks of `b`: per PE, the centres of
/// round-numbered PEs and the last; per block, block edges from 0 to `n`.
pub(super) fn pe_ticks(n: usize, b: usize) -> Vec<f64> {
    let step =
        [1, 2, 4, 8, 16, 32, 64, 128, 256].into_iter().find(|&s| s >= b && n.div_ceil(s) <= 12).unwrap_or(n.max(1));
    if b > 1 {
        let mut t: Vec<usize> = (0..n).step_by(step).collect();
        t.push(n);
        return t.into_iter().map(|x| x as f64).collect();
    }
    let mut t: Vec<usize> = (0..n).step_by(step).collect();
    if n > 1 && (n - 1) - t.last().copied().unwrap_or(0) >= step.div_ceil(2) {
        t.push(n - 1);
    }
    t.into_iter().map(|x| x as f64 + 0.5).collect()
}

/// Figure 1: the PE array's failure rate per PE (or block of PEs) on the report's colour
/// scale `scale`, row 0 at the top like a floor plan.
pub(super) fn draw_heatmap<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, h: &Heatmap, scale: &HeatScale) -> Drawn
where
    DB::ErrorType: 'static,
{
    let min = MIN_CELL_TRIALS;
    let area = legend(area, &[(format!("fewer than {min} trials: too few to colour"), Swatch::TooFew)])?;
    let b = block_size(h);
    let cells = blocks(h, b);
    let coloured: Vec<&PeBlock> = cells.iter().filter(|c| c.trials >= min).collect();
    let (vmax, scale_ticks, scale_step) = (scale.top, scale.ticks.clone(), scale.step);
    let (plot, bar) = area.split_horizontally(area.dim_in_pixel().0.saturating_sub(110));
    let (rows, cols) = (h.rows as f64, h.cols as f64);
    // Chart y runs up from the bottom: PE row r spans y in [rows - r - 1, rows - r].
    let xt = pe_ticks(h.cols, b);
    let yt = pe_ticks(h.rows, b).into_iter().map(|r| rows - r).collect();
    let mut chart = chart(&plot, (0.0, cols, xt), (0.0, rows, yt), 50)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(if b > 1 { format!("PE column ({b}x{b} PE blocks)") } else { "PE column".into() })
        .y_desc("PE row")
        .x_label_formatter(&|x| format!("{}", (x + 1e-9).floor() as i64))
        .y_label_formatter(&|y| format!("{}", (rows - y + 1e-9).floor() as i64))
        .label_style(font(13.0))
        .axis_desc_style(font(14.0))
        .draw()?;
    // The whole array grey and hatched, then the cells with enough trials coloured over it:
    // too-few cells stay "no data" (also in grey-scale print), and the SVG holds one element
    // per coloured cell rather than per PE.
    chart.draw_series(std::iter::once(Rectangle::new([(0.0, rows), (cols, 0.0)], TOO_FEW.filled())))?;
    // About 40 hatch lines across, at a power-of-two pitch so that they meet cell corners.
    let pitch = 2f64.powf((rows.max(cols) / 40.0).log2().round());
    let lines = ((rows + cols) / pitch).ceil() as i64;
    let hatch = (0..=lines).filter_map(|k| {
        // The diagonal x - y = d (bottom-left to top-right), clipped to the array.
        let d = k as f64 * pitch - rows;
        let (x0, x1) = (d.max(0.0), cols.min(rows + d));
        (x0 < x1).then(|| PathElement::new(vec![(x0, x0 - d), (x1, x1 - d)], TOO_FEW_HATCH.stroke_width(1)))
    });
    chart.draw_series(hatch)?;
    chart.draw_series(coloured.iter().map(|c| {
        let corners = [(c.c0 as f64, rows - c.r0 as f64), (c.c1 as f64, rows - c.r1 as f64)];
        Rectangle::new(corners, heat(c.rate() / vmax).filled())
    }))?;
    // Thin lines between cells, so that neighbours of one colour stay apart.
    let edges = |n: usize| (1..n.div_ceil(b)).map(move |i| (i * b) as f64);
    let grid = edges(h.cols)
        .map(|x| vec![(x, 0.0), (x, rows)])
        .chain(edges(h.rows).map(|y| vec![(0.0, rows - y), (cols, rows - y)]))
        .map(|line| PathElement::new(line, CELL_EDGE.stroke_width(1)));
    chart.draw_series(grid)?;
    chart.draw_series(std::iter::once(Rectangle::new([(0.0, 0.0), (cols, rows)], BLACK.stroke_width(1))))?;

    // The colour bar: the scale from 0 to its top, labelled in percent on the right.
    let mut bar_chart = ChartBuilder::on(&bar)
        .margin_top(10)
        .margin_bottom(52)
        .margin_left(8)
        .margin_right(4)
        .right_y_label_area_size(62)
        .build_cartesian_2d(Axis::new(0.0, 1.0, vec![]), Axis::new(0.0, vmax, scale_ticks))?;
    bar_chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_desc("failure rate")
        .y_label_formatter(&|y| percent(*y, scale_step))
        .label_style(font(13.0))
        .axis_desc_style(font(14.0))
        .draw()?;
    const STEPS: usize = 64;
    bar_chart.draw_series((0..STEPS).map(|i| {
        let (a, b) = (i as f64 / STEPS as f64, (i + 1) as f64 / STEPS as f64);
        Rectangle::new([(0.0, a * vmax), (1.0, b * vmax)], heat((a + b) / 2.0).filled())
    }))?;
    bar_chart.draw_series(std::iter::once(Rectangle::new([(0.0, 0.0), (1.0, vmax)], BLACK.stroke_width(1))))?;
    Ok(())
}
