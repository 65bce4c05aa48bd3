//! Two campaigns side by side (before and after a protection plan, two machines, bf16 against
//! fp32): per site class and unit, each side's vulnerability and failure share with intervals,
//! the change, and whether the 95% intervals overlap (if they do, the campaigns cannot tell
//! the two apart at this sample size).

use crate::aggregate::{Counts, Report};
use crate::document::{pct, pct_of, Block, Row};
use crate::error::{ReportError, Result};
use crate::load::Trace;
use faultline_fault::stats::Estimate;
use std::path::{Path, PathBuf};

/// One compared quantity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    /// Side A's estimate `[p, lo, hi]` (absent: the class is not in A).
    pub a: Option<[f64; 3]>,
    /// Side B's.
    pub b: Option<[f64; 3]>,
}

impl Change {
    /// `b - a` of the point estimates, when both sides have it.
    pub fn delta(&self) -> Option<f64> {
        Some(self.b?[0] - self.a?[0])
    }

    /// Whether the two 95% intervals overlap (`None` unless both sides have the quantity).
    pub fn overlap(&self) -> Option<bool> {
        let (a, b) = (self.a?, self.b?);
        Some(a[1] <= b[2] && b[1] <= a[2])
    }
}

/// One row of the comparison: a class or a unit.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffRow {
    /// Class pattern or unit name.
    pub name: String,
    /// Whether this is a unit's total.
    pub unit: bool,
    /// Trials on each side.
    pub trials: [u64; 2],
    /// Vulnerability (share not masked).
    pub unmasked: Change,
    /// Training-failure share.
    pub failure: Change,
}

/// Compares two aggregated campaigns: every unit, then every class either side has (A's order,
/// then B's extra classes).
pub fn compare(a: &Report, b: &Report) -> Vec<DiffRow> {
    let est = |e: Estimate| [e.p, e.lo, e.hi];
    let mut rows = Vec::new();
    let mut units: Vec<&str> = a.units.iter().map(|u| u.unit.as_str()).collect();
    units.extend(b.units.iter().map(|u| u.unit.as_str()).filter(|n| !a.units.iter().any(|u| u.unit == *n)));
    for name in units {
        let (x, y) = (a.units.iter().find(|u| u.unit == name), b.units.iter().find(|u| u.unit == name));
        rows.push(DiffRow {
            name: name.to_string(),
            unit: true,
            trials: [x.map_or(0, |u| u.trials), y.map_or(0, |u| u.trials)],
            unmasked: Change { a: x.map(|u| u.unmasked), b: y.map(|u| u.unmasked) },
            failure: Change { a: x.map(|u| u.failure), b: y.map(|u| u.failure) },
        });
    }
    let mut classes: Vec<&str> = a.classes.iter().map(|c| c.info.class.as_str()).collect();
    classes.extend(
        b.classes.iter().map(|c| c.info.class.as_str()).filter(|n| !a.classes.iter().any(|c| c.info.class == *n)),
    );
    for name in classes {
        let find = |r: &Report| r.classes.iter().find(|c| c.info.class == name).map(|c| c.counts);
        let (x, y): (Option<Counts>, Option<Counts>) = (find(a), find(b));
        rows.push(DiffRow {
            name: name.to_string(),
            unit: false,
            trials: [x.map_or(0, |c| c.trials()), y.map_or(0, |c| c.trials())],
            unmasked: Change { a: x.map(|c| est(c.unmasked())), b: y.map(|c| est(c.unmasked())) },
            failure: Change { a: x.map(|c| est(c.failure())), b: y.map(|c| est(c.failure())) },
        });
    }
    rows
}

/// A side's estimate as text (`-` if absent).
fn side(e: Option<[f64; 3]>) -> String {
    e.map_or("-".into(), pct)
}

impl Change {
    /// `b - a` in percentage points, one decimal, signed (`-` if a side lacks it).
    pub fn points(&self) -> String {
        // Adding 0.0 turns a rounded -0.0 into 0.0: no change reads `+0.0`.
        self.delta().map_or("-".into(), |d| format!("{:+.1}", (1000.0 * d).round() / 10.0 + 0.0))
    }

    /// `overlap`, `differ` or `-`.
    pub fn verdict(&self) -> &'static str {
        match self.overlap() {
            Some(true) => "overlap",
            Some(false) => "differ",
            None => "-",
        }
    }
}

/// The change in percentage points and whether the intervals overlap (`differ` in bold).
fn change_cells(c: &Change) -> [String; 2] {
    let v = c.verdict();
    [c.points(), if v == "differ" { format!("**{v}**") } else { v.into() }]
}

/// One side's line in the comparison's header.
fn describe(side: &str, t: &Trace, r: &Report) -> String {
    format!(
        "{side}: `{}`: {} trials, machine `{}`, fault `{}`, code {}",
        t.dir.display(),
        r.summary.trials,
        t.info.hw,
        ron::to_string(&t.info.spec.fault).unwrap_or_default(),
        t.info.code
    )
}

