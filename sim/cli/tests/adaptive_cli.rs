//! Adaptive campaigns as a user runs them: rounds planned from the records, so one thread or
//! two, and a run cut off mid-round and resumed, write the same records byte for byte; the
//! summary combines the strata; sharding and bad specs are refused in one line.

mod common;
use common::faultline;
use std::fs;
use std::path::Path;

const SPEC: &str = "configs/campaign-mlp-adaptive.ron";

fn run(out: &Path, extra: &[&str]) -> String {
    let mut args = vec!["campaign", SPEC, "--out", out.to_str().unwrap()];
    args.extend(extra);
    let o = faultline(&args);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn rounds_are_the_same_for_any_thread_count_and_after_a_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two, cut) = (tmp.path().join("one"), tmp.path().join("two"), tmp.path().join("cut"));
    let text = run(&one, &["--threads", "1"]);
    run(&two, &["--threads", "2"]);
    let records = fs::read_to_string(one.join("records.jsonl")).unwrap();
    assert_eq!(records, fs::read_to_string(two.join("records.jsonl")).unwrap());
    assert_eq!(fs::read(one.join("summary.json")).unwrap(), fs::read(two.join("summary.json")).unwrap());
    let lines: Vec<&str> = records.lines().collect();
    // More than the first round (floor 10 x every stratum), fewer than the budget.
    assert!(lines.len() > 400 && lines.len() < 8000, "{} trials", lines.len());
    assert!(text.contains("all selected (adaptive): "), "{text}");
    // Cut off in the middle of a later round (as a kill leaves it) and resumed.
    fs::create_dir_all(&cut).unwrap();
    fs::copy(one.join("campaign.json"), cut.join("campaign.json")).unwrap();
    let keep = lines.len() * 2 / 3;
    fs::write(cut.join("records.jsonl"), lines[..keep].iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    fs::write(cut.join("timing.jsonl"), "").unwrap();
    run(&cut, &["--threads", "2", "--resume"]);
    assert_eq!(records, fs::read_to_string(cut.join("records.jsonl")).unwrap());
    let summary: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(one.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["failure"]["method"], "adaptive");
    // Stopped at the target: the combined interval's half-width is at most 0.1 points.
    let (lo, hi) = (summary["failure"]["lo"].as_f64().unwrap(), summary["failure"]["hi"].as_f64().unwrap());
    assert!((hi - lo) / 2.0 <= 0.001, "[{lo}, {hi}]");
}

#[test]
fn sharding_and_bad_adaptive_specs_are_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("s");
    let o = faultline(&["campaign", SPEC, "--out", out.to_str().unwrap(), "--shard", "0/2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("sampling") && err.contains("unsharded"), "{err}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = fs::read_to_string(root.join(SPEC)).unwrap();
    // The spec's relative paths, made absolute for a copy outside configs/.
    let abs = |p: &str| fs::canonicalize(root.join(p)).unwrap().display().to_string();
    let fixed = text
        .replace("\"../models/mlp-digits.ron\"", &format!("{:?}", abs("models/mlp-digits.ron")))
        .replace("\"tpu-32x32.ron\"", &format!("{:?}", abs("configs/tpu-32x32.ron")));
    for (from, to, field) in [
        ("budget: 8000", "budget: 0", "sampling.budget"),
        ("round: 200", "round: 9000", "sampling.round"),
        ("floor: 10", "floor: 0", "sampling.floor"),
        ("Absolute(0.0001)", "Absolute(0.7)", "sampling.target"),
        ("Absolute(0.0001)", "Relative(0)", "sampling.target"),
        ("budget: 8000", "budget: 300", "sampling.budget"),
    ] {
        let spec = tmp.path().join("bad.ron");
        fs::write(&spec, fixed.replace(from, to)).unwrap();
        let o = faultline(&["campaign", spec.to_str().unwrap(), "--out", tmp.path().join("b").to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{to}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(field), "{to}: {err}");
    }
}
