//! The bit-exact-twin invariant over whole step programs: for every shipped model on every
//! shipped config in both MXU precisions, a functional step, a cycle-level step and a hybrid
//! step (one instruction, chosen at random, run at cycle level inside a functional step) give
//! the same loss, output, state and cycles, bit for bit.

use faultline_graph::ModelSpec;
use faultline_hw::{ExecMode, FaultSchedule, HwConfig};
use faultline_train::{data::source, Injection, MxuFormat, OptimizerKind, TrainOptions, Trainer};
use std::path::Path;

fn trainer(model: &str, config: &str, precision: MxuFormat, mode: ExecMode) -> Trainer {
    edited_trainer(model, config, precision, mode, |_| {})
}

/// [`trainer`] on the config changed by `edit`.
fn edited_trainer(
    model: &str,
    config: &str,
    precision: MxuFormat,
    mode: ExecMode,
    edit: impl FnOnce(&mut HwConfig),
) -> Trainer {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec = ModelSpec::load(root.join(format!("models/{model}.ron"))).unwrap();
    let mut hw = HwConfig::load(root.join(format!("configs/{config}.ron"))).unwrap();
    edit(&mut hw);
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    // Adam exercises the most instruction kinds; batch 8 keeps cycle-level steps quick.
    let options =
        TrainOptions { batch: 8, optimizer: OptimizerKind::Adam, precision, mode, eval_every: 0, ..Default::default() };
    Trainer::new(&spec, &hw, data, options).unwrap()
}

const MODELS: [&str; 3] = ["mlp-digits", "cnn-small", "transformer-tiny"];
const CONFIGS: [&str; 3] = ["tpu-8x8", "tpu-32x32", "tpu-128x128"];
const PRECISIONS: [MxuFormat; 2] = [MxuFormat::Bf16, MxuFormat::Fp32];

#[test]
fn functional_cycle_level_and_hybrid_steps_are_bit_identical() {
    for (k, (model, config, precision)) in MODELS
        .iter()
        .flat_map(|m| CONFIGS.iter().flat_map(move |c| PRECISIONS.iter().map(move |p| (*m, *c, *p))))
        .enumerate()
    {
        let f = trainer(model, config, precision, ExecMode::Functional);
        let cyc = trainer(model, config, precision, ExecMode::CycleLevel);
        let (x, y) = f.data.train.gather(&f.batcher.clone().next_indices());
        let run = |t: &Trainer, inj: Option<&Injection>| {
            let mut s = t.state.clone();
            let o = t.exec.step_with_fault(&mut s, &x, &y, inj).unwrap();
            let out: Vec<u32> = o.output.iter().map(|v| v.to_bits()).collect();
            (o.loss.to_bits(), out, s, o.cycles, o.phase_cycles)
        };
        let golden = run(&f, None);
        assert!(golden == run(&cyc, None), "{model} on {config} ({precision}): cycle-level differs");
        // Hybrid: the first, the last and a spread of instructions in between, each run at cycle
        // level inside a functional step.
        let n = f.exec.program().instrs.len();
        for instr in [0, n - 1, (k * 7919) % n, (k * 104_729 + 13) % n] {
            let hybrid = Injection::register(instr, FaultSchedule::none());
            assert!(golden == run(&f, Some(&hybrid)), "{model} on {config} ({precision}): hybrid at {instr} differs");
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(8))]

    /// Hybrid == cycle-level with a fault: one random fault of every site class (DRAM words
    /// included), struck at a random cycle of a step (a flip, or a stuck-at that may outlast
    /// an instruction), gives the same loss, output, state, cycles and reported effect whether
    /// only the instruction it hits runs at cycle level (inside a functional step), every
    /// instruction does, or the hybrid step starts from the golden step where the fault does
    /// (and a masked register fault ends after its instructions), on tiled programs too.
    #[test]
    fn a_faulty_hybrid_step_equals_a_faulty_cycle_level_step(
        idx in proptest::prelude::any::<u64>(),
        cycle in proptest::prelude::any::<u64>(),
        model in 0usize..3,
        tight in proptest::prelude::any::<bool>(),
        stuck in proptest::prelude::prop_oneof![proptest::prelude::Just(0u64), 1u64..400],
    ) {
        let (model, config) = (MODELS[model], "tpu-8x8");
        // 16 KiB SRAMs make placement cut cnn-small's and transformer-tiny's instructions into
        // tiles (mlp-digits' weights do not fit them).
        let tight = tight && model != "mlp-digits";
        if let Err(e) = faulty_steps_agree(model, config, tight, idx, cycle, stuck) {
            proptest::prop_assert!(false, "{}", e);
        }
    }
}

