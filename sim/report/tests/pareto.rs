//! The Pareto report on a hand-written exploration (`fixtures/explore.json`: two campaigns of
//! three plans and two layers each). Expected values are worked out by hand from the fixture:
//!
//! * `mlp-mxu`: `range` is dominated by `parity` (FIT 400 > 307.2, same bits, more cycles);
//!   `none` and `parity` are Pareto. Layers: fc1 global 1.2 % / per-tile 3.0 % = 0.40x, rule
//!   picks global; fc2 2.1 % / 0.6 % = 3.50x, rule picks per-tile. Always global 1.2 + 2.1 =
//!   3.30 %, guided 1.2 + 0.6 = 1.80 %, ratio 3.3 / 1.8 = 1.83x.
//! * `cnn-memory`: the baseline never failed (FIT 0, no coverage to measure), so it dominates
//!   both plans. Layers: conv1 0.2 % / 0.5 %, picks global; fc 0.4 % / 0.4 %, picks per-tile:
//!   always global 0.6 %, guided 0.2 + 0.4 = 0.6 %, no gain.

use faultline_fault::explore::ExploreResult;
use faultline_report::pareto::write_pareto;
use std::fs;
use std::path::Path;

fn fixture() -> ExploreResult {
    let text = fs::read_to_string(Path::new("tests/fixtures/explore.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Writes the report of `result` into a fresh temporary directory; returns it and `pareto.md`.
fn report(result: &ExploreResult) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let w = write_pareto(result, dir.path()).unwrap();
    let md = fs::read_to_string(&w.markdown).unwrap();
    (dir, md)
}

/// The Markdown of the campaign whose heading starts with `campaign`, up to the next one.
fn section<'a>(md: &'a str, campaign: &str) -> &'a str {
    let start = md.find(&format!("\n## {campaign} (")).unwrap_or_else(|| panic!("no section `{campaign}`"));
    let rest = &md[start + 1..];
    rest[3..].find("\n## ").map_or(rest, |end| &rest[..end + 3])
}

/// The cells of the table row whose first cell is `first`, in `md`.
fn row(md: &str, first: &str) -> Vec<String> {
    let line = md
        .lines()
        .find(|l| l.starts_with(&format!("| {first} |")))
        .unwrap_or_else(|| panic!("no row `{first}` in\n{md}"));
    line.trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect()
}

/// Column indices of the plan table.
const FIT: usize = 4;
const COVERAGE: usize = 8;
const FALSE_POSITIVES: usize = 9;
const PARETO: usize = 10;
const PAIRED: usize = 11;

