//! Campaigns end to end: records independent of threads, shards, resuming and mode; the
//! physics the field expects of fault outcomes; liveness proofs that hold; spec errors that
//! name the field.

use faultline_fault::model::Anchor;
use faultline_fault::{merge, Campaign, CampaignSpec, Outcome, RunOptions, Shard, Summary, TrialMode};
use faultline_hw::budget::HostMemory;
use faultline_hw::isa::{ExecUnit, Instr};
use faultline_hw::{FaultSite, Register, SiteClass, Unit};
use faultline_num::BitFault;
use faultline_train::StepFault;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

/// The repository root (specs name models and configs relative to their own directory).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A spec file in `dir` with `body` after the model and machine lines.
fn spec_file(dir: &Path, name: &str, body: &str) -> PathBuf {
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

fn prepare(file: &Path) -> Campaign {
    Campaign::prepare(CampaignSpec::load(file).unwrap(), file, &HostMemory::default()).unwrap()
}

fn opts(threads: usize, shard: Shard) -> RunOptions {
    RunOptions { threads, shard, resume: false, mode: TrialMode::Hybrid }
}

fn read(dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(dir.join(file)).unwrap()
}

/// Register, memory and DMA classes, several injection steps: 1, 2 and 3 threads, three
/// shards merged, and a run cut mid-line and resumed write the same bytes, in trial order.
#[test]
fn records_do_not_depend_on_threads_or_shards() {
    let d = tempfile::tempdir().unwrap();
    let f = spec_file(
        d.path(),
        "det",
        "golden_steps: 12, inject_steps: Range(first: 4, last: 7), sites: [\"mxu.*\", \"vpu.*\", \"ub.*\", \"acc.*\", \
         \"dma.*\"], fault: Flip, sampling: Stratified(per_class: 12), follow_up: 5, seed: 5",
    );
    let c = prepare(&f);
    let (one, two, three) = (d.path().join("one"), d.path().join("two"), d.path().join("three"));
    let merged = d.path().join("merged");
    let s1 = c.run(&one, opts(1, Shard::ALL), |_| {}).unwrap();
    c.run(&two, opts(2, Shard::ALL), |_| {}).unwrap();
    c.run(&three, opts(3, Shard::ALL), |_| {}).unwrap();
    let shards: Vec<PathBuf> = (0..3).map(|i| d.path().join(format!("shard-{i}"))).collect();
    // Out of order on purpose: merge takes slices in any order.
    for i in [2, 0, 1] {
        c.run(&shards[i], opts(2, Shard { index: i as u64, count: 3 }), |_| {}).unwrap();
    }
    merge(&merged, &shards).unwrap();
    for file in ["campaign.json", "records.jsonl", "summary.json"] {
        assert_eq!(read(&one, file), read(&two, file), "{file}: 1 vs 2 threads");
        assert_eq!(read(&one, file), read(&three, file), "{file}: 1 vs 3 threads");
        assert_eq!(read(&one, file), read(&merged, file), "{file}: one run vs 3 shards merged");
    }
    // Timing lines are in trial order too, one per record.
    let trials = |dir: &Path, file: &str| -> Vec<u64> {
        let text = String::from_utf8(read(dir, file)).unwrap();
        text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["trial"].as_u64().unwrap()).collect()
    };
    assert_eq!(trials(&one, "records.jsonl"), (0..16 * 12).collect::<Vec<_>>());
    assert_eq!(trials(&three, "timing.jsonl"), trials(&three, "records.jsonl"));
    // 6 MXU, 6 VPU, 1 UB, 1 accumulator and 2 DMA classes, 12 trials each.
    assert_eq!(s1.trials, 16 * 12);
    assert!(s1.simulated > 0 && s1.skipped_dead > 0);
    // A merge refuses a missing or repeated slice.
    let e = merge(&d.path().join("m2"), &shards[..2]).unwrap_err().to_string();
    assert!(e.contains("shards missing: 2/3"), "{e}");
    let e = merge(&d.path().join("m3"), &[shards[0].clone(), shards[0].clone(), shards[1].clone()]).unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
    // A shard cut short (as a kill leaves it) is refused until it is resumed.
    let records = shards[1].join("records.jsonl");
    let text = std::fs::read_to_string(&records).unwrap();
    let cut: String = text.lines().take(5).map(|l| format!("{l}\n")).collect();
    std::fs::write(&records, cut).unwrap();
    let e = merge(&d.path().join("m4"), &shards).unwrap_err().to_string();
    assert!(e.contains("shard 1/3 is incomplete or out of order (5 of its 64 trials recorded)"), "{e}");
    c.run(&shards[1], RunOptions { resume: true, ..opts(1, Shard { index: 1, count: 3 }) }, |_| {}).unwrap();
    merge(&d.path().join("m5"), &shards).unwrap();
    assert_eq!(read(&one, "records.jsonl"), read(&d.path().join("m5"), "records.jsonl"));
    // A run cut in the middle of a line, as a crash leaves it, resumed on 3 threads.
    let full = read(&three, "records.jsonl");
    std::fs::write(three.join("records.jsonl"), &full[..full.len() / 3]).unwrap();
    c.run(&three, RunOptions { resume: true, ..opts(3, Shard::ALL) }, |_| {}).unwrap();
    assert_eq!(read(&three, "records.jsonl"), full, "resumed on 3 threads");
    assert_eq!(trials(&three, "timing.jsonl"), trials(&three, "records.jsonl"));
}

