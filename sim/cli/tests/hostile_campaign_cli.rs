//! Hostile campaign, plan and exploration files given to `faultline campaign` and `faultline
//! explore`: each is refused before anything runs or is written, with one line on stderr and
//! exit status 2, and nothing lands outside `--out`. Children run with a limited address space,
//! so a size that is allocated before it is checked fails here.

mod common;
use common::{faultline, faultline_limited};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Children run with a 2 GiB address space.
const LIMIT: u64 = 2 << 30;

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).canonicalize().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `faultline ARGS` (address space `limit`), which must fail with exit status 2 and one
/// line on stderr containing `want`, quickly; returns that line.
fn refused_within(args: &[&str], limit: u64, want: &str) -> String {
    let clock = Instant::now();
    let out = faultline_limited(args, limit);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(err.starts_with("error: ") && err.contains(want), "{args:?}: expected `{want}` in {err}");
    assert!(clock.elapsed() < Duration::from_secs(20), "{args:?}: refused only after {:?}", clock.elapsed());
    err
}

fn refused(args: &[&str], want: &str) -> String {
    refused_within(args, LIMIT, want)
}

/// A campaign file `name.ron` in `dir`: mlp-digits on tpu-32x32 (absolute paths), `body` after.
fn campaign(dir: &Path, name: &str, body: &str) -> PathBuf {
    let r = root();
    let text = format!(
        "CampaignSpec(name: {name:?}, model: {:?}, hw: {:?}, {body})",
        s(&r.join("models/mlp-digits.ron")),
        s(&r.join("configs/tpu-32x32.ron"))
    );
    let p = dir.join(format!("{}.ron", name.replace(['/', '.'], "_")));
    std::fs::write(&p, text).unwrap();
    p
}

/// A short campaign: 4 golden steps, 4 trials.
const SHORT: &str = "golden_steps: 4, inject_steps: List([2]), sites: [\"mxu.pe[*][*].psum\"], fault: Flip, \
                     sampling: Uniform(n: 4), follow_up: 2, seed: 1";

/// A plan file `file.ron` in `dir` named `file`.
fn plan_file(dir: &Path, file: &str, body: &str) -> PathBuf {
    plan(dir, file, file, body)
}

/// A plan file `file.ron` in `dir` named `name`.
fn plan(dir: &Path, file: &str, name: &str, body: &str) -> PathBuf {
    let p = dir.join(format!("{file}.ron"));
    std::fs::write(&p, format!("(name: {name:?}, {body})")).unwrap();
    p
}

#[test]
fn explore_refuses_a_plan_on_an_inference_campaign_as_campaign_does() {
    let d = tempfile::tempdir().unwrap();
    let inference = root().join("configs/campaign-transformer-inference.ron");
    let secded = root().join("configs/protect-secded-sram.ron");
    let x = d.path().join("x.ron");
    std::fs::write(
        &x,
        format!("ExploreSpec(name: \"x\", campaigns: [{:?}], plans: [{:?}])", s(&inference), s(&secded)),
    )
    .unwrap();
    let out = d.path().join("out");
    let by_explore = refused(&["explore", s(&x), "--out", s(&out)], "None for an Inference campaign");
    let by_campaign = refused(
        &["campaign", s(&inference), "--protect", s(&secded), "--out", s(&d.path().join("c"))],
        "None for an Inference campaign",
    );
    assert_eq!(by_explore, by_campaign);
    assert!(!out.exists(), "explore wrote {} before refusing", out.display());
}

