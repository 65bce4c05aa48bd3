//! Valid-looking campaign files that the campaign cannot honour are refused before anything
//! runs or is written, with one line naming the file, the field and what is allowed: a plan on
//! an inference campaign (in `explore` as in `campaign`), margins and limits whose thresholds
//! and bounds overflow fp32 or fire on the fault-free run, injection steps past the golden
//! run, and names that would leave the output directory or share one.

use faultline_fault::explore::{run, ExploreSpec};
use faultline_fault::record::CampaignInfo;
use faultline_fault::spec::{parse_ron, Steps};
use faultline_fault::{Campaign, CampaignSpec};
use faultline_hw::budget::HostMemory;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A campaign file `name.ron` in `dir`: mlp-digits on tpu-32x32, `body` after the machine.
fn campaign_file(dir: &Path, name: &str, body: &str) -> PathBuf {
    let r = root();
    let text = format!(
        "CampaignSpec(name: \"{name}\", model: \"{}\", hw: \"{}\", {body})",
        r.join("models/mlp-digits.ron").display(),
        r.join("configs/tpu-32x32.ron").display()
    );
    let p = dir.join(format!("{name}.ron"));
    std::fs::write(&p, text).unwrap();
    p
}

/// A short training campaign (4 golden steps) with `train` settings, protected by `plan`.
fn small(dir: &Path, name: &str, train: &str, plan: &Path) -> PathBuf {
    campaign_file(
        dir,
        name,
        &format!(
            "train: ({train}), golden_steps: 4, inject_steps: List([2]), sites: [\"mxu.pe[*][*].psum\"], \
             fault: Flip, sampling: Uniform(n: 4), follow_up: 2, seed: 1, protection: Some({:?})",
            plan.display().to_string()
        ),
    )
}

/// A plan file `file.ron` in `dir` named `name`.
fn plan_file(dir: &Path, file: &str, name: &str, body: &str) -> PathBuf {
    let p = dir.join(format!("{file}.ron"));
    std::fs::write(&p, format!("(name: {name:?}, {body})")).unwrap();
    p
}

fn prepare_err(file: &Path) -> String {
    match Campaign::prepare(CampaignSpec::load(file).unwrap(), file, &HostMemory::default()) {
        Ok(_) => panic!("{} accepted", file.display()),
        Err(e) => e.to_string(),
    }
}

fn one_line(e: &str) {
    assert!(!e.contains('\n'), "not one line: {e}");
}

#[test]
fn explore_refuses_a_plan_on_an_inference_campaign_as_campaign_does() {
    let d = tempfile::tempdir().unwrap();
    let inference = root().join("configs/campaign-transformer-inference.ron");
    let plan = plan_file(d.path(), "codes", "codes", "mechanisms: [Ecc(code: Secded, on: [\"ub.*\"])]");
    let x = d.path().join("x.ron");
    std::fs::write(
        &x,
        format!("ExploreSpec(name: \"x\", campaigns: [{:?}], plans: [\"codes.ron\"])", inference.display().to_string()),
    )
    .unwrap();
    // What `faultline campaign --protect` checks: the spec with the plan, validated.
    let mut spec = CampaignSpec::load(&inference).unwrap();
    spec.protection = Some(std::path::absolute(&plan).unwrap());
    let want = spec.validate(&inference).unwrap_err().to_string();
    assert!(want.contains("field `protection`") && want.contains("None for an Inference campaign"), "{want}");
    let clock = Instant::now();
    assert_eq!(ExploreSpec::load(&x).unwrap_err().to_string(), want);
    // `run` checks it too, before any golden run (100 steps of a transformer) or file.
    let spec: ExploreSpec = parse_ron(&std::fs::read_to_string(&x).unwrap(), &x).unwrap();
    let out = d.path().join("out");
    let e = run(&spec, &x, &out, 1, &HostMemory::default(), |_| {}).map(|_| ()).unwrap_err().to_string();
    assert_eq!(e, want);
    assert!(clock.elapsed() < Duration::from_secs(5), "refused only after {:?}", clock.elapsed());
    assert!(!out.exists(), "an exploration refused up front wrote {}", out.display());
}