/// The cycle-level reference (every instruction at register level, dead faults run too)
/// records exactly what hybrid trials record.
#[test]
fn hybrid_trials_record_what_cycle_level_trials_record() {
    let d = tempfile::tempdir().unwrap();
    let f = spec_file(
        d.path(),
        "twin",
        "golden_steps: 8, inject_steps: List([3]), sites: [\"mxu.pe[*][*].psum\", \"mxu.pe[*][*].weight\", \
         \"vpu.lane[*].out\", \"acc.*\"], fault: Flip, sampling: Uniform(n: 40), follow_up: 3, seed: 9, \
         verify_dead_every: 0",
    );
    let c = prepare(&f);
    let (h, cy) = (d.path().join("h"), d.path().join("c"));
    c.run(&h, opts(2, Shard::ALL), |_| {}).unwrap();
    c.run(&cy, RunOptions { mode: TrialMode::CycleLevel, ..opts(2, Shard::ALL) }, |_| {}).unwrap();
    assert_eq!(read(&h, "records.jsonl"), read(&cy, "records.jsonl"));
}

/// Hybrid trials start from their injection step kept whole as far as the memory limit allows
/// (a quarter of it): a limit that keeps some of the steps, or none, records the same bytes; the
/// host bytes a run needs count the steps kept; each timing line splits the trial's time.
#[test]
fn injection_steps_kept_whole_within_the_memory_limit() {
    let d = tempfile::tempdir().unwrap();
    let f = spec_file(
        d.path(),
        "kept",
        "golden_steps: 10, inject_steps: Range(first: 3, last: 6), sites: [\"mxu.pe[*][*].psum\", \"vpu.lane[*].out\", \
         \"ub.*\", \"dma.*\"], fault: Flip, sampling: Stratified(per_class: 10), follow_up: 3, seed: 2",
    );
    let all = prepare(&f);
    let per = all.trainer().exec.golden_step_bytes();
    let all_dir = d.path().join("all");
    all.run(&all_dir, opts(2, Shard::ALL), |_| {}).unwrap();
    // Limits keeping 0..=3 of the 4 steps, where the golden run itself fits.
    let mut fewer = 0;
    for kept in 0..4u64 {
        let mem = HostMemory::new(4 * (kept * per + per / 2), "--max-memory");
        let Ok(c) = Campaign::prepare(CampaignSpec::load(&f).unwrap(), &f, &mem) else { continue };
        assert_eq!(all.host_bytes(1).unwrap() - c.host_bytes(1).unwrap(), (4 - kept) * per);
        let dir = d.path().join(format!("kept-{kept}"));
        c.run(&dir, opts(2, Shard::ALL), |_| {}).unwrap();
        assert_eq!(read(&all_dir, "records.jsonl"), read(&dir, "records.jsonl"), "{kept} steps kept");
        fewer += 1;
    }
    assert!(fewer > 0, "some limit keeps fewer steps");
    let timing = String::from_utf8(read(&d.path().join("all"), "timing.jsonl")).unwrap();
    let mut followed = 0;
    for line in timing.lines() {
        let t: serde_json::Value = serde_json::from_str(line).unwrap();
        let us = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("{k} in {line}"));
        assert!(us("follow_us") + us("eval_us") <= us("wall_us"), "{line}");
        followed += usize::from(us("eval_us") > 0);
    }
    assert!(followed > 0, "some trial was followed and evaluated");
}

