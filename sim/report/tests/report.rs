//! The report on a fixed fixture trace (`fixtures/tiny`, a real campaign: see `tiny.ron`):
//! golden files for `report.md` and `summary.csv`, agreement with the campaign's own
//! `summary.json`, the CSVs' shape, a self-contained HTML page, diffs, and the errors a bad
//! trace directory gives.

use faultline_hw::budget::HostMemory;
use faultline_report::aggregate::aggregate;
use faultline_report::diff::compare;
use faultline_report::document::pct_of;
use faultline_report::figures::{block_size, heat_scale};
use faultline_report::load::load;
use faultline_report::ReportError;
use std::fs;
use std::path::Path;

/// Relative to the package (tests run there), so the report's paths do not depend on the checkout.
const FIXTURE: &str = "tests/fixtures/tiny";

/// Compares `got` with the golden file `name`, or rewrites it with `FAULTLINE_BLESS=1`.
fn golden(name: &str, got: &str) {
    let path = Path::new("tests/golden").join(name);
    if std::env::var_os("FAULTLINE_BLESS").is_some() {
        fs::write(&path, got).unwrap();
        return;
    }
    let want = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if got != want {
        let line = got.lines().zip(want.lines()).position(|(g, w)| g != w).map_or(0, |i| i + 1);
        panic!(
            "{name} differs from tests/golden/{name} at line {line}:\n  got:  {}\n  want: {}\n(FAULTLINE_BLESS=1 rewrites it)",
            got.lines().nth(line.saturating_sub(1)).unwrap_or(""),
            want.lines().nth(line.saturating_sub(1)).unwrap_or("")
        );
    }
}

#[test]
fn report_matches_the_golden_files() {
    let trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    let report = aggregate(&trace);
    let out = tempfile::tempdir().unwrap();
    let w = faultline_report::write_report(&trace, &report, out.path()).unwrap();
    golden("report.md", &fs::read_to_string(&w.markdown).unwrap());
    golden("summary.csv", &fs::read_to_string(&w.csv[0]).unwrap());
}

#[test]
fn report_summary_is_the_campaigns_own() {
    // The report recomputes the summary from the records; the campaign wrote its own.
    let trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    // Compared as text: the file is what `faultline campaign` wrote, to the last digit.
    let written = fs::read_to_string(Path::new(FIXTURE).join("summary.json")).unwrap();
    let report = aggregate(&trace);
    assert_eq!(serde_json::to_string_pretty(&report.summary).unwrap().trim(), written.trim());
    // Every trial lands in exactly one class, one bit, one step row and one phase row.
    let n = trace.trials.len() as u64;
    assert_eq!(report.classes.iter().map(|c| c.counts.trials()).sum::<u64>(), n);
    assert_eq!(report.by_step.iter().map(|g| g.counts.trials()).sum::<u64>(), n);
    assert_eq!(report.by_phase.iter().map(|g| g.counts.trials()).sum::<u64>(), n);
    let bits: u64 = report.bit_profiles.iter().flat_map(|p| &p.bits).map(|c| c.trials()).sum();
    assert_eq!(bits, n);
    // PE cells count the MXU classes' trials.
    for h in &report.heatmaps {
        let class = report.classes.iter().find(|c| c.info.class == h.class).unwrap();
        assert_eq!(h.cells.iter().map(|c| c.trials).sum::<u64>(), class.counts.trials(), "{}", h.class);
        assert_eq!(h.cells.iter().map(|c| c.failures).sum::<u64>(), class.counts.failure().k, "{}", h.class);
    }
}

#[test]
fn csv_files_have_one_row_per_class_and_trial() {
    let trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    let report = aggregate(&trace);
    let out = tempfile::tempdir().unwrap();
    let w = faultline_report::write_report(&trace, &report, out.path()).unwrap();
    let read = |p: &Path| {
        let mut r = csv::Reader::from_path(p).unwrap();
        let head = r.headers().unwrap().len();
        let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
        assert!(rows.iter().all(|x| x.len() == head), "{}: ragged rows", p.display());
        (head, rows)
    };
    let (_, classes) = read(&w.csv[0]);
    assert_eq!(classes.len(), trace.info.classes.len());
    let (_, trials) = read(&w.csv[1]);
    assert_eq!(trials.len(), trace.trials.len());
    // A PE trial names its row and column; element = row * cols + col.
    let pe = trials.iter().find(|r| &r[2] == "mxu").unwrap();
    let (e, row, col): (u64, u64, u64) = (pe[4].parse().unwrap(), pe[5].parse().unwrap(), pe[6].parse().unwrap());
    assert_eq!(e, row * 8 + col);
}

