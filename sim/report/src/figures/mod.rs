//! The report's figures, drawn with plotters: each one once as an SVG string (inlined by the
//! HTML) and once as a PNG file (linked by the Markdown), by the same generic drawing code.
//!
//! Text uses the bundled DejaVu Sans (no system fonts are needed), the outcome colours are one
//! fixed palette ([`outcome_color`]) and nothing random or time-dependent enters a drawing, so
//! the same report gives byte-identical SVGs.

use crate::aggregate::{bit_field, Counts, Heatmap, Report, MIN_CELL_TRIALS};
use crate::error::{ReportError, Result};
use crate::load::Curve;
use faultline_fault::stats::Estimate;
use faultline_fault::Outcome;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

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

/// The fixed colour of each outcome, shared by every figure and the HTML tables (Okabe-Ito
/// based: distinguishable with the common colour-vision deficiencies; masked outcomes grey).
pub fn outcome_color(o: Outcome) -> RGBColor {
    match o {
        Outcome::HwMasked => RGBColor(0xA6, 0xA6, 0xA6),
        Outcome::Masked => RGBColor(0x6E, 0x6E, 0x6E),
        Outcome::Benign | Outcome::SdcBenign => RGBColor(0x00, 0x9E, 0x73),
        Outcome::ImmediateInfNan | Outcome::Due => RGBColor(0xD5, 0x5E, 0x00),
        Outcome::ShortTermInfNan => RGBColor(0xE6, 0x9F, 0x00),
        Outcome::SharpDegrade | Outcome::SdcCritical => RGBColor(0xCC, 0x79, 0xA7),
        Outcome::SharpSlowDegrade => RGBColor(0x88, 0x22, 0x55),
        Outcome::SlowDegrade => RGBColor(0x00, 0x72, 0xB2),
        Outcome::LowTestAccuracy => RGBColor(0x56, 0xB4, 0xE9),
        // Caught by protection: blue-greys, apart from the masked greys.
        Outcome::Corrected => RGBColor(0xB7, 0xD7, 0xE8),
        Outcome::DetectedRecovered => RGBColor(0x7F, 0xA7, 0xC0),
        Outcome::Detected => RGBColor(0x33, 0x5C, 0x81),
    }
}

/// Series colour of "share not masked".
const UNMASKED: RGBColor = RGBColor(0x00, 0x72, 0xB2);
/// Series colour of "share failing".
const FAILURE: RGBColor = RGBColor(0xD5, 0x5E, 0x00);
/// Fill of heatmap cells with too few trials to colour (distinct from every scale colour).
const TOO_FEW: RGBColor = RGBColor(0xE0, 0xE0, 0xE0);
/// Their hatch line.
const TOO_FEW_HATCH: RGBColor = RGBColor(0x99, 0x99, 0x99);
/// Lines between heatmap cells.
const CELL_EDGE: RGBColor = RGBColor(0xC4, 0xC4, 0xC4);
/// Grid lines.
pub(crate) const GRID: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);

/// Pixel size of the heatmaps (square-ish plot plus a colour bar) and of the other figures.
const HEATMAP_SIZE: (u32, u32) = (680, 600);
pub(crate) const FIGURE_SIZE: (u32, u32) = (800, 500);
/// Heatmaps of larger arrays are drawn in blocks of PEs, so that a drawn cell stays visible
/// and the SVG small (a 128x128 array would otherwise be 16384 rectangles).
const MAX_HEATMAP_CELLS: usize = 64;

/// Font family every text uses: the bundled font is registered under this name.
pub(crate) const FONT: &str = "sans-serif";

/// Registers the bundled font once per process (plotters has no font without it).
pub(crate) fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FONT, FontStyle::Normal, include_bytes!("../../assets/DejaVuSans.ttf"))
                .map_err(|_| "the bundled DejaVuSans.ttf is not a valid font".to_string())
        })
        .clone()
        .map_err(|why| ReportError::Figure { name: "(font)".into(), why })
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
    Heatmap(&'a Heatmap),
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
            kind: Kind::Heatmap(h),
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

/// Any backend's drawing error (both backends' errors are `'static`).
type DrawError = Box<dyn std::error::Error>;
/// Result of drawing.
type Drawn<T = ()> = std::result::Result<T, DrawError>;
/// A chart of this module.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Axis, Axis>>;

/// The one generic drawing function: title, then the figure's body, on any backend.
fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, report: &Report, p: &Plan) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let body = title(&root, &p.title)?;
    match p.kind {
        Kind::Heatmap(h) => draw_heatmap(&body, h)?,
        Kind::Bits(i) => draw_bits(&body, report, i)?,
        Kind::Step => draw_step(&body, report)?,
        Kind::Loss => draw_loss(&body, report)?,
        Kind::Accuracy => draw_accuracy(&body, report)?,
    }
    root.present()?;
    Ok(())
}

/// A linear f64 axis with explicitly chosen ticks (plotters' `WithKeyPoints` over an f64
/// range has no label formatter, so `configure_mesh` refuses it).
pub(crate) struct Axis {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    pub(crate) ticks: Vec<f64>,
}