/// Stuck-ats lasting a whole step, or permanent from the injection step on (every follow-up
/// step struck again): hybrid and cycle-level trials record the same, no cycle is sampled,
/// and a stuck DMA address bit, which misdirects every transfer, breaks training every time.
#[test]
fn whole_step_and_permanent_stuck_ats() {
    let d = tempfile::tempdir().unwrap();
    for (name, lasts) in [("step", "Step"), ("perm", "Permanent")] {
        let f = spec_file(
            d.path(),
            name,
            &format!(
                "golden_steps: 9, inject_steps: List([4]), sites: [\"mxu.pe[*][*].psum\", \"vpu.lane[*].out\",                  \"dma.*\"], fault: StuckAt(value: 1, lasts: {lasts}), sampling: Stratified(per_class: 4),                  follow_up: 4, seed: 13"
            ),
        );
        let c = prepare(&f);
        let (h, cy) = (d.path().join(format!("{name}-h")), d.path().join(format!("{name}-c")));
        let s = c.run(&h, opts(2, Shard::ALL), |_| {}).unwrap();
        c.run(&cy, RunOptions { mode: TrialMode::CycleLevel, ..opts(2, Shard::ALL) }, |_| {}).unwrap();
        assert_eq!(read(&h, "records.jsonl"), read(&cy, "records.jsonl"), "{lasts}");
        let text = String::from_utf8(read(&h, "records.jsonl")).unwrap();
        assert!(text.lines().all(|l| l.contains("\"cycle\":0,")), "{lasts}: whole steps sample no cycle");
        let dma = s.classes.iter().find(|x| x.class == "dma.src_addr").unwrap();
        if lasts == "Permanent" {
            assert_eq!(dma.failure.k, dma.trials, "{lasts}: {:?}", dma.outcomes);
        }
        assert!(s.simulated > 0);
    }
}

/// Inference campaigns: faults in the forward pass over test batches of the trained model;
/// hybrid and cycle-level trials record the same; changed predictions are counted exactly
/// when the outcome says so; a batch past the test split is refused.
#[test]
fn inference_campaigns() {
    let d = tempfile::tempdir().unwrap();
    let body =
        "mode: Inference, golden_steps: 30, inject_steps: Range(first: 1, last: 12), sites: [\"mxu.pe[*][*].psum\", \
                \"mxu.pe[*][*].weight\", \"vpu.*\", \"dma.*\"], fault: MultiBit(bits: 2, along: Bits), \
                sampling: Stratified(per_class: 8), seed: 4";
    let c = prepare(&spec_file(d.path(), "inf", body));
    assert_eq!(c.info.trials, 10 * 8);
    let (h, cy) = (d.path().join("h"), d.path().join("c"));
    let s = c.run(&h, opts(2, Shard::ALL), |_| {}).unwrap();
    c.run(&cy, RunOptions { mode: TrialMode::CycleLevel, ..opts(2, Shard::ALL) }, |_| {}).unwrap();
    assert_eq!(read(&h, "records.jsonl"), read(&cy, "records.jsonl"));
    assert!(s.simulated > 0);
    let text = String::from_utf8(read(&h, "records.jsonl")).unwrap();
    let mut sdc = 0;
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let changed = r["changed_predictions"].as_u64();
        match r["outcome"].as_str().unwrap() {
            "SdcCritical" => assert!(changed.unwrap() >= 1, "{line}"),
            "SdcBenign" => assert_eq!(changed, Some(0), "{line}"),
            o => assert!(changed.is_none() && !o.contains("Degrade") && !o.contains("InfNan"), "{line}"),
        }
        sdc += line.contains("\"outcome\":\"Sdc") as u32;
    }
    assert!(sdc > 0, "some flips change outputs");
    // mlp-digits' 359 test samples are 12 batches of 32.
    let f = spec_file(d.path(), "inf13", &body.replace("last: 12", "last: 13"));
    let e = Campaign::prepare(CampaignSpec::load(&f).unwrap(), &f, &HostMemory::default()).err().unwrap().to_string();
    assert!(e.contains("field `inject_steps` = 13: test batches 1..=12"), "{e}");
    let f = spec_file(d.path(), "inf-follow", &format!("{body}, follow_up: 3"));
    let e = CampaignSpec::load(&f).unwrap_err().to_string();
    assert!(e.contains("field `follow_up` = 3: 0 or absent for an Inference campaign"), "{e}");
}

