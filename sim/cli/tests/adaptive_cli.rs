//! Adaptive campaigns as a user runs them: rounds planned from the records, so one thread or
//! two, shards merged after every round, and a run cut off or killed mid-round and resumed,
//! write the same records byte for byte; the summary combines the strata; a wrong `--after`
//! and bad specs are refused in one line.

mod common;
use common::{faultline, run_and_kill};
use std::fs;
use std::path::{Path, PathBuf};

const SPEC: &str = "configs/campaign-mlp-adaptive.ron";
/// Four rounds of at most 144 trials, in well under a second.
const SMALL: &str = "configs/campaign-slurm-adaptive.ron";
const FILES: [&str; 3] = ["records.jsonl", "summary.json", "campaign.json"];

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
fn bad_adaptive_specs_are_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
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

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `faultline ARGS`, which must succeed: its standard output.
fn ok(args: &[&str]) -> String {
    let o = faultline(args);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `faultline ARGS`, which must fail with one line naming `what`s: the line.
fn refused(args: &[&str], what: &[&str]) -> String {
    let o = faultline(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    for w in what {
        assert!(err.contains(w), "{args:?}: `{w}` not in {err}");
    }
    err
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or("")
}

/// Shard `i` of 3 of `spec` in `dir/s{i}`, after the merge `after` (the first round without).
fn shard(spec: &str, dir: &Path, i: usize, after: Option<&Path>, extra: &[&str]) -> String {
    let out = dir.join(format!("s{i}"));
    let mut args = vec!["campaign", spec, "--out", s(&out), "--shard"];
    let slice = format!("{i}/3");
    args.push(&slice);
    if let Some(a) = after {
        args.extend(["--after", s(a)]);
    }
    args.extend(extra);
    ok(&args)
}

/// Merges `dir/s0..s2` into `dir/{name}`: its path and what merge printed.
fn merge(dir: &Path, name: &str) -> (PathBuf, String) {
    let m = dir.join(name);
    let shards: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("s{i}"))).collect();
    let mut args = vec!["merge", "--out", s(&m)];
    args.extend(shards.iter().map(|p| s(p)));
    let text = ok(&args);
    (m, text)
}

fn same_files(a: &Path, b: &Path) {
    for f in FILES {
        assert!(fs::read(a.join(f)).unwrap() == fs::read(b.join(f)).unwrap(), "{f} of {a:?} and {b:?} differ");
    }
}

/// Three shards, merged after every round and run again after the merge until it says the
/// campaign is finished, write what one run writes, on one thread or two; a shard run after
/// the last merge runs nothing.
#[test]
fn shards_merged_after_each_round_write_the_unsharded_bytes() {
    let d = tempfile::tempdir().unwrap();
    let (one, two) = (d.path().join("one"), d.path().join("two"));
    let text = ok(&["campaign", SMALL, "--out", s(&one), "--threads", "1"]);
    assert_eq!(last_line(&text), "adaptive: finished: budget spent after 4 rounds, 240 trials");
    ok(&["campaign", SMALL, "--out", s(&two), "--threads", "2"]);
    same_files(&one, &two);
    let mut after: Option<PathBuf> = None;
    for round in 1..=4 {
        for i in 0..3 {
            let text = shard(SMALL, d.path(), i, after.as_deref(), &["--threads", "1"]);
            let want = format!("adaptive: ran round {round} (trials ");
            assert!(last_line(&text).starts_with(&want), "{text}");
        }
        let (m, text) = merge(d.path(), &format!("m{round}"));
        let status = last_line(&text);
        if round < 4 {
            let want = format!("adaptive: next round {} (trials ", round + 1);
            assert!(status.starts_with(&want) && status.ends_with(&format!("--after {}", s(&m))), "{text}");
        } else {
            assert_eq!(status, "adaptive: finished: budget spent after 4 rounds, 240 trials");
        }
        after = Some(m);
    }
    same_files(&one, after.as_deref().unwrap());
    // The campaign is finished: a shard runs nothing and says so.
    let text = shard(SMALL, d.path(), 1, after.as_deref(), &[]);
    assert!(last_line(&text).ends_with("240 trials; nothing to run"), "{text}");
    let (m, _) = merge(d.path(), "again");
    same_files(&one, &m);
}

/// A copy of the small spec in `dir` with two rounds of 144 and 1,500 trials: slow enough at
/// cycle level (a few seconds) to be killed in the second round.
fn long_spec(dir: &Path) -> String {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let text =
        fs::read_to_string(root.join(SMALL)).unwrap().replace("budget: 240, round: 40", "budget: 1644, round: 1500");
    let text = text.replace("\"../models/", &format!("\"{}/models/", root.display()));
    let text = text.replace("hw: \"", &format!("hw: \"{}/configs/", root.display()));
    let p = dir.join("long.ron");
    fs::write(&p, text).unwrap();
    s(&p).to_string()
}

