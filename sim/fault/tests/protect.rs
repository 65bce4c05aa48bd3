//! Protection plans in campaigns: codes act on exactly the faults that reached a read (paired
//! with the unprotected campaign, whose program is the same), SECDED detects double errors
//! that parity misses, recovery restores the golden trajectory bit for bit, and a plan that
//! selects nothing is an error naming the plan file and field.

use faultline_fault::{Campaign, CampaignSpec, Outcome, TrialRecord};
use faultline_hw::budget::HostMemory;
use faultline_train::{ModelState, Trainer};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A plan file in `dir`.
fn plan_file(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(format!("{name}.ron"));
    std::fs::write(&p, format!("(name: \"{name}\", {body})")).unwrap();
    p
}

/// A mlp-digits campaign on tpu-32x32 (training step 6, 4-step window) with `fault` on
/// `sites`, protected by `plan` if given.
fn campaign(dir: &Path, name: &str, sites: &str, fault: &str, optimizer: &str, plan: Option<&Path>) -> Campaign {
    let r = root();
    let protection = plan.map_or(String::new(), |p| format!("protection: Some(\"{}\"),", p.display()));
    let text = format!(
        "CampaignSpec(name: \"{name}\", model: \"{}\", hw: \"{}\", train: (batch: 32, optimizer: {optimizer}), \
         golden_steps: 12, inject_steps: List([6]), sites: [{sites}], fault: {fault}, \
         sampling: Stratified(per_class: 80), follow_up: 4, seed: 3, {protection})",
        r.join("models/mlp-digits.ron").display(),
        r.join("configs/tpu-32x32.ron").display()
    );
    let f = dir.join(format!("{name}.ron"));
    std::fs::write(&f, text).unwrap();
    Campaign::prepare(CampaignSpec::load(&f).unwrap(), &f, &HostMemory::default()).unwrap()
}

fn trials(c: &Campaign) -> Vec<TrialRecord> {
    let mut tr = c.trainer();
    (0..c.info.trials).map(|t| c.trial(&mut tr, t).unwrap()).collect()
}

fn same_bits(a: &ModelState, b: &ModelState) -> bool {
    a.step == b.step
        && a.tensors
            .iter()
            .zip(&b.tensors)
            .all(|((n, x), (m, y))| n == m && x.data.iter().zip(&y.data).all(|(p, q)| p.to_bits() == q.to_bits()))
}

