//! Faulted runs that start from the golden step where their fault does
//! (`Executor::step_with_fault_from`): where a buffer is written in parts on both sides of the
//! fault's instruction (a later K tile accumulating into a GEMM's output, a column reduction
//! continuing its sums), the run must start back at that buffer's first write, or it would add
//! onto the buffer's final words. The proptest in `twins.rs` covers every site class at random
//! cycles; this test aims at exactly those accumulating instructions.

use faultline_graph::ModelSpec;
use faultline_hw::isa::Instr;
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::{data::source, inject, MxuFormat, StepFault, TrainOptions, Trainer};
use std::path::Path;

/// `model` on tpu-8x8 with 16 KiB SRAMs, so that placement cuts instructions into tiles.
fn tight(model: &str) -> Trainer {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec = ModelSpec::load(root.join(format!("models/{model}.ron"))).unwrap();
    let mut hw = HwConfig::load(root.join("configs/tpu-8x8.ron")).unwrap();
    hw.memory.unified_buffer.bytes = 16 * 1024;
    hw.memory.accumulator.bytes = 16 * 1024;
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    let options = TrainOptions {
        batch: 8,
        precision: MxuFormat::Bf16,
        mode: ExecMode::Functional,
        eval_every: 0,
        ..Default::default()
    };
    Trainer::new(&spec, &hw, data, options).unwrap()
}

#[test]
fn a_fault_in_a_later_accumulating_tile_starts_back_at_its_first_part() {
    let mut corrupted = 0;
    for model in ["cnn-small", "transformer-tiny"] {
        let t = tight(model);
        let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
        let golden = t.exec.golden_step(&t.state, &x, Some(&y)).unwrap();
        let p = t.exec.program();
        for (i, ins) in p.instrs.iter().enumerate() {
            let (acc, site) = match ins {
                Instr::Gemm { acc, .. } => (*acc, "mxu.pe[0][0].psum[30]"),
                Instr::Vpu { acc, .. } => (*acc, "vpu.lane[0].out[30]"),
                Instr::Dma { .. } => (false, ""),
            };
            let out = ins.writes()[0];
            if !acc || !p.instrs[..i].iter().any(|e| e.writes().contains(&out)) {
                continue;
            }
            let c = &t.schedule.instrs[i];
            for k in 0..8 {
                let fault = StepFault {
                    kind: faultline_num::BitFault::Flip,
                    site: site.parse().unwrap(),
                    step: 1,
                    cycle: c.start + c.cycles * k / 8,
                    duration: 1,
                };
                let run = |from| {
                    let (inj, _) = inject::resolve(&t.exec, &t.schedule, &fault).unwrap();
                    let mut s = t.state.clone();
                    let o = t.exec.step_with_fault_from(&mut s, &x, &y, inj.as_ref(), from).unwrap();
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
                    let state: Vec<Vec<u32>> = s.tensors.values().map(|t| bits(&t.data)).collect();
                    (o.loss.to_bits(), bits(&o.output), state, o.cycles, o.effect.map(|e| e.corrupted))
                };
                let (whole, late) = (run(None), run(Some(&golden)));
                assert_eq!(whole, late, "{model}: {fault} (instruction {i}, accumulating)");
                corrupted += usize::from(whole.4.is_some_and(|c| c > 0));
            }
        }
    }
    // Not vacuous: faults that changed an accumulating tile's outputs were compared.
    assert!(corrupted >= 4, "only {corrupted} faults corrupted an accumulating tile");
}
