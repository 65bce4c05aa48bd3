//! Fuzz-style property tests of the hardware crate's text parsers: the hardware config
//! (`HwConfig::from_ron`), the fault form (`FaultEvent: FromStr`) and SCALE-Sim's run configs
//! and topologies (`faultline_hw::interop::scalesim`), fed mutated valid inputs (the shipped configs and
//! topologies; printed fault events) and random bytes. Whatever the input: no panic, and either
//! a value that is valid (a config passing `validate` that the timing model can cost; a fault
//! that prints back to itself; a SCALE-Sim config whose machine validates on every shipped base;
//! a topology of as many layers as `topology_size` counts, each costed without overflow) or an
//! error whose message is exactly one line.

use faultline_hw::fault::{FaultEvent, FaultTime};
use faultline_hw::fuzz::{apply, edit, numbers, Edit, NUMBERS};
use faultline_hw::interop::scalesim::{self, ScaleSimConfig};
use faultline_hw::kernel::{self, KernelSpec};
use faultline_hw::{Dataflow, HwConfig, SiteClass};
use faultline_num::{BitFault, Precision};
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

fn shipped() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    ["tpu-8x8.ron", "tpu-32x32.ron", "tpu-128x128.ron", "tpu-128x128-v2.ron"]
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
            for kind in [
                KernelSpec::Matmul { m: 16, k: 8, n: 8 },
                KernelSpec::Relu { n: 1000 },
                KernelSpec::Softmax { rows: 3, cols: 9 },
            ] {
                match kernel::timing(&c, &kind) {
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

/// A shipped file, relative to the repository root.
fn shipped_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)).expect(path)
}

/// The SCALE-Sim run configs mutated: the shipped one, and a USER-bandwidth 128x128 variant.
fn scalesim_configs() -> Vec<String> {
    let cfg = shipped_file("configs/scalesim-32x32.cfg");
    let user = cfg
        .replace("InterfaceBandwidth: CALC", "InterfaceBandwidth: USER")
        .replace("ArrayHeight:    32", "ArrayHeight:    128")
        .replace("ArrayWidth:     32", "ArrayWidth:     128");
    vec![cfg, user]
}

/// The topologies mutated: the shipped test topologies and a depth-wise one.
fn topologies() -> Vec<String> {
    let mut t: Vec<String> = ["topologies/test-gemms.csv", "topologies/test-convs.csv"].map(shipped_file).to_vec();
    t.push(
        "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n\
         DP1, 12, 12, 3, 3, 8, 8, 1,\n\"pw,1\", 10, 10, 1, 1, 8, 16, 1,\n"
            .to_string(),
    );
    t
}

/// Every shipped machine, as `faultline scalesim --base` may name it.
fn bases() -> &'static [HwConfig] {
    static BASES: OnceLock<Vec<HwConfig>> = OnceLock::new();
    BASES.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        [
            "tpu-8x8.ron",
            "tpu-32x32.ron",
            "tpu-128x128.ron",
            "tpu-128x128-v2.ron",
            "tpu-32x32-int8.ron",
            "tpu-8x8-fp32.ron",
        ]
        .iter()
        .map(|n| HwConfig::load(dir.join(n)).expect("shipped config"))
        .collect()
    })
}

/// An error message's contract: one line, naming the file.
fn one_line_error(msg: &str, file: &str) -> Result<(), TestCaseError> {
    prop_assert!(!msg.contains('\n') && !msg.contains('\r') && msg.starts_with(file), "{:?}", msg);
    Ok(())
}

/// The SCALE-Sim config parser's contract on any text: a config that parses describes a valid
/// machine on every shipped base (whatever its array, SRAMs, bandwidth or name), one the timing
/// model can cost.
fn scalesim_config_contract(text: &str) -> Result<(), TestCaseError> {
    match ScaleSimConfig::parse(text, Path::new("fuzz.cfg")) {
        Ok(c) => {
            for base in bases() {
                let (hw, _) = c.machine(base);
                prop_assert!(hw.validate(Path::new("fuzz.cfg")).is_ok(), "{:?} on {}: {:?}", c, base.name, hw);
                if let Err(e) = kernel::timing(&hw, &KernelSpec::Matmul { m: 16, k: 8, n: 8 }) {
                    prop_assert!(!e.to_string().contains("overflows"), "{}", e);
                }
            }
        }
        Err(e) => one_line_error(&e.to_string(), "fuzz.cfg")?,
    }
    Ok(())
}

