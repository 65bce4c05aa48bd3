//! The Pareto report's figures, in the campaign report's style (its font, size and grid
//! colour): residual FIT against each cost, with whiskers and the front as a step line.

use crate::document::fit;
use crate::error::{ReportError, Result};
use crate::figures::{self, font, register_font, slug, tick_step, Axis, Figure, Section, FIGURE_SIZE, GRID};
use faultline_fault::explore::{CampaignResult, ExploreResult, PlanResult};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// Plan markers and whiskers (Okabe-Ito blue).
const POINT: RGBColor = RGBColor(0x00, 0x72, 0xB2);
/// The Pareto front's step line (Okabe-Ito vermilion).
const FRONT: RGBColor = RGBColor(0xD5, 0x5E, 0x00);
/// Whiskers are cut (and end in an arrow) above this many times the largest estimate.
const CLIP: f64 = 4.0;

/// The name prefix of campaign `ci`'s figures: `pareto-<n>-<slug>-`, numbered so that two
/// campaigns whose names slug alike never share figures.
pub(super) fn figure_prefix(result: &ExploreResult, ci: usize) -> String {
    format!("pareto-{}-{}-", ci + 1, slug(&result.campaigns[ci].campaign))
}

/// The cost a figure puts on its x axis.
#[derive(Clone, Copy, PartialEq)]
enum Cost {
    /// Cycle overhead, in percent of the unprotected step.
    Overhead,
    /// Check bits added.
    Bits,
}

impl Cost {
    /// Plan `p`'s value on this axis.
    fn of(self, p: &PlanResult) -> f64 {
        match self {
            Cost::Overhead => 100.0 * p.cycle_overhead,
            Cost::Bits => p.area_bits as f64,
        }
    }
}

/// A figure to draw.
struct Plan<'a> {
    name: String,
    title: String,
    campaign: &'a CampaignResult,
    cost: Cost,
}

/// Draws both figures of every campaign with plans, writes them under `dir/figures/` and
/// returns them in report order.
pub fn write_figures(result: &ExploreResult, dir: &Path) -> Result<Vec<Figure>> {
    register_font()?;
    let out = dir.join("figures");
    std::fs::create_dir_all(&out).map_err(ReportError::io(&out))?;
    let mut plans = Vec::new();
    for (ci, c) in result.campaigns.iter().enumerate().filter(|(_, c)| !c.plans.is_empty()) {
        let prefix = figure_prefix(result, ci);
        for (cost, stem, what) in [(Cost::Overhead, "overhead", "cycle overhead"), (Cost::Bits, "bits", "check bits")] {
            plans.push(Plan {
                name: format!("{prefix}{stem}"),
                title: format!("{}: residual failure FIT vs {what}", c.campaign),
                campaign: c,
                cost,
            });
        }
    }
    plans.iter().map(|p| render(p, &out)).collect()
}

/// Any backend's drawing error (both backends' errors are `'static`).
type DrawError = Box<dyn std::error::Error>;
/// Result of drawing.
type Drawn<T = ()> = std::result::Result<T, DrawError>;

/// Draws one figure to SVG and PNG and writes both.
fn render(p: &Plan, out: &Path) -> Result<Figure> {
    let mut svg = String::new();
    draw(SVGBackend::with_string(&mut svg, FIGURE_SIZE).into_drawing_area(), p)
        .map_err(|e| ReportError::Figure { name: p.name.clone(), why: e.to_string() })?;
    let png = out.join(format!("{}.png", p.name));
    draw(BitMapBackend::new(&png, FIGURE_SIZE).into_drawing_area(), p)
        .map_err(|e| ReportError::Figure { name: p.name.clone(), why: format!("{}: {e}", png.display()) })?;
    let path = out.join(format!("{}.svg", p.name));
    std::fs::write(&path, &svg).map_err(ReportError::io(&path))?;
    // The campaign report's sections have no place for an exploration's figures; the
    // renderers ignore the section, and `build` places these by name.
    Ok(Figure { name: p.name.clone(), title: p.title.clone(), section: Section::Pareto, svg })
}

