//! Drawing helpers the figures share: the chart type and its [`Axis`], title, legend and
//! its swatches, round ticks, and interval series of outcome shares.

use faultline_fault::stats::Estimate;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::style::{font, FAILURE, GRID, TOO_FEW, TOO_FEW_HATCH, UNMASKED};

/// Any backend's drawing error (both backends' errors are `'static`).
pub(super) type DrawError = Box<dyn std::error::Error>;
/// Result of drawing.
pub(super) type Drawn<T = ()> = std::result::Result<T, DrawError>;
/// A chart of this module.
pub(super) type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Axis, Axis>>;

/// A linear f64 axis with explicitly chosen ticks (plotters' `WithKeyPoints` over an f64
/// range has no label formatter, so `configure_mesh` refuses it).
pub(crate) struct Axis {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    pub(crate) ticks: Vec<f64>,
}

impl Axis {
    pub(super) fn new(lo: f64, hi: f64, ticks: Vec<f64>) -> Axis {
        Axis { lo, hi, ticks }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let t = if self.hi == self.lo { 0.5 } else { ((v - self.lo) / (self.hi - self.lo)).clamp(-4.0, 5.0) };
        let len = (limit.1 - limit.0) as f64;
        // Rounded as plotters' own f64 axes are.
        if len >= 0.0 {
            limit.0 + (len * t + 1e-3).floor() as i32
        } else {
            limit.0 - (-len * t + 1e-3).floor() as i32
        }
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Only bold points: grid lines at the labelled ticks, no light lines between.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// Draws `text` as the title, shrunk to fit the width, and returns the area below it.
pub(super) fn title<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, text: &str) -> Drawn<DrawingArea<DB, Shift>>
where
    DB::ErrorType: 'static,
{
    let room = area.dim_in_pixel().0.saturating_sub(16);
    let mut size = 18.0;
    while size > 10.0 && area.estimate_text_size(text, &font(size))?.0 > room {
        size -= 1.0;
    }
    Ok(area.titled(text, font(size))?)
}

/// How a legend entry's sample is drawn.
#[derive(Clone, Copy)]
pub(super) enum Swatch {
    Line(RGBColor, u32),
    Dot(RGBColor),
    Triangle(RGBColor),
    Cross(RGBColor),
    Whisker,
    TooFew,
}

/// Draws a legend in rows across the top of `area` (outside the plot, so it never hides
/// data) and returns the area below it.
pub(super) fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, Swatch)],
) -> Drawn<DrawingArea<DB, Shift>>
where
    DB::ErrorType: 'static,
{
    const SWATCH: i32 = 22;
    const GAP: i32 = 6;
    const SEP: i32 = 20;
    const ROW: i32 = 20;
    let style = font(13.0);
    let width = area.dim_in_pixel().0 as i32 - 20;
    // Greedy rows of (entry, its width).
    let mut rows: Vec<Vec<(usize, i32)>> = vec![Vec::new()];
    let mut used = 0;
    for (i, (label, _)) in entries.iter().enumerate() {
        let w = SWATCH + GAP + area.estimate_text_size(label, &style)?.0 as i32;
        let row = rows.last_mut().expect("one row");
        if !row.is_empty() && used + SEP + w > width {
            rows.push(vec![(i, w)]);
            used = w;
        } else {
            used += if row.is_empty() { w } else { SEP + w };
            row.push((i, w));
        }
    }
    let height = ROW * rows.len() as i32 + 6;
    let (top, rest) = area.split_vertically(height);
    for (r, row) in rows.iter().enumerate() {
        let total: i32 = row.iter().map(|&(_, w)| w).sum::<i32>() + SEP * (row.len() as i32 - 1);
        let mut x = (top.dim_in_pixel().0 as i32 - total) / 2;
        let y = ROW * r as i32 + ROW / 2 + 3;
        for &(i, w) in row {
            let (label, swatch) = &entries[i];
            draw_swatch(&top, *swatch, x, y, SWATCH)?;
            top.draw(&Text::new(label.as_str(), (x + SWATCH + GAP, y), style.pos(Pos::new(HPos::Left, VPos::Center))))?;
            x += w + SEP;
        }
    }
    Ok(rest)
}

/// Draws one legend sample `w` pixels wide, its left end at `(x, y)`.
fn draw_swatch<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, s: Swatch, x: i32, y: i32, w: i32) -> Drawn
where
    DB::ErrorType: 'static,
{
    let mid = (x + w / 2, y);
    match s {
        Swatch::Line(c, width) => area.draw(&PathElement::new(vec![(x, y), (x + w, y)], c.stroke_width(width)))?,
        Swatch::Dot(c) => area.draw(&Circle::new(mid, 4, c.filled()))?,
        Swatch::Triangle(c) => area.draw(&TriangleMarker::new(mid, 5, c.filled()))?,
        Swatch::Cross(c) => area.draw(&Cross::new(mid, 5, c.stroke_width(2)))?,
        Swatch::Whisker => {
            let style = BLACK.stroke_width(1);
            area.draw(&PathElement::new(vec![(mid.0, y - 7), (mid.0, y + 7)], style))?;
            area.draw(&PathElement::new(vec![(mid.0 - 3, y - 7), (mid.0 + 3, y - 7)], style))?;
            area.draw(&PathElement::new(vec![(mid.0 - 3, y + 7), (mid.0 + 3, y + 7)], style))?;
        }
        Swatch::TooFew => {
            area.draw(&Rectangle::new([(x + 4, y - 7), (x + w - 4, y + 7)], TOO_FEW.filled()))?;
            area.draw(&PathElement::new(vec![(x + 4, y + 7), (x + w - 4, y - 7)], TOO_FEW_HATCH.stroke_width(1)))?;
        }
    }
    Ok(())
}