/// The forward GEMMs of a step: (first cycle, cycles, output rows).
fn forward_gemms(c: &Campaign) -> Vec<(u64, u64, usize)> {
    let t = c.trainer();
    let p = t.exec.program();
    (0..p.instrs.len())
        .filter(|&i| p.tags[i].phase == faultline_graph::Phase::Forward)
        .filter_map(|i| match p.instrs[i] {
            Instr::Gemm { m, .. } => Some((t.schedule.instrs[i].start, t.schedule.instrs[i].cycles, m)),
            _ => None,
        })
        .collect()
}

fn class(c: &Campaign, unit: Unit, register: Register) -> SiteClass {
    c.space.classes.iter().map(|x| x.class).find(|x| x.unit == unit && x.register == register).unwrap()
}

fn flip(site: FaultSite, step: u64, cycle: u64) -> StepFault {
    StepFault { kind: BitFault::Flip, site, step, cycle, duration: 1 }
}

/// FIdelity's and He et al.'s physics: an exponent-MSB flip of an fp32 partial sum in a
/// forward matmul changes training far more often than a mantissa-LSB flip at the same PE and
/// cycle; a psum flip corrupts one output element, a WS weight-register flip up to one column
/// of the fold (at most its M rows) and at least once more than one.
#[test]
fn exponent_flips_matter_and_corruption_has_the_dataflow_shape() {
    let d = tempfile::tempdir().unwrap();
    let f = spec_file(
        d.path(),
        "phys",
        "golden_steps: 14, inject_steps: List([4]), sites: [\"mxu.*\"], fault: Flip, sampling: Uniform(n: 1), \
         follow_up: 10, seed: 1",
    );
    let c = prepare(&f);
    let mut tr = c.trainer();
    let hw = tr.exec.hw.clone();
    let (rows, cols) = (hw.mxu.rows, hw.mxu.cols);
    let gemms = forward_gemms(&c);
    assert!(!gemms.is_empty());
    let psum = class(&c, Unit::Mxu, Register::Psum);
    let weight = class(&c, Unit::Mxu, Register::Weight);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let (mut msb, mut lsb, mut tried) = (0, 0, 0);
    let (mut weight_max, mut weight_hits) = (0, 0);
    for t in 0..160u64 {
        let (start, len, m) = gemms[rng.gen_range(0..gemms.len())];
        let cycle = start + rng.gen_range(0..len);
        let (i, j) = (rng.gen_range(0..rows), rng.gen_range(0..cols));
        let run = |tr: &mut _, cls: SiteClass, reg, bit| {
            let site = FaultSite::pe(i, j, reg, bit);
            let a = Anchor { class: cls, elem: (i * cols + j) as u64, bit, step: 4, cycle, check_bits: 0 };
            c.judge(tr, t, &a, &[flip(site, 4, cycle)], true).unwrap()
        };
        let hi = run(&mut tr, psum, Register::Psum, 30);
        let lo = run(&mut tr, psum, Register::Psum, 0);
        tried += 1;
        msb += hi.outcome.unmasked() as u32;
        lsb += lo.outcome.unmasked() as u32;
        for r in [&hi, &lo] {
            let corrupted = r.injection.as_ref().unwrap().corrupted;
            assert!(corrupted <= 1, "a psum flip corrupts one element: {} corrupted {corrupted}", r.fault);
        }
        let w = run(&mut tr, weight, Register::Weight, 14);
        let corrupted = w.injection.as_ref().unwrap().corrupted;
        assert!(corrupted <= m as u64, "{}: {corrupted} outputs corrupted, more than a column's {m} rows", w.fault);
        weight_max = weight_max.max(corrupted);
        weight_hits += (corrupted > 0) as u32;
    }
    assert!(msb >= 10 && msb >= 4 * lsb.max(1), "exponent-MSB {msb} vs mantissa-LSB {lsb} unmasked of {tried}");
    assert!(weight_hits > 0 && weight_max > 1, "weight flips: {weight_hits} corrupting, at most {weight_max}");
}

