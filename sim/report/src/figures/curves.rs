//! Figures 4 and 5: loss curves of golden and sampled faulty trials, and the test accuracy at
//! each trial's window end.

use crate::aggregate::Report;
use crate::load::Curve;
use faultline_fault::Outcome;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::BTreeMap;

use super::chart::{chart, legend, mesh, percent, ticks, Drawn, Swatch};
use super::shares::{spacing, step_ticks};
use super::step_word;
use super::style::outcome_color;

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
pub(super) const LOSS_CLIP: f64 = 100.0;
/// Log-scale the loss axis when the losses shown span more than this factor.
const LOSS_LOG_RANGE: f64 = 20.0;

/// Label of a loss tick (the value, or `10^k` when log-scaled), without float noise.
pub(super) fn loss_label(v: f64, log: bool) -> String {
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

/// Figure 4: golden loss per step (black, on top) over sampled faulty trials' losses, coloured
/// by outcome; a non-finite loss ends a curve with an X at the top edge.
pub(super) fn draw_loss<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Drawn
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
    let mut entries = vec![("golden (drawn on top)".to_string(), Swatch::Line(BLACK, 2))];
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
    // Golden last, so that it is the reference every faulty curve is read against and never
    // hidden under them; a faulty curve that runs under it is one that followed it.
    let golden_pts = golden.iter().enumerate().filter_map(|(i, &g)| axis(g).map(|y| ((i + 1) as f64, y)));
    chart.draw_series(LineSeries::new(golden_pts, BLACK.stroke_width(2)))?;
    Ok(())
}

/// Figure 5: each faulty trial's test accuracy at its window end (coloured by outcome, spread
/// across x within its step, ordered by outcome then trial), with golden's as black bars.
pub(super) fn draw_accuracy<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Drawn
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
    let mut entries = vec![("golden".to_string(), Swatch::Line(BLACK, 2))];
    entries.extend(outcome_entries(report.accuracy.iter().map(|p| p.outcome)));
    let area = legend(area, &entries)?;
    let (xlo, xhi) = (xs[0] as f64 - 0.6 * gap, xs[xs.len() - 1] as f64 + 0.6 * gap);
    let mut chart = chart(&area, (xlo, xhi, step_ticks(&xs, xlo, xhi)), (ylo, yhi, yticks), 60)?;
    mesh(&mut chart, step_word(report), "test accuracy at window end", &|x| format!("{}", x.round() as i64), &|y| {
        percent(*y, ystep)
    })?;
    chart.draw_series(points.iter().map(|&(x, y, o)| Circle::new((x, y), 3, outcome_color(o).mix(0.85).filled())))?;
    // Golden's bars over the points, as golden's loss is drawn over the faulty curves.
    chart.draw_series(report.golden_accuracy.iter().map(|&(s, a)| {
        PathElement::new(vec![(s as f64 - half * 1.1, a), (s as f64 + half * 1.1, a)], BLACK.stroke_width(2))
    }))?;
    Ok(())
}
