//! The report's CSV files, one header line each so `pandas.read_csv` reads them as they are:
//! `summary.csv` (one row per site class) and `trials.csv` (one row per trial).

use crate::aggregate::{bit_field, Report};
use crate::error::{ReportError, Result};
use crate::load::Trace;
use std::path::Path;

/// A float as CSV text: Rust's shortest round-trip form, empty when absent.
fn num(x: Option<f64>) -> String {
    x.map(|v| v.to_string()).unwrap_or_default()
}

/// Opens a CSV writer on `path`.
pub(crate) fn writer(path: &Path) -> Result<csv::Writer<std::fs::File>> {
    csv::Writer::from_path(path).map_err(|e| csv_error(path, e))
}

/// A CSV error as an I/O error on `path`.
pub(crate) fn csv_error(path: &Path, e: csv::Error) -> ReportError {
    ReportError::Io { path: path.to_path_buf(), source: std::io::Error::other(e) }
}

/// Writes `summary.csv`: per class its bits, outcome counts, vulnerability and failure shares
/// with their Wilson 95% intervals, and FIT when the campaign gives a raw FIT per bit.
pub fn write_summary(report: &Report, fit_per_bit: Option<f64>, path: &Path) -> Result<()> {
    let mut w = writer(path)?;
    let mut head: Vec<String> =
        ["unit", "class", "register", "kind", "format", "bits", "trials", "skipped_dead"].map(String::from).to_vec();
    head.extend(report.outcomes.iter().map(|o| o.name().to_string()));
    head.extend(
        [
            "unmasked",
            "unmasked_lo",
            "unmasked_hi",
            "failure",
            "failure_lo",
            "failure_hi",
            "fit_per_bit",
            "fit_unmasked",
            "fit_failure",
            "fit_failure_lo",
            "fit_failure_hi",
        ]
        .map(String::from),
    );
    w.write_record(&head).map_err(|e| csv_error(path, e))?;
    for c in &report.classes {
        let (u, f) = (c.unmasked, c.failure);
        let mut row = vec![
            c.info.unit.clone(),
            c.info.class.clone(),
            c.info.register.clone(),
            format!("{:?}", c.info.kind),
            c.info.format.clone().unwrap_or_default(),
            c.info.bits.to_string(),
            c.counts.trials().to_string(),
            c.skipped.to_string(),
        ];
        row.extend(report.outcomes.iter().map(|&o| c.counts.of(o).to_string()));
        row.extend([u.p, u.lo, u.hi, f.p, f.lo, f.hi].map(|x| x.to_string()));
        row.push(num(fit_per_bit));
        row.push(num(c.fit_unmasked.map(|x| x[0])));
        row.extend((0..3).map(|i| num(c.fit_failure.map(|x| x[i]))));
        w.write_record(&row).map_err(|e| csv_error(path, e))?;
    }
    w.flush().map_err(ReportError::io(path))
}

/// Writes `trials.csv`: every trial with its site (unit, register, PE row and column where
/// the class has two indices, bit and the bit's field), time, outcome and where it landed.
pub fn write_trials(trace: &Trace, path: &Path) -> Result<()> {
    let mut w = writer(path)?;
    w.write_record([
        "trial",
        "class",
        "unit",
        "register",
        "element",
        "row",
        "col",
        "bit",
        "field",
        "step",
        "cycle",
        "skipped",
        "outcome",
        "unmasked",
        "failure",
        "phase",
        "layer",
        "op",
        "corrupted",
        "test_accuracy_delta",
    ])
    .map_err(|e| csv_error(path, e))?;
    for t in &trace.trials {
        let c = &trace.info.classes[t.class as usize];
        let (row, col) = match c.dims {
            [_, cols] if cols > 1 => ((t.element / cols as u64).to_string(), (t.element % cols as u64).to_string()),
            _ => (String::new(), String::new()),
        };
        let landed = t.landed.map(|l| {
            [
                l.phase.name().to_string(),
                trace.layers[l.layer as usize].clone(),
                trace.ops[l.op as usize].clone(),
                l.corrupted.to_string(),
            ]
        });
        let [phase, layer, op, corrupted] = landed.unwrap_or_default();
        w.write_record([
            t.trial.to_string(),
            c.class.clone(),
            c.unit.clone(),
            c.register.clone(),
            t.element.to_string(),
            row,
            col,
            t.bit.to_string(),
            bit_field(c.format.as_deref(), t.bit).to_string(),
            t.step.to_string(),
            t.cycle.to_string(),
            t.skipped.to_string(),
            t.outcome.name().to_string(),
            t.outcome.unmasked().to_string(),
            t.outcome.failure().to_string(),
            phase,
            layer,
            op,
            corrupted,
            num(t.test_accuracy_delta),
        ])
        .map_err(|e| csv_error(path, e))?;
    }
    w.flush().map_err(ReportError::io(path))
}