#[test]
fn codes_act_on_exactly_the_faults_that_reached_a_read() {
    let d = tempfile::tempdir().unwrap();
    let sites = "\"ub.word[*]\", \"mxu.pe[*][*].weight\"";
    let plan = plan_file(
        d.path(),
        "codes",
        "mechanisms: [Ecc(code: Secded, on: [\"ub.word[*]\"]), Ecc(code: Parity, on: [\"mxu.pe[*][*].weight\"])]",
    );
    let bare = trials(&campaign(d.path(), "bare", sites, "Flip", "sgd", None));
    let c = campaign(d.path(), "coded", sites, "Flip", "sgd", Some(&plan));
    let p = c.info.protection.as_ref().unwrap();
    // Codes add no instruction: the same step, and check bits as the area.
    assert_eq!(p.cycles, p.base_cycles);
    let ub = p.code_of("ub.word[*]").unwrap();
    assert_eq!((ub.width, ub.check_bits), (32, 7));
    assert_eq!(p.area_bits, p.ecc.iter().map(|e| e.area_bits).sum::<u64>());
    let coded = trials(&c);
    let (mut corrected, mut detected) = (0, 0);
    for (a, b) in bare.iter().zip(&coded) {
        assert_eq!(a.fault, b.fault, "the same faults, paired");
        let expect = match (a.outcome, a.class.as_str()) {
            (Outcome::HwMasked, _) => Outcome::HwMasked,
            (_, "ub.word[*]") => Outcome::Corrected,
            _ => Outcome::DetectedRecovered,
        };
        assert_eq!(b.outcome, expect, "trial {}: {} unprotected was {}", a.trial, a.fault, a.outcome);
        corrected += (b.outcome == Outcome::Corrected) as u32;
        detected += (b.outcome == Outcome::DetectedRecovered) as u32;
        assert_eq!(b.detected_by.is_some(), b.outcome != Outcome::HwMasked);
    }
    assert!(
        corrected > 0 && detected > 0,
        "corrected {corrected}, detected {detected}: the sample never reached a read"
    );
    // The check bits are sites too, one stratum per code after the data classes: a flip there
    // is corrected (SECDED) or detected (parity) when its word is read, and never a failure.
    let strata: Vec<(String, u64)> = c.info.classes.iter().map(|k| (k.class.clone(), k.bits)).collect();
    let expect: Vec<(String, u64)> = (c.info.classes[..2].iter())
        .map(|k| {
            (format!("{}.check", k.class), k.bits / k.width as u64 * p.code_of(&k.class).unwrap().check_bits as u64)
        })
        .collect();
    assert_eq!(strata[2..], expect);
    assert_eq!(c.info.classes.iter().find(|k| k.class == "mxu.pe[*][*].weight.check").unwrap().width, 1);
    let checks = &coded[bare.len()..];
    assert_eq!(checks.len(), 160);
    let (mut read_ub, mut read_pe) = (0, 0);
    for r in checks {
        let (class, bit) = (r.class.as_str(), r.bit);
        let expect = match class {
            "ub.word[*].check" => (32..39).contains(&bit).then_some(Outcome::Corrected),
            "mxu.pe[*][*].weight.check" => (bit == 16).then_some(Outcome::DetectedRecovered),
            _ => None,
        };
        let expect = expect.unwrap_or_else(|| panic!("trial {}: {class} bit {bit}", r.trial));
        assert!([Outcome::HwMasked, expect].contains(&r.outcome), "trial {}: {} is {}", r.trial, r.fault, r.outcome);
        read_ub += (r.outcome == Outcome::Corrected) as u32;
        read_pe += (r.outcome == Outcome::DetectedRecovered) as u32;
    }
    assert!(read_ub > 0 && read_pe > 0, "no check bit was read while wrong: {read_ub}, {read_pe}");
}

#[test]
fn secded_detects_double_errors_that_parity_misses() {
    let d = tempfile::tempdir().unwrap();
    let sites = "\"ub.word[*]\"";
    let two = "MultiBit(bits: 2, along: Bits)";
    let secded = plan_file(d.path(), "secded", "mechanisms: [Ecc(code: Secded, on: [\"ub.word[*]\"])]");
    let parity = plan_file(d.path(), "parity", "mechanisms: [Ecc(code: Parity, on: [\"ub.word[*]\"])], recovery: None");
    let bare = trials(&campaign(d.path(), "bare2", sites, two, "sgd", None));
    let by_secded = trials(&campaign(d.path(), "secded2", sites, two, "sgd", Some(&secded)));
    let by_parity = trials(&campaign(d.path(), "parity2", sites, two, "sgd", Some(&parity)));
    let mut reached = 0;
    for ((a, s), p) in bare.iter().zip(&by_secded).zip(&by_parity) {
        if a.outcome == Outcome::HwMasked {
            assert_eq!((s.outcome, p.outcome), (Outcome::HwMasked, Outcome::HwMasked));
            continue;
        }
        reached += 1;
        assert_eq!(s.outcome, Outcome::DetectedRecovered, "{}", a.fault);
        // Parity sees an even-weight error as clean: the fault goes on as if unprotected.
        assert_eq!(p.outcome, a.outcome, "{}", a.fault);
        assert_eq!(p.detected_by, None);
    }
    assert!(reached > 0);
    // Two bits of a SECDED codeword that reach its check bits are detected like any other two.
    for s in &by_secded[bare.len()..] {
        assert!([Outcome::HwMasked, Outcome::DetectedRecovered].contains(&s.outcome), "{}", s.fault);
    }
    // Three bits: parity detects them, and without recovery the run stops there.
    let three = "MultiBit(bits: 3, along: Bits)";
    let bare3 = trials(&campaign(d.path(), "bare3", sites, three, "sgd", None));
    let parity3 = trials(&campaign(d.path(), "parity3", sites, three, "sgd", Some(&parity)));
    for (a, p) in bare3.iter().zip(&parity3) {
        let expect = if a.outcome == Outcome::HwMasked { Outcome::HwMasked } else { Outcome::Detected };
        assert_eq!(p.outcome, expect, "{}", a.fault);
    }
}