/// One fault of every site class at bit index `idx` (modulo the class) and cycle `cycle` (modulo
/// the step) of step 1: a flip, or a stuck-at-1 for `stuck` cycles. The hybrid step, the
/// cycle-level step and the hybrid step started from the golden step all agree, bit for bit.
fn faulty_steps_agree(model: &str, config: &str, tight: bool, idx: u64, cycle: u64, stuck: u64) -> Result<(), String> {
    let make = |mode| {
        edited_trainer(model, config, MxuFormat::Bf16, mode, |hw| {
            hw.dram.fault_sites = true;
            if tight {
                hw.memory.unified_buffer.bytes = 16 * 1024;
                hw.memory.accumulator.bytes = 16 * 1024;
            }
        })
    };
    let (f, cyc) = (make(ExecMode::Functional), make(ExecMode::CycleLevel));
    let (x, y) = f.data.train.gather(&f.batcher.clone().next_indices());
    let hw = &f.exec.hw;
    let golden = f.exec.golden_step(&f.state, &x, Some(&y)).unwrap();
    for class in faultline_hw::SiteClass::all(hw) {
        let site = class.site_at(hw, idx % class.bit_count(hw)).unwrap();
        let (kind, duration) =
            if stuck == 0 { (faultline_num::BitFault::Flip, 1) } else { (faultline_num::BitFault::StuckAt1, stuck) };
        let fault =
            faultline_train::StepFault { kind, site, step: 1, cycle: cycle % f.schedule.total_cycles, duration };
        let run = |t: &Trainer, from: Option<&faultline_train::GoldenStep>| {
            let (inj, rep) = faultline_train::inject::resolve(&t.exec, &t.schedule, &fault).unwrap();
            let mut s = t.state.clone();
            let o = t.exec.step_with_fault_from(&mut s, &x, &y, inj.as_ref(), from).unwrap();
            let out: Vec<u32> = o.output.iter().map(|v| v.to_bits()).collect();
            // Bits, not floats: a fault may leave NaNs, which compare unequal to themselves.
            let state: Vec<(String, Vec<u32>)> =
                s.tensors.iter().map(|(k, t)| (k.clone(), t.data.iter().map(|v| v.to_bits()).collect())).collect();
            let rep = faultline_train::inject::complete(rep, o.effect.as_ref()).to_string();
            (o.loss.to_bits(), out, state, s.step, rep, o.cycles, o.phase_cycles, o.unit_cycles)
        };
        let (h, c, late) = (run(&f, None), run(&cyc, None), run(&f, Some(&golden)));
        if h != c {
            return Err(format!("{model} on {config}: {fault} differs: {} vs {}", h.4, c.4));
        }
        if h != late {
            return Err(format!("{model} on {config}: {fault} from the golden step differs: {} vs {}", h.4, late.4));
        }
    }
    Ok(())
}

/// The MNIST models (pooling, BatchNorm, global average pooling, shortcuts) on the machine they
/// are sized for: fault-free steps bit-identical in every mode and both precisions, hybrid at a
/// spread of instructions, and faulty hybrid, cycle-level and late-start steps identical for a
/// fault of every site class at two draws each.
#[test]
fn mnist_models_are_bit_identical_in_every_mode_with_and_without_faults() {
    for model in ["lenet-mnist", "resnet-mini"] {
        for precision in PRECISIONS {
            let f = trainer(model, "tpu-128x128", precision, ExecMode::Functional);
            let cyc = trainer(model, "tpu-128x128", precision, ExecMode::CycleLevel);
            let (x, y) = f.data.train.gather(&f.batcher.clone().next_indices());
            let run = |t: &Trainer, inj: Option<&Injection>| {
                let mut s = t.state.clone();
                let o = t.exec.step_with_fault(&mut s, &x, &y, inj).unwrap();
                let out: Vec<u32> = o.output.iter().map(|v| v.to_bits()).collect();
                (o.loss.to_bits(), out, s, o.cycles, o.phase_cycles)
            };
            let golden = run(&f, None);
            assert!(golden == run(&cyc, None), "{model} ({precision}): cycle-level differs");
            let n = f.exec.program().instrs.len();
            for instr in (0..8).map(|k| k * (n - 1) / 7) {
                let hybrid = Injection::register(instr, FaultSchedule::none());
                assert!(golden == run(&f, Some(&hybrid)), "{model} ({precision}): hybrid at {instr} differs");
            }
        }
        for (idx, cycle, stuck) in [(12_345_677, 98_765, 0), (987_654_321, 31_337, 200)] {
            faulty_steps_agree(model, "tpu-128x128", false, idx, cycle, stuck).unwrap();
        }
    }
}