/// About `max` round ticks from 0 to `hi`, and their step ([`figures::tick_step`]).
fn ticks(hi: f64, max: usize) -> (Vec<f64>, f64) {
    match tick_step(hi, max) {
        Some(step) => (figures::ticks(0.0, hi, max), step),
        None => (vec![0.0], 1.0),
    }
}

/// A tick label with as many decimals as the tick step needs (2.5 needs one, 20 none).
fn tick_label(v: f64, step: f64) -> String {
    if v.abs() >= 1e6 {
        return format!("{v:e}");
    }
    let decimals = (0..8).find(|&d| {
        let s = step * 10f64.powi(d);
        (s - s.round()).abs() < 1e-6 * s.max(1.0)
    });
    format!("{v:.*}", decimals.unwrap_or(8) as usize)
}

/// An axis from 0 to a little above `hi` (1 when nothing is above 0: a FIT of 0 or a single
/// plan at no cost still gets an axis), padded below 0 so markers at 0 are not cut, with the
/// ticks and their step. `to_tick`: the top is the first tick at or above `hi`, so the
/// highest whisker ends under a labelled line.
fn axis_from_zero(hi: f64, pad_hi: f64, to_tick: bool) -> (Axis, f64) {
    let hi = if hi > 0.0 && hi.is_finite() { hi } else { 1.0 };
    let (mut ticks, step) = ticks(hi, 6);
    let last = ticks.last().copied().unwrap_or(0.0);
    let top = if to_tick && last < hi * (1.0 - 1e-9) {
        ticks.push(last + step);
        last + step
    } else {
        hi
    };
    (Axis { lo: -0.04 * top, hi: top * (1.0 + pad_hi), ticks }, step)
}

/// The plans on the front of `(x, y)` alone (lowest y for their x, lower than every plan
/// of smaller x), as points in x order.
fn front(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut sorted: Vec<(f64, f64)> = points.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for p in sorted {
        if out.last().is_none_or(|l| p.1 < l.1) {
            out.push(p);
        }
    }
    out
}

/// The staircase through `front`, extended to `right`: the boundary of what the plans attain.
fn staircase(front: &[(f64, f64)], right: f64) -> Vec<(f64, f64)> {
    let mut path = Vec::new();
    for (i, &(x, y)) in front.iter().enumerate() {
        if i > 0 {
            path.push((x, front[i - 1].1));
        }
        path.push((x, y));
    }
    if let Some(&(x, y)) = front.last() {
        path.push((x.max(right), y));
    }
    path
}

/// The legend, in one row across the top of `area` (outside the plot, so it never hides a
/// point); returns the area below it.
fn legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>) -> Drawn<DrawingArea<DB, Shift>>
where
    DB::ErrorType: 'static,
{
    const SWATCH: i32 = 22;
    const GAP: i32 = 6;
    const SEP: i32 = 18;
    let entries = ["Pareto-optimal (FIT, bits, cycles)", "dominated", "front in these two axes", "FIT 95% interval"];
    let style = font(13.0);
    let mut widths = Vec::new();
    for e in entries {
        widths.push(SWATCH + GAP + area.estimate_text_size(e, &style)?.0 as i32);
    }
    let total = widths.iter().sum::<i32>() + SEP * (entries.len() as i32 - 1);
    let (top, rest) = area.split_vertically(26);
    let (mut x, y) = (((top.dim_in_pixel().0 as i32 - total) / 2).max(4), 13);
    for (i, (e, w)) in entries.iter().zip(widths).enumerate() {
        let mid = (x + SWATCH / 2, y);
        match i {
            0 => top.draw(&Circle::new(mid, 5, POINT.filled()))?,
            1 => {
                top.draw(&Circle::new(mid, 5, WHITE.filled()))?;
                top.draw(&Circle::new(mid, 5, POINT.stroke_width(2)))?;
            }
            2 => top.draw(&PathElement::new(vec![(x, y), (x + SWATCH, y)], FRONT.stroke_width(2)))?,
            _ => {
                let s = POINT.stroke_width(1);
                top.draw(&PathElement::new(vec![(mid.0, y - 7), (mid.0, y + 7)], s))?;
                top.draw(&PathElement::new(vec![(mid.0 - 3, y - 7), (mid.0 + 3, y - 7)], s))?;
                top.draw(&PathElement::new(vec![(mid.0 - 3, y + 7), (mid.0 + 3, y + 7)], s))?;
            }
        }
        top.draw(&Text::new(*e, (x + SWATCH + GAP, y), style.pos(Pos::new(HPos::Left, VPos::Center))))?;
        x += w + SEP;
    }
    Ok(rest)
}