/// A model may name a layer `fc,1` or `fc"2` (only spaces and control characters are refused):
/// trials.csv quotes them, so a CSV reader gets every row at the header's width and the names back.
#[test]
fn layer_names_with_commas_and_quotes_round_trip_through_trials_csv() {
    let dir = edited(|t| {
        t.replace("\"layer\":\"fc1\"", "\"layer\":\"fc,1\"").replace("\"layer\":\"fc2\"", "\"layer\":\"fc\\\"2\"")
    });
    let trace = load(dir.path(), &HostMemory::default(), |_, _| {}).unwrap();
    let out = tempfile::tempdir().unwrap();
    let w = faultline_report::write_report(&trace, &aggregate(&trace), out.path()).unwrap();
    let mut r = csv::Reader::from_path(&w.csv[1]).unwrap();
    let layer = r.headers().unwrap().iter().position(|h| h == "layer").unwrap();
    let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
    assert_eq!(rows.len(), trace.trials.len());
    let count = |name: &str| rows.iter().filter(|x| &x[layer] == name).count();
    assert_eq!((count("fc,1"), count("fc\"2"), count("fc1")), (65, 27, 0));
}

#[test]
fn html_is_one_self_contained_page() {
    let trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    let report = aggregate(&trace);
    let out = tempfile::tempdir().unwrap();
    let w = faultline_report::write_report(&trace, &report, out.path()).unwrap();
    let html = fs::read_to_string(&w.html).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    for banned in ["<script", "src=", "href=", "http://", "https://", "<link"] {
        // The SVG namespace URI is a name, not a fetch.
        let hits = html.matches(banned).count()
            - html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count() * (banned == "http://") as usize;
        assert_eq!(hits, 0, "index.html contains `{banned}`");
    }
    // Every figure but the heatmaps (the page draws those as grids) is inlined, and every
    // grid cell (a PE, or a block of PEs where single PEs have too few trials) has a hover
    // title with its counts.
    let svgs: Vec<String> = fs::read_dir(out.path().join("figures"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    let heatmaps = svgs.iter().filter(|n| n.starts_with("heatmap-")).count();
    assert_eq!(heatmaps, report.heatmaps.len());
    assert_eq!(html.matches("<figure>").count(), svgs.len() - heatmaps, "figures inlined vs files");
    let cells: usize = report
        .heatmaps
        .iter()
        .map(|h| {
            let b = block_size(h);
            h.rows.div_ceil(b) * h.cols.div_ceil(b)
        })
        .sum();
    assert_eq!(
        html.matches("<td class=\"few\" title=\"pe[").count() + html.matches("<td style=\"background:").count(),
        cells
    );
}

/// The report of the fixture: its trace, aggregate, Markdown and HTML.
fn fixture_report() -> (faultline_report::load::Trace, faultline_report::aggregate::Report, String, String) {
    let trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    let report = aggregate(&trace);
    let out = tempfile::tempdir().unwrap();
    let w = faultline_report::write_report(&trace, &report, out.path()).unwrap();
    let (md, html) = (fs::read_to_string(&w.markdown).unwrap(), fs::read_to_string(&w.html).unwrap());
    (trace, report, md, html)
}

#[test]
fn executive_summary_comes_first_and_names_the_top_class_and_protection_with_intervals() {
    let (_, report, md, html) = fixture_report();
    // First after the title, in both files.
    let headings: Vec<&str> = md.lines().filter(|l| l.starts_with('#')).take(2).collect();
    assert_eq!(headings, ["# Faultline report: tiny", "## Summary"]);
    let after_h1 = html.split("</h1>\n").nth(1).unwrap();
    assert!(after_h1.starts_with("<section id=\"summary\""), "{}", &after_h1[..80]);
    let summary = md.split("## Summary").nth(1).unwrap().split("\n## ").next().unwrap();
    // The most vulnerable class, found here independently, with its interval.
    let top = report.classes.iter().max_by(|a, b| a.counts.unmasked().p.total_cmp(&b.counts.unmasked().p)).unwrap();
    let named = format!("**Most vulnerable site class:** `{}`: {} %", top.info.class, pct_of(top.counts.unmasked()));
    assert!(summary.contains(&named), "{named} not in:\n{summary}");
    // The class with the highest failure share, with its interval, is the one to protect first.
    let worst = report.classes.iter().max_by(|a, b| a.counts.failure().p.total_cmp(&b.counts.failure().p)).unwrap();
    let f = worst.counts.failure();
    let protect = format!(
        "**Protect first:** `{}`: {:.2} [{:.2}, {:.2}] %",
        worst.info.class,
        100.0 * f.p,
        100.0 * f.lo,
        100.0 * f.hi
    );
    assert!(summary.contains(&protect), "{protect} not in:\n{summary}");
    assert!(summary.contains("**Enough trials to say so?** "), "{summary}");
}

/// The protection ranking's rows as (rank, `tied with` cell), from report.md.
fn ranking_rows(md: &str) -> Vec<(usize, String)> {
    let section = md.split("## Where protection buys the most").nth(1).unwrap().split("\n## ").next().unwrap();
    section
        .lines()
        .filter(|l| l.starts_with("| ") && l.chars().nth(2).is_some_and(|c| c.is_ascii_digit()))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            (cells[0].trim_start_matches("| ").parse().unwrap(), cells[5].to_string())
        })
        .collect()
}