/// The topology parser's contract on any text: `topology_size` agrees with what is built (so
/// a memory estimate made from it holds), the expansion is bounded by the rows written, and
/// every layer's SCALE-Sim counts are computed without overflow on any array.
fn topology_contract(text: &str) -> Result<(), TestCaseError> {
    let file = Path::new("fuzz.csv");
    let size = scalesim::topology_size(text, file);
    match scalesim::parse_topology(text, file) {
        Ok(layers) => {
            let size = size.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(size.layers, layers.len() as u64);
            prop_assert!(size.name_bytes >= layers.iter().map(|l| l.name.len() as u64).sum::<u64>());
            prop_assert!(size.layers <= text.lines().count() as u64 * 65536);
            for l in &layers {
                let [m, k, n] = l.gemm();
                prop_assert!(m >= 1 && k >= 1 && n >= 1 && (m as u128 * k as u128 * n as u128) <= 1 << 50);
                for (r, c) in [(1, 1), (16, 4), (128, 128), (1024, 1024)] {
                    for df in [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary] {
                        // (Utilisation over the last cycle's index, as SCALE-Sim has it, can pass
                        // 100% on a 1x1 array.)
                        let s = scalesim::counts(r, c, df, [m, k, n]);
                        prop_assert!(s.folds >= 1 && s.overall_util > 0.0 && s.compute_util > 0.0, "{:?}", s);
                    }
                }
            }
        }
        Err(e) => {
            let msg = e.to_string();
            one_line_error(&msg, "fuzz.csv")?;
            prop_assert_eq!(size.map_err(|e| e.to_string()), Err(msg), "topology_size errs as parse does");
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
    fn mutated_scalesim_configs_never_panic(file in 0usize..2, edits in proptest::collection::vec(edit(), 1..5)) {
        scalesim_config_contract(&apply(&scalesim_configs()[file], &edits))?;
    }

    #[test]
    fn random_text_as_scalesim_config_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400),
                                                   text in "[\\[\\]:=a-zA-Z0-9_ \n]{0,300}") {
        scalesim_config_contract(&String::from_utf8_lossy(&bytes))?;
        scalesim_config_contract(&text)?;
    }

    #[test]
    fn mutated_topologies_never_panic(file in 0usize..3, edits in proptest::collection::vec(edit(), 1..5)) {
        topology_contract(&apply(&topologies()[file], &edits))?;
    }

    #[test]
    fn random_text_as_topology_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400),
                                            text in "[a-zA-Z0-9_ ,\"\n]{0,300}") {
        topology_contract(&String::from_utf8_lossy(&bytes))?;
        topology_contract(&text)?;
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

/// Every number of the shipped SCALE-Sim config and topologies replaced, one at a time, by every
/// hostile value (array sides, SRAM sizes and layer dimensions of 0, 2^64, 1e308, ...).
#[test]
fn every_scalesim_number_replaced_by_every_hostile_value() {
    for (text, contract) in scalesim_configs()
        .into_iter()
        .map(|t| (t, scalesim_config_contract as fn(&str) -> Result<(), TestCaseError>))
        .chain(topologies().into_iter().map(|t| (t, topology_contract as fn(&str) -> Result<(), TestCaseError>)))
    {
        contract(&text).unwrap();
        let count = numbers(text.as_bytes()).len();
        assert!(count > 10, "{text}");
        for i in 0..count {
            for j in 0..NUMBERS.len() {
                let t = apply(&text, &[Edit::Number(i, j)]);
                contract(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
            }
        }
    }
}