impl Axis {
    fn new(lo: f64, hi: f64, ticks: Vec<f64>) -> Axis {
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

pub(crate) fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font())
}

/// Draws `text` as the title, shrunk to fit the width, and returns the area below it.
fn title<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, text: &str) -> Drawn<DrawingArea<DB, Shift>>
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
enum Swatch {
    Line(RGBColor, u32),
    Dot(RGBColor),
    Triangle(RGBColor),
    Cross(RGBColor),
    Whisker,
    TooFew,
}

/// Draws a legend in rows across the top of `area` (outside the plot, so it never hides
/// data) and returns the area below it.
fn legend<DB: DrawingBackend>(
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
fn percent(x: f64, step: f64) -> String {
    let decimals = if step < 0.01 - 1e-12 { 1 } else { 0 };
    format!("{:.*}%", decimals, x * 100.0)
}

/// Builds a chart with f64 axes over `x` and `y` with the given ticks.
fn chart<'a, DB: DrawingBackend>(
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
fn mesh<DB: DrawingBackend>(
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
fn rate_series<DB: DrawingBackend>(
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
fn share_axis(highest: f64, headroom: f64) -> (f64, Vec<f64>, f64) {
    let top = [0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0].into_iter().find(|&t| t >= highest - 1e-12).unwrap_or(1.0);
    let ticks = ticks(0.0, top, 5);
    let step = if ticks.len() > 1 { ticks[1] - ticks[0] } else { top };
    (top * (1.0 + headroom), ticks, step)
}

/// The rate legend of the bit and step figures.
fn rate_legend(failure: &str) -> Vec<(String, Swatch)> {
    vec![
        ("not masked".into(), Swatch::Dot(UNMASKED)),
        (failure.to_string(), Swatch::Triangle(FAILURE)),
        ("95% Wilson interval".into(), Swatch::Whisker),
    ]
}

/// Sequential colour (ColorBrewer YlOrRd) of `t` in [0, 1]: pale yellow at 0, dark red at 1
/// (the HTML grids use it too, so both show a rate in one colour).
pub fn heat(t: f64) -> RGBColor {
    const STOPS: [(u8, u8, u8); 9] = [
        (0xFF, 0xFF, 0xCC),
        (0xFF, 0xED, 0xA0),
        (0xFE, 0xD9, 0x76),
        (0xFE, 0xB2, 0x4C),
        (0xFD, 0x8D, 0x3C),
        (0xFC, 0x4E, 0x2A),
        (0xE3, 0x1A, 0x1C),
        (0xBD, 0x00, 0x26),
        (0x80, 0x00, 0x26),
    ];
    let x = t.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f64;
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// PEs per side of a drawn heatmap cell. A campaign spreads its trials over the whole array,
/// so per-PE cells rarely reach [`MIN_CELL_TRIALS`]: the side doubles (keeping at least 4
/// cells per side) until at least half the cells have enough trials to colour. Arrays larger
/// than [`MAX_HEATMAP_CELLS`] per side start at a block size that fits.
fn block_size(h: &Heatmap) -> usize {
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

/// A drawn heatmap cell: PE rows `r0..r1`, columns `c0..c1`, summed trials and failures.
struct Block {
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
    trials: u64,
    failures: u64,
}

/// The heatmap's cells summed over `b` x `b` blocks of PEs (smaller at the far edges).
fn blocks(h: &Heatmap, b: usize) -> Vec<Block> {
    let mut out = Vec::new();
    for r0 in (0..h.rows).step_by(b) {
        for c0 in (0..h.cols).step_by(b) {
            let (r1, c1) = ((r0 + b).min(h.rows), (c0 + b).min(h.cols));
            let (mut trials, mut failures) = (0, 0);
            for r in r0..r1 {
                for c in c0..c1 {
                    if let Some(cell) = h.cells.get(r * h.cols + c) {
                        trials += cell.trials;
                        failures += cell.failures;
                    }
                }
            }
            out.push(Block { r0, r1, c0, c1, trials, failures });
        }
    }
    out
}

/// Tick positions on an axis of `n` PEs drawn in blocks of `b`: per PE, the centres of
/// round-numbered PEs and the last; per block, block edges from 0 to `n`.
fn pe_ticks(n: usize, b: usize) -> Vec<f64> {
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

/// Figure 1: the PE array's failure rate per PE (or block of PEs), row 0 at the top like a
/// floor plan.
fn draw_heatmap<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, h: &Heatmap) -> Drawn
where
    DB::ErrorType: 'static,
{
    let min = MIN_CELL_TRIALS;
    let area = legend(area, &[(format!("fewer than {min} trials: too few to colour"), Swatch::TooFew)])?;
    let b = block_size(h);
    let cells = blocks(h, b);
    let rate = |c: &Block| c.failures as f64 / c.trials as f64;
    let coloured: Vec<&Block> = cells.iter().filter(|c| c.trials >= min).collect();
    // The scale tops out at the highest rate shown, rounded up, so that low rates still differ.
    let highest = coloured.iter().map(|c| rate(c)).fold(0.0, f64::max);
    let (vmax, scale_ticks, scale_step) = share_axis(highest.max(0.05), 0.0);
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
        Rectangle::new(corners, heat(rate(c) / vmax).filled())
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

/// Background colour of a bit field's band.
fn field_color(field: &str) -> RGBColor {
    match field {
        "sign" => RGBColor(0xFB, 0xE3, 0xE3),
        "exponent" => RGBColor(0xE1, 0xEC, 0xFA),
        "mantissa" => RGBColor(0xE6, 0xF4, 0xE1),
        _ => RGBColor(0xF3, 0xEE, 0xDC),
    }
}

/// Bits to label on an axis of `width` bits: every bit up to 16, else the MSB, bit 0, field
/// boundaries and multiples of 4, leaving out any within 2 bits of one already chosen.
fn bit_ticks(width: u32, format: Option<&str>) -> Vec<u32> {
    if width <= 16 {
        return (0..width).collect();
    }
    let mut want = vec![width - 1, 0];
    for b in 1..width {
        if bit_field(format, b) != bit_field(format, b - 1) {
            want.extend([b, b - 1]);
        }
    }
    want.extend((0..width).filter(|b| b % 4 == 0));
    let mut chosen: Vec<u32> = Vec::new();
    for b in want {
        if chosen.iter().all(|&c| c.abs_diff(b) > 2) {
            chosen.push(b);
        }
    }
    chosen
}

/// Figure 2: per bit, the share of trials not masked and the share failing, over bands
/// marking the value's fields; MSB on the left as in a register diagram.
fn draw_bits<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report, index: usize) -> Drawn
where
    DB::ErrorType: 'static,
{
    let profile = &report.bit_profiles[index];
    let format = profile.format.as_deref();
    let width = profile.bits.len() as u32;
    let pos = |bit: u32| (width - 1 - bit) as f64;
    let area = legend(area, &rate_legend(failure_word(report)))?;
    let measured: Vec<(u32, &Counts)> = (0..width).zip(&profile.bits).filter(|(_, c)| c.trials() > 0).collect();
    let mut bands: Vec<(&str, u32, u32)> = Vec::new(); // (field, msb, lsb), MSB first
    for bit in (0..width).rev() {
        let f = bit_field(format, bit);
        match bands.last_mut() {
            Some(band) if band.0 == f => band.2 = bit,
            _ => bands.push((f, bit, bit)),
        }
    }
    bands.retain(|b| !b.0.is_empty());
    // Room above the data for the field names.
    const HEADROOM: f64 = 0.12;
    let highest = measured.iter().map(|(_, c)| c.unmasked().hi.max(c.failure().hi)).fold(0.0, f64::max);
    let (ytop, yticks, ystep) = share_axis(highest, if bands.is_empty() { 0.03 } else { HEADROOM });
    let xticks = bit_ticks(width, format).into_iter().map(pos).collect();
    let mut chart = chart(&area, (-0.5, width as f64 - 0.5, xticks), (0.0, ytop, yticks), 60)?;
    // Bands first, so the grid and the data draw over them.
    chart.draw_series(bands.iter().map(|&(f, msb, lsb)| {
        Rectangle::new([(pos(msb) - 0.5, 0.0), (pos(lsb) + 0.5, ytop)], field_color(f).filled())
    }))?;
    let x_fmt = |x: &f64| format!("{}", width as i64 - 1 - x.round() as i64);
    mesh(&mut chart, "bit position (MSB left)", "share of trials", &x_fmt, &|y| percent(*y, ystep))?;
    // Field names in the headroom; a one- or two-bit band at either end (fp32's sign) is
    // labelled from its outer edge inwards, so the plot edge does not cut the name.
    let label_y = ytop * (1.0 + HEADROOM / 2.0) / (1.0 + HEADROOM);
    let last = bands.len().saturating_sub(1);
    chart.draw_series(bands.iter().enumerate().map(|(i, &(f, msb, lsb))| {
        let narrow = msb - lsb < 2 && bands.len() > 1;
        let (x, h) = match i {
            0 if narrow => (pos(msb) - 0.4, HPos::Left),
            _ if narrow && i == last => (pos(lsb) + 0.4, HPos::Right),
            _ => ((pos(msb) + pos(lsb)) / 2.0, HPos::Center),
        };
        Text::new(f.to_string(), (x, label_y), font(13.0).pos(Pos::new(h, VPos::Center)))
    }))?;
    let series = |f: fn(&Counts) -> Estimate, dx: f64| -> Vec<(f64, Estimate)> {
        measured.iter().map(|&(bit, c)| (pos(bit) + dx, f(c))).collect()
    };
    rate_series(&mut chart, &series(Counts::unmasked, -0.17), UNMASKED, false, 0.1, false)?;
    rate_series(&mut chart, &series(Counts::failure, 0.17), FAILURE, true, 0.1, false)?;
    Ok(())
}

/// The by-step rows with a numeric step, in step order.
fn steps(report: &Report) -> Vec<(u64, Counts)> {
    let mut v: Vec<(u64, Counts)> =
        report.by_step.iter().filter_map(|g| g.name.parse().ok().map(|s| (s, g.counts))).collect();
    v.sort_by_key(|&(s, _)| s);
    v
}

/// Smallest gap between consecutive sorted `xs` (1 for a single value).
fn spacing(xs: &[u64]) -> f64 {
    let gap = xs.windows(2).map(|w| (w[1] - w[0]) as f64).filter(|&d| d > 0.0).fold(f64::INFINITY, f64::min);
    if gap.is_finite() {
        gap
    } else {
        1.0
    }
}

/// Step ticks: every step when there are few, else round numbers.
fn step_ticks(xs: &[u64], lo: f64, hi: f64) -> Vec<f64> {
    if xs.len() <= 12 {
        xs.iter().map(|&s| s as f64).collect()
    } else {
        ticks(lo, hi, 10).into_iter().filter(|t| t.fract() == 0.0).collect()
    }
}

/// Figure 3: the share not masked and failing per injection step, with intervals.
fn draw_step<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Drawn
where
    DB::ErrorType: 'static,
{
    let rows = steps(report);
    let xs: Vec<u64> = rows.iter().map(|r| r.0).collect();
    let gap = spacing(&xs);
    let (lo, hi) = (xs[0] as f64 - 0.6 * gap, xs[xs.len() - 1] as f64 + 0.6 * gap);
    let area = legend(area, &rate_legend(failure_word(report)))?;
    let highest = rows.iter().map(|(_, c)| c.unmasked().hi.max(c.failure().hi)).fold(0.0, f64::max);
    let (ytop, yticks, ystep) = share_axis(highest, 0.03);
    let mut chart = chart(&area, (lo, hi, step_ticks(&xs, lo, hi)), (0.0, ytop, yticks), 60)?;
    let x_desc = step_word(report);
    mesh(&mut chart, x_desc, "share of trials", &|x| format!("{}", x.round() as i64), &|y| percent(*y, ystep))?;
    let (dx, cap) = (0.08 * gap, 0.01 * (hi - lo));
    let series = |f: fn(&Counts) -> Estimate, dx: f64| -> Vec<(f64, Estimate)> {
        rows.iter().map(|(s, c)| (*s as f64 + dx, f(c))).collect()
    };
    rate_series(&mut chart, &series(Counts::unmasked, -dx), UNMASKED, false, cap, true)?;
    rate_series(&mut chart, &series(Counts::failure, dx), FAILURE, true, cap, true)?;
    Ok(())
}

/// Outcomes present among `outcomes`, in palette order, as legend entries.
fn outcome_entries(outcomes: impl Iterator<Item = Outcome>) -> Vec<(String, Swatch)> {
    let mut present = [false; Outcome::ALL.len()];
    outcomes.for_each(|o| present[o.index()] = true);
    Outcome::ALL
        .iter()
        .filter(|o| present[o.index()])
        .map(|&o| (o.name().to_string(), Swatch::Line(outcome_color(o), 3)))
        .collect()
}

/// Faulty losses above this multiple of golden's highest are drawn at the top edge: a loss of
/// 1e30 would otherwise flatten every other curve onto the x axis.
const LOSS_CLIP: f64 = 100.0;
/// Log-scale the loss axis when the losses shown span more than this factor.
const LOSS_LOG_RANGE: f64 = 20.0;

/// Label of a loss tick (the value, or `10^k` when log-scaled), without float noise.
fn loss_label(v: f64, log: bool) -> String {
    let v = if log { 10f64.powf(v) } else { v };
    if v == 0.0 {
        return "0".into();
    }
    let k = v.abs().log10().floor();
    if !(-3.0..5.0).contains(&k) {
        return format!("{:.0e}", v);
    }
    // Three significant digits at most: 0.001, 0.25, 2, 150.
    let decimals = (2.0 - k).max(0.0) as usize;
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// Log-axis ticks (in log10 units) over `[lo, hi]`: 1-2-5 steps over a few decades, every
/// decade (or every few) beyond.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (d0, d1) = (lo.floor() as i32, hi.ceil() as i32);
    let mantissas: &[f64] = if d1 - d0 <= 4 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    let every = ((d1 - d0) as f64 / 8.0).ceil().max(1.0) as usize;
    (d0..=d1)
        .step_by(every)
        .flat_map(|d| mantissas.iter().map(move |m| d as f64 + m.log10()))
        .filter(|&t| t >= lo - 1e-9 && t <= hi + 1e-9)
        .collect()
}

/// A faulty loss curve as drawn: its finite (step, loss) points up to the first non-finite
/// step, if any.
struct Faulty {
    outcome: Outcome,
    points: Vec<(f64, f64)>,
    broken: Option<f64>,
}

impl Faulty {
    fn of(c: &Curve, golden: &[f64]) -> Faulty {
        let mut points = Vec::new();
        let mut broken = None;
        for (i, d) in c.loss_delta.iter().enumerate() {
            let step = c.step as usize + i;
            let Some(&g) = golden.get(step.wrapping_sub(1)) else { break };
            if !(g + d).is_finite() {
                broken = Some(step as f64);
                break;
            }
            points.push((step as f64, g + d));
        }
        Faulty { outcome: c.outcome, points, broken }
    }
}

/// Figure 4: golden loss per step (black) under sampled faulty trials' losses, coloured by
/// outcome; a non-finite loss ends a curve with an X at the top edge.
fn draw_loss<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Drawn
where
    DB::ErrorType: 'static,
{
    let golden = &report.golden_losses;
    let golden_max = golden.iter().copied().filter(|g| g.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    let clip = if golden_max > 0.0 { golden_max * LOSS_CLIP } else { f64::INFINITY };
    let curves: Vec<Faulty> = report.curves.iter().map(|c| Faulty::of(c, golden)).collect();
    let shown = golden.iter().copied().chain(curves.iter().flat_map(|c| c.points.iter().map(|p| p.1.min(clip))));
    let (mut min, mut min_pos, mut max) = (f64::INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for v in shown.filter(|v| v.is_finite()) {
        if v > 0.0 {
            min_pos = min_pos.min(v);
        }
        (min, max) = (min.min(v), max.max(v));
    }
    let clipped = curves.iter().any(|c| c.points.iter().any(|p| p.1 > clip));
    let broken = curves.iter().any(|c| c.broken.is_some());
    let log = min_pos.is_finite() && max / min_pos > LOSS_LOG_RANGE;
    // Values on the y axis (log10 of the loss when log-scaled); `None`: no place on it.
    let axis = |v: f64| match log {
        false => Some(v),
        true if v > 0.0 => Some(v.log10()),
        true => None,
    };
    let (lo, hi) = match log {
        true => (min_pos.log10(), max.log10()),
        false => (min.min(0.0), max.max(min.min(0.0) + 1e-12)),
    };
    let span = hi - lo;
    let ylo = if log { lo - 0.04 * span } else { lo };
    // Headroom for the X marks of non-finite losses.
    let yhi = hi + if broken { 0.1 } else { 0.05 } * span;
    let yticks = if log { log_ticks(ylo, hi) } else { ticks(lo, hi, 6) };
    let mut entries = vec![("golden".to_string(), Swatch::Line(BLACK, 3))];
    entries.extend(outcome_entries(report.curves.iter().map(|c| c.outcome)));
    if clipped {
        entries.push((format!("loss > {LOSS_CLIP:.0}x golden max (clipped)"), Swatch::Triangle(BLACK)));
    }
    if broken {
        entries.push(("non-finite loss (X at top)".into(), Swatch::Cross(BLACK)));
    }
    let area = legend(area, &entries)?;
    let xhi = (golden.len() as f64).max(2.0);
    let mut chart = chart(&area, (1.0, xhi, ticks(1.0, xhi, 10)), (ylo, yhi, yticks), 60)?;
    let y_desc = if log { "training loss (log scale)" } else { "training loss" };
    mesh(&mut chart, "training step", y_desc, &|x| format!("{}", x.round() as i64), &|y| loss_label(*y, log))?;
    // Golden first and thick, so faulty curves that follow it stay visible on top of it.
    let golden_pts = golden.iter().enumerate().filter_map(|(i, &g)| axis(g).map(|y| ((i + 1) as f64, y)));
    chart.draw_series(LineSeries::new(golden_pts, BLACK.stroke_width(3)))?;
    for Faulty { outcome, points, broken } in &curves {
        let color = outcome_color(*outcome);
        // A loss without a place on a log axis (<= 0) breaks the line like a non-finite one.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for &(x, v) in points {
            match axis(v.min(clip)) {
                Some(y) => runs.last_mut().expect("one run").push((x, y)),
                None => runs.push(Vec::new()),
            }
        }
        for run in runs.into_iter().filter(|r| !r.is_empty()) {
            if run.len() == 1 {
                chart.draw_series(std::iter::once(Circle::new(run[0], 3, color.filled())))?;
            } else {
                chart.draw_series(LineSeries::new(run, color.mix(0.85).stroke_width(2)))?;
            }
        }
        let over = points.iter().filter(|p| p.1 > clip).filter_map(|&(x, _)| axis(clip).map(|y| (x, y)));
        chart.draw_series(over.map(|p| TriangleMarker::new(p, 5, color.filled())))?;
        if let Some(x) = broken {
            let y = yhi - 0.04 * (yhi - ylo);
            chart.draw_series(std::iter::once(Cross::new((*x, y), 6, color.stroke_width(2))))?;
        }
    }
    Ok(())
}

/// Figure 5: each faulty trial's test accuracy at its window end (coloured by outcome, spread
/// across x within its step, ordered by outcome then trial), with golden's as black bars.
fn draw_accuracy<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Drawn
where
    DB::ErrorType: 'static,
{
    let mut by_step: BTreeMap<u64, Vec<(usize, usize)>> = BTreeMap::new(); // step -> (outcome, order)
    for (i, p) in report.accuracy.iter().enumerate() {
        by_step.entry(p.step).or_default().push((p.outcome.index(), i));
    }
    let mut xs: Vec<u64> = by_step.keys().copied().chain(report.golden_accuracy.iter().map(|g| g.0)).collect();
    xs.sort_unstable();
    xs.dedup();
    let gap = spacing(&xs);
    let half = 0.35 * gap;
    // Deterministic jitter: a step's points spread evenly over its slot in (outcome, trial) order.
    let mut points: Vec<(f64, f64, Outcome)> = Vec::new();
    for (&step, members) in &mut by_step {
        members.sort_unstable();
        let m = members.len();
        for (j, &(_, i)) in members.iter().enumerate() {
            let off = if m > 1 { -half + 2.0 * half * j as f64 / (m - 1) as f64 } else { 0.0 };
            let p = &report.accuracy[i];
            points.push((step as f64 + off, p.accuracy, p.outcome));
        }
    }
    let values = points.iter().map(|p| p.1).chain(report.golden_accuracy.iter().map(|g| g.1));
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let pad = ((hi - lo) * 0.08).max(0.01);
    let (ylo, yhi) = ((lo - pad).max(0.0), (hi + pad).min(1.0));
    let yticks = ticks(ylo, yhi, 6);
    let ystep = if yticks.len() > 1 { yticks[1] - yticks[0] } else { 0.01 };
    let mut entries = vec![("golden".to_string(), Swatch::Line(BLACK, 3))];
    entries.extend(outcome_entries(report.accuracy.iter().map(|p| p.outcome)));
    let area = legend(area, &entries)?;
    let (xlo, xhi) = (xs[0] as f64 - 0.6 * gap, xs[xs.len() - 1] as f64 + 0.6 * gap);
    let mut chart = chart(&area, (xlo, xhi, step_ticks(&xs, xlo, xhi)), (ylo, yhi, yticks), 60)?;
    mesh(&mut chart, step_word(report), "test accuracy at window end", &|x| format!("{}", x.round() as i64), &|y| {
        percent(*y, ystep)
    })?;
    chart.draw_series(report.golden_accuracy.iter().map(|&(s, a)| {
        PathElement::new(vec![(s as f64 - half * 1.1, a), (s as f64 + half * 1.1, a)], BLACK.stroke_width(3))
    }))?;
    chart.draw_series(points.iter().map(|&(x, y, o)| Circle::new((x, y), 3, outcome_color(o).mix(0.85).filled())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{aggregate, BitProfile, Cell};
    use crate::load::load;
    use faultline_hw::budget::HostMemory;

    /// The report of the shipped fixture campaign (`tests/fixtures/tiny`).
    fn fixture() -> Report {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny");
        aggregate(&load(&dir, &HostMemory::default(), |_, _| {}).expect("fixture loads"))
    }

    /// `report` with every figure's data removed.
    fn empty(mut report: Report) -> Report {
        report.heatmaps.clear();
        report.bit_profiles.clear();
        report.by_step.clear();
        report.curves.clear();
        report.accuracy.clear();
        report
    }

    /// Text as plotters' SVG backend writes it.
    fn escaped(s: &str) -> String {
        s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
    }

    /// Whether `svg` draws the text `s` (the SVG backend writes each text on its own line).
    fn draws(svg: &str, s: &str) -> bool {
        svg.contains(&format!("\n{}\n</text>", escaped(s)))
    }

    #[test]
    fn every_figure_is_an_svg_with_its_title_and_a_png_file() {
        let dir = tempfile::tempdir().unwrap();
        let figures = write_figures(&fixture(), dir.path()).unwrap();
        let names: Vec<&str> = figures.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "heatmap-weight",
                "heatmap-psum",
                "bits-mxu-pe-weight",
                "bits-mxu-pe-psum",
                "bits-vpu-lane-out",
                "bits-ub-word",
                "bits-seq-acc-addr",
                "bits-seq-tile",
                "outcome-vs-step",
                "loss-curves",
                "test-accuracy",
            ]
        );
        let sections: Vec<Section> = figures.iter().map(|f| f.section).collect();
        assert!(sections.windows(2).all(|w| w[0] as u8 <= w[1] as u8), "report order: {sections:?}");
        for f in &figures {
            assert!(f.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{}", f.name);
            assert!(f.svg.starts_with("<svg"), "{}: {}", f.name, &f.svg[..40]);
            assert!(f.svg.trim_end().ends_with("</svg>"), "{}", f.name);
            assert!(draws(&f.svg, &f.title), "{}: title `{}` not drawn", f.name, f.title);
            let on_disk = std::fs::read_to_string(dir.path().join(format!("figures/{}.svg", f.name))).unwrap();
            assert_eq!(on_disk, f.svg, "{}", f.name);
            let png = std::fs::read(dir.path().join(format!("figures/{}.png", f.name))).unwrap();
            assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{}.png is not a PNG", f.name);
        }
        let heatmap = &figures[0];
        assert!(heatmap.title.starts_with("mxu.pe[*][*].weight \u{2014} training failure rate"), "{}", heatmap.title);
        assert!(heatmap.svg.contains("\nPE column") && draws(&heatmap.svg, "PE row"));
        let bits = &figures[3];
        for field in ["sign", "exponent", "mantissa", "bit position (MSB left)"] {
            assert!(draws(&bits.svg, field), "{} lacks `{field}`", bits.name);
        }
        let seq = &figures[6];
        assert!(!draws(&seq.svg, "mantissa"), "a class without a format has no field bands");
    }

    #[test]
    fn the_same_report_gives_byte_identical_figures() {
        let report = fixture();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = write_figures(&report, a.path()).unwrap();
        let second = write_figures(&report, b.path()).unwrap();
        assert_eq!(first.len(), second.len());
        for (x, y) in first.iter().zip(&second) {
            assert!(x.svg == y.svg, "{} differs between runs", x.name);
            let png = |d: &Path| std::fs::read(d.join(format!("figures/{}.png", x.name))).unwrap();
            assert!(png(a.path()) == png(b.path()), "{}.png differs between runs", x.name);
        }
    }

    /// A 4x4 array, row-major: PE (0,0) 2 trials both failed (too few: would be the darkest
    /// colour), (0,1) none, (0,2) 1 trial; (3,3) 4 trials all failed; the rest 4 trials, none
    /// failed.
    fn small_heatmap() -> Heatmap {
        let mut cells = vec![Cell { trials: 4, unmasked: 1, failures: 0 }; 16];
        cells[0] = Cell { trials: 2, unmasked: 2, failures: 2 };
        cells[1] = Cell::default();
        cells[2] = Cell { trials: 1, unmasked: 0, failures: 0 };
        cells[15] = Cell { trials: 4, unmasked: 4, failures: 4 };
        Heatmap { class: "mxu.pe[*][*].psum".into(), register: "psum".into(), rows: 4, cols: 4, cells }
    }

    /// `(x, y)` of each `<rect` filled with `color`.
    fn rects(svg: &str, color: &str) -> Vec<(i32, i32)> {
        let attr = |line: &str, name: &str| -> i32 {
            let start = line.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            line[start..].split('"').next().unwrap().parse().unwrap()
        };
        svg.lines()
            .filter(|l| l.starts_with("<rect") && l.contains(&format!("fill=\"{color}\"")))
            .map(|l| (attr(l, "x"), attr(l, "y")))
            .collect()
    }

    #[test]
    fn heatmap_greys_out_cells_with_too_few_trials_and_puts_row_0_on_top() {
        let mut report = empty(fixture());
        report.heatmaps.push(small_heatmap());
        let dir = tempfile::tempdir().unwrap();
        let figures = write_figures(&report, dir.path()).unwrap();
        assert_eq!(figures.len(), 1);
        let svg = &figures[0].svg;
        assert_eq!(figures[0].name, "heatmap-psum");
        assert!(figures[0].title.contains("per PE"), "{}", figures[0].title);
        let zero = rects(svg, "#FFFFCC"); // heat(0)
        let full = rects(svg, "#800026"); // heat(1): rate 1 at the top of a 0..100% scale
        let grey = rects(svg, "#E0E0E0");
        // 12 cells with enough trials and no failure; the too-few ones are not among them.
        assert_eq!(zero.len(), 12, "{svg}");
        assert_eq!(full.len(), 1, "only PE (3,3) is coloured as failing; PE (0,0) has too few trials");
        // The grey (hatched) array under the coloured cells, and the legend's sample.
        assert_eq!(grey.len(), 2);
        assert!(svg.contains("fewer than 3 trials"));
        // PE (3,3) is the bottom-right cell: row 0 is at the top.
        assert!(zero.iter().all(|&(x, y)| x < full[0].0 || y < full[0].1), "{zero:?} vs {full:?}");
        assert!(zero.iter().any(|&(x, y)| x < full[0].0 && y < full[0].1));
    }

    #[test]
    fn sparse_heatmaps_are_drawn_in_blocks_of_pes() {
        let sparse = |per_cell: &dyn Fn(usize) -> u64| Heatmap {
            class: "mxu.pe[*][*].act".into(),
            register: "act".into(),
            rows: 32,
            cols: 32,
            cells: (0..1024).map(|i| Cell { trials: per_cell(i), unmasked: 0, failures: 0 }).collect(),
        };
        // 3 trials per PE: per PE.
        assert_eq!(block_size(&sparse(&|_| 3)), 1);
        // One trial in every 4th PE: 2x2 blocks still have 1-2, 4x4 blocks have 4.
        assert_eq!(block_size(&sparse(&|i| (i % 4 == 0) as u64)), 4);
        // Almost nothing: never coarser than 4 cells per side.
        assert_eq!(block_size(&sparse(&|i| (i == 0) as u64)), 8);
        let mut report = empty(fixture());
        report.heatmaps.push(sparse(&|i| (i % 4 == 0) as u64));
        let dir = tempfile::tempdir().unwrap();
        let figures = write_figures(&report, dir.path()).unwrap();
        assert!(figures[0].title.contains("per 4x4 PE block"), "{}", figures[0].title);
        assert_eq!(rects(&figures[0].svg, "#FFFFCC").len(), 64);
    }

    #[test]
    fn figures_without_data_are_left_out() {
        let mut report = empty(fixture());
        // Inference campaigns have no loss curve; a heatmap of a class with no trials says nothing.
        report.golden_losses.clear();
        report.heatmaps.push(Heatmap { cells: vec![Cell::default(); 16], ..small_heatmap() });
        report.bit_profiles.push(BitProfile { class: "x.y".into(), format: None, bits: vec![Counts::default(); 8] });
        let dir = tempfile::tempdir().unwrap();
        assert!(write_figures(&report, dir.path()).unwrap().is_empty());
    }

    #[test]
    fn loss_curves_clip_huge_losses_and_mark_non_finite_ones() {
        let mut report = empty(fixture());
        let golden = report.golden_losses.clone();
        report.curves = vec![
            // A blow-up: 1e30 then non-finite.
            Curve { trial: 1, step: 4, outcome: Outcome::ShortTermInfNan, loss_delta: vec![0.0, 1e30, f64::NAN] },
            Curve { trial: 2, step: 4, outcome: Outcome::Benign, loss_delta: vec![0.01; 8] },
        ];
        let dir = tempfile::tempdir().unwrap();
        let figures = write_figures(&report, dir.path()).unwrap();
        assert_eq!(figures.len(), 1);
        let svg = &figures[0].svg;
        assert!(svg.contains("log scale"), "1e30 against a loss of ~2 needs a log axis");
        assert!(svg.contains("non-finite loss") && svg.contains("golden max (clipped)"));
        assert!(draws(svg, "ShortTermInfNan") && draws(svg, "Benign") && !draws(svg, "SlowDegrade"));
        // The axis stops 100x above golden, not at 1e30.
        assert!(!svg.contains("e30") && !svg.contains("e29"), "axis not clipped");
        let top = golden.iter().copied().fold(0.0, f64::max) * LOSS_CLIP;
        assert!(
            draws(svg, &loss_label(10f64.powf(top.log10().floor()), false)),
            "no tick at the decade below the clip"
        );
        // Small losses only: linear.
        report.curves.remove(0);
        let figures = write_figures(&report, dir.path()).unwrap();
        assert!(!figures[0].svg.contains("log scale") && !figures[0].svg.contains("non-finite"));
    }

    #[test]
    fn slugs_are_lowercase_filesystem_safe_and_unique() {
        assert_eq!(slug("mxu.pe[*][*].weight_shadow"), "mxu-pe-weight-shadow");
        assert_eq!(slug("ub.word[*]"), "ub-word");
        assert_eq!(slug("DMA.src_addr"), "dma-src-addr");
        let mut report = empty(fixture());
        let profile = |class: &str| BitProfile {
            class: class.into(),
            format: Some("int8".into()),
            bits: vec![Counts { outcomes: [1; Outcome::ALL.len()] }; 8],
        };
        report.bit_profiles = vec![profile("a.b_c"), profile("a.b.c"), profile("a.b-c")];
        let names: Vec<String> = plan(&report).into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["bits-a-b-c", "bits-a-b-c-2", "bits-a-b-c-3"]);
    }

    #[test]
    fn ticks_and_labels_are_round() {
        let shares: Vec<String> = ticks(0.0, 1.0, 5).into_iter().map(|t| percent(t, 0.2)).collect();
        assert_eq!(shares, ["0%", "20%", "40%", "60%", "80%", "100%"]);
        assert_eq!(ticks(1.0, 40.0, 10), [5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0]);
        let mut fp32 = bit_ticks(32, Some("fp32"));
        fp32.sort_unstable();
        assert_eq!(fp32, [0, 4, 8, 12, 16, 20, 23, 28, 31]);
        assert_eq!(bit_ticks(8, Some("int8")), (0..8).collect::<Vec<_>>());
        assert_eq!(percent(0.25, 0.05), "25%");
        assert_eq!(percent(0.005, 0.002), "0.5%");
        assert_eq!(loss_label(2f64.log10(), true), "2");
        assert_eq!(loss_label(-1.0, true), "0.1");
        assert_eq!(loss_label(30.0, true), "1e30");
        assert_eq!(loss_label(0.25, false), "0.25");
        assert_eq!(pe_ticks(32, 1), [0.5, 4.5, 8.5, 12.5, 16.5, 20.5, 24.5, 28.5, 31.5]);
        assert_eq!(pe_ticks(32, 4), [0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0]);
    }

    #[test]
    fn outcome_colours_are_distinct_within_a_mode() {
        let training: Vec<RGBColor> =
            Outcome::ALL.iter().filter(|o| !o.inference_only()).map(|&o| outcome_color(o)).collect();
        let inference: Vec<RGBColor> =
            Outcome::ALL.iter().filter(|o| o.inference_only() || !o.unmasked()).map(|&o| outcome_color(o)).collect();
        assert_eq!(training.len(), 12);
        for colors in [training, inference] {
            for (i, a) in colors.iter().enumerate() {
                assert!(colors[i + 1..].iter().all(|b| b != a), "{a:?} used twice");
            }
        }
    }
}