#[test]
fn recovery_restores_the_golden_trajectory_bit_for_bit() {
    let d = tempfile::tempdir().unwrap();
    let plan = plan_file(
        d.path(),
        "he",
        "mechanisms: [Abft(nodes: [\"*\"], phases: [Forward, Backward], tile: Global), NonFiniteLoss, \
         MomentBound(20.0)], recovery: Reexecute(2)",
    );
    let c = campaign(d.path(), "recover", "\"mxu.pe[*][*].psum\", \"vpu.lane[*].out\"", "Flip", "adam", Some(&plan));
    let p = c.info.protection.as_ref().unwrap();
    assert!(p.checks.iter().any(|c| c.mechanism == "moment-bound"));
    assert!(p.checks.iter().all(|c| c.false_positives == 0), "a check fired on the golden run: {:?}", p.checks);
    let mut golden: Trainer = c.trainer();
    for _ in 0..10 {
        golden.step().unwrap();
    }
    let mut tr = c.trainer();
    let mut recovered = 0;
    for t in 0..c.info.trials {
        // The sampled fault with its bit moved to the exponent's top (bit 30): a flip there
        // into a live value is what the checks exist for.
        let (mut a, mut upset) = c.upset(t);
        a.bit = 30;
        upset.iter_mut().for_each(|f| f.site.bit = 30);
        let rec = c.judge(&mut tr, t, &a, &upset, true).unwrap();
        if rec.outcome != Outcome::DetectedRecovered {
            continue;
        }
        recovered += 1;
        // The trainer holds the re-executed step 6; four more steps are golden's steps 7-10.
        for _ in 0..4 {
            tr.step().unwrap();
        }
        assert!(same_bits(&tr.state, &golden.state), "trial {t} ({}): not golden after recovery", rec.fault);
    }
    assert!(recovered > 0, "no trial was detected");
}

#[test]
fn a_plan_that_guards_nothing_names_its_file_and_field() {
    let d = tempfile::tempdir().unwrap();
    let spec = |plan: &Path, optimizer: &str| {
        let r = root();
        let text = format!(
            "CampaignSpec(name: \"e\", model: \"{}\", hw: \"{}\", train: (optimizer: {optimizer}), golden_steps: 4, \
             inject_steps: List([2]), sites: [\"mxu.*\"], fault: Flip, sampling: Uniform(n: 1), follow_up: 2, seed: 1, \
             protection: Some(\"{}\"))",
            r.join("models/mlp-digits.ron").display(),
            r.join("configs/tpu-32x32.ron").display(),
            plan.display()
        );
        let f = d.path().join("e.ron");
        std::fs::write(&f, text).unwrap();
        match Campaign::prepare(CampaignSpec::load(&f).unwrap(), &f, &HostMemory::default()) {
            Ok(_) => panic!("plan {} accepted", plan.display()),
            Err(e) => e.to_string(),
        }
    };
    let p = plan_file(d.path(), "nothing", "mechanisms: [Abft(nodes: [\"conv*\"], tile: Global)]");
    let e = spec(&p, "sgd");
    assert!(e.starts_with(&format!("{}: field `mechanisms[0].nodes`", p.display())), "{e}");
    assert!(e.contains("fc1.matmul"), "the error lists what could be guarded: {e}");
    let p = plan_file(d.path(), "nocode", "mechanisms: [Ecc(code: Secded, on: [\"l2.*\"])]");
    assert!(spec(&p, "sgd").contains("field `mechanisms[0].on`"));
    let p = plan_file(d.path(), "moment", "mechanisms: [MomentBound(20.0)]");
    assert!(spec(&p, "sgd").contains("train.optimizer: adam"));
    let p = plan_file(d.path(), "zero", "mechanisms: [NonFiniteLoss], recovery: Reexecute(0)");
    assert!(spec(&p, "sgd").contains("field `recovery` = Reexecute(0)"));
    let p = plan_file(d.path(), "typo", "mechanisms: [NonFiniteLos]");
    assert!(spec(&p, "sgd").starts_with(&format!("{}:1:", p.display())));
}

