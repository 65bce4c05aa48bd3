//! A resumed run is the run it resumes: the checkpoint restores everything that defines the
//! run, refuses flags that contradict it, and the trace continues byte for byte, also after
//! `kill -9` at random moments.

mod common;
use common::faultline;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const MLP: [&str; 5] = ["train", "--model", "models/mlp-digits.ron", "--config", "configs/tpu-32x32.ron"];

fn train(extra: &[&str]) -> std::process::Output {
    let mut args = MLP.to_vec();
    args.extend_from_slice(extra);
    faultline(&args)
}

fn ok(out: std::process::Output) -> std::process::Output {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The example: a checkpoint of a seed-3 run resumed without --seed continues the
/// seed-3 run (data split and batch order included), exactly.
#[test]
fn resume_restores_the_seed_and_the_rest_of_the_run() {
    let d = tempfile::tempdir().unwrap();
    let (ck, a, b) = (d.path().join("ck"), d.path().join("a.jsonl"), d.path().join("b.jsonl"));
    ok(train(&["--steps", "50", "--seed", "3", "--batch", "16", "--eval-every", "7", "--save-checkpoint", s(&ck)]));
    ok(train(&["--steps", "100", "--resume", s(&ck), "--trace", s(&a)]));
    ok(train(&["--steps", "100", "--seed", "3", "--batch", "16", "--eval-every", "7", "--trace", s(&b)]));
    let (a, b) = (std::fs::read_to_string(a).unwrap(), std::fs::read_to_string(b).unwrap());
    // The resumed trace starts at step 51; it equals the tail of the uninterrupted one.
    let tail: Vec<&str> = b.lines().skip(50).collect();
    assert_eq!(a.lines().collect::<Vec<_>>(), tail);
    assert!(a.lines().next().unwrap().starts_with("{\"step\":51,"));
}

#[test]
fn flags_that_contradict_the_checkpoint_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    ok(train(&["--steps", "5", "--seed", "3", "--optimizer", "adam", "--lr", "0.02", "--save-checkpoint", s(&ck)]));
    for (extra, want) in [
        (vec!["--seed", "1"], "--seed 1 contradicts the checkpoint, whose run has --seed 3"),
        (vec!["--batch", "8"], "--batch 8 contradicts"),
        (vec!["--optimizer", "sgd"], "--optimizer sgd contradicts"),
        (vec!["--lr", "0.5"], "--lr 0.5 contradicts"),
        (vec!["--precision", "fp32"], "--precision fp32 contradicts"),
        (vec!["--eval-every", "3"], "--eval-every 3 contradicts"),
        (vec!["--steps", "4"], "past --steps 4"),
        (vec!["--init-weights", "x"], "cannot be used with"),
        (vec!["--config", "configs/tpu-8x8.ron"], "hardware config is `tpu-32x32`"),
        (vec!["--model", "models/cnn-small.ron"], "model is `mlp-digits`"),
    ] {
        let mut args = MLP.to_vec();
        match args.iter().position(|a| *a == extra[0]) {
            Some(i) => args[i + 1] = extra[1], // --model / --config replace the base's
            None => args.extend(&extra),
        }
        if extra[0] != "--steps" {
            args.extend(["--steps", "10"]);
        }
        args.extend(["--resume", s(&ck)]);
        let out = faultline(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // Flags that agree with the checkpoint are fine.
    ok(train(&["--steps", "6", "--seed", "3", "--optimizer", "adam", "--lr", "0.02", "--resume", s(&ck)]));
}

#[test]
fn resuming_with_the_same_trace_continues_it_byte_for_byte() {
    let d = tempfile::tempdir().unwrap();
    let (ck, t, full) = (d.path().join("ck"), d.path().join("t.jsonl"), d.path().join("full.jsonl"));
    ok(train(&["--steps", "20", "--trace", s(&full)]));
    ok(train(&["--steps", "20", "--trace", s(&t), "--save-checkpoint", s(&ck), "--checkpoint-every", "5"]));
    // A crash after step 13: the trace ran ahead of the newest checkpoint (step 10) and its
    // last line is torn; the final checkpoint was never written.
    let text = std::fs::read_to_string(&t).unwrap();
    let cut: String = text.lines().take(13).map(|l| format!("{l}\n")).collect::<String>() + "{\"step\":14,\"lo";
    std::fs::write(&t, cut).unwrap();
    std::fs::remove_file(ck.join("checkpoint.json")).unwrap();
    for sub in ["step-000015", "step-000020"] {
        std::fs::remove_dir_all(ck.join(sub)).unwrap();
    }
    // Resuming from the directory picks the newest complete checkpoint (step 10).
    ok(train(&["--steps", "20", "--trace", s(&t), "--save-checkpoint", s(&ck), "--resume", s(&ck)]));
    assert_eq!(std::fs::read(&t).unwrap(), std::fs::read(&full).unwrap());
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.path().join("t.run.json")).unwrap()).unwrap();
    let inv = run["invocations"].as_array().unwrap();
    assert_eq!(inv.len(), 2);
    assert_eq!((inv[1]["start_step"].as_u64(), inv[1]["target_step"].as_u64()), (Some(10), Some(20)));
    // A trace of another run is refused, not silently mixed.
    let other = d.path().join("other.jsonl");
    ok(train(&["--steps", "3", "--trace", s(&other)]));
    let out = train(&["--steps", "20", "--trace", s(&other), "--resume", s(&ck.join("step-000010"))]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the trace of the checkpoint's run"));
}

/// Nothing to train is a one-line error, with or without --json, not a summary of no steps
/// (`loss NaN -> NaN, cycles/step 0`, exit 0); a refused resume leaves the run's files alone.
#[test]
fn nothing_to_train_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let (ck, t) = (d.path().join("ck"), d.path().join("t.jsonl"));
    ok(train(&["--steps", "4", "--save-checkpoint", s(&ck), "--trace", s(&t)]));
    let files = |dir: &Path| -> Vec<(std::ffi::OsString, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            // The lock names its holder (pid), so it differs from run to run.
            .filter(|e| e.file_name() != faultline_hw::files::LOCK_FILE)
            .map(|e| (e.file_name(), std::fs::read(e.path()).unwrap()))
            .collect();
        v.sort();
        v
    };
    let (before, trace) = (files(&ck), std::fs::read(&t).unwrap());
    let resume = ["--resume", s(&ck), "--save-checkpoint", s(&ck), "--trace", s(&t)];
    for (steps, want) in [
        ("0", "invalid value '0' for '--steps <STEPS>': 0 is not in 1..=16777216"),
        ("4", "the checkpoint is at step 4, already at --steps 4: nothing to train; --steps is the total to reach"),
        ("3", "the checkpoint is at step 4, past --steps 3: nothing to train; --steps is the total to reach"),
    ] {
        for json in [false, true] {
            let mut args = vec!["--steps", steps];
            if steps != "0" {
                args.extend(resume);
            }
            if json {
                args.push("--json");
            }
            let out = train(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.starts_with("error: ") && err.lines().count() == 1 && err.contains(want), "{args:?}: {err}");
            assert!(out.stdout.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
        }
    }
    assert!(files(&ck) == before, "a refused resume changed the checkpoint");
    assert!(std::fs::read(&t).unwrap() == trace, "a refused resume changed the trace");
    // One step more is fine.
    ok(train(&["--steps", "5", "--resume", s(&ck)]));
}

#[test]
fn a_torn_checkpoint_is_refused_with_a_hint() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    ok(train(&["--steps", "4", "--save-checkpoint", s(&ck)]));
    std::fs::remove_file(ck.join("checkpoint.json")).unwrap();
    let out = train(&["--steps", "8", "--resume", s(&ck)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("incomplete") && err.contains("parent directory"), "{err}");
}

fn has_checkpoint(ck: &Path) -> bool {
    ck.join("checkpoint.json").is_file()
        || std::fs::read_dir(ck).is_ok_and(|d| d.flatten().any(|e| e.path().join("checkpoint.json").is_file()))
}

/// `kill -9` at random moments (several times), each time resuming with the same command and
/// paths: the finished trace and final checkpoint equal the uninterrupted run's, byte for byte.
#[test]
fn runs_killed_at_random_moments_resume_to_the_uninterrupted_result() {
    let d = tempfile::tempdir().unwrap();
    // Cycle-level on the small array: slow enough (about a second) to be killed mid-run.
    let base = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = MLP.iter().map(|s| s.to_string()).collect();
        v[4] = "configs/tpu-8x8.ron".into();
        for a in ["--steps", "240", "--mode", "cycle", "--eval-every", "5", "--checkpoint-every", "7"] {
            v.push(a.into());
        }
        for (flag, p) in [("--trace", dir.join("t.jsonl")), ("--save-checkpoint", dir.join("ck"))] {
            v.push(flag.into());
            v.push(p.to_str().unwrap().into());
        }
        v
    };
    let (reference, killed) = (d.path().join("ref"), d.path().join("run"));
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(base(&reference))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let wall = start.elapsed();
    let seed: u64 = rand::random();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let spawn = |resume: bool| {
        let mut args = base(&killed);
        if resume {
            args.extend(["--resume".to_string(), killed.join("ck").to_str().unwrap().to_string()]);
        }
        Command::new(env!("CARGO_BIN_EXE_faultline"))
            .args(args)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Kill when the run has reached a random step (its trace has that many lines) plus a random
    // part of a step's time, so kills land mid-run however fast this machine runs just now, at
    // any point of a step (trace, checkpoint or state writes).
    let lines = || std::fs::read(killed.join("t.jsonl")).map_or(0, |t| t.iter().filter(|&&c| c == b'\n').count());
    let per_step = wall / 240;
    let mut kills = Vec::new();
    for _ in 0..5 {
        let mut child = spawn(has_checkpoint(&killed.join("ck")));
        let target = rng.gen_range(lines().min(230) + 1..=235);
        let extra = per_step.mul_f64(rng.gen_range(0.0..1.0));
        while lines() < target && child.try_wait().unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(extra);
        let _ = child.kill(); // SIGKILL; the run may also have finished already
        let status = child.wait().unwrap();
        kills.push((target, status));
    }
    use std::os::unix::process::ExitStatusExt;
    assert!(kills.iter().any(|(_, st)| st.signal() == Some(9)), "no run was killed mid-way: {kills:?}");
    // The same command once more finishes the run; if a run above already did, it is refused
    // as having nothing to train.
    let out = spawn(has_checkpoint(&killed.join("ck"))).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let done = out.status.code() == Some(2) && err.contains("the checkpoint is at step 240, already at --steps 240");
    assert!(out.status.success() || done, "seed {seed}: {err}");
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(
        read(&reference.join("t.jsonl")) == read(&killed.join("t.jsonl")),
        "seed {seed}, kills {kills:?}: the trace differs from the uninterrupted run's"
    );
    let a = faultline_train::Checkpoint::load(&reference.join("ck")).unwrap();
    let b = faultline_train::Checkpoint::load(&killed.join("ck")).unwrap();
    assert_eq!(a.state.step, 240);
    assert!(a == b, "seed {seed}, kills {kills:?}: the final state differs");
    // Byte for byte, too: the final checkpoint's manifest and tensor files.
    let files = |dir: &Path| -> Vec<(std::ffi::OsString, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_file() && e.file_name() != faultline_hw::files::LOCK_FILE)
            .map(|e| (e.file_name(), read(&e.path())))
            .collect();
        v.sort();
        v
    };
    let (fa, fb) = (files(&reference.join("ck")), files(&killed.join("ck")));
    assert!(fa.len() > 1, "{fa:?}");
    let names = |f: &[(std::ffi::OsString, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&fa), names(&fb), "seed {seed}, kills {kills:?}");
    for ((name, x), (_, y)) in fa.iter().zip(&fb) {
        assert!(x == y, "seed {seed}, kills {kills:?}: {name:?} differs from the uninterrupted run's");
    }
}
