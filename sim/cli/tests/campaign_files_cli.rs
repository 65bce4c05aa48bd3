//! Campaign directories are owned, identified and bounded: one writer per output directory
//! (two real processes), records of another campaign refused by every reader, only regular
//! files read and every read bounded (`/dev/zero`, FIFOs, hand-edited sizes), and
//! `--max-memory` kept by every command that reads campaign files.

mod common;
use common::limit_address_space as limit;
use faultline_fault::store::read_info;
use faultline_hw::files::DirLock;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Children run with a 2 GiB address space: a reader that allocates by what a file claims
/// fails here instead of passing slowly.
const LIMIT: u64 = 2 << 30;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Runs `faultline ARGS` with the address-space limit, killed (and failed) after `secs`: a
/// command that hangs on a FIFO fails the test instead of hanging it.
fn run_for(args: &[&str], secs: u64) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_faultline"));
    cmd.args(args).current_dir(root()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    limit(&mut cmd, LIMIT);
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(secs) {
            child.kill().unwrap();
            panic!("`faultline {}` still running after {secs} s (hangs?)", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn ok(out: Output) -> Output {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// `faultline ARGS` fails with one line on stderr containing `want`.
fn refused(args: &[&str], want: &str) {
    let out = run_for(args, 120);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(err.starts_with("error: ") && err.contains(want), "{args:?}: expected `{want}` in {err}");
}

/// A small campaign spec in `dir`: mlp-digits on the 8x8 machine, `n` MXU flips.
fn spec(dir: &Path, name: &str, seed: u64, n: u64) -> PathBuf {
    let r = root();
    let text = format!(
        "CampaignSpec(name: \"{name}\", model: \"{m}\", hw: \"{h}\", train: (batch: 32, optimizer: sgd, seed: 1), \
         golden_steps: 6, inject_steps: List([3]), sites: [\"mxu.*\", \"ub.*\"], fault: Flip, \
         sampling: Uniform(n: {n}), follow_up: 3, seed: {seed})\n",
        m = r.join("models/mlp-digits.ron").display(),
        h = r.join("configs/tpu-8x8.ron").display(),
    );
    let file: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
    let p = dir.join(format!("{file}-{seed}.ron"));
    std::fs::write(&p, text).unwrap();
    p
}

/// Runs the campaign `spec` into `out` (extra flags after).
fn campaign(spec: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["campaign", s(spec), "--out", s(out)];
    args.extend_from_slice(extra);
    run_for(&args, 300)
}

/// Starts `faultline campaign SPEC --out OUT EXTRA...` and returns it once it has written a
/// record, still running.
fn started(spec: &Path, out: &Path, extra: &[&str]) -> std::process::Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(["campaign", s(spec), "--out", s(out)])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::metadata(out.join("records.jsonl")).map_or(true, |m| m.len() == 0) {
        assert!(start.elapsed() < Duration::from_secs(120), "the campaign never wrote a record");
        assert!(child.try_wait().unwrap().is_none(), "the campaign ended before the test caught it running");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

#[test]
fn a_second_writer_is_refused_and_the_lock_dies_with_a_killed_holder() {
    let d = tempfile::tempdir().unwrap();
    // Slow enough to be caught running: cycle-level trials on one thread.
    let sp = spec(d.path(), "slow", 7, 400);
    let out = d.path().join("out");
    let mut a = started(&sp, &out, &["--threads", "1", "--mode", "cycle"]);
    let records = out.join("records.jsonl");
    // A second process on the same directory, as `--resume` would be started by mistake.
    refused(&["campaign", s(&sp), "--out", s(&out), "--resume"], "locked by another faultline process (pid ");
    // kill -9: the operating system drops the lock with the process.
    a.kill().unwrap();
    a.wait().unwrap();
    ok(campaign(&sp, &out, &["--resume"]));
    let text = std::fs::read_to_string(&records).unwrap();
    let trials: Vec<u64> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["trial"].as_u64().unwrap())
        .collect();
    assert_eq!(trials, (0..400).collect::<Vec<_>>(), "every trial once, in order");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["trials"], 400);
}

#[test]
fn every_command_that_writes_a_directory_takes_its_lock() {
    let d = tempfile::tempdir().unwrap();
    let sp = spec(d.path(), "small", 7, 40);
    let c = d.path().join("c");
    ok(campaign(&sp, &c, &[]));
    let held = d.path().join("held");
    let _lock = DirLock::acquire(&held).unwrap();
    let want = "locked by another faultline process";
    refused(&["campaign", s(&sp), "--out", s(&held)], want);
    refused(&["merge", "--out", s(&held), s(&c)], want);
    refused(&["report", s(&c), "--out", s(&held)], want);
    refused(&["diff", s(&c), s(&c), "--out", s(&held)], want);
    refused(&["explore", "configs/explore-mlp.ron", "--out", s(&held)], want);
    refused(
        &[
            "scalesim",
            "--config",
            "configs/scalesim-32x32.cfg",
            "--topology",
            "topologies/test-gemms.csv",
            "--out",
            s(&held),
        ],
        want,
    );
    refused(
        &[
            "train",
            "--model",
            "models/mlp-digits.ron",
            "--config",
            "configs/tpu-8x8.ron",
            "--steps",
            "1",
            "--save-checkpoint",
            s(&held),
        ],
        want,
    );
}

/// Copies `campaign.json` of `from` and `records.jsonl` of `records` into a new directory.
fn mixed(d: &Path, name: &str, from: &Path, records: &Path) -> PathBuf {
    let m = d.join(name);
    std::fs::create_dir_all(&m).unwrap();
    std::fs::copy(from.join("campaign.json"), m.join("campaign.json")).unwrap();
    std::fs::copy(records.join("records.jsonl"), m.join("records.jsonl")).unwrap();
    if from.join("shard.json").exists() {
        std::fs::copy(from.join("shard.json"), m.join("shard.json")).unwrap();
    }
    m
}

#[test]
fn records_of_another_campaign_are_refused_by_every_reader() {
    let d = tempfile::tempdir().unwrap();
    let (s7, s8) = (spec(d.path(), "same", 7, 60), spec(d.path(), "same", 8, 60));
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    ok(campaign(&s7, &a, &[]));
    ok(campaign(&s8, &b, &[]));
    let (ia, ib) = (read_info(&a).unwrap(), read_info(&b).unwrap());
    assert_ne!(ia.id, ib.id, "another seed is another campaign");
    let want = "records of another campaign";

    // The same spec with another seed: same trial ids, another campaign.
    let m = mixed(d.path(), "m", &a, &b);
    refused(&["campaign", s(&s7), "--out", s(&m), "--resume"], want);
    refused(&["report", s(&m), "--out", s(&d.path().join("r"))], want);
    refused(&["diff", s(&a), s(&m), "--out", s(&d.path().join("df"))], want);
    refused(&["vcd", "--campaign", s(&m), "--trial", "3", "--out", s(&d.path().join("t.vcd"))], want);
    // One foreign line in the middle of the campaign's own records.
    let mut lines: Vec<String> =
        std::fs::read_to_string(a.join("records.jsonl")).unwrap().lines().map(String::from).collect();
    lines[30] = std::fs::read_to_string(b.join("records.jsonl")).unwrap().lines().nth(30).unwrap().to_string();
    let one = d.path().join("one");
    std::fs::create_dir(&one).unwrap();
    std::fs::copy(a.join("campaign.json"), one.join("campaign.json")).unwrap();
    std::fs::write(one.join("records.jsonl"), lines.join("\n") + "\n").unwrap();
    refused(&["report", s(&one), "--out", s(&d.path().join("r1"))], "line 31: a record of campaign");
    refused(&["campaign", s(&s7), "--out", s(&one), "--resume"], "line 31: a record of campaign");

    // merge: a shard whose records are another campaign's shard.
    let (a0, a1, b1) = (d.path().join("a0"), d.path().join("a1"), d.path().join("b1"));
    ok(campaign(&s7, &a0, &["--shard", "0/2"]));
    ok(campaign(&s7, &a1, &["--shard", "1/2"]));
    ok(campaign(&s8, &b1, &["--shard", "1/2"]));
    let f1 = mixed(d.path(), "f1", &a1, &b1);
    refused(&["merge", "--out", s(&d.path().join("mg")), s(&a0), s(&f1)], want);
    // The honest shards merge to the unsharded run's bytes.
    let mg = d.path().join("mg-ok");
    ok(run_for(&["merge", "--out", s(&mg), s(&a0), s(&a1)], 120));
    for f in ["campaign.json", "records.jsonl", "summary.json"] {
        assert_eq!(std::fs::read(a.join(f)).unwrap(), std::fs::read(mg.join(f)).unwrap(), "{f}");
    }
    // An unreadable shard.json is named as such, not taken for a whole campaign.
    std::fs::write(a1.join("shard.json"), "{\"index\": 1").unwrap();
    refused(&["merge", "--out", s(&d.path().join("mg2")), s(&a0), s(&a1)], "shard.json: not a shard file");
}

#[test]
fn devices_fifos_and_endless_files_are_refused_without_hanging() {
    let d = tempfile::tempdir().unwrap();
    let sp = spec(d.path(), "small", 7, 40);
    let c = d.path().join("c");
    ok(campaign(&sp, &c, &[]));
    let fifo = d.path().join("fifo");
    let cs = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cs.as_ptr(), 0o600) }, 0);
    let r = d.path().join("r");
    for (file, target, want) in [
        ("records.jsonl", Path::new("/dev/zero"), "a character device, not a regular file"),
        ("records.jsonl", fifo.as_path(), "a FIFO, not a regular file"),
        ("campaign.json", Path::new("/dev/zero"), "a character device, not a regular file"),
        ("campaign.json", fifo.as_path(), "a FIFO, not a regular file"),
    ] {
        let x = d.path().join(format!("x-{file}-{}", target.file_name().unwrap().to_str().unwrap()));
        std::fs::create_dir(&x).unwrap();
        for f in ["campaign.json", "records.jsonl", "summary.json"] {
            std::fs::copy(c.join(f), x.join(f)).unwrap();
        }
        std::fs::remove_file(x.join(file)).unwrap();
        std::os::unix::fs::symlink(target, x.join(file)).unwrap();
        refused(&["report", s(&x), "--out", s(&r)], want);
        refused(&["diff", s(&c), s(&x), "--out", s(&r)], want);
        refused(&["vcd", "--campaign", s(&x), "--trial", "1", "--out", s(&d.path().join("t.vcd"))], want);
        refused(&["merge", "--out", s(&d.path().join(format!("m-{file}"))), s(&x)], want);
        refused(&["campaign", s(&sp), "--out", s(&x), "--resume"], want);
    }
    // A timing file holds only wall times: an endless or corrupt one does not block a resume.
    let t = d.path().join("t");
    std::fs::create_dir(&t).unwrap();
    for f in ["campaign.json", "records.jsonl"] {
        std::fs::copy(c.join(f), t.join(f)).unwrap();
    }
    std::fs::write(t.join("timing.jsonl"), "{\"trial\":0,\"wall_us\":12}\nnot json\n\u{0}\u{1}\n{\"trial\":1,")
        .unwrap();
    ok(campaign(&sp, &t, &["--resume"]));
    assert_eq!(std::fs::read_to_string(t.join("timing.jsonl")).unwrap(), "{\"trial\":0,\"wall_us\":12}\n");
    // The spec itself, and the other files commands read: SCALE-Sim's, a config, a plan.
    refused(&["campaign", s(&fifo), "--out", s(&d.path().join("f"))], "a FIFO, not a regular file");
    refused(
        &["scalesim", "--config", s(&fifo), "--topology", "topologies/test-gemms.csv"],
        "a FIFO, not a regular file",
    );
    refused(
        &["scalesim", "--config", "configs/scalesim-32x32.cfg", "--topology", s(&fifo)],
        "a FIFO, not a regular file",
    );
    refused(&["sites", "--config", s(&fifo)], "a FIFO, not a regular file");
    refused(
        &["campaign", s(&sp), "--out", s(&d.path().join("p")), "--protect", s(&fifo)],
        "a FIFO, not a regular file",
    );
    refused(&["explore", s(&fifo), "--out", s(&d.path().join("e"))], "a FIFO, not a regular file");
    refused(&["campaign", "/dev/zero", "--out", s(&d.path().join("z"))], "a character device, not a regular file");
    refused(
        &["vcd", "--campaign", s(&c), "--trial", "1", "--spec", "/dev/zero", "--out", s(&d.path().join("t.vcd"))],
        "--spec /dev/zero: a character device, not a regular file",
    );
    // Over the 16 MiB cap for campaign.json.
    let big = d.path().join("big");
    std::fs::create_dir(&big).unwrap();
    std::fs::copy(c.join("records.jsonl"), big.join("records.jsonl")).unwrap();
    let mut text = std::fs::read_to_string(c.join("campaign.json")).unwrap();
    text.push_str(&" ".repeat(17 << 20));
    std::fs::write(big.join("campaign.json"), text).unwrap();
    refused(&["report", s(&big), "--out", s(&r)], "larger than 16.0 MiB");
}