/// Writes `c.ron` in `dir`: campaign `small` of mlp-digits on tpu-32x32 (12 golden steps, step 6
/// injected, a 4-step follow-up, seed 2) over `sites` with `fault` and `sampling`.
fn small_campaign(dir: &Path, sites: &str, fault: &str, sampling: &str) {
    let r = root();
    std::fs::write(
        dir.join("c.ron"),
        format!(
            "CampaignSpec(name: \"small\", model: \"{}\", hw: \"{}\", golden_steps: 12, inject_steps: List([6]), \
             sites: {sites}, fault: {fault}, sampling: {sampling}, follow_up: 4, seed: 2)",
            r.join("models/mlp-digits.ron").display(),
            r.join("configs/tpu-32x32.ron").display()
        ),
    )
    .unwrap();
}

/// Runs the exploration `ExploreSpec(name: "x", FIELDS)` written in `dir`, into `dir/out`.
fn explore(dir: &Path, fields: &str) -> faultline_fault::explore::ExploreResult {
    use faultline_fault::explore::{run, ExploreSpec};
    let file = dir.join("x.ron");
    std::fs::write(&file, format!("ExploreSpec(name: \"x\", {fields})")).unwrap();
    let spec = ExploreSpec::load(&file).unwrap();
    run(&spec, &file, &dir.join("out"), 2, &HostMemory::default(), |_| {}).unwrap()
}