/// Dead (bit, cycle) pairs are masked in hardware when run, for every class (memories and
/// control registers included); a stuck-at on a PE column a ragged fold leaves unused is
/// masked for the GEMM's whole span.
#[test]
fn provably_dead_faults_are_hardware_masked() {
    let d = tempfile::tempdir().unwrap();
    let f = spec_file(
        d.path(),
        "dead",
        "golden_steps: 8, inject_steps: List([3]), sites: [\"*\"], fault: Flip, sampling: Stratified(per_class: 30), \
         follow_up: 3, seed: 21",
    );
    let c = prepare(&f);
    let mut tr = c.trainer();
    let hw = tr.exec.hw.clone();
    let mut checked = std::collections::BTreeSet::new();
    for t in 0..c.info.trials {
        let (a, upset) = c.upset(t);
        if c.space.dead(&hw, &upset) {
            let r = c.judge(&mut tr, t, &a, &upset, true).unwrap();
            assert_eq!(r.outcome, Outcome::HwMasked, "{}", r.fault);
            checked.insert(a.class.pattern());
        }
    }
    assert!(checked.len() >= 15, "dead faults checked in {} classes: {checked:?}", checked.len());

    // mlp-digits' output layer has 10 columns on a 32-wide array: column 31 idles all along.
    let p = tr.exec.program();
    let g = (0..p.instrs.len())
        .find(|&i| {
            matches!(p.instrs[i], Instr::Gemm { n, .. } if n < hw.mxu.cols) && p.instrs[i].unit() == ExecUnit::Mxu
        })
        .expect("a ragged GEMM");
    let (start, cycles) = (tr.schedule.instrs[g].start, tr.schedule.instrs[g].cycles);
    let site = FaultSite::pe(0, hw.mxu.cols - 1, Register::Psum, 30);
    let stuck = StepFault { kind: BitFault::StuckAt1, site, step: 3, cycle: start, duration: cycles };
    let a =
        Anchor { class: site.class(), elem: (hw.mxu.cols - 1) as u64, bit: 30, step: 3, cycle: start, check_bits: 0 };
    let r = c.judge(&mut tr, 0, &a, &[stuck], true).unwrap();
    assert_eq!(r.outcome, Outcome::HwMasked, "{}", r.fault);
    assert!(r.injection.unwrap().unit_busy, "the GEMM was running");
}

/// Two flips of the same bit at the same cycle cancel (bits of one upset compose, in
/// registers and in memory words), while one of them alone is not masked.
#[test]
fn upset_bits_compose() {
    let d = tempfile::tempdir().unwrap();
    let f = spec_file(
        d.path(),
        "compose",
        "golden_steps: 8, inject_steps: List([3]), sites: [\"mxu.pe[*][*].psum\", \"ub.*\", \"acc.*\"], \
         fault: Flip, sampling: Stratified(per_class: 1000), follow_up: 3, seed: 2",
    );
    let c = prepare(&f);
    let mut tr = c.trainer();
    let mut units = std::collections::BTreeSet::new();
    for t in 0..c.info.trials {
        let (a, upset) = c.upset(t);
        if units.contains(&a.class.unit) || c.space.dead(&tr.exec.hw, &upset) {
            continue;
        }
        let one = c.judge(&mut tr, t, &a, &upset, true).unwrap();
        if one.outcome == Outcome::HwMasked {
            continue;
        }
        let twice = [upset[0], upset[0]];
        let r = c.judge(&mut tr, t, &a, &twice, true).unwrap();
        assert_eq!(r.outcome, Outcome::HwMasked, "{} twice", one.fault);
        units.insert(a.class.unit);
    }
    assert!(units.len() >= 2, "checked in {units:?}");
}

/// A bad spec is an error naming the file, the line or field, and what is allowed.
#[test]
fn bad_specs_name_the_file_and_field() {
    let d = tempfile::tempdir().unwrap();
    let err = |body: &str| {
        let f = spec_file(d.path(), "bad", body);
        match CampaignSpec::load(&f) {
            Ok(s) => Campaign::prepare(s, &f, &HostMemory::default()).err().expect("refused").to_string(),
            Err(e) => e.to_string(),
        }
    };
    let base = "golden_steps: 10, inject_steps: List([3]), fault: Flip, sampling: Uniform(n: 5), follow_up: 3, seed: 1";
    let e = err(&format!("{base}, sites: [\"mxu.*\"], colour: 3"));
    assert!(e.contains("bad.ron:1:") && e.contains("colour"), "{e}");
    let e = err(&format!("{base}, sites: [\"mux.*\"]"));
    assert!(e.contains("field `sites` = \"mux.*\"") && e.contains("mxu.pe[*][*].psum"), "{e}");
    let e =
        err("golden_steps: 10, inject_steps: List([8]), sites: [\"mxu.*\"], fault: Flip, sampling: Uniform(n: 5), \
                 follow_up: 3, seed: 1");
    assert!(e.contains("field `inject_steps` = 8") && e.contains("at most 7"), "{e}");
    let e =
        err(&format!("{base}, sites: [\"*\"], fault: MultiBit(bits: 2, along: Elements)").replace("fault: Flip, ", ""));
    assert!(e.contains("field `fault` = MultiBit(bits: 2, ..)") && e.contains("seq."), "{e}");
    let e = err(&format!("{base}, sites: [\"*\"]").replace("Uniform(n: 5)", "Exhaustive"));
    assert!(e.contains("field `sampling`") && e.contains("use Uniform or Stratified"), "{e}");
}