/// The round step (1, 2, 2.5 or 5 x 10^k) of about `max` ticks over a span of `span`
/// (`None` for an empty or non-finite span).
pub(crate) fn tick_step(span: f64, max: usize) -> Option<f64> {
    let raw = span / max.max(1) as f64;
    if raw <= 0.0 || !raw.is_finite() {
        return None;
    }
    let mag = 10f64.powf(raw.log10().floor());
    Some([1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|&s| s >= raw * (1.0 - 1e-9)).unwrap_or(10.0 * mag))
}

/// About `max` round tick values in `[lo, hi]` ([`tick_step`]).
pub(crate) fn ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    let Some(step) = tick_step(hi - lo, max) else { return vec![lo] };
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    // Multiples of the step, not accumulated sums: no drift like 0.30000000000000004.
    (first..=last).map(|k| k as f64 * step).collect()
}

/// A share as a percentage label, with a decimal when the ticks are finer than 1%.
pub(super) fn percent(x: f64, step: f64) -> String {
    let decimals = if step < 0.01 - 1e-12 { 1 } else { 0 };
    format!("{:.*}%", decimals, x * 100.0)
}

/// Builds a chart with f64 axes over `x` and `y` with the given ticks.
pub(super) fn chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    x: (f64, f64, Vec<f64>),
    y: (f64, f64, Vec<f64>),
    y_label_width: u32,
) -> Drawn<Chart<'a, DB>>
where
    DB::ErrorType: 'static,
{
    Ok(ChartBuilder::on(area)
        .margin(10)
        .margin_right(20)
        .x_label_area_size(42)
        .y_label_area_size(y_label_width)
        .build_cartesian_2d(Axis::new(x.0, x.1, x.2), Axis::new(y.0, y.1, y.2))?)
}

/// Draws the axes, tick labels and grid lines of `chart`.
pub(super) fn mesh<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    x_desc: &str,
    y_desc: &str,
    x_fmt: &dyn Fn(&f64) -> String,
    y_fmt: &dyn Fn(&f64) -> String,
) -> Drawn
where
    DB::ErrorType: 'static,
{
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(x_fmt)
        .y_label_formatter(y_fmt)
        .label_style(font(13.0))
        .axis_desc_style(font(14.0))
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(TRANSPARENT)
        .draw()?;
    Ok(())
}

/// Plots estimates `(x, estimate)` as markers with 95% interval whiskers (caps `cap` wide),
/// joined by a thin line when `join`.
pub(super) fn rate_series<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    points: &[(f64, Estimate)],
    color: RGBColor,
    triangle: bool,
    cap: f64,
    join: bool,
) -> Drawn
where
    DB::ErrorType: 'static,
{
    if join && points.len() > 1 {
        chart.draw_series(LineSeries::new(points.iter().map(|&(x, e)| (x, e.p)), color.mix(0.6).stroke_width(1)))?;
    }
    let style = color.stroke_width(1);
    chart.draw_series(points.iter().flat_map(|&(x, e)| {
        [
            PathElement::new(vec![(x, e.lo), (x, e.hi)], style),
            PathElement::new(vec![(x - cap, e.lo), (x + cap, e.lo)], style),
            PathElement::new(vec![(x - cap, e.hi), (x + cap, e.hi)], style),
        ]
    }))?;
    if triangle {
        chart.draw_series(points.iter().map(|&(x, e)| TriangleMarker::new((x, e.p), 5, color.filled())))?;
    } else {
        chart.draw_series(points.iter().map(|&(x, e)| Circle::new((x, e.p), 4, color.filled())))?;
    }
    Ok(())
}

/// The y axis of a share plot: 0 up to a round top just above the highest interval end, with
/// `headroom` more above it (for labels); returns (top of range, ticks, tick step).
pub(super) fn share_axis(highest: f64, headroom: f64) -> (f64, Vec<f64>, f64) {
    let top = [0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0].into_iter().find(|&t| t >= highest - 1e-12).unwrap_or(1.0);
    let ticks = ticks(0.0, top, 5);
    let step = if ticks.len() > 1 { ticks[1] - ticks[0] } else { top };
    (top * (1.0 + headroom), ticks, step)
}

/// The rate legend of the bit and step figures.
pub(super) fn rate_legend(failure: &str) -> Vec<(String, Swatch)> {
    vec![
        ("not masked".into(), Swatch::Dot(UNMASKED)),
        (failure.to_string(), Swatch::Triangle(FAILURE)),
        ("95% Wilson interval".into(), Swatch::Whisker),
    ]
}
