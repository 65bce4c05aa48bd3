//! The calculated memory fault path against a replay through real memory arrays: for random
//! small training steps (shipped models, batch, array shape, dataflow) and random word flips
//! in the unified buffer, accumulators, weight buffer and DRAM, the reads that
//! `inject::memory` predicts see the flip are exactly the reads that return a changed value
//! when the step's whole memory traffic goes through `faultline_hw::memory::Memory`.

use faultline_graph::ModelSpec;
use faultline_hw::fault::{FaultEvent, FaultSite, FaultTime};
use faultline_hw::{Dataflow, HwConfig, Unit};
use faultline_num::BitFault;
use faultline_train::data::source;
use faultline_train::inject::memory::{self, StepMap, WordOp};
use faultline_train::inject::replay::{replay, Read};
use faultline_train::{TrainOptions, Trainer};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const MODELS: [&str; 3] = ["mlp-digits", "cnn-small", "transformer-tiny"];
const DATAFLOWS: [Dataflow; 3] = [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary];

/// A trainer of shipped model `model` on tpu-8x8 reshaped to `rows x cols` with `dataflow`.
fn trainer(model: &str, batch: usize, dataflow: Dataflow, rows: usize, cols: usize) -> Trainer {
    let spec = ModelSpec::load(root().join(format!("models/{model}.ron"))).unwrap();
    let mut hw = HwConfig::load(root().join("configs/tpu-8x8.ron")).unwrap();
    (hw.mxu.dataflow, hw.mxu.rows, hw.mxu.cols) = (dataflow, rows, cols);
    hw.dram.fault_sites = true;
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    Trainer::new(&spec, &hw, data, TrainOptions { batch, eval_every: 0, ..TrainOptions::default() }).unwrap()
}

/// With no fault every read returns what its element last wrote: no word is reused while live,
/// on every shipped model and dataflow.
#[test]
fn a_fault_free_replay_reads_back_every_write() {
    for model in MODELS {
        for df in DATAFLOWS {
            let t = trainer(model, 4, df, 8, 8);
            let r = replay(t.exec.program(), &t.schedule, &t.exec.hw, None).unwrap();
            assert!(r.reads > 0);
            assert!(
                r.changed.is_empty(),
                "{model} {df:?}: {} reads changed, first {:?}",
                r.changed.len(),
                r.changed[0]
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn predicted_hits_are_the_reads_a_real_memory_replay_sees_changed(
        model in 0usize..3, df in 0usize..3, batch in 1usize..5, rows in 2usize..9, cols in 2usize..9,
        unit in 0usize..4, pick in any::<u64>(), bit in 0u32..32, at in any::<u64>(),
    ) {
        let t = trainer(MODELS[model], batch, DATAFLOWS[df], rows, cols);
        let (p, sched, hw) = (t.exec.program(), &t.schedule, &t.exec.hw);
        let unit = [Unit::Ub, Unit::Acc, Unit::Wbuf, Unit::Dram][unit];
        // A word some buffer lives in (any weight-buffer word), so that most flips are live.
        let addr = match unit {
            Unit::Wbuf => pick % hw.memory.weight_buffer.words(),
            _ => {
                let homed: Vec<(u64, u64)> = p.homes.iter().zip(&p.buffers)
                    .filter(|(h, b)| h.mem == unit && b.len > 0)
                    .map(|(h, b)| (h.base, b.len as u64))
                    .collect();
                prop_assume!(!homed.is_empty());
                let (base, len) = homed[(pick % homed.len() as u64) as usize];
                base + (pick >> 32) % len
            }
        };
        let bits = match unit {
            Unit::Wbuf => hw.memory.weight_buffer.word_bits,
            Unit::Acc => hw.memory.accumulator.word_bits,
            Unit::Ub => hw.memory.unified_buffer.word_bits,
            _ => 32,
        };
        let site = FaultSite::word(unit, addr, bit % bits);
        let cycle = at % sched.total_cycles;
        // Flips only: a stuck bit that already holds its value changes nothing a replay sees.
        let f = FaultEvent { site, kind: BitFault::Flip, at: FaultTime { tile: 0, cycle }, duration: 1 }.activate(0);
        let map = StepMap::new(p, sched, hw).unwrap();
        let (_, hits) = memory::hits(&map, f).unwrap();
        let mut predicted: Vec<Read> = hits.iter().map(|h| {
            assert_eq!(h.op, WordOp::Fault(f));
            assert!(!h.written);
            Read { instr: h.instr, buf: h.buf, elem: h.elem, part: h.part }
        }).collect();
        let mut seen = replay(p, sched, hw, Some(f)).unwrap().changed;
        predicted.sort();
        seen.sort();
        prop_assert_eq!(predicted, seen, "{} on {:?} {}x{} batch {}: flip {} at cycle {}", MODELS[model], DATAFLOWS[df], rows, cols, batch, site, cycle);
    }
}