#[test]
fn ranking_marks_ties_exactly_where_intervals_overlap() {
    let (_, report, md, _) = fixture_report();
    let rows = ranking_rows(&md);
    assert_eq!(rows.len(), report.ranking.len());
    // Overlap computed here from the classes' own failure estimates, not from the ranking.
    let est = |class: &str| report.classes.iter().find(|c| c.info.class == class).unwrap().counts.failure();
    for (i, (rank, tied)) in rows.iter().enumerate() {
        assert_eq!(*rank, i + 1);
        let a = est(&report.ranking[i].class);
        let want: Vec<usize> = (0..rows.len())
            .filter(|&j| j != i)
            .filter(|&j| {
                let b = est(&report.ranking[j].class);
                a.lo <= b.hi && b.lo <= a.hi
            })
            .collect();
        let listed: Vec<usize> = if tied == "\u{2014}" {
            Vec::new()
        } else {
            tied.split(", ")
                .flat_map(|run| {
                    let ends: Vec<usize> = run
                        .split('\u{2013}')
                        .map(|r| r.trim_start_matches('#').parse::<usize>().unwrap() - 1)
                        .collect();
                    ends[0]..=*ends.last().unwrap()
                })
                .collect()
        };
        assert_eq!(listed, want, "rank {rank}");
    }
    // The fixture's top is tied; make its failures certain and it stands apart.
    assert_ne!(rows[0].1, "\u{2014}");
    let top = report.ranking[0].class.clone();
    let mut trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    let k = trace.info.classes.iter().position(|c| c.class == top).unwrap() as u16;
    for t in trace.trials.iter_mut().filter(|t| t.class == k) {
        t.outcome = faultline_fault::Outcome::SlowDegrade;
    }
    let out = tempfile::tempdir().unwrap();
    let w = faultline_report::write_report(&trace, &aggregate(&trace), out.path()).unwrap();
    let md = fs::read_to_string(&w.markdown).unwrap();
    assert_eq!(ranking_rows(&md)[0].1, "\u{2014}");
    assert!(!md.contains("Its interval overlaps those of ranks"), "{md}");
}

