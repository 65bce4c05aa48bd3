//! Fuzz-style property tests of the fault crate's files: campaign specs
//! (`configs/campaign-*.ron`), protection plans (`configs/protect-*.ron`) and explorations
//! (`configs/explore-mlp.ron`, with its campaigns and plans), fed mutated shipped files and
//! random bytes. Whatever the input: no panic, and either a value whose sizes are bounded
//! (its steps listable, its margins finite against any fp32 value, its JSON readable back)
//! or an error that is exactly one line.
//!
//! Allocations are capped: a request above [`ALLOC_CAP`] fails, which aborts the test
//! binary ("memory allocation of N bytes failed"), so a size that drives an allocation
//! before it is bounded shows up here instead of as a slow test or the OOM killer.

use faultline_fault::explore::ExploreSpec;
use faultline_fault::protect::ProtectionPlan;
use faultline_fault::spec::{parse_ron, CampaignSpec};
use faultline_hw::fuzz::{apply, edit, numbers, Edit, NUMBERS};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};

/// Largest single allocation: far above anything a file up to its 16 MiB limit needs parsed
/// and checked, far below the gigabytes an unbounded size asks for.
const ALLOC_CAP: usize = 256 << 20;

struct Capped;

// SAFETY: every call forwards to the system allocator with the caller's arguments, or returns
// null (allocation failure, which the caller handles) for a size above the cap.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs")
}

/// The shipped files whose names start with `prefix`, as (name, text), in name order.
fn shipped(prefix: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(configs())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".ron"))
        .map(|n| (n.clone(), std::fs::read_to_string(configs().join(&n)).unwrap()))
        .collect();
    v.sort();
    v
}

/// Errors are one line naming the file.
fn one_line(e: impl std::fmt::Display, file: &str) -> Result<(), TestCaseError> {
    let msg = e.to_string();
    prop_assert!(!msg.contains('\n') && msg.starts_with(file), "{:?}", msg);
    Ok(())
}

/// The campaign parser's contract on any text.
fn campaign_contract(text: &str) -> Result<(), TestCaseError> {
    match CampaignSpec::from_ron(text, Path::new("fuzz.ron")) {
        Ok(spec) => {
            // Its steps are within the golden run, so listing them is bounded by it.
            prop_assert!(spec.inject_steps.count() <= spec.golden_steps, "{:?}", spec.inject_steps);
            prop_assert_eq!(spec.inject_steps.steps().len() as u64, spec.inject_steps.count());
            // Rates scaled from its FIT per bit (by at most 2^64 bits) are numbers in JSON.
            prop_assert!(spec.fit_per_bit.is_none_or(|f| (f * u64::MAX as f64).is_finite()), "{:?}", spec.fit_per_bit);
            // What loads is what `campaign.json` holds, and reads back the same.
            let json = serde_json::to_string(&spec).unwrap();
            prop_assert_eq!(&serde_json::from_str::<CampaignSpec>(&json).unwrap(), &spec);
        }
        Err(e) => one_line(e, "fuzz.ron:")?,
    }
    Ok(())
}

/// The plan parser's contract on any text (what [`ProtectionPlan::load`] does, from memory).
fn plan_contract(text: &str) -> Result<(), TestCaseError> {
    let file = Path::new("fuzz.ron");
    match parse_ron::<ProtectionPlan>(text, file).and_then(|p| p.validate(file).map(|_| p)) {
        Ok(plan) => {
            // Any fp32 golden maximum times a margin or limit is a finite f64 threshold.
            use faultline_fault::protect::{Mechanism, RangeBound};
            for m in &plan.mechanisms {
                let x = match m {
                    Mechanism::Range { bound: RangeBound::Learned(x), .. }
                    | Mechanism::Restrict { margin: x, .. }
                    | Mechanism::MomentBound(x) => *x,
                    _ => continue,
                };
                prop_assert!((x * f64::from(f32::MAX)).is_finite() && x > 0.0, "{:?}", m);
            }
            let json = serde_json::to_string(&plan).unwrap();
            prop_assert_eq!(&serde_json::from_str::<ProtectionPlan>(&json).unwrap(), &plan);
        }
        Err(e) => one_line(e, "fuzz.ron:")?,
    }
    Ok(())
}

