//! The report on a fixed fixture trace (`fixtures/tiny`, a real campaign: see `tiny.ron`):
//! golden files for `report.md` and `summary.csv`, agreement with the campaign's own
//! `summary.json`, the CSVs' shape, a self-contained HTML page, diffs, and the errors a bad
//! trace directory gives.

use faultline_hw::budget::HostMemory;
use faultline_report::aggregate::aggregate;
use faultline_report::diff::compare;
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
    // Every figure is inlined, and every PE grid cell has a hover title with its counts.
    // Every figure but the heatmaps (the page draws those as grids) is inlined.
    let svgs: Vec<String> = fs::read_dir(out.path().join("figures"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    let heatmaps = svgs.iter().filter(|n| n.starts_with("heatmap-")).count();
    assert_eq!(heatmaps, report.heatmaps.len());
    assert_eq!(html.matches("<figure>").count(), svgs.len() - heatmaps, "figures inlined vs files");
    let cells: usize = report.heatmaps.iter().map(|h| h.rows * h.cols).sum();
    assert_eq!(
        html.matches("<td class=\"few\" title=\"pe[").count() + html.matches("<td style=\"background:").count(),
        cells
    );
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