/// The comparison's blocks.
pub fn build(ta: &Trace, a: &Report, tb: &Trace, b: &Report) -> Vec<Block> {
    let (na, nb) = (&ta.info.spec.name, &tb.info.spec.name);
    let mut blocks = vec![
        Block::Heading(1, format!("Faultline diff: {na} (A) against {nb} (B)")),
        Block::List(vec![describe("A", ta, a), describe("B", tb, b)]),
        Block::Para(
            "Shares in % with Wilson 95% intervals; change = B - A in percentage points. Where the intervals \
             overlap the campaigns do not tell A and B apart at these sample sizes (run more trials, or a \
             stratified plan on the classes in question); `differ` marks intervals that do not overlap."
                .into(),
        ),
    ];
    let (sa, sb) = (&a.summary, &b.summary);
    let overall = |x: &faultline_fault::record::Combined| [x.p, x.lo, x.hi];
    let ov = [
        ("vulnerability", Change { a: Some(overall(&sa.unmasked)), b: Some(overall(&sb.unmasked)) }),
        ("failure", Change { a: Some(overall(&sa.failure)), b: Some(overall(&sb.failure)) }),
    ];
    blocks.push(Block::Heading(2, "All selected classes".into()));
    blocks.push(Block::Table {
        head: ["quantity", "A % [95% CI]", "B % [95% CI]", "change (pp)", "intervals"].map(String::from).to_vec(),
        rows: ov
            .iter()
            .map(|(q, c)| {
                let mut cells = vec![q.to_string(), side(c.a), side(c.b)];
                cells.extend(change_cells(c));
                Row { cells, strong: false }
            })
            .collect(),
        text_columns: 1,
    });
    let rows = compare(a, b);
    for (title, units) in [("By unit", true), ("By site class", false)] {
        blocks.push(Block::Heading(2, title.into()));
        blocks.push(Block::Table {
            head: [
                if units { "unit" } else { "class" },
                "trials A",
                "trials B",
                "vulnerability A",
                "vulnerability B",
                "change (pp)",
                "intervals",
                "failure A",
                "failure B",
                "change (pp)",
                "intervals",
            ]
            .map(String::from)
            .to_vec(),
            rows: rows
                .iter()
                .filter(|r| r.unit == units)
                .map(|r| {
                    let mut cells = vec![
                        if units { r.name.clone() } else { format!("`{}`", r.name) },
                        r.trials[0].to_string(),
                        r.trials[1].to_string(),
                        side(r.unmasked.a),
                        side(r.unmasked.b),
                    ];
                    cells.extend(change_cells(&r.unmasked));
                    cells.extend([side(r.failure.a), side(r.failure.b)]);
                    cells.extend(change_cells(&r.failure));
                    Row { cells, strong: false }
                })
                .collect(),
            text_columns: 1,
        });
    }
    let outcome_rows = a
        .outcomes
        .iter()
        .chain(b.outcomes.iter().filter(|o| !a.outcomes.contains(o)))
        .map(|&o| {
            // The summary lists every outcome with its share of the trials.
            let share =
                |r: &Report| r.summary.outcomes.iter().find(|x| x.outcome == o).map_or("-".into(), |x| pct_of(x.share));
            Row { cells: vec![o.name().into(), share(a), share(b)], strong: false }
        })
        .collect();
    blocks.push(Block::Heading(2, "Outcomes (pooled over the trials)".into()));
    blocks.push(Block::Table {
        head: ["outcome", "A % [95% CI]", "B % [95% CI]"].map(String::from).to_vec(),
        rows: outcome_rows,
        text_columns: 1,
    });
    blocks
}

/// Writes `diff.csv`: one row per unit and class with both sides' shares and intervals.
pub fn write_csv(rows: &[DiffRow], path: &Path) -> Result<()> {
    let err = |e| crate::tables::csv_error(path, e);
    let mut w = crate::tables::writer(path)?;
    let mut head = vec!["name".to_string(), "level".into(), "trials_a".into(), "trials_b".into()];
    for q in ["unmasked", "failure"] {
        for s in ["a", "a_lo", "a_hi", "b", "b_lo", "b_hi", "change", "overlap"] {
            head.push(format!("{q}_{s}"));
        }
    }
    w.write_record(&head).map_err(err)?;
    for r in rows {
        let mut row = vec![
            r.name.clone(),
            if r.unit { "unit" } else { "class" }.into(),
            r.trials[0].to_string(),
            r.trials[1].to_string(),
        ];
        for c in [&r.unmasked, &r.failure] {
            for e in [c.a, c.b] {
                row.extend((0..3).map(|i| e.map(|x| x[i].to_string()).unwrap_or_default()));
            }
            row.push(c.delta().map(|d| d.to_string()).unwrap_or_default());
            row.push(c.overlap().map(|o| o.to_string()).unwrap_or_default());
        }
        w.write_record(&row).map_err(err)?;
    }
    w.flush().map_err(ReportError::io(path))
}

/// Writes the comparison of `a` and `b` into `out`: `index.html`, `report.md`, `diff.csv`.
pub fn write_diff(ta: &Trace, a: &Report, tb: &Trace, b: &Report, out: &Path) -> Result<[PathBuf; 3]> {
    std::fs::create_dir_all(out).map_err(ReportError::io(out))?;
    let blocks = build(ta, a, tb, b);
    let title = format!("Faultline diff: {} against {}", ta.info.spec.name, tb.info.spec.name);
    let html = crate::write_file(out, "index.html", crate::html::render(&title, &blocks))?;
    let md = crate::write_file(out, "report.md", crate::markdown::render(&blocks))?;
    let csv = out.join("diff.csv");
    write_csv(&compare(a, b), &csv)?;
    Ok([html, md, csv])
}
