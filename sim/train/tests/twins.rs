//! The bit-exact-twin invariant over whole step programs: for every shipped model on every
//! shipped config in both MXU precisions, a functional step, a cycle-level step and a hybrid
//! step (one instruction, chosen at random, run at cycle level inside a functional step) give
//! the same loss, output, state and cycles, bit for bit.

use faultline_graph::ModelSpec;
use faultline_hw::{ExecMode, FaultSchedule, HwConfig};
use faultline_train::{source, Injection, MxuFormat, OptimizerKind, TrainOptions, Trainer};
use std::path::Path;

fn trainer(model: &str, config: &str, precision: MxuFormat, mode: ExecMode) -> Trainer {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec = ModelSpec::load(root.join(format!("models/{model}.ron"))).unwrap();
    let hw = HwConfig::load(root.join(format!("configs/{config}.ron"))).unwrap();
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