/// `dir/campaign.json` with `edit` applied to its JSON.
fn edit_info(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let p = dir.join("campaign.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn hand_edited_sizes_are_refused_before_allocating() {
    let d = tempfile::tempdir().unwrap();
    let sp = spec(d.path(), "small", 7, 40);
    let c = d.path().join("c");
    ok(campaign(&sp, &c, &[]));
    let r = d.path().join("r");
    for (i, (edit, want)) in [
        (
            Box::new(|v: &mut serde_json::Value| {
                v["classes"][0]["dims"] = serde_json::json!([4294967295u32, 4294967295u32])
            }) as Box<dyn Fn(&mut serde_json::Value)>,
            "`classes[0].dims` = [4294967295, 4294967295]",
        ),
        (
            Box::new(|v: &mut serde_json::Value| v["classes"][0]["width"] = serde_json::json!(4294967295u32)),
            "`classes[0].width` = 4294967295",
        ),
        (Box::new(|v: &mut serde_json::Value| v["classes"][1]["bits"] = serde_json::json!(7)), "`classes[1].bits` = 7"),
        (
            Box::new(|v: &mut serde_json::Value| v["trials"] = serde_json::json!(u64::MAX)),
            "`trials` = 18446744073709551615",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let x = d.path().join(format!("x{i}"));
        std::fs::create_dir(&x).unwrap();
        for f in ["campaign.json", "records.jsonl"] {
            std::fs::copy(c.join(f), x.join(f)).unwrap();
        }
        edit_info(&x, edit);
        refused(&["report", s(&x), "--out", s(&r)], want);
        refused(&["diff", s(&x), s(&c), "--out", s(&r)], want);
        refused(&["merge", "--out", s(&d.path().join(format!("m{i}"))), s(&x)], want);
        refused(&["vcd", "--campaign", s(&x), "--trial", "1", "--out", s(&d.path().join("t.vcd"))], want);
    }
}

#[test]
fn readers_of_campaign_files_keep_max_memory() {
    let d = tempfile::tempdir().unwrap();
    let sp = spec(d.path(), "small", 7, 40);
    let c = d.path().join("c");
    ok(campaign(&sp, &c, &[]));
    // A campaign whose report needs ~100 MB (a row per trial), refused under 16M before reading.
    let big = d.path().join("big");
    std::fs::create_dir(&big).unwrap();
    std::fs::copy(c.join("campaign.json"), big.join("campaign.json")).unwrap();
    edit_info(&big, |v| v["trials"] = serde_json::json!(1_000_000));
    std::fs::write(big.join("records.jsonl"), "").unwrap();
    refused(&["--max-memory", "16M", "report", s(&big), "--out", s(&d.path().join("r"))], "--max-memory");
    refused(&["--max-memory", "16M", "diff", s(&big), s(&c), "--out", s(&d.path().join("r"))], "--max-memory");
    ok(run_for(&["--max-memory", "16M", "report", s(&c), "--out", s(&d.path().join("r"))], 60));

    // Resume and merge stream their records: 400,000 of them (~160 MB) in a 600 MB address
    // space. The directory is a real campaign's, killed as soon as it began, its records
    // completed by hand.
    let n = 400_000u64;
    let spb = spec(d.path(), "big", 7, n);
    let m = d.path().join("many");
    let mut a = started(&spb, &m, &["--threads", "1"]);
    a.kill().unwrap();
    a.wait().unwrap();
    let info = read_info(&m).unwrap();
    assert_eq!(info.info.trials, n);
    let line = std::fs::read_to_string(c.join("records.jsonl")).unwrap().lines().next().unwrap().to_string();
    let tail = &line[line.find(",\"fault\"").unwrap()..];
    let mut text = String::with_capacity(n as usize * (tail.len() + 64));
    for t in 0..n {
        text.push_str(&format!("{{\"schema\":{},\"campaign\":\"{}\",\"trial\":{t}{tail}\n", info.info.schema, info.id));
    }
    assert!(text.len() > 150 << 20, "{}", text.len());
    std::fs::write(m.join("records.jsonl"), text).unwrap();
    let len = std::fs::metadata(m.join("records.jsonl")).unwrap().len();
    for args in [
        vec!["campaign", s(&spb), "--out", s(&m), "--resume", "--threads", "1", "--json"],
        vec!["merge", "--out", s(&d.path().join("merged")), s(&m)],
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_faultline"));
        cmd.args(&args).current_dir(root());
        limit(&mut cmd, 600 << 20);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}: {}", args[0], String::from_utf8_lossy(&out.stderr));
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["trials"], n);
    assert_eq!(std::fs::metadata(d.path().join("merged/records.jsonl")).unwrap().len(), len);
}

#[test]
fn a_campaign_with_a_protection_plan_replays_in_vcd() {
    let d = tempfile::tempdir().unwrap();
    let sp = spec(d.path(), "small", 7, 300);
    let c = d.path().join("c");
    ok(campaign(&sp, &c, &["--protect", "configs/protect-parity-abft.ron"]));
    // A simulated MXU trial: one with something to show.
    let trial = std::fs::read_to_string(c.join("records.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| {
            r["skipped"] == false
                && r["class"].as_str().unwrap().starts_with("mxu.")
                && r["injection"]["corrupted"].as_u64() > Some(0)
        })
        .expect("a simulated MXU trial")["trial"]
        .to_string();
    let out = run_for(&["vcd", "--campaign", s(&c), "--trial", &trial, "--out", s(&d.path().join("t.vcd"))], 120);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(d.path().join("t.vcd").is_file());
}

#[test]
fn the_markdown_report_escapes_the_campaign_name() {
    let d = tempfile::tempdir().unwrap();
    let sp = spec(d.path(), "x<script>alert(1)</script>", 7, 20);
    let c = d.path().join("c");
    ok(campaign(&sp, &c, &[]));
    let r = d.path().join("r");
    ok(run_for(&["report", s(&c), "--out", s(&r)], 60));
    let md = std::fs::read_to_string(r.join("report.md")).unwrap();
    assert!(md.starts_with("# Faultline report: x&lt;script>alert(1)&lt;/script>\n"), "{}", &md[..md.len().min(400)]);
    // Outside code spans (where a renderer shows text as it is), no raw tag.
    let outside: String = md.split('`').step_by(2).collect();
    assert!(!outside.contains("<script") && !outside.contains("</script"), "raw HTML in report.md");
}