#[test]
fn explore_pairs_register_faults_across_programs_and_costs_each_layer() {
    let d = tempfile::tempdir().unwrap();
    small_campaign(d.path(), r#"["mxu.pe[*][*].psum", "ub.word[*]"]"#, "Flip", "Stratified(per_class: 40)");
    plan_file(d.path(), "codes", "mechanisms: [Ecc(code: Secded, on: [\"ub.word[*]\"])]");
    plan_file(d.path(), "abft", "mechanisms: [Abft(nodes: [\"*\"], tile: Global)]");
    let res = explore(d.path(), "campaigns: [\"c.ron\"], plans: [\"codes.ron\", \"abft.ron\"]");
    let out = d.path().join("out");
    let c = &res.campaigns[0];
    let names: Vec<&str> = c.plans.iter().map(|p| p.plan.as_str()).collect();
    assert_eq!(names, ["none", "codes", "abft"]);
    assert_eq!(c.plans[0].cycle_overhead, 0.0);
    // Codes change no instruction: every trial is the baseline's fault.
    assert_eq!((c.plans[1].cycles, c.plans[1].paired_trials), (c.base_cycles, c.trials));
    assert!(c.plans[2].cycle_overhead > 0.0);
    assert!(c.plans[2].false_positives.n > 0 && c.plans[2].false_positives.k == 0);
    // Under ABFT the psum faults are the baseline's, moved to the same instruction.
    let lines = |plan: &str| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(out.join("small").join(plan).join("records.jsonl")).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let (base, abft) = (lines("none"), lines("abft"));
    let mut same = 0;
    for (b, a) in base.iter().zip(&abft) {
        if b["class"] != "mxu.pe[*][*].psum" {
            continue;
        }
        let site = |v: &serde_json::Value| v["fault"].as_str().unwrap().split('@').next().unwrap().to_string();
        assert_eq!(site(b), site(a), "trial {}", b["trial"]);
        if b["injection"]["unit_busy"] == true {
            assert_eq!(b["injection"]["node"], a["injection"]["node"], "trial {}", b["trial"]);
            assert_eq!(b["injection"]["tile"], a["injection"]["tile"], "trial {}", b["trial"]);
            same += 1;
        }
    }
    assert!(same > 0, "no psum fault struck a busy array");
    assert!(c.plans[2].paired_trials >= 40 && c.plans[2].paired_trials < c.trials);
    // fc1: 32 x 64 x 64, 131072 MACs over 8192 words of operands and result.
    let fc1 = c.layers.iter().find(|l| l.node == "fc1.matmul").unwrap();
    assert_eq!((fc1.gemm, fc1.intensity), ([32, 64, 64], 16.0));
    assert!(fc1.global_overhead > 0.0 && fc1.tile_overhead > 0.0);
    assert!(out.join("explore.json").exists());
}

/// A fault in the unit's idle tail, after its last instruction, stays inside the protected
/// step even when the plan's instructions shorten that tail (the shipped MXU campaign under
/// the shipped Ranger plan had trials moved past the step's end, and the exploration failed).
#[test]
fn faults_after_a_units_last_instruction_stay_inside_the_protected_step() {
    let d = tempfile::tempdir().unwrap();
    let r = root();
    let res = explore(
        d.path(),
        &format!(
            "campaigns: [\"{}\"], plans: [\"{}\"]",
            r.join("configs/campaign-mlp-mxu.ron").display(),
            r.join("configs/protect-ranger.ron").display()
        ),
    );
    let ranger = &res.campaigns[0].plans[1];
    assert!(ranger.cycles > res.campaigns[0].base_cycles);
    // Most trials pair exactly; the few clamped to the step's last cycle do not.
    assert!(ranger.paired_trials > res.campaigns[0].trials / 2 && ranger.paired_trials < res.campaigns[0].trials);
}

/// The shipped Ranger plan: the clamps' bounds are learned on the golden run (each the
/// smallest fp32 at or above its node's largest golden `|x|`), and with them the golden
/// trajectory is the unprotected one, bit for bit.
#[test]
fn restrict_learns_its_bounds_and_leaves_the_golden_run_bit_identical() {
    let d = tempfile::tempdir().unwrap();
    let ranger = root().join("configs/protect-ranger.ron");
    let sites = "\"mxu.pe[*][*].psum\"";
    let bare = campaign(d.path(), "bare-r", sites, "Flip", "sgd", None);
    let c = campaign(d.path(), "ranger", sites, "Flip", "sgd", Some(&ranger));
    let p = c.info.protection.as_ref().unwrap();
    let nodes: Vec<&str> = p.clamps.iter().map(|k| k.node.as_str()).collect();
    assert_eq!(nodes, ["fc1.matmul", "relu1.relu", "fc2.matmul"]);
    assert!(p.checks.is_empty() && p.cycles > p.base_cycles, "clamps cost VPU cycles and detect nothing");
    for k in &p.clamps {
        let b = k.bound as f32;
        assert!(k.golden_max > 0.0 && k.bound >= k.golden_max && b < f32::MAX, "{k:?}");
        assert!(f64::from(b.next_down()) < k.margin * k.golden_max, "{k:?}: not the smallest fp32 bound");
        let g = &c.trainer().exec.tg.graph;
        assert_eq!(g.node(g.find(&k.name).unwrap()).op, faultline_graph::Op::Clamp { bound: b });
    }
    let (g, h) = (&bare.info.golden, &c.info.golden);
    let bits = |l: &[f64]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&g.losses), bits(&h.losses), "a clamp changed a golden loss");
    assert_eq!(g.final_checksum, h.final_checksum, "a clamp changed the golden state");
    // The executor trials run with the learned bounds: a fault-free golden step is golden.
    let (mut a, mut b) = (bare.trainer(), c.trainer());
    for _ in 0..12 {
        assert_eq!(a.step().unwrap().loss.to_bits(), b.step().unwrap().loss.to_bits());
    }
    assert!(same_bits(&a.state, &b.state));
}

/// The psum flip of the bottom-left PE at bit 30 (exponent top), `offset` cycles into fc1's
/// forward GEMM of step 6, judged on campaign `c`; and the GEMM's length in cycles.
fn psum_flip_in_fc1(c: &Campaign, offset: u64) -> (Outcome, u64) {
    use faultline_hw::{FaultSite, Register};
    use faultline_train::StepFault;
    let tr = c.trainer();
    let (p, g) = (tr.exec.program(), &tr.exec.tg.graph);
    let i = (0..p.instrs.len())
        .find(|&i| {
            p.instrs[i].unit() == faultline_hw::isa::ExecUnit::Mxu && g.node(p.tags[i].node).name == "fc1.matmul"
        })
        .unwrap();
    let cycle = tr.schedule.instrs[i].start + offset;
    let site = FaultSite::pe(tr.exec.hw.mxu.rows - 1, 0, Register::Psum, 30);
    let f = StepFault { kind: faultline_num::BitFault::Flip, site, step: 6, cycle, duration: 1 };
    let (mut a, _) = c.upset(0);
    (a.bit, a.cycle, a.step) = (30, cycle, 6);
    let mut tr = c.trainer();
    (c.judge(&mut tr, 0, &a, &[f], true).unwrap().outcome, tr.schedule.instrs[i].cycles)
}

