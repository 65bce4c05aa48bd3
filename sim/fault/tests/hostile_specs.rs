//! Valid-looking campaign files that the campaign cannot honour are refused before anything
//! runs, with one line naming the file, the field and what is allowed: injection steps past
//! the golden run, stuck-ats longer than the step.

use faultline_fault::spec::Steps;
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

fn prepare_err(file: &Path) -> String {
    match Campaign::prepare(CampaignSpec::load(file).unwrap(), file, &HostMemory::default()) {
        Ok(_) => panic!("{} accepted", file.display()),
        Err(e) => e.to_string(),
    }
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
