//! Figures 2 and 3: the outcome shares per bit position and per injection step, with their
//! intervals.

use crate::aggregate::{bit_field, Counts, Report};
use faultline_fault::stats::Estimate;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::chart::{chart, legend, mesh, percent, rate_legend, rate_series, share_axis, ticks, Drawn};
use super::style::{font, FAILURE, UNMASKED};
use super::{failure_word, step_word};

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
pub(super) fn bit_ticks(width: u32, format: Option<&str>) -> Vec<u32> {
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
pub(super) fn draw_bits<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report, index: usize) -> Drawn
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
    let highest = (measured.iter())
        .map(|(_, c)| profile.over_all(c.unmasked()).hi.max(profile.over_all(c.failure()).hi))
        .fold(0.0, f64::max);
    let (ytop, yticks, ystep) = share_axis(highest, if bands.is_empty() { 0.03 } else { HEADROOM });
    let xticks = bit_ticks(width, format).into_iter().map(pos).collect();
    let mut chart = chart(&area, (-0.5, width as f64 - 0.5, xticks), (0.0, ytop, yticks), 60)?;
    // Bands first, so the grid and the data draw over them.
    chart.draw_series(bands.iter().map(|&(f, msb, lsb)| {
        Rectangle::new([(pos(msb) - 0.5, 0.0), (pos(lsb) + 0.5, ytop)], field_color(f).filled())
    }))?;
    let x_fmt = |x: &f64| format!("{}", width as i64 - 1 - x.round() as i64);
    let y_label = if profile.share < 1.0 { "share of faults" } else { "share of trials" };
    mesh(&mut chart, "bit position (MSB left)", y_label, &x_fmt, &|y| percent(*y, ystep))?;
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
        measured.iter().map(|&(bit, c)| (pos(bit) + dx, profile.over_all(f(c)))).collect()
    };
    rate_series(&mut chart, &series(Counts::unmasked, -0.17), UNMASKED, false, 0.1, false)?;
    rate_series(&mut chart, &series(Counts::failure, 0.17), FAILURE, true, 0.1, false)?;
    Ok(())
}

/// The by-step rows with a numeric step, in step order.
pub(super) fn steps(report: &Report) -> Vec<(u64, Counts)> {
    let mut v: Vec<(u64, Counts)> =
        report.by_step.iter().filter_map(|g| g.name.parse().ok().map(|s| (s, g.counts))).collect();
    v.sort_by_key(|&(s, _)| s);
    v
}

/// Smallest gap between consecutive sorted `xs` (1 for a single value).
pub(super) fn spacing(xs: &[u64]) -> f64 {
    let gap = xs.windows(2).map(|w| (w[1] - w[0]) as f64).filter(|&d| d > 0.0).fold(f64::INFINITY, f64::min);
    if gap.is_finite() {
        gap
    } else {
        1.0
    }
}

/// Step ticks: every step when there are few, else round numbers.
pub(super) fn step_ticks(xs: &[u64], lo: f64, hi: f64) -> Vec<f64> {
    if xs.len() <= 12 {
        xs.iter().map(|&s| s as f64).collect()
    } else {
        ticks(lo, hi, 10).into_iter().filter(|t| t.fract() == 0.0).collect()
    }
}

/// Figure 3: the share not masked and failing per injection step, with intervals.
pub(super) fn draw_step<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, report: &Report) -> Drawn
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
