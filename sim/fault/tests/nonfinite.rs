//! Non-finite values in a campaign's files are written by name (`"NaN"`, `"Infinity"`,
//! `"-Infinity"`), not as the `null` JSON would give all three, and read back.

use faultline_fault::model::Anchor;
use faultline_fault::protect::{Applied, CheckInfo, ClampInfo, Mechanism, ProtectionPlan, Recovery, Rule};
use faultline_fault::record::{CampaignInfo, TrialRecord};
use faultline_fault::{Campaign, CampaignSpec, Outcome, RunOptions, Shard, TrialMode};
use faultline_graph::Phase;
use faultline_hw::budget::HostMemory;
use faultline_hw::{Register, Unit};
use faultline_train::StepFault;
use std::path::{Path, PathBuf};

/// A spec for mlp-digits on tpu-32x32 in `dir`, with `body` after the model and machine.
fn spec_file(dir: &Path, body: &str) -> PathBuf {
    let r = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = format!(
        "CampaignSpec(name: \"nonfinite\", model: \"{}\", hw: \"{}\", {body})",
        r.join("models/mlp-digits.ron").display(),
        r.join("configs/tpu-32x32.ron").display()
    );
    let p = dir.join("nonfinite.ron");
    std::fs::write(&p, text).unwrap();
    p
}

fn prepare(body: &str, dir: &Path) -> Campaign {
    let f = spec_file(dir, body);
    Campaign::prepare(CampaignSpec::load(&f).unwrap(), &f, &HostMemory::default()).unwrap()
}

/// The flip the README follows: bit 30 of an SGD update result makes an fc1 weight ~6e37, so
/// step 6's loss is ~4e35 and step 7's NaN. Its record ends its loss deltas with `"NaN"`, and
/// reads back with the delta NaN and the finite ones bit for bit.
#[test]
fn a_diverging_trial_records_its_nan_loss_by_name() {
    let d = tempfile::tempdir().unwrap();
    let body = "golden_steps: 9, inject_steps: List([5]), sites: [\"vpu.lane[*].out\"], fault: Flip, \
                sampling: Uniform(n: 1), follow_up: 4, seed: 1";
    let c = prepare(body, d.path());
    let class =
        c.space.classes.iter().map(|x| x.class).find(|x| x.unit == Unit::Vpu && x.register == Register::LaneOut);
    let fault: StepFault = "flip:vpu.lane[3].out[30]@step=5,cycle=4960".parse().unwrap();
    let a = Anchor { class: class.unwrap(), elem: 3, bit: 30, step: 5, cycle: 4960, check_bits: 0 };
    let c = c.with_faults(vec![(a, vec![fault])], "the README's SGD flip".into());
    let out = d.path().join("out");
    c.run(&out, RunOptions { threads: 1, shard: Shard::ALL, resume: false, mode: TrialMode::Hybrid }, |_| {}).unwrap();
    let text = std::fs::read_to_string(out.join("records.jsonl")).unwrap();
    let line = text.lines().next().unwrap();
    let rec: TrialRecord = serde_json::from_str(line).unwrap();
    assert_eq!(rec.outcome, Outcome::ShortTermInfNan, "{line}");
    let (last, finite) = rec.loss_delta.split_last().unwrap();
    assert!(last.is_nan() && finite.len() == 2 && finite.iter().all(|d| d.is_finite()), "{line}");
    let written: Vec<String> = finite.iter().map(|d| serde_json::to_string(d).unwrap()).collect();
    assert!(line.contains(&format!("\"loss_delta\":[{},\"NaN\"]", written.join(","))), "{line}");
    assert_eq!(faultline_fault::store::outcomes(&out).unwrap()[0], Outcome::ShortTermInfNan);
}

/// `campaign.json`: golden losses and protection values that are not finite are written by
/// name and read back (NaN as NaN, infinities bit for bit); the text is the same once more.
#[test]
fn campaign_info_names_non_finite_values() {
    let d = tempfile::tempdir().unwrap();
    let body = "golden_steps: 4, inject_steps: List([2]), sites: [\"vpu.lane[*].out\"], fault: Flip, \
                sampling: Uniform(n: 1), follow_up: 1, seed: 1";
    let mut info: CampaignInfo = prepare(body, d.path()).info.clone();
    let finite = info.golden.losses[3];
    info.golden.losses[..3].copy_from_slice(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY]);
    let check = CheckInfo {
        name: "fc1.matmul.range".into(),
        mechanism: "range".into(),
        node: "fc1.matmul".into(),
        layer: "fc1".into(),
        phase: Phase::Forward,
        gemm: None,
        side: None,
        tile: None,
        rule: Rule::Learned(2.0),
        threshold: f64::INFINITY,
        golden_max: f64::INFINITY,
        false_positives: 0,
    };
    let clamp = ClampInfo {
        name: "relu1.relu.clamp".into(),
        node: "relu1.relu".into(),
        layer: "relu1".into(),
        phase: Phase::Forward,
        margin: 2.0,
        bound: f64::INFINITY,
        golden_max: 2e38,
    };
    let plan = ProtectionPlan {
        name: "overflowing".into(),
        mechanisms: vec![Mechanism::Restrict { nodes: vec!["relu1.relu".into()], margin: 2.0 }],
        recovery: Recovery::Once,
    };
    let cycles = info.cycles_per_step;
    info.protection = Some(Applied {
        plan,
        checks: vec![check],
        ecc: vec![],
        clamps: vec![clamp],
        loss_check: true,
        base_cycles: cycles,
        cycles,
        area_bits: 0,
        golden_residuals: vec![vec![f32::NAN], vec![0.5]],
    });
    let text = serde_json::to_string_pretty(&info).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["protection"]["golden_residuals"], serde_json::json!([["NaN"], [0.5]]));
    let losses = &v["golden"]["losses"];
    assert_eq!((&losses[0], &losses[1], &losses[2]), (&"NaN".into(), &"Infinity".into(), &"-Infinity".into()));
    assert_eq!(losses[3].as_f64().unwrap().to_bits(), finite.to_bits());
    let p = &v["protection"];
    assert_eq!((&p["checks"][0]["threshold"], &p["checks"][0]["golden_max"]), (&"Infinity".into(), &"Infinity".into()));
    assert_eq!((&p["clamps"][0]["bound"], p["clamps"][0]["golden_max"].as_f64()), (&"Infinity".into(), Some(2e38)));
    let back: CampaignInfo = serde_json::from_str(&text).unwrap();
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(back.golden.losses[0].is_nan());
    assert_eq!(bits(&back.golden.losses[1..]), bits(&info.golden.losses[1..]));
    let (bp, ip) = (back.protection.as_ref().unwrap(), info.protection.as_ref().unwrap());
    assert_eq!((&bp.checks, &bp.clamps), (&ip.checks, &ip.clamps));
    assert_eq!(serde_json::to_string_pretty(&back).unwrap(), text);
}