/// The psum flip of the bottom-left PE at bit 30 (exponent top) during fc1's GEMM in step 6,
/// at the first cycle (from the GEMM's start) where it makes unprotected training fail: under
/// Ranger's clamps the same flip is harmless.
#[test]
fn restrict_turns_an_exponent_flip_that_breaks_training_into_a_harmless_one() {
    let d = tempfile::tempdir().unwrap();
    let ranger = root().join("configs/protect-ranger.ron");
    let sites = "\"mxu.pe[*][*].psum\"";
    let bare = campaign(d.path(), "bare-f", sites, "Flip", "sgd", None);
    let c = campaign(d.path(), "ranger-f", sites, "Flip", "sgd", Some(&ranger));
    let failed = |o: Outcome| !matches!(o, Outcome::HwMasked | Outcome::Masked | Outcome::Benign);
    let len = psum_flip_in_fc1(&bare, 0).1;
    let offset =
        (0..len).find(|&o| failed(psum_flip_in_fc1(&bare, o).0)).expect("no psum flip in fc1's GEMM breaks training");
    let (was, now) = (psum_flip_in_fc1(&bare, offset).0, psum_flip_in_fc1(&c, offset).0);
    assert_eq!((was, now), (Outcome::SharpDegrade, Outcome::Benign));
    // Over every cycle of the GEMM: the clamps leave no such flip failing training.
    let fails = |c: &Campaign| (0..len).filter(|&o| failed(psum_flip_in_fc1(c, o).0)).count();
    let (was, now) = (fails(&bare), fails(&c));
    eprintln!("bit-30 psum flips in fc1's GEMM that fail training: {was} of {len} unprotected, {now} under ranger");
    assert!(was > 0 && now == 0, "{was} -> {now}");
}

#[test]
fn a_restrict_plan_with_a_bad_margin_or_no_node_names_its_field() {
    let d = tempfile::tempdir().unwrap();
    let load = |body: &str| {
        let p = plan_file(d.path(), "r", body);
        faultline_fault::protect::ProtectionPlan::load(&p).map(|_| ()).unwrap_err().to_string()
    };
    let e = load("mechanisms: [Restrict(nodes: [\"*.relu\"], margin: 0.5)]");
    assert!(e.contains("field `mechanisms[0].margin` = 0.5") && e.contains(">= 1"), "{e}");
    assert!(load("mechanisms: [NonFiniteLoss, Restrict(nodes: [\"*\"], margin: NaN)]").contains("mechanisms[1].margin"));
    let e = load("mechanisms: [Restrict(nodes: [], margin: 1.0)]");
    assert!(e.contains("field `mechanisms[0].nodes` = []"), "{e}");
    // A glob that selects nothing: the error lists what could be restricted.
    let p = plan_file(d.path(), "conv", "mechanisms: [Restrict(nodes: [\"conv*\"], margin: 1.0)]");
    let r = root();
    let text = format!(
        "CampaignSpec(name: \"e\", model: \"{}\", hw: \"{}\", golden_steps: 4, inject_steps: List([2]), \
         sites: [\"mxu.*\"], fault: Flip, sampling: Uniform(n: 1), follow_up: 2, seed: 1, protection: Some(\"{}\"))",
        r.join("models/mlp-digits.ron").display(),
        r.join("configs/tpu-32x32.ron").display(),
        p.display()
    );
    let f = d.path().join("e.ron");
    std::fs::write(&f, text).unwrap();
    let e = match Campaign::prepare(CampaignSpec::load(&f).unwrap(), &f, &HostMemory::default()) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.starts_with(&format!("{}: field `mechanisms[0].nodes`", p.display())), "{e}");
    assert!(e.contains("relu1.relu") && e.contains("fc1.matmul"), "{e}");
}