#[test]
fn margins_past_fp32_are_refused_when_the_plan_is_loaded() {
    let d = tempfile::tempdir().unwrap();
    let load = |body: &str| {
        let p = plan_file(d.path(), "m", "m", body);
        let e = faultline_fault::protect::ProtectionPlan::load(&p).map(|_| ()).unwrap_err().to_string();
        one_line(&e);
        assert!(e.starts_with(&format!("{}: field `mechanisms[0].", p.display())), "{e}");
        e
    };
    let e = load("mechanisms: [Restrict(nodes: [\"*.matmul\"], margin: 1e308)]");
    assert!(e.contains("`mechanisms[0].margin` = 1e308: a margin >= 1 and <= 3.4028235e38"), "{e}");
    let e = load("mechanisms: [Range(nodes: [\"*.matmul\"], bound: Learned(1e308))]");
    assert!(e.contains("`mechanisms[0].bound` = Learned(1e308): Learned(margin) with margin >= 1 and <= 3.4028235e38"));
    let e = load("mechanisms: [Range(nodes: [\"*\"], bound: Learned(inf))]");
    assert!(e.contains("Learned(inf)"), "{e}");
    // A limit on fp32 moments past fp32's range is no limit either.
    let p = plan_file(d.path(), "mb", "mb", "mechanisms: [MomentBound(1e300)]");
    let e = faultline_fault::protect::ProtectionPlan::load(&p).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("field `mechanisms[0]` = MomentBound(1e300): a positive limit <= 3.4028235e38"), "{e}");
    // fp32's largest value itself loads.
    let p = plan_file(d.path(), "ok", "ok", "mechanisms: [Restrict(nodes: [\"*\"], margin: 3.4028234663852886e38)]");
    faultline_fault::protect::ProtectionPlan::load(&p).unwrap();
}

#[test]
fn learned_bounds_past_fp32_are_refused_before_any_trial() {
    let d = tempfile::tempdir().unwrap();
    // 3e38 loads, but times the golden run's largest |x| of a GEMM output (about 2 here) it
    // overflows fp32: refused once the bounds are learned, naming the clamp, bound and max.
    let plan = plan_file(d.path(), "r38", "r38", "mechanisms: [Restrict(nodes: [\"*.matmul\"], margin: 3e38)]");
    let e = prepare_err(&small(d.path(), "c38", "", &plan));
    one_line(&e);
    let want = format!(
        "{}: field `mechanisms[0].margin` = 3e38: a margin whose bound is finite in fp32: clamp `fc1.matmul.clamp` \
         learned bound inf = margin x golden max ",
        plan.display()
    );
    assert!(e.starts_with(&want), "{e}");
    assert!(e.contains("past fp32's largest value 3.4028235e38 (margins up to "), "{e}");
    // The same for a range check's threshold.
    let plan = plan_file(d.path(), "g38", "g38", "mechanisms: [Range(nodes: [\"fc1.matmul\"], bound: Learned(3e38))]");
    let e = prepare_err(&small(d.path(), "g38c", "", &plan));
    one_line(&e);
    let want = format!(
        "{}: field `mechanisms[0].bound` = Learned(3e38): a threshold finite in fp32: check `fc1.matmul.range` learned ",
        plan.display()
    );
    assert!(e.starts_with(&want) && e.contains("from the golden run's largest residual"), "{e}");
    // A large margin whose bounds do fit: the campaign's file reads back as written.
    let plan = plan_file(d.path(), "r30", "r30", "mechanisms: [Restrict(nodes: [\"*.matmul\"], margin: 1e30)]");
    let f = small(d.path(), "c30", "", &plan);
    let c = Campaign::prepare(CampaignSpec::load(&f).unwrap(), &f, &HostMemory::default()).unwrap();
    let p = c.info.protection.as_ref().unwrap();
    assert!(p.clamps.iter().all(|k| k.bound.is_finite() && k.bound > 1e30), "{:?}", p.clamps);
    let text = serde_json::to_string(&c.info).unwrap();
    assert_eq!(serde_json::from_str::<CampaignInfo>(&text).unwrap(), c.info);
}

#[test]
fn a_moment_bound_below_the_golden_moments_names_both() {
    let d = tempfile::tempdir().unwrap();
    let plan = plan_file(d.path(), "mb", "mb", "mechanisms: [NonFiniteLoss, MomentBound(1e-9)]");
    let e = prepare_err(&small(d.path(), "adam", "optimizer: adam", &plan));
    one_line(&e);
    let want = format!(
        "{}: field `mechanisms[1]` = MomentBound(1e-9): a threshold the fault-free golden run stays within: check `",
        plan.display()
    );
    assert!(e.starts_with(&want), "{e}");
    assert!(e.contains("(threshold 1e-9) fired on ") && e.contains("steps, and its largest value there is "), "{e}");
    let max: f64 = e.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(max > 1e-9, "{e}");
}