/// A directory holding copies of the shipped exploration's campaigns and plans, which an
/// exploration file written there loads.
fn explore_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, text) in shipped("campaign-explore-").into_iter().chain(shipped("protect-")) {
        std::fs::write(d.path().join(name), text).unwrap();
    }
    d
}

/// The exploration loader's contract on any text, written as `x.ron` in `dir`.
fn explore_contract(dir: &Path, text: &str) -> Result<(), TestCaseError> {
    let x = dir.join("x.ron");
    std::fs::write(&x, text).unwrap();
    match ExploreSpec::load(&x) {
        // Rates scaled from its FIT per bit (by at most 2^64 bits) are numbers in JSON.
        Ok(spec) => prop_assert!((spec.fit_per_bit * u64::MAX as f64).is_finite(), "{}", spec.fit_per_bit),
        // Errors name the exploration or a campaign or plan it names (files of `dir`, or a
        // path a mutation made up).
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!msg.contains('\n'), "{:?}", msg);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_campaign_specs_never_panic(file in 0usize..64, edits in proptest::collection::vec(edit(), 1..5)) {
        let specs = shipped("campaign-");
        campaign_contract(&apply(&specs[file % specs.len()].1, &edits))?;
    }

    #[test]
    fn mutated_plans_never_panic(file in 0usize..64, edits in proptest::collection::vec(edit(), 1..5)) {
        let plans = shipped("protect-");
        plan_contract(&apply(&plans[file % plans.len()].1, &edits))?;
    }

    #[test]
    fn mutated_explorations_never_panic(edits in proptest::collection::vec(edit(), 1..5)) {
        thread_local!(static DIR: tempfile::TempDir = explore_dir());
        let text = &shipped("explore-mlp")[0].1;
        DIR.with(|d| explore_contract(d.path(), &apply(text, &edits)))?;
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        campaign_contract(&text)?;
        plan_contract(&text)?;
    }
}

/// The shipped files satisfy the contracts, and have numbers for the mutations to replace.
#[test]
fn shipped_files_load_and_have_numbers() {
    for (name, text) in shipped("campaign-") {
        CampaignSpec::from_ron(&text, Path::new(&name)).unwrap();
        assert!(numbers(text.as_bytes()).len() >= 3, "{name}");
    }
    for (name, text) in shipped("protect-") {
        plan_contract(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    ExploreSpec::load(&configs().join("explore-mlp.ron")).unwrap();
}

/// Every number of every shipped file replaced, one at a time, by every hostile value: the
/// exhaustive companion of the random mutations. It includes `inject_steps: Range(first: 1,
/// last: 2^64 - 1)` (which panicked listing the steps), `last: 4294967296` (32 GB), and
/// margins of `1e308` (thresholds that overflow to infinity, written as `null`).
#[test]
fn every_number_replaced_by_every_hostile_value() {
    let dir = explore_dir();
    let cases = |text: &str| {
        (0..numbers(text.as_bytes()).len())
            .flat_map(|i| (0..NUMBERS.len()).map(move |j| (i, j)))
            .map(|(i, j)| apply(text, &[Edit::Number(i, j)]))
            .collect::<Vec<_>>()
    };
    for (_, text) in shipped("campaign-") {
        for t in cases(&text) {
            campaign_contract(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        }
    }
    for (_, text) in shipped("protect-") {
        for t in cases(&text) {
            plan_contract(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        }
    }
    for (_, text) in shipped("explore-mlp") {
        for t in cases(&text) {
            explore_contract(dir.path(), &t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        }
    }
}