/// One figure: each plan at (its cost, its residual FIT) with the FIT's interval as a
/// whisker and its name beside it; Pareto plans filled; the front of these two axes as a
/// step line.
fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, p: &Plan) -> Drawn
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let room = root.dim_in_pixel().0.saturating_sub(16);
    let mut size = 18.0;
    while size > 10.0 && root.estimate_text_size(&p.title, &font(size))?.0 > room {
        size -= 1.0;
    }
    let body = root.titled(&p.title, font(size))?;
    let body = legend(&body)?;
    let plans = &p.campaign.plans;
    let xs: Vec<f64> = plans.iter().map(|q| p.cost.of(q)).collect();
    // Linear from 0 on both axes: a FIT of 0 is common (a plan that removed every failure
    // seen), and has no logarithm.
    let (xaxis, xstep) = axis_from_zero(xs.iter().copied().fold(0.0, f64::max), 0.08, false);
    let fit_top = plans.iter().map(|q| q.failure_fit.hi.max(q.failure_fit.p)).fold(0.0, f64::max);
    // A few huge, failure-free classes (SRAM words) give upper ends far above every
    // estimate; past CLIP x the largest estimate a whisker is cut and marked, so that the
    // estimates stay readable.
    let fit_max = plans.iter().map(|q| q.failure_fit.p).fold(0.0, f64::max);
    let fit_top = if fit_max > 0.0 { fit_top.min(CLIP * fit_max) } else { fit_top };
    let (yaxis, ystep) = axis_from_zero(fit_top, 0.04, true);
    let cut = yaxis.hi;
    // Say on the figure what the whiskers mean for the comparison: cut ones, and whether
    // every interval overlaps every other (then the points' order is within the noise).
    let mut notes = Vec::new();
    let highest = plans.iter().map(|q| q.failure_fit.hi).fold(0.0, f64::max);
    if highest > cut {
        notes.push(format!("whiskers cut at {} (arrows); upper ends reach {}", tick_label(cut, ystep), fit(highest)));
    }
    let all_overlap = plans.iter().all(|a| plans.iter().all(|b| a.failure_fit.overlaps(b.failure_fit)));
    if all_overlap && plans.len() > 1 {
        notes.push("all FIT intervals overlap: differences within the noise".into());
    }
    let body = if notes.is_empty() {
        body
    } else {
        let (top, rest) = body.split_vertically(22);
        let w = top.dim_in_pixel().0 as i32;
        top.draw(&Text::new(notes.join("; "), (w / 2, 10), font(13.0).pos(Pos::new(HPos::Center, VPos::Center))))?;
        rest
    };
    let right = xaxis.hi;
    let mut chart = ChartBuilder::on(&body)
        .margin(10)
        .margin_right(20)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(xaxis, yaxis)?;
    let x_desc = match p.cost {
        Cost::Overhead => "cycle overhead (% of the unprotected step)",
        Cost::Bits => "check bits added",
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("residual failure FIT")
        .x_label_formatter(&|x| tick_label(*x, xstep))
        .y_label_formatter(&|y| tick_label(*y, ystep))
        .label_style(font(13.0))
        .axis_desc_style(font(14.0))
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(TRANSPARENT)
        .draw()?;
    // The front first, then the whiskers over it (a step often runs along one), then the
    // markers over both, then the names on top.
    let pts: Vec<(f64, f64)> = plans.iter().zip(&xs).map(|(q, &x)| (x, q.failure_fit.p)).collect();
    chart.draw_series(std::iter::once(PathElement::new(staircase(&front(&pts), right), FRONT.stroke_width(2))))?;
    let whisker = POINT.stroke_width(1);
    chart.draw_series(
        plans
            .iter()
            .zip(&xs)
            .map(|(q, &x)| PathElement::new(vec![(x, q.failure_fit.lo), (x, q.failure_fit.hi.min(cut))], whisker)),
    )?;
    // Caps a fixed width in pixels, whatever the x axis spans; a cut whisker ends in an arrow.
    chart.draw_series(plans.iter().zip(&xs).flat_map(|(q, &x)| {
        let (lo, hi) = (q.failure_fit.lo, q.failure_fit.hi);
        let top = if hi > cut {
            EmptyElement::at((x, cut)) + PathElement::new(vec![(-4, 6), (0, 0), (4, 6)], whisker)
        } else {
            EmptyElement::at((x, hi)) + PathElement::new(vec![(-4, 0), (4, 0)], whisker)
        };
        [EmptyElement::at((x, lo)) + PathElement::new(vec![(-4, 0), (4, 0)], whisker), top]
    }))?;
    for (q, &pt) in plans.iter().zip(&pts) {
        if q.pareto {
            chart.draw_series(std::iter::once(Circle::new(pt, 5, POINT.filled())))?;
        } else {
            chart.draw_series([Circle::new(pt, 5, WHITE.filled()), Circle::new(pt, 5, POINT.stroke_width(2))])?;
        }
    }
    // Names beside their points, moved down (or up) until they overlap no name already
    // placed: plans of one cost (several at 0 check bits) would otherwise print on top of
    // each other.
    let style = font(12.0);
    let plot_right = chart.plotting_area().get_pixel_range().0.end;
    let mut placed: Vec<(i32, i32, i32, i32)> = Vec::new();
    for (q, &pt) in plans.iter().zip(&pts) {
        let (w, h) = body.estimate_text_size(&q.plan, &style)?;
        let (w, h) = (w as i32, h as i32);
        let (px, py) = chart.backend_coord(&pt);
        let dx = if px + 8 + w <= plot_right { 8 } else { -8 - w };
        let candidates = (0..12).map(|k| if k % 2 == 0 { -h - 4 - (k / 2) * (h + 2) } else { 4 + (k / 2) * (h + 2) });
        let mut dy = -h - 4;
        for c in candidates {
            let r = (px + dx, py + c, px + dx + w, py + c + h);
            if placed.iter().all(|o| r.2 <= o.0 || o.2 <= r.0 || r.3 <= o.1 || o.3 <= r.1) {
                dy = c;
                break;
            }
        }
        placed.push((px + dx, py + dy, px + dx + w, py + dy + h));
        let label = Text::new(q.plan.clone(), (dx, dy), style.pos(Pos::new(HPos::Left, VPos::Top)));
        chart.draw_series(std::iter::once(EmptyElement::at(pt) + label))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_keeps_the_lowest_fit_for_each_cost() {
        let pts = [(0.0, 500.0), (1.2, 300.0), (2.0, 400.0), (0.0, 600.0), (5.0, 0.0)];
        assert_eq!(front(&pts), [(0.0, 500.0), (1.2, 300.0), (5.0, 0.0)]);
        assert_eq!(
            staircase(&front(&pts), 6.0),
            [(0.0, 500.0), (1.2, 500.0), (1.2, 300.0), (5.0, 300.0), (5.0, 0.0), (6.0, 0.0)]
        );
        assert_eq!(front(&[(0.0, 0.0)]), [(0.0, 0.0)]);
    }

    #[test]
    fn axes_start_at_zero_and_survive_all_zero_data() {
        let (a, step) = axis_from_zero(0.0, 0.1, true);
        assert!(a.lo < 0.0 && a.hi > 1.0 && a.ticks[0] == 0.0 && step > 0.0);
        let (a, step) = axis_from_zero(777.9, 0.0, false);
        assert_eq!((a.ticks, step, a.hi), (vec![0.0, 200.0, 400.0, 600.0], 200.0, 777.9));
        // To the next tick: the top whisker ends under a labelled grid line.
        let (a, _) = axis_from_zero(777.9, 0.0, true);
        assert_eq!((a.ticks, a.hi), (vec![0.0, 200.0, 400.0, 600.0, 800.0], 800.0));
        assert_eq!(tick_label(7.5, 2.5), "7.5");
        assert_eq!(tick_label(400.0, 200.0), "400");
        assert_eq!(tick_label(0.02, 0.01), "0.02");
    }
}