#[test]
fn injection_steps_are_bounded_before_they_are_listed() {
    let d = tempfile::tempdir().unwrap();
    for last in [u64::MAX, 1_000_000_000, 100_000_000] {
        let f = campaign_file(
            d.path(),
            "steps",
            &format!(
                "golden_steps: 40, inject_steps: Range(first: 1, last: {last}), sites: [\"mxu.*\"], fault: Flip, \
                 sampling: Uniform(n: 4), follow_up: 5, seed: 1"
            ),
        );
        let clock = Instant::now();
        let e = CampaignSpec::load(&f).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "{}: field `inject_steps` = {last}: steps whose follow-up (5 steps) ends within golden_steps (40): \
                 at most 35",
                f.display()
            )
        );
        assert!(clock.elapsed() < Duration::from_secs(1), "{last}: {:?}", clock.elapsed());
    }
    // Counted without being listed.
    assert_eq!(Steps::Range { first: 1, last: u64::MAX }.count(), u64::MAX);
    assert_eq!(Steps::Range { first: 0, last: u64::MAX }.count(), u64::MAX);
    assert_eq!(Steps::Range { first: 5, last: 4 }.count(), 0);
    assert_eq!(Steps::List(vec![3, 1, 3]).count(), 2);
    assert_eq!(Steps::Range { first: 2, last: u64::MAX }.span(), Some((2, u64::MAX)));
}

#[test]
fn a_stuck_at_longer_than_the_step_is_refused_before_the_golden_run() {
    let d = tempfile::tempdir().unwrap();
    let f = campaign_file(
        d.path(),
        "stuck",
        "golden_steps: 40, inject_steps: List([2]), sites: [\"mxu.*\"], \
         fault: StuckAt(value: 1, lasts: Cycles(18446744073709551615)), sampling: Uniform(n: 4), follow_up: 5, seed: 1",
    );
    let e = prepare_err(&f);
    assert!(
        e.starts_with(&format!("{}: field `fault.lasts` = Cycles(18446744073709551615): Cycles(n) with", f.display()))
    );
}

#[test]
fn inference_batches_past_the_test_split_are_refused_before_the_golden_run() {
    let d = tempfile::tempdir().unwrap();
    // mlp-digits' 359 test samples are 12 batches of 32.
    let f = campaign_file(
        d.path(),
        "inf",
        "mode: Inference, golden_steps: 40, inject_steps: Range(first: 1, last: 13), sites: [\"mxu.*\"], \
         fault: Flip, sampling: Uniform(n: 4), seed: 1",
    );
    let mut golden_steps = 0;
    let r = Campaign::prepare_with(CampaignSpec::load(&f).unwrap(), &f, &HostMemory::default(), |_| golden_steps += 1);
    let e = r.map(|_| ()).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: field `inject_steps` = 13: test batches 1..=12", f.display())), "{e}");
    assert_eq!(golden_steps, 0, "refused after {golden_steps} golden steps");
}

#[test]
fn fit_rates_whose_products_overflow_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let body = "golden_steps: 4, inject_steps: List([2]), sites: [\"mxu.*\"], fault: Flip, sampling: Uniform(n: 2), \
                follow_up: 2, seed: 1";
    let f = campaign_file(d.path(), "fit", &format!("{body}, fit_per_bit: Some(1e308)"));
    let e = CampaignSpec::load(&f).unwrap_err().to_string();
    assert_eq!(e, format!("{}: field `fit_per_bit` = 1e308: a number in [0, 1e9] (FIT per bit), or None", f.display()));
    let f = campaign_file(d.path(), "fine", &format!("{body}, fit_per_bit: Some(1e9)"));
    CampaignSpec::load(&f).unwrap();
    let x = d.path().join("x.ron");
    std::fs::write(&x, "ExploreSpec(name: \"x\", campaigns: [\"fine.ron\"], plans: [], fit_per_bit: 1e300)").unwrap();
    let e = ExploreSpec::load(&x).map(|_| ()).unwrap_err().to_string();
    assert_eq!(e, format!("{}: field `fit_per_bit` = 1e300: a positive FIT per bit, at most 1e9", x.display()));
    for rounds in [0, 101] {
        std::fs::write(&x, format!("ExploreSpec(name: \"x\", campaigns: [\"fine.ron\"], plans: [], rounds: {rounds})"))
            .unwrap();
        let e = ExploreSpec::load(&x).map(|_| ()).unwrap_err().to_string();
        assert_eq!(e, format!("{}: field `rounds` = {rounds}: 1 to 100 rounds per campaign", x.display()));
    }
    // Every round of an exhaustive campaign would run the same trials.
    let ex = campaign_file(d.path(), "ex", &body.replace("Uniform(n: 2)", "Exhaustive"));
    std::fs::write(&x, "ExploreSpec(name: \"x\", campaigns: [\"ex.ron\"], plans: [], rounds: 2)").unwrap();
    let e = ExploreSpec::load(&x).map(|_| ()).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: field `sampling` = Exhaustive: Uniform or Stratified", ex.display())), "{e}");
    std::fs::write(&x, "ExploreSpec(name: \"x\", campaigns: [\"ex.ron\"], plans: [], rounds: 1)").unwrap();
    ExploreSpec::load(&x).unwrap();
}