#[test]
fn bounds_that_overflow_fp32_are_refused_and_nothing_unreadable_is_written() {
    let d = tempfile::tempdir().unwrap();
    let c = campaign(d.path(), "c", SHORT);
    let out = d.path().join("out");
    let run = |plan: &str, body: &str, want: &str| {
        let p = plan_file(d.path(), plan, body);
        refused(&["campaign", s(&c), "--protect", s(&p), "--out", s(&out)], want)
    };
    run(
        "huge",
        "mechanisms: [Restrict(nodes: [\"*.matmul\"], margin: 1e308)]",
        "field `mechanisms[0].margin` = 1e308: a margin >= 1 and <= 3.4028235e38",
    );
    run(
        "range",
        "mechanisms: [Range(nodes: [\"*.matmul\"], bound: Learned(1e308))]",
        "field `mechanisms[0].bound` = Learned(1e308)",
    );
    // Loads, but the golden GEMM outputs (about 2) times 3e38 overflow fp32.
    let e = run(
        "over",
        "mechanisms: [Restrict(nodes: [\"*.matmul\"], margin: 3e38)]",
        "clamp `fc1.matmul.clamp` learned bound inf = margin x golden max ",
    );
    assert!(
        e.contains(&format!("{}: field `mechanisms[0].margin` = 3e38", d.path().join("over.ron").display())),
        "{e}"
    );
    assert!(!out.exists(), "a refused campaign wrote {}", out.display());
    // A margin whose bounds fit: the directory it writes resumes and reports.
    let p = plan_file(d.path(), "big", "mechanisms: [Restrict(nodes: [\"*.matmul\"], margin: 1e30)]");
    for _ in 0..2 {
        let o = faultline(&["campaign", s(&c), "--protect", s(&p), "--out", s(&out), "--resume", "--threads", "1"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert!(out.join("summary.json").is_file());
    let o = faultline(&["report", s(&out), "--out", s(&d.path().join("report"))]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_moment_bound_below_the_golden_moments_names_both() {
    let d = tempfile::tempdir().unwrap();
    let c = campaign(d.path(), "adam", &format!("train: (optimizer: adam), {SHORT}"));
    let p = plan_file(d.path(), "mb", "mechanisms: [NonFiniteLoss, MomentBound(1e-9)]");
    let out = d.path().join("out");
    let e = refused(
        &["campaign", s(&c), "--protect", s(&p), "--out", s(&out)],
        "field `mechanisms[1]` = MomentBound(1e-9): a threshold the fault-free golden run stays within: check `",
    );
    assert!(e.contains("(threshold 1e-9) fired on ") && e.contains("and its largest value there is "), "{e}");
    assert!(!e.contains("internal inconsistency"), "{e}");
    assert!(!out.exists());
}

#[test]
fn injection_steps_past_the_golden_run_are_refused_before_they_are_listed() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("out");
    for last in ["18446744073709551615", "1000000000", "100000000"] {
        let c = campaign(
            d.path(),
            "steps",
            &format!(
                "golden_steps: 40, inject_steps: Range(first: 1, last: {last}), sites: [\"mxu.*\"], fault: Flip, \
                 sampling: Uniform(n: 4), follow_up: 5, seed: 1"
            ),
        );
        // 512 MiB of address space: listing 10^8 steps takes 800 MB.
        refused_within(
            &["campaign", s(&c), "--out", s(&out), "--max-memory", "16M"],
            512 << 20,
            &format!("field `inject_steps` = {last}: steps whose follow-up (5 steps) ends within golden_steps (40)"),
        );
    }
    assert!(!out.exists());
}

#[test]
fn explore_never_writes_outside_out() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("a/b");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out");
    let explore = |campaigns: &[&Path], plans: &[&Path]| {
        let x = dir.join("x.ron");
        let list = |v: &[&Path]| v.iter().map(|p| format!("{:?}", s(p))).collect::<Vec<_>>().join(", ");
        std::fs::write(
            &x,
            format!("ExploreSpec(name: \"x\", campaigns: [{}], plans: [{}])", list(campaigns), list(plans)),
        )
        .unwrap();
        x
    };
    let abs = d.path().join("abs-campaign");
    for name in ["../../escaped-campaign", s(&abs), "..", "a b"] {
        let c = campaign(&dir, name, SHORT);
        let x = explore(&[&c], &[]);
        refused(
            &["explore", s(&x), "--out", s(&out)],
            &format!("{}: field `name` = {name:?}: a name that is one directory under --out", c.display()),
        );
    }
    let good = campaign(&dir, "good", SHORT);
    let dots = plan(&dir, "dots", "..", "mechanisms: [NonFiniteLoss]");
    refused(&["explore", s(&explore(&[&good], &[&dots])), "--out", s(&out)], "field `name` = \"..\"");
    let again = campaign(&dir, "Good", SHORT);
    refused(&["explore", s(&explore(&[&good, &again], &[])), "--out", s(&out)], "is also campaigns[0]'s");
    let none = plan(&dir, "none", "none", "mechanisms: [NonFiniteLoss]");
    refused(&["explore", s(&explore(&[&good], &[&none])), "--out", s(&out)], "is also the unprotected baseline's");
    // Nothing was written: not above `dir`, not in --out.
    let mut top: Vec<String> =
        std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    top.sort();
    assert_eq!(top, ["a"]);
    let mut under: Vec<String> =
        std::fs::read_dir(d.path().join("a")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    under.sort();
    assert_eq!(under, ["b"]);
    assert!(!out.exists());
}