#[test]
fn every_pe_grid_uses_one_stated_colour_scale_in_html_svg_and_png() {
    let trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    // One grid with a far higher rate than the others: per-grid scales would differ.
    let mut trace2 = trace.clone();
    let w = trace2.info.classes.iter().position(|c| c.register == "weight").unwrap() as u16;
    for t in trace2.trials.iter_mut().filter(|t| t.class == w) {
        t.outcome = faultline_fault::Outcome::SlowDegrade;
    }
    let report = aggregate(&trace2);
    assert!(report.heatmaps.len() > 1);
    let scale = heat_scale(&report);
    assert_eq!(scale.top, 1.0, "every weight trial failed: the scale reaches 100%");
    let out = tempfile::tempdir().unwrap();
    let w = faultline_report::write_report(&trace2, &report, out.path()).unwrap();
    let html = fs::read_to_string(&w.html).unwrap();
    let legends: Vec<&str> = html
        .lines()
        .filter(|l| l.starts_with("<p class=\"legend\">"))
        .map(|l| l.split_once("failure rate").unwrap().1)
        .collect();
    assert_eq!(legends.len(), report.heatmaps.len());
    assert!(legends.iter().all(|l| *l == legends[0] && l.contains("100%")), "{legends:?}");
    assert!(html.contains("from 0 % (pale yellow) to 100 % or more (dark red)"));
    // Each heatmap figure's colour bar tops out at the same label.
    let mut svgs = 0;
    for e in fs::read_dir(out.path().join("figures")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("heatmap-") && name.ends_with(".svg") {
            let svg = fs::read_to_string(out.path().join("figures").join(&name)).unwrap();
            assert!(svg.lines().any(|l| l.trim() == "100%"), "{name}: its colour bar does not reach the report's 100%");
            svgs += 1;
        }
    }
    assert_eq!(svgs, report.heatmaps.len());
    // The grids pool PEs into the figure's blocks, and say so.
    for h in &report.heatmaps {
        let b = block_size(h);
        if b > 1 {
            assert!(html.contains(&format!("a cell is a block of {b}x{b} PEs")), "{}", h.class);
        }
    }
}

#[test]
fn diff_of_a_campaign_with_itself_changes_nothing_and_sees_a_real_change() {
    let trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    let a = aggregate(&trace);
    for r in compare(&a, &a) {
        assert_eq!(r.failure.delta(), Some(0.0), "{}", r.name);
        assert_eq!(r.failure.overlap(), Some(true), "{}", r.name);
    }
    // B: every simulated weight-register trial made training fail (say, protection removed
    // elsewhere): the weight class must differ, the others must not change.
    let mut t2 = trace.clone();
    let w = t2.info.classes.iter().position(|c| c.register == "weight").unwrap() as u16;
    for t in t2.trials.iter_mut().filter(|t| t.class == w) {
        t.outcome = faultline_fault::Outcome::SlowDegrade;
    }
    let b = aggregate(&t2);
    let rows = compare(&a, &b);
    let weight = rows.iter().find(|r| r.name == "mxu.pe[*][*].weight").unwrap();
    assert_eq!(weight.failure.overlap(), Some(false));
    assert!(weight.failure.delta().unwrap() > 0.9);
    let psum = rows.iter().find(|r| r.name == "mxu.pe[*][*].psum").unwrap();
    assert_eq!(psum.failure.delta(), Some(0.0));
    let out = tempfile::tempdir().unwrap();
    let files = faultline_report::diff::write_diff(&trace, &a, &t2, &b, out.path()).unwrap();
    let md = fs::read_to_string(&files[1]).unwrap();
    assert!(md.contains("| `mxu.pe[*][*].weight` |") && md.contains("**differ**"), "{md}");
}

/// A copy of the fixture in a temporary directory, with `edit` applied to its records' text.
fn edited(edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["campaign.json", "records.jsonl"] {
        fs::copy(Path::new(FIXTURE).join(f), dir.path().join(f)).unwrap();
    }
    let r = dir.path().join("records.jsonl");
    fs::write(&r, edit(&fs::read_to_string(&r).unwrap())).unwrap();
    dir
}