/// Runs a memory campaign of mlp-digits (batch 8, injection at step 3 of 8, 3 follow-up
/// steps) on tpu-8x8 as `edit` changes its text, in hybrid and in cycle-level mode; checks that
/// both record the same and returns the summary and the records.
fn memory_campaign_both_modes(
    edit: impl Fn(&str) -> String,
    train: &str,
    sites: &str,
    per_class: usize,
) -> (Summary, String) {
    let d = tempfile::tempdir().unwrap();
    let hw = std::fs::read_to_string(root().join("configs/tpu-8x8.ron")).unwrap();
    let hw_file = d.path().join("tpu-8x8-edited.ron");
    std::fs::write(&hw_file, edit(&hw)).unwrap();
    let text = format!(
        "CampaignSpec(name: \"memory\", model: \"{}\", hw: \"{}\", train: ({train}), golden_steps: 8, \
         inject_steps: List([3]), sites: [{sites}], fault: Flip, sampling: Stratified(per_class: {per_class}), \
         follow_up: 3, seed: 21, verify_dead_every: 0)",
        root().join("models/mlp-digits.ron").display(),
        hw_file.display()
    );
    let f = d.path().join("memory.ron");
    std::fs::write(&f, text).unwrap();
    let c = prepare(&f);
    let (h, cy) = (d.path().join("h"), d.path().join("c"));
    let s = c.run(&h, opts(2, Shard::ALL), |_| {}).unwrap();
    c.run(&cy, RunOptions { mode: TrialMode::CycleLevel, ..opts(2, Shard::ALL) }, |_| {}).unwrap();
    assert_eq!(read(&h, "records.jsonl"), read(&cy, "records.jsonl"));
    (s, String::from_utf8(read(&h, "records.jsonl")).unwrap())
}

/// Trials of class `class` in `records` whose fault corrupted some read.
fn corrupting(records: &str, class: &str) -> usize {
    records
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["class"] == class && r["injection"]["corrupted"].as_u64().unwrap_or(0) > 0)
        .count()
}

/// A machine whose compiler forwards stored values and reuses the least recently used words
/// (`placement`): memory, DMA and sequencer trials record the same in hybrid and cycle-level
/// mode, and the SRAM classes corrupt reads, forwarded Adam moments included.
#[test]
fn memory_campaigns_with_forwarded_stores_and_least_recently_used_words() {
    let dma = "dma: (setup_cycles: 8, buffers: 2),";
    let placed = |hw: &str| {
        assert!(hw.contains(dma));
        hw.replace(dma, &format!("{dma}\n    placement: (forward_stored: true, words: LeastRecentlyUsed),"))
    };
    let sites = "\"ub.*\", \"acc.*\", \"dma.*\", \"seq.*\"";
    let (s, records) = memory_campaign_both_modes(placed, "batch: 8, optimizer: adam", sites, 60);
    for class in ["ub.word[*]", "acc.word[*]"] {
        assert!(corrupting(&records, class) > 0, "{class}: no trial corrupted a read ({:?})", s.classes);
    }
}

/// Memory, DMA and sequencer sites on an input-stationary machine: every class corrupts what
/// some trial's step reads (the memory fault path maps IS GEMMs as it does WS ones), and
/// hybrid and cycle-level trials record the same.
#[test]
fn memory_campaigns_on_an_input_stationary_machine() {
    let is = |hw: &str| {
        assert!(hw.contains("dataflow: WeightStationary"));
        hw.replace("dataflow: WeightStationary", "dataflow: InputStationary")
    };
    let sites = "\"ub.*\", \"acc.*\", \"wbuf.*\", \"dma.*\", \"seq.*\"";
    let (s, records) = memory_campaign_both_modes(is, "batch: 8", sites, 40);
    for class in &s.classes {
        let n = corrupting(&records, class.class.as_str());
        assert!(n > 0, "{}: no trial corrupted a read ({:?})", class.class, class.outcomes);
    }
    assert!(
        s.classes.iter().any(|x| x.class == "wbuf.word[*]"),
        "{:?}",
        s.classes.iter().map(|x| &x.class).collect::<Vec<_>>()
    );
}