#[test]
fn writes_markdown_html_csv_and_an_svg_and_png_per_figure() {
    let dir = tempfile::tempdir().unwrap();
    let w = write_pareto(&fixture(), dir.path()).unwrap();
    assert_eq!(w.markdown, dir.path().join("pareto.md"));
    assert_eq!(w.html, dir.path().join("index.html"));
    assert_eq!(w.csv, dir.path().join("pareto.csv"));
    for p in [&w.markdown, &w.html, &w.csv] {
        assert!(p.is_file(), "{} missing", p.display());
    }
    // Two figures per campaign: FIT against cycle overhead and against check bits.
    assert_eq!(w.figures, 4);
    let mut svgs: Vec<String> = fs::read_dir(dir.path().join("figures"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    svgs.sort();
    assert_eq!(
        svgs,
        [
            "pareto-1-mlp-mxu-bits.svg",
            "pareto-1-mlp-mxu-overhead.svg",
            "pareto-2-cnn-memory-bits.svg",
            "pareto-2-cnn-memory-overhead.svg"
        ]
    );
    let md = fs::read_to_string(&w.markdown).unwrap();
    let html = fs::read_to_string(&w.html).unwrap();
    for name in &svgs {
        let svg = fs::read_to_string(dir.path().join("figures").join(name)).unwrap();
        assert!(svg.contains("<svg"), "{name} is not an SVG");
        // Every plan is labelled on every figure of its campaign.
        let plans: &[&str] =
            if name.contains("mlp") { &["none", "parity", "range"] } else { &["none", "secded", "abft"] };
        for p in plans {
            assert!(svg.contains(&format!("\n{p}\n</text>")), "{name} lacks the label `{p}`");
        }
        let png = fs::read(dir.path().join("figures").join(name.replace(".svg", ".png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}: no PNG beside it");
        // Markdown links the file; HTML inlines it.
        assert!(md.contains(&format!("(figures/{name})")), "pareto.md does not link {name}");
    }
    assert_eq!(html.matches("<svg").count(), 4);
    assert!(html.contains("<title>Faultline exploration: fixture-explore</title>"));
}

#[test]
fn plan_table_shows_every_plan_its_fit_interval_and_the_pareto_plans() {
    let (_dir, md) = report(&fixture());
    let mlp = section(&md, "mlp-mxu");
    let cnn = section(&md, "cnn-memory");
    assert!(mlp.starts_with("## mlp-mxu (mlp on tpu-8x8, 400 trials per plan, unprotected step 10000 cycles)"));
    assert!(cnn.starts_with("## cnn-memory (cnn on tpu-32x32, 200 trials per plan, unprotected step 250000 cycles)"));
    // FIT with three significant digits: 48 -> 48.0, 8 -> 8.00, 260 -> 260.
    assert_eq!(row(cnn, "abft")[FIT], "48.0 [8.00, 260]");
    assert_eq!(row(mlp, "parity")[FIT], "307 [190, 470]");
    assert_eq!(row(cnn, "none")[FIT], "0 [0, 180]");
    // `yes` exactly for the Pareto plans.
    for (sec, plans) in [(mlp, ["none", "parity", "range"]), (cnn, ["none", "secded", "abft"])] {
        for p in plans {
            let want = if sec == mlp { p != "range" } else { p == "none" };
            let cell = &row(sec, p)[PARETO];
            let point = cell.split(" / ").next().unwrap();
            assert_eq!(point == "yes", want, "{p}: Pareto cell `{cell}`");
            assert!(point == "yes" || point == "\u{2014}", "{p}: `{cell}`");
        }
    }
    // The rest of a row, as the fixture has it.
    let range = row(mlp, "range");
    assert_eq!(range[..4], ["range", "10200", "2.00", "4096"]);
    assert_eq!(range[COVERAGE], "30.0 [14.5, 51.9]");
    assert_eq!(range[PAIRED], "6/1 of 350");
    assert_eq!(row(mlp, "parity")[FALSE_POSITIVES], "1/50");
    // The baseline has no pairing with itself; without baseline failures, nothing to cover.
    assert_eq!(row(mlp, "none")[PAIRED], "-");
    assert_eq!(row(mlp, "none")[COVERAGE], "0.0 [0.0, 16.1]");
    assert_eq!(row(cnn, "abft")[COVERAGE], "-");
    assert_eq!(row(cnn, "abft")[PAIRED], "0/1 of 150");
}

#[test]
fn layer_table_shows_intensity_overheads_and_their_ratio() {
    let (_dir, md) = report(&fixture());
    let mlp = section(&md, "mlp-mxu");
    // 2.1 % global / 0.6 % per-tile.
    assert_eq!(
        row(mlp, "`fc2.matmul`"),
        ["`fc2.matmul`", "fc2", "32×128×10", "7.19", "2.10", "0.60", "3.50x", "per-tile"]
    );
    assert_eq!(row(mlp, "`fc1.matmul`")[3..], ["18.29", "1.20", "3.00", "0.40x", "global"]);
    assert_eq!(row(section(&md, "cnn-memory"), "`fc.matmul`")[6], "1.00x");
}

#[test]
fn abft_sums_compare_always_global_with_intensity_guided() {
    let (_dir, md) = report(&fixture());
    let mlp = section(&md, "mlp-mxu");
    assert!(
        mlp.contains("always global 3.30 % of the step, intensity-guided (the rule's pick per layer) 1.80 %"),
        "{mlp}"
    );
    assert!(mlp.contains("ratio always-global / intensity-guided: 1.83x"));
    assert!(
        mlp.contains("report intensity-guided ABFT at 1.09–5.3x lower overhead than global ABFT; here: 1.83x lower.")
    );
    // Li et al.'s <20 % budget: parity catches 8 of the 20 baseline failures at 1.2 %.
    assert!(mlp.contains("under 20 % cycle overhead is `parity`: 40.0 [21.9, 61.3] % at 1.20 % overhead"), "{mlp}");
    let cnn = section(&md, "cnn-memory");
    assert!(cnn.contains("always global 0.60 % of the step, intensity-guided (the rule's pick per layer) 0.60 %"));
    assert!(cnn.contains("here: no gain (1.00x)"), "{cnn}");
    assert!(cnn.contains("no plan under 20 % cycle overhead caught or failed anything"));
}

#[test]
fn csv_has_one_row_per_campaign_and_plan() {
    let dir = tempfile::tempdir().unwrap();
    let w = write_pareto(&fixture(), dir.path()).unwrap();
    let mut r = csv::Reader::from_path(&w.csv).unwrap();
    let head: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    let col = |name: &str| head.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name}"));
    let rows: Vec<csv::StringRecord> = r.records().map(|x| x.unwrap()).collect();
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().all(|x| x.len() == head.len()));
    let key: Vec<(&str, &str)> = rows.iter().map(|x| (&x[col("campaign")], &x[col("plan")])).collect();
    assert_eq!(
        key,
        [
            ("mlp-mxu", "none"),
            ("mlp-mxu", "parity"),
            ("mlp-mxu", "range"),
            ("cnn-memory", "none"),
            ("cnn-memory", "secded"),
            ("cnn-memory", "abft")
        ]
    );
    let parity = &rows[1];
    assert_eq!(&parity[col("failure_fit")], "307.2");
    assert_eq!(&parity[col("failure_fit_hi")], "470");
    assert_eq!(&parity[col("cycle_overhead")], "0.012");
    assert_eq!(&parity[col("area_bits")], "4096");
    assert_eq!(&parity[col("coverage_k")], "8");
    assert_eq!(&parity[col("coverage")], "0.4");
    assert_eq!(&parity[col("false_positives_k")], "1");
    assert_eq!(&parity[col("pareto")], "true");
    assert_eq!(&rows[2][col("pareto")], "false");
    assert_eq!(&rows[2][col("failures_added")], "1");
    // As `-` in the table: the baseline's pairing, a coverage of no baseline failures.
    assert_eq!(&rows[0][col("failures_removed")], "");
    assert_eq!(&rows[5][col("coverage")], "");
    assert_eq!(&rows[5][col("coverage_n")], "0");
}

#[test]
fn a_single_plan_with_zero_fit_and_no_layers_still_reports() {
    let mut result = fixture();
    result.campaigns.truncate(1);
    let c = &mut result.campaigns[0];
    c.plans.truncate(1);
    c.plans[0].failure_fit = faultline_fault::explore::Interval { p: 0.0, lo: 0.0, hi: 0.0 };
    c.layers.clear();
    let dir = tempfile::tempdir().unwrap();
    let w = write_pareto(&result, dir.path()).unwrap();
    assert_eq!(w.figures, 2);
    let md = fs::read_to_string(&w.markdown).unwrap();
    assert_eq!(row(&md, "none")[FIT], "0 [0, 0]");
    assert!(md.contains("No forward GEMM in this campaign"));
    for stem in ["overhead", "bits"] {
        let svg = fs::read_to_string(dir.path().join(format!("figures/pareto-1-mlp-mxu-{stem}.svg"))).unwrap();
        assert!(svg.contains("<svg") && !svg.contains("NaN") && !svg.contains("inf"), "{stem}");
    }
}

/// An exploration run in rounds says how many ran and why they stopped, and calls paired
/// changes beyond chance at its level per look, not at 5%.
#[test]
fn rounds_are_reported_with_their_level_per_look() {
    use faultline_fault::explore::{RoundsRun, Stopped};
    let mut result = fixture();
    let (_dir, one) = report(&result);
    assert!(!one.contains("rounds of") && !one.contains("per look"));
    // `parity`'s 8/0 (p = 0.008) is beyond chance at 5%, not at 0.625%.
    assert!(section(&one, "mlp-mxu").contains("beyond chance at 5%: `parity`"));
    let c = &mut result.campaigns[0];
    c.rounds = Some(RoundsRun { run: 3, max: 8, trials_per_round: 500, alpha: 0.05 / 8.0, stopped: Stopped::Futile });
    let (_dir, md) = report(&result);
    let mlp = section(&md, "mlp-mxu");
    assert!(
        md.contains(
            "It ran 3 of at most 8 rounds of 500 trials per plan and stopped because each pair left tied would need \
             more paired trials than the rounds allowed give. Each look tested at 0.625% so that 95% confidence \
             holds over all of them (Bonferroni)."
        ),
        "{md}"
    );
    assert!(!mlp.contains("beyond chance") && mlp.contains("within chance: `parity`"), "{mlp}");
    assert!(!section(&md, "cnn-memory").contains("rounds of"));
}

/// The shipped example (`reports/examples/explore-mlp/`, which the README points to) is what
/// this code renders from its `explore.json`: the page and tables are not stale.
#[test]
fn shipped_example_is_what_its_explore_json_renders_to() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports/examples/explore-mlp");
    let result: ExploreResult =
        serde_json::from_str(&fs::read_to_string(shipped.join("explore.json")).unwrap()).unwrap();
    // FAULTLINE_BLESS=1 rewrites the example's report from its explore.json, as
    // `faultline explore` would after the same campaigns (explore.json itself is untouched).
    if std::env::var_os("FAULTLINE_BLESS").is_some() {
        write_pareto(&result, &shipped).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    write_pareto(&result, dir.path()).unwrap();
    for file in ["pareto.md", "pareto.csv", "comparisons.csv", "index.html"] {
        let (want, got) =
            (fs::read_to_string(shipped.join(file)).unwrap(), fs::read_to_string(dir.path().join(file)).unwrap());
        assert!(
            want == got,
            "{file} of the shipped example is stale: regenerate it with `faultline explore configs/explore-mlp.ron` \
             (or FAULTLINE_BLESS=1 on this test)"
        );
    }
}

#[test]
fn the_page_says_when_plans_differ_within_the_noise() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports/examples/explore-mlp");
    let result: ExploreResult =
        serde_json::from_str(&fs::read_to_string(shipped.join("explore.json")).unwrap()).unwrap();
    let text = faultline_report::pareto::noise_summary(&result.campaigns[1]);
    // explore-cnn: every FIT interval overlaps the baseline's, and global ABFT's 22/1 over four
    // rounds is beyond chance at the level per look; He et al.'s checks' 6/0 is not.
    assert!(text.contains("within the noise"), "{text}");
    assert!(text.contains("beyond chance at 0.833% per look: `abft-global` (22/1, p < 0.001)"), "{text}");
    assert!(text.contains("`he-training-checks` (6/0, p = 0.03)"), "{text}");
    // A plan whose FIT interval lies below the baseline's is named as apart.
    let mut c = result.campaigns[1].clone();
    c.plans[1].failure_fit = faultline_fault::explore::Interval { p: 0.0, lo: 0.0, hi: 0.0 };
    c.plans[0].failure_fit.lo = 0.01;
    let text = faultline_report::pareto::noise_summary(&c);
    assert!(text.contains(&format!("`{}` lies below the unprotected interval", c.plans[1].plan)), "{text}");
    // Two plans apart: the verb agrees.
    c.plans[2].failure_fit = c.plans[1].failure_fit;
    let text = faultline_report::pareto::noise_summary(&c);
    let two = format!("`{}`, `{}` lie below", c.plans[1].plan, c.plans[2].plan);
    assert!(text.contains(&two), "{text}");
}

/// Plan against plan: with comparisons in `explore.json`, the summary leads with the front at
/// 95% and the tied pairs with the trials that would separate them, the table lists every
/// pair, and `comparisons.csv` has a row per pair.
#[test]
fn comparisons_say_which_plans_are_told_apart() {
    use faultline_fault::explore::PlanComparison;
    use faultline_fault::stats::paired::PairedCounts;
    let mut result = fixture();
    result.campaigns.truncate(1);
    let c = &mut result.campaigns[0];
    let cmp = |first: &str, second: &str, first_only, second_only, n| {
        let counts = PairedCounts { both: 0, first_only, second_only, neither: n - first_only - second_only };
        PlanComparison {
            first: first.into(),
            second: second.into(),
            counts,
            difference: counts.difference(faultline_fault::stats::Z95),
            p_value: counts.p_value(),
            separated: counts.p_value() < 0.05,
            trials_needed: counts.trials_to_separate(0.05, 0.8),
        }
    };
    c.comparisons =
        vec![cmp("none", "parity", 9, 0, 400), cmp("none", "range", 2, 1, 350), cmp("parity", "range", 0, 1, 350)];
    for p in &mut c.plans {
        p.front_at_confidence = p.plan == "none" || p.plan == "parity";
    }
    let (dir, md) = report(&result);
    let mlp = section(&md, "mlp-mxu");
    assert_eq!(row(mlp, "parity")[PARETO], "yes / yes");
    assert_eq!(row(mlp, "range")[PARETO], "\u{2014} / \u{2014}");
    let summary = md.split("## What was compared").next().unwrap();
    assert!(
        summary.contains("the front, where each plan fails demonstrably less than every cheaper plan"),
        "{summary}"
    );
    assert!(summary.contains("is `none`, `parity`."), "{summary}");
    assert!(summary.contains("Told apart: `none` and `parity` (p = 0.004)."), "{summary}");
    // Only pairs of point-estimate Pareto plans are in the summary; `range` is dominated.
    assert!(!summary.contains("`range`"), "{summary}");
    let table: Vec<&str> = mlp.lines().filter(|l| l.starts_with("| **none** | **parity** |")).collect();
    assert_eq!(table.len(), 1);
    // Told apart: in bold.
    assert!(table[0].contains("| **400** | **9 / 0** |") && table[0].ends_with("| **yes** |"), "{}", table[0]);
    let tied = mlp.lines().find(|l| l.starts_with("| parity | range |")).unwrap();
    // The trials that would separate it, briefly (the column must fit a 1280-px page).
    assert!(tied.contains("| no: ~") && tied.ends_with(" to separate |"), "{tied}");
    let csv = fs::read_to_string(dir.path().join("comparisons.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4);
    assert!(csv.lines().nth(1).unwrap().starts_with("mlp-mxu,none,parity,400,0,9,0,391,"));
}
