//! `faultline campaign` as a user runs it: killed (`kill -9`) part-way, more than once, and
//! resumed, it writes exactly the records of an uninterrupted run; a second run into the same
//! directory is refused unless it resumes; shards merge to the unsharded bytes.

mod common;
use common::{faultline, lines, run_and_kill};
use std::path::Path;

const SPEC: &str = "configs/campaign-slurm-test.ron";

/// A campaign of 3000 trials (the kill test's: long enough at cycle level to be killed
/// part-way on a fast machine, quick in hybrid mode) in `dir`.
fn long_spec(dir: &Path) -> String {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let text = std::fs::read_to_string(root.join(SPEC)).unwrap().replace("Uniform(n: 300)", "Uniform(n: 3000)");
    let text = text.replace("\"../models/", &format!("\"{}/models/", root.display()));
    let text = text.replace("hw: \"", &format!("hw: \"{}/configs/", root.display()));
    let p = dir.join("long.ron");
    std::fs::write(&p, text).unwrap();
    s(&p).to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(out: std::process::Output) -> std::process::Output {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn a_killed_campaign_resumes_to_the_same_records() {
    let d = tempfile::tempdir().unwrap();
    let spec = long_spec(d.path());
    let (whole, killed) = (d.path().join("whole"), d.path().join("killed"));
    ok(faultline(&["campaign", &spec, "--out", s(&whole), "--threads", "2"]));
    let first = run_and_kill(&spec, &killed, &["--resume"], 20);
    let second = run_and_kill(&spec, &killed, &["--resume"], first + 60);
    assert!(first < second && second < 3000, "killed at {first} and {second} records of 3000");
    // A half-written last line (as a kill mid-write leaves) is cut on resume.
    let records = killed.join("records.jsonl");
    let mut text = std::fs::read_to_string(&records).unwrap();
    text.push_str("{\"schema\":1,\"trial\":");
    std::fs::write(&records, text).unwrap();
    // Without --resume the directory is refused.
    let out = faultline(&["campaign", &spec, "--out", s(&killed)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --resume"), "{}", String::from_utf8_lossy(&out.stderr));
    ok(faultline(&["campaign", &spec, "--out", s(&killed), "--resume", "--threads", "2"]));
    for f in ["campaign.json", "records.jsonl", "summary.json"] {
        assert_eq!(std::fs::read(whole.join(f)).unwrap(), std::fs::read(killed.join(f)).unwrap(), "{f}");
    }
    assert_eq!(lines(&killed.join("timing.jsonl")), 3000, "one timing line per trial, none repeated");
}

#[test]
fn shards_merge_to_one_run_and_mismatches_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let whole = d.path().join("whole");
    ok(faultline(&["campaign", SPEC, "--out", s(&whole), "--json"]));
    let shards: Vec<String> = (0..2).map(|i| s(&d.path().join(format!("s{i}"))).to_string()).collect();
    for (i, dir) in shards.iter().enumerate() {
        ok(faultline(&["campaign", SPEC, "--out", dir, "--shard", &format!("{i}/2"), "--json"]));
    }
    // Resuming a shard as another slice is refused.
    let out = faultline(&["campaign", SPEC, "--out", &shards[0], "--shard", "1/2", "--resume"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("was run as shard 0/2"), "{err}");
    let merged = d.path().join("merged");
    let out = ok(faultline(&["merge", "--out", s(&merged), &shards[1], &shards[0]]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("campaign slurm-test: 300 trials"));
    // The report's terms: vulnerability, not "unmasked".
    assert!(
        text.contains("vulnerability % [95% CI]") && text.contains("all selected (pooled): vulnerability "),
        "{text}"
    );
    assert!(!text.contains("unmasked"), "{text}");
    for f in ["campaign.json", "records.jsonl", "summary.json"] {
        assert_eq!(std::fs::read(whole.join(f)).unwrap(), std::fs::read(merged.join(f)).unwrap(), "{f}");
    }
    let out = faultline(&["campaign", SPEC, "--out", s(&d.path().join("x")), "--shard", "2/2"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("`2/2` is not a shard"));
}
