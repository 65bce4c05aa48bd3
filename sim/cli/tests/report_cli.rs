//! `faultline report` and `faultline diff` as a user runs them: on the report fixture they
//! write their files and print the unit table; on a directory that is not a campaign's, one
//! line naming the file, exit status 2.

mod common;
use common::faultline;

const FIXTURE: &str = "sim/report/tests/fixtures/tiny";

#[test]
fn report_writes_its_files_and_prints_the_unit_table() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("r");
    let o = faultline(&["report", FIXTURE, "--out", dir.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.starts_with("report of campaign tiny: 360 trials (104 simulated, 256 provably dead)"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("MXU ") && l.contains("3072")), "{text}");
    // The report's terms, and the ranking's intervals and ties.
    assert!(text.lines().any(|l| l.starts_with("unit ") && l.contains("vulnerability % [95% CI]")), "{text}");
    assert!(!text.contains("unmasked"), "{text}");
    let protect = text.lines().find(|l| l.starts_with("protect first: ")).expect("a protect-first line");
    assert!(protect.starts_with("protect first: seq.tile (5.00% [1.71, 13.70] per faulty bit)"), "{text}");
    assert!(text.contains("  not separated: #1's 95% interval overlaps those of #2\u{2013}#6"), "{text}");
    for f in
        ["index.html", "report.md", "summary.csv", "trials.csv", "figures/loss-curves.svg", "figures/loss-curves.png"]
    {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
}

#[test]
fn diff_of_a_campaign_with_itself_overlaps_everywhere() {
    let out = tempfile::tempdir().unwrap();
    let o = faultline(&["diff", FIXTURE, FIXTURE, "--out", out.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<&str> = text.lines().filter(|l| l.ends_with("overlap") || l.ends_with("differ")).collect();
    // Two quantities x (4 units + 6 classes).
    assert_eq!(rows.len(), 20, "{text}");
    assert!(rows.iter().all(|l| l.ends_with("+0.0  overlap")), "{text}");
    assert!(out.path().join("diff.csv").is_file());
}

#[test]
fn a_directory_that_is_not_a_campaign_is_one_line_naming_the_file() {
    let empty = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    for args in [
        vec!["report", empty.path().to_str().unwrap(), "--out", out.path().to_str().unwrap()],
        vec!["diff", FIXTURE, empty.path().to_str().unwrap(), "--out", out.path().to_str().unwrap()],
    ] {
        let o = faultline(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: ") && err.contains("campaign.json: missing"), "{err}");
    }
}

#[test]
fn the_shipped_example_report_is_what_the_readme_commands_write() {
    // README: `faultline campaign configs/campaign-mlp-8x8.ron --out traces/mlp-8x8`, then
    // `faultline report traces/mlp-8x8 --out reports/mlp-8x8`; the result is checked in under
    // reports/examples/mlp-8x8. Lines naming the code version and the output paths differ by
    // commit and directory; everything else must match.
    let tmp = tempfile::tempdir().unwrap();
    let (trace, report) = (tmp.path().join("trace"), tmp.path().join("report"));
    let o = faultline(&["campaign", "configs/campaign-mlp-8x8.ron", "--out", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = faultline(&["report", trace.to_str().unwrap(), "--out", report.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shipped = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../reports/examples/mlp-8x8"));
    let keep = |t: String| -> Vec<String> {
        let varies = ["- code: ", "- reproduce: ", "<li>code: ", "<li>reproduce: "];
        t.lines().filter(|l| !varies.iter().any(|v| l.starts_with(v))).map(String::from).collect()
    };
    // index.html too: the guide quotes it (its hover texts), and the browser test screenshots it.
    for f in ["report.md", "summary.csv", "trials.csv", "index.html"] {
        let got = keep(std::fs::read_to_string(report.join(f)).unwrap());
        let want = keep(std::fs::read_to_string(shipped.join(f)).unwrap());
        let at = got.iter().zip(&want).position(|(g, w)| g != w).map(|i| i + 1);
        assert!(at.is_none() && got.len() == want.len(), "{f} differs from the shipped example (first differing kept line: {at:?}): regenerate reports/examples/mlp-8x8 (README)");
    }
}