/// An exploration `x.ron` in `dir` of `campaigns` under `plans` (file names in `dir`).
fn explore_file(dir: &Path, campaigns: &[&str], plans: &[&str]) -> PathBuf {
    let x = dir.join("x.ron");
    std::fs::write(&x, format!("ExploreSpec(name: \"x\", campaigns: {campaigns:?}, plans: {plans:?})")).unwrap();
    x
}

#[test]
fn explore_refuses_names_that_leave_out_or_share_a_directory() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("a/b");
    std::fs::create_dir_all(&dir).unwrap();
    let body = "golden_steps: 4, inject_steps: List([2]), sites: [\"mxu.*\"], fault: Flip, sampling: Uniform(n: 2), \
                follow_up: 2, seed: 1";
    let named = |file: &str, name: &str| {
        let f = campaign_file(&dir, file, body);
        let text =
            std::fs::read_to_string(&f).unwrap().replace(&format!("name: \"{file}\""), &format!("name: {name:?}"));
        std::fs::write(&f, text).unwrap();
        format!("{file}.ron")
    };
    let good = named("good", "good");
    plan_file(&dir, "p", "p", "mechanisms: [NonFiniteLoss]");
    let refused = |campaigns: &[&str], plans: &[&str], want: &str| {
        let x = explore_file(&dir, campaigns, plans);
        let e = ExploreSpec::load(&x).map(|_| ()).unwrap_err().to_string();
        one_line(&e);
        assert!(e.contains(want), "expected `{want}` in {e}");
        // `run` refuses the same, before it writes anything.
        let spec: ExploreSpec = parse_ron(&std::fs::read_to_string(&x).unwrap(), &x).unwrap();
        let out = dir.join("out");
        let r = run(&spec, &x, &out, 1, &HostMemory::default(), |_| {}).map(|_| ()).unwrap_err().to_string();
        assert_eq!(r, e);
        assert!(!out.exists(), "{campaigns:?} {plans:?} wrote {}", out.display());
    };
    let allowed = "a name that is one directory under --out: 1 to 100 of A-Z a-z 0-9 _ . + -, not \".\" or \"..\"";
    for bad in ["../../escaped-campaign", "/tmp/escaped-campaign", "..", ".", "a/b", "a\\b", "x y", "é"] {
        let c = named("bad", bad);
        let want = format!("{}: field `name` = {bad:?}: {allowed}", dir.join(&c).display());
        refused(&[&c], &[], &want);
    }
    let long = named("long", &"n".repeat(101));
    refused(&[&long], &[], "field `name` = \"nnnn");
    for bad in ["..", "../p", "/abs"] {
        plan_file(&dir, "q", bad, "mechanisms: [NonFiniteLoss]");
        let want = format!("{}: field `name` = {bad:?}: {allowed}", dir.join("q.ron").display());
        refused(&[&good], &["q.ron"], &want);
    }
    // Two campaigns or plans with one name (case aside), or a plan named as the baseline.
    let also = named("also", "GOOD");
    refused(&[&good, &also], &[], "field `campaigns[1]` = \"also.ron\": files whose names differ (case aside)");
    refused(&[&good, &also], &[], "its name \"GOOD\" is also campaigns[0]'s");
    refused(&[&good, &good], &[], "field `campaigns[1]` = \"good.ron\"");
    plan_file(&dir, "p2", "P", "mechanisms: [NonFiniteLoss]");
    refused(&[&good], &["p.ron", "p2.ron"], "field `plans[1]` = \"p2.ron\": files whose names differ");
    plan_file(&dir, "none", "None", "mechanisms: [NonFiniteLoss]");
    refused(&[&good], &["none.ron"], "its name \"None\" is also the unprotected baseline's");
    // Nothing was written above `dir`, whatever the names.
    let names: Vec<String> =
        std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["a"]);
    assert!(!Path::new("/tmp/escaped-campaign").exists());
    // Plus signs and dots are fine: the shipped exploration loads.
    ExploreSpec::load(&root().join("configs/explore-mlp.ron")).unwrap();
}

/// A path with a newline in it (a mutation the fuzz tests made) is shown escaped: errors stay
/// one line.
#[test]
fn paths_in_errors_stay_on_one_line() {
    let d = tempfile::tempdir().unwrap();
    let x = explore_file(d.path(), &["no\nsuch.ron"], &[]);
    let e = ExploreSpec::load(&x).map(|_| ()).unwrap_err().to_string();
    assert_eq!(e, format!("{}", d.path().join("no\\nsuch.ron").display()));
}