/// `kill -9` in the middle of the second round, unsharded and on a shard, then `--resume`:
/// the same records as a run never killed.
#[test]
fn a_campaign_killed_mid_round_resumes_to_the_same_records() {
    let d = tempfile::tempdir().unwrap();
    let spec = long_spec(d.path());
    let whole = d.path().join("whole");
    let text = ok(&["campaign", &spec, "--out", s(&whole), "--threads", "2"]);
    assert_eq!(last_line(&text), "adaptive: finished: target met after 2 rounds, 1644 trials");
    // Unsharded: killed between trials 144 and 1644, resumed on two threads.
    let killed = d.path().join("killed");
    let at = run_and_kill(&spec, &killed, &[], 400);
    assert!((400..1644).contains(&at), "killed at {at} records");
    ok(&["campaign", &spec, "--out", s(&killed), "--resume", "--threads", "2"]);
    same_files(&whole, &killed);
    // Shard 0 of 3 killed in its slice of the second round (trials 48 to 548 of its own).
    for i in 0..3 {
        shard(&spec, d.path(), i, None, &["--threads", "1"]);
    }
    let (m1, _) = merge(d.path(), "m1");
    let at = run_and_kill(&spec, &d.path().join("s0"), &["--shard", "0/3", "--after", s(&m1)], 150);
    assert!((150..548).contains(&at), "killed at {at} records");
    let text = shard(&spec, d.path(), 0, Some(&m1), &["--resume", "--threads", "2"]);
    assert!(last_line(&text).starts_with("adaptive: ran round 2 (trials 144..1644"), "{text}");
    for i in 1..3 {
        shard(&spec, d.path(), i, Some(&m1), &[]);
    }
    let (m2, text) = merge(d.path(), "m2");
    assert_eq!(last_line(&text), "adaptive: finished: target met after 2 rounds, 1644 trials");
    same_files(&whole, &m2);
}

/// `--after` must be the latest merge of these shards, of this campaign, of whole rounds; a
/// merge of shards at different rounds is refused too. Each refusal is one line naming the
/// directory and what is wrong.
#[test]
fn a_wrong_after_is_refused_in_one_line() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    for i in 0..3 {
        shard(SMALL, dir, i, None, &[]);
    }
    let (m1, _) = merge(dir, "m1");
    for i in 0..3 {
        shard(SMALL, dir, i, Some(&m1), &[]);
    }
    let (m2, _) = merge(dir, "m2");
    for i in 0..3 {
        shard(SMALL, dir, i, Some(&m2), &[]);
    }
    let (m3, _) = merge(dir, "m3");
    // The round after a merge is run again: nothing to do.
    let text = shard(SMALL, dir, 2, Some(&m2), &[]);
    assert!(last_line(&text).starts_with("adaptive: ran round 3 (trials 184..224"), "{text}");
    let s0 = dir.join("s0");
    let run = |after: &Path| -> Vec<String> {
        ["campaign", SMALL, "--out", s(&s0), "--shard", "0/3", "--after", s(after)].map(String::from).to_vec()
    };
    // A merge that misses the latest round: the shards have run past the round after it.
    refused(&args(&run(&m1)), &[s(&s0), "past", "pass the latest merge of the shards as --after"]);
    // Another campaign's directory.
    let other = dir.join("other");
    ok(&["campaign", "configs/campaign-slurm-test.ron", "--out", s(&other)]);
    refused(&args(&run(&other)), &[s(&other.join("campaign.json")), "records another campaign"]);
    // A shard's directory, not a merge.
    refused(&args(&run(&dir.join("s1"))), &["s1/shard.json", "not a merge"]);
    // A merge cut inside a round (as a hand-made one could be).
    let cut = dir.join("cut");
    fs::create_dir_all(&cut).unwrap();
    fs::copy(m2.join("campaign.json"), cut.join("campaign.json")).unwrap();
    let records = fs::read_to_string(m2.join("records.jsonl")).unwrap();
    fs::write(cut.join("records.jsonl"), records.lines().take(150).map(|l| format!("{l}\n")).collect::<String>())
        .unwrap();
    refused(&args(&run(&cut)), &[s(&cut.join("records.jsonl")), "150 trials, which end inside round 2"]);
    // A shard directory that did not run the earlier rounds.
    let fresh = dir.join("fresh");
    let err = refused(
        &["campaign", SMALL, "--out", s(&fresh), "--shard", "0/3", "--after", s(&m2)],
        &[s(&fresh), "holds no campaign", "ran the earlier rounds"],
    );
    assert!(!fresh.exists(), "{err}");
    // Without --after, a shard past the first round.
    refused(
        &["campaign", SMALL, "--out", s(&s0), "--shard", "0/3", "--resume"],
        &[s(&s0), "past the first round", "--after"],
    );
    // A campaign that is not adaptive has no rounds.
    refused(
        &[
            "campaign",
            "configs/campaign-slurm-test.ron",
            "--out",
            s(&dir.join("u")),
            "--shard",
            "0/3",
            "--after",
            s(&m2),
        ],
        &["--after", "only a shard of an Adaptive campaign"],
    );
    // Shards at different rounds do not merge.
    shard(SMALL, dir, 0, Some(&m3), &[]);
    let o = faultline(&["merge", "--out", s(&dir.join("m4")), s(&s0), s(&dir.join("s1")), s(&dir.join("s2"))]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!((o.status.code(), err.lines().count()), (Some(2), 1), "{err}");
    assert!(err.contains("the shards stop at different rounds"), "{err}");
}