/// The bit-30 psum flip of the bottom-left PE in fc1's forward GEMM of step 6 that breaks
/// unprotected training (the first offset that does): the gradient-norm and update-norm
/// detectors (Altenbernd et al.) flag the step, and re-execution restores the golden step.
#[test]
fn norm_spike_detectors_catch_an_exponent_flip_and_recompute_the_step() {
    let d = tempfile::tempdir().unwrap();
    let sites = "\"mxu.pe[*][*].psum\"";
    let failed = |o: Outcome| !matches!(o, Outcome::HwMasked | Outcome::Masked | Outcome::Benign);
    let bare = campaign(d.path(), "bare-s", sites, "Flip", "sgd", None);
    let len = psum_flip_in_fc1(&bare, 0).1;
    let offset =
        (0..len).find(|&o| failed(psum_flip_in_fc1(&bare, o).0)).expect("no psum flip in fc1's GEMM breaks training");
    for (name, mech) in [("grad", "GradNormSpike"), ("update", "UpdateNormOutlier")] {
        let plan =
            plan_file(d.path(), name, &format!("mechanisms: [{mech}(factor: 4.0, window: 4)], recovery: Reexecute(1)"));
        let c = campaign(d.path(), &format!("{name}-s"), sites, "Flip", "sgd", Some(&plan));
        let p = c.info.protection.as_ref().unwrap();
        assert_eq!(p.checks.len(), 1, "{name}: one detector");
        assert!(p.cycles > p.base_cycles, "{name}: the norm is computed on the machine, and costs cycles");
        assert_eq!(psum_flip_in_fc1(&c, offset).0, Outcome::DetectedRecovered, "{name}");
    }
}

#[test]
fn a_norm_spike_detector_with_a_bad_factor_or_window_names_its_field() {
    let d = tempfile::tempdir().unwrap();
    let load = |body: &str| {
        let p = plan_file(d.path(), "s", body);
        faultline_fault::protect::ProtectionPlan::load(&p).map(|_| ()).unwrap_err().to_string()
    };
    let e = load("mechanisms: [GradNormSpike(factor: 1.0, window: 20)]");
    assert!(e.contains("field `mechanisms[0].factor` = 1") && e.contains("more than 1"), "{e}");
    let e = load("mechanisms: [NonFiniteLoss, UpdateNormOutlier(factor: 4.0, window: 0)]");
    assert!(e.contains("field `mechanisms[1].window` = 0") && e.contains("1 to 1000"), "{e}");
    assert!(load("mechanisms: [GradNormSpike(factor: NaN, window: 3)]").contains("mechanisms[0].factor"));
}

/// An exploration in rounds: each round is the campaign again with the next seed, in
/// `<plan>/round-<r>`; the rounds stop for the reason they give, the pooled trials are every
/// round's, and running it again resumes every round to the same result.
#[test]
fn explore_in_rounds_pools_each_round_and_resumes_to_the_same_result() {
    let d = tempfile::tempdir().unwrap();
    small_campaign(d.path(), r#"["mxu.pe[*][*].psum"]"#, "Flip", "Uniform(n: 40)");
    plan_file(d.path(), "codes", "mechanisms: [Ecc(code: Secded, on: [\"ub.word[*]\"])]");
    plan_file(d.path(), "abft", "mechanisms: [Abft(nodes: [\"*\"], tile: Global)]");
    let fields = "campaigns: [\"c.ron\"], plans: [\"codes.ron\", \"abft.ron\"], rounds: 6";
    let res = explore(d.path(), fields);
    let c = &res.campaigns[0];
    let rounds = c.rounds.as_ref().expect("rounds recorded");
    // Nothing fails in the first round: the plans fail alike, any may yet fail less, and
    // rounds run until no pair could be told apart within the six.
    assert!(rounds.run >= 2, "{rounds:?}");
    assert_eq!((rounds.max, rounds.trials_per_round), (6, 40));
    assert!((rounds.alpha - 0.05 / 6.0).abs() < 1e-12);
    assert_eq!(c.trials, 40 * rounds.run as u64);
    let out = d.path().join("out/small");
    for plan in ["none", "codes", "abft"] {
        for k in 2..=6 {
            assert_eq!(out.join(plan).join(format!("round-{k}")).exists(), k <= rounds.run, "{plan} round {k}");
        }
    }
    let text = std::fs::read_to_string(d.path().join("out/explore.json")).unwrap();
    std::fs::remove_file(d.path().join("out/explore.json")).unwrap();
    assert_eq!(explore(d.path(), fields), res);
    assert_eq!(std::fs::read_to_string(d.path().join("out/explore.json")).unwrap(), text);
}
