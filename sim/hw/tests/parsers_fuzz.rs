//! Fuzz-style property tests of the hardware crate's text parsers: the hardware config
//! (`HwConfig::from_ron`) and the fault form (`FaultEvent: FromStr`), fed mutated valid inputs
//! (the shipped configs; printed fault events) and random bytes. Whatever the input: no panic,
//! and either a value that is valid (a config passing `validate` that the timing model can cost;
//! a fault that prints back to itself) or an error whose message is exactly one line.

use faultline_hw::fault::{FaultEvent, FaultTime};
use faultline_hw::fuzz::{apply, edit, numbers, Edit, NUMBERS};
use faultline_hw::op::{self, OpKind};
use faultline_hw::{Dataflow, HwConfig, SiteClass};
use faultline_num::{BitFault, Precision};
use proptest::prelude::*;
use std::path::Path;

fn shipped() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    ["tpu-8x8.ron", "tpu-32x32.ron", "tpu-128x128.ron"]
        .iter()
        .map(|n| std::fs::read_to_string(dir.join(n)).expect("shipped config"))
        .collect()
}

/// The config parser's contract on any text.
fn config_contract(text: &str) -> Result<(), TestCaseError> {
    match HwConfig::from_ron(text, "fuzz.ron") {
        Ok(c) => {
            prop_assert!(c.validate(Path::new("fuzz.ron")).is_ok());
            // A valid config is one the machine can be costed on without panics or overflow.
            // A valid config is one the machine can be costed on without overflow: every
            // transfer pays at least its fixed cost and ends by the op's end (a wrapped sum would
            // break both), and the op takes at least its compute time.
            let fixed = c.dma.setup_cycles.checked_add(c.dram.latency_cycles);
            prop_assert!(fixed.is_some());
            for kind in
                [OpKind::Matmul { m: 16, k: 8, n: 8 }, OpKind::Relu { n: 1000 }, OpKind::Softmax { rows: 3, cols: 9 }]
            {
                match op::timing(&c, &kind) {
                    Ok(t) => {
                        for tr in &t.transfers {
                            let len = tr.end.checked_sub(tr.start);
                            prop_assert!(len >= fixed && tr.end <= t.total_cycles, "{:?} in {:?}", tr, t);
                        }
                        prop_assert!(t.total_cycles >= t.compute_cycles);
                        prop_assert!((t.total_cycles as f64 / c.clock_mhz).is_finite());
                    }
                    Err(e) => prop_assert!(!e.to_string().contains("overflows"), "{}", e),
                }
            }
            for class in SiteClass::all(&c) {
                prop_assert!(class.bit_count(&c) > 0);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!msg.contains('\n') && msg.starts_with("fuzz.ron:"), "{:?}", msg);
        }
    }
    Ok(())
}

/// Any valid fault event on a site of either dataflow, as campaigns and the CLI produce them.
fn any_event() -> impl Strategy<Value = FaultEvent> {
    let classes: Vec<(HwConfig, SiteClass)> = [Dataflow::WeightStationary, Dataflow::OutputStationary]
        .into_iter()
        .flat_map(|df| {
            let mut c = HwConfig::test_config(32, 32, df, Precision::Bf16Fp32);
            c.dram.fault_sites = true;
            SiteClass::all(&c).into_iter().map(move |k| (c.clone(), k))
        })
        .collect();
    let kinds = prop_oneof![Just(BitFault::Flip), Just(BitFault::StuckAt0), Just(BitFault::StuckAt1)];
    (0..classes.len(), any::<u64>(), kinds, 0usize..100, 0u64..10_000, 1u64..1000).prop_map(
        move |(i, idx, kind, tile, cycle, duration)| {
            let (c, class) = &classes[i];
            let site = class.site_at(c, idx % class.bit_count(c)).expect("index below the bit count");
            let duration = if kind == BitFault::Flip { 1 } else { duration };
            FaultEvent { site, kind, at: FaultTime { tile, cycle }, duration }
        },
    )
}

/// The fault parser's contract on any text.
fn fault_contract(text: &str) -> Result<(), TestCaseError> {
    match text.parse::<FaultEvent>() {
        Ok(e) => {
            prop_assert!(e.duration >= 1 && (e.kind != BitFault::Flip || e.duration == 1), "{:?}", e);
            prop_assert_eq!(e.to_string().parse::<FaultEvent>().unwrap(), e);
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!msg.contains('\n') && msg.starts_with("cannot parse fault `"), "{:?}", msg);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mutated_shipped_configs_never_panic(file in 0usize..3, edits in proptest::collection::vec(edit(), 1..5)) {
        config_contract(&apply(&shipped()[file], &edits))?;
    }

    #[test]
    fn random_bytes_as_config_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        config_contract(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn ron_like_noise_as_config_never_panics(text in "[(): ,a-z0-9_\"\\.\\-\\[\\]\n]{0,300}") {
        config_contract(&text)?;
    }

    #[test]
    fn mutated_faults_never_panic(e in any_event(), edits in proptest::collection::vec(edit(), 1..4)) {
        fault_contract(&apply(&e.to_string(), &edits))?;
    }

    #[test]
    fn random_text_as_fault_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80),
                                         text in "[a-z0-9_:@+\\.\\[\\]x\n]{0,60}") {
        fault_contract(&String::from_utf8_lossy(&bytes))?;
        fault_contract(&text)?;
    }
}

/// The shipped configs themselves satisfy the contract (and the mutation helper finds their
/// numbers, so `Edit::Number` really replaces values).
#[test]
fn shipped_configs_are_valid_and_have_numbers() {
    for text in shipped() {
        config_contract(&text).unwrap();
        HwConfig::from_ron(&text, "x.ron").unwrap();
        let nums = numbers(text.as_bytes());
        assert!(nums.len() > 20, "{nums:?}");
        let changed = apply(&text, &[Edit::Number(nums.len() - 1, 0)]);
        assert!(changed.contains("setup_cycles: 8, buffers: 0"), "{changed}");
    }
}

/// Every number of every shipped config replaced, one at a time, by every hostile value: the
/// exhaustive companion of the random mutations (it includes `latency_cycles: 2^64 - 1`, which
/// the old validator accepted and the timing model then wrapped to a plausible total).
#[test]
fn every_number_replaced_by_every_hostile_value() {
    for text in shipped() {
        for i in 0..numbers(text.as_bytes()).len() {
            for j in 0..NUMBERS.len() {
                let t = apply(&text, &[Edit::Number(i, j)]);
                config_contract(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
            }
        }
    }
}