/// The error text of loading `dir`.
fn load_error(dir: &Path) -> String {
    match load(dir, &HostMemory::default(), |_, _| {}) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_trace_directories_name_the_file_and_line() {
    let empty = tempfile::tempdir().unwrap();
    let e = load_error(empty.path());
    assert!(e.contains("campaign.json") && e.contains("missing"), "{e}");

    // A record of another schema on line 3.
    let d = edited(|t| {
        let mut lines: Vec<String> = t.lines().map(String::from).collect();
        lines[2] = lines[2].replacen("\"schema\":3", "\"schema\":1", 1);
        lines.join("\n") + "\n"
    });
    let e = load_error(d.path());
    assert!(e.contains("records.jsonl line 3") && e.contains("schema 1"), "{e}");

    // A line that is not a record, then a trial recorded twice.
    let d = edited(|t| t.replacen("{\"schema\"", "{\"schemo\"", 1));
    let e = load_error(d.path());
    assert!(e.contains("records.jsonl line 1") && e.contains("not a trial record"), "{e}");
    let d = edited(|t| format!("{t}{}", t.lines().next().unwrap()) + "\n");
    let e = load_error(d.path());
    assert!(e.contains("line 361") && e.contains("recorded twice"), "{e}");

    // campaign.json of another schema.
    let d = edited(|t| t.to_string());
    let c = d.path().join("campaign.json");
    fs::write(&c, fs::read_to_string(&c).unwrap().replacen("\"schema\": 3", "\"schema\": 1", 1)).unwrap();
    let e = load_error(d.path());
    assert!(e.contains("campaign.json") && e.contains("schema 1"), "{e}");
    assert!(matches!(load(d.path(), &HostMemory::default(), |_, _| {}), Err(ReportError::Campaign(_))));
}

#[test]
fn a_half_written_last_line_is_left_out() {
    // A campaign killed mid-write leaves a cut last line: the report reads what is whole.
    let d = edited(|t| {
        let last = t.trim_end().rfind('\n').unwrap();
        t[..last + 40].to_string()
    });
    let trace = load(d.path(), &HostMemory::default(), |_, _| {}).unwrap();
    assert!(trace.partial_last_line);
    assert_eq!(trace.trials.len(), 359);
    let report = aggregate(&trace);
    assert_eq!(report.summary.trials, 359);
}

#[test]
fn ties_rank_lists_and_trials_to_separate() {
    use faultline_report::aggregate::ties;
    use faultline_report::document::{rank_list, trials_to_separate};
    // [p, lo, hi]: #1 apart from #3, tied with #2; #2 tied with both.
    let t = ties(&[[0.5, 0.4, 0.6], [0.35, 0.2, 0.45], [0.1, 0.0, 0.3]]);
    assert_eq!(t, vec![vec![1], vec![0, 2], vec![1]]);
    assert_eq!(rank_list(&[1, 2, 3, 5, 7, 8]), "#2\u{2013}#4, #6, #8\u{2013}#9");
    assert_eq!(rank_list(&[]), "");
    // 8/300 against 2/300 (the shipped example's top two): about 570 trials each.
    assert_eq!(trials_to_separate(8.0 / 300.0, 2.0 / 300.0), Some(570));
    assert_eq!(trials_to_separate(0.1, 0.1), None);
}

/// Under `Adaptive` sampling a class's trials are drawn from its live faults only: the bit
/// table counts the provably dead rest as masked, so each rate is the trials' times the live
/// share (here the weight registers' exponent field: 5 and 1 of 32 trials, at half).
#[test]
fn adaptive_bit_rates_count_the_dead_share_as_masked() {
    use faultline_fault::stats::Estimate;
    let mut trace = load(Path::new(FIXTURE), &HostMemory::default(), |_, _| {}).unwrap();
    trace.info.classes[0].sampled_share = Some(0.5);
    let report = aggregate(&trace);
    assert_eq!((report.bit_profiles[0].share, report.bit_profiles[1].share), (0.5, 1.0));
    let out = tempfile::tempdir().unwrap();
    let w = faultline_report::write_report(&trace, &report, out.path()).unwrap();
    let md = fs::read_to_string(&w.markdown).unwrap();
    let half = |k, n| pct_of(report.bit_profiles[0].over_all(Estimate::of(k, n)));
    let row = format!("| `mxu.pe[*][*].weight` | bf16 | exponent | 8 | 32 | {} | {} |", half(5, 32), half(1, 32));
    assert!(md.contains(&row), "{row}\n{md}");
    assert_eq!(half(5, 32), "7.8 [3.4, 15.9]");
    // The psum class keeps its trials' rates.
    assert!(md.contains("| `mxu.pe[*][*].psum` | fp32 | mantissa | 23 | 45 | 11.1 [4.8, 23.5] | 0.0 [0.0, 7.9] |"));
}
