//! The calculated memory fault path against a replay through real memory arrays: for random
//! small training steps (shipped models, batch, array shape, dataflow) and random flips of
//! words in the unified buffer, accumulators, weight buffer and DRAM and of the DMA's address
//! registers, the reads (and, for the DMA, the destination words) that `inject::memory`
//! predicts the flip changes are exactly those that change when the step's whole memory
//! traffic goes through `faultline_hw::memory::Memory`.

use faultline_graph::ModelSpec;
use faultline_hw::fault::{FaultEvent, FaultSite, FaultTime, DMA_ADDR_BITS};
use faultline_hw::isa::Instr;
use faultline_hw::{Dataflow, HwConfig, PlacementConfig, Register, Unit, WordChoice};
use faultline_num::BitFault;
use faultline_train::data::source;
use faultline_train::inject::memory::{self, StepMap, WordHit, WordSource};
use faultline_train::inject::traffic::{replay, Read};
use faultline_train::{TrainOptions, Trainer};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const MODELS: [&str; 3] = ["mlp-digits", "cnn-small", "transformer-tiny"];
/// Every placement: forwarded stores or not, first-fit or least recently used words.
const PLACEMENTS: [PlacementConfig; 4] = [
    PlacementConfig { forward_stored: false, words: WordChoice::FirstFit },
    PlacementConfig { forward_stored: true, words: WordChoice::FirstFit },
    PlacementConfig { forward_stored: false, words: WordChoice::LeastRecentlyUsed },
    PlacementConfig { forward_stored: true, words: WordChoice::LeastRecentlyUsed },
];
const DATAFLOWS: [Dataflow; 3] = [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary];

/// A trainer of shipped model `model` on tpu-8x8 reshaped to `rows x cols` with `dataflow`
/// and `placement`.
fn trainer(
    model: &str,
    batch: usize,
    dataflow: Dataflow,
    rows: usize,
    cols: usize,
    placement: PlacementConfig,
) -> Trainer {
    let spec = ModelSpec::load(root().join(format!("models/{model}.ron"))).unwrap();
    let mut hw = HwConfig::load(root().join("configs/tpu-8x8.ron")).unwrap();
    hw.placement = placement;
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
        for (df, placement) in DATAFLOWS.into_iter().flat_map(|d| PLACEMENTS.map(|p| (d, p))) {
            let t = trainer(model, 4, df, 8, 8, placement);
            let r = replay(t.exec.program(), &t.schedule, &t.exec.hw, None).unwrap();
            assert!(r.reads > 0);
            assert!(
                r.changed.is_empty(),
                "{model} {df:?} {placement:?}: {} reads changed, first {:?}",
                r.changed.len(),
                r.changed[0]
            );
        }
    }
}

/// The site, bit and cycle of one random fault: a word some buffer lives in (any
/// weight-buffer word), or a DMA address bit during some transfer's data phase, so that most
/// faults are live.
fn draw(t: &Trainer, unit: Unit, pick: u64, bit: u32, at: u64) -> Option<(FaultSite, u64)> {
    let (p, sched, hw) = (t.exec.program(), &t.schedule, &t.exec.hw);
    let cycle = at % sched.total_cycles;
    if unit == Unit::Dma {
        let dmas: Vec<usize> = (0..p.instrs.len()).filter(|&i| matches!(p.instrs[i], Instr::Dma { .. })).collect();
        let c = &sched.instrs[*dmas.get((pick % dmas.len().max(1) as u64) as usize)?];
        let (from, to) = (c.start + p.dma_overhead, c.start + c.cycles);
        let register = if pick >> 40 & 1 == 0 { Register::SrcAddr } else { Register::DstAddr };
        let cycle = if to > from { from + at % (to - from) } else { cycle };
        return Some((FaultSite::control(Unit::Dma, register, bit % DMA_ADDR_BITS), cycle));
    }
    let (addr, bits) = match unit {
        Unit::Wbuf => (pick % hw.memory.weight_buffer.words(), hw.memory.weight_buffer.word_bits),
        _ => {
            let homed: Vec<(u64, u64)> = p
                .homes
                .iter()
                .zip(&p.buffers)
                .filter(|(h, b)| h.mem == unit && b.len > 0)
                .map(|(h, b)| (h.base, b.len as u64))
                .collect();
            let (base, len) = *homed.get((pick % homed.len().max(1) as u64) as usize)?;
            let bits = match unit {
                Unit::Acc => hw.memory.accumulator.word_bits,
                Unit::Ub => hw.memory.unified_buffer.word_bits,
                _ => 32,
            };
            (base + (pick >> 32) % len, bits)
        }
    };
    Some((FaultSite::word(unit, addr, bit % bits), cycle))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// Flips only: a stuck bit that already holds its value changes nothing a replay sees.
    #[test]
    fn predicted_hits_are_the_reads_a_real_memory_replay_sees_changed(
        model in 0usize..3, df in 0usize..3, batch in 1usize..5, rows in 2usize..9, cols in 2usize..9,
        unit in 0usize..5, pick in any::<u64>(), bit in 0u32..32, at in any::<u64>(), placement in 0usize..4,
    ) {
        let placement = PLACEMENTS[placement];
        let t = trainer(MODELS[model], batch, DATAFLOWS[df], rows, cols, placement);
        let (p, sched, hw) = (t.exec.program(), &t.schedule, &t.exec.hw);
        let unit = [Unit::Ub, Unit::Acc, Unit::Wbuf, Unit::Dram, Unit::Dma][unit];
        let drawn = draw(&t, unit, pick, bit, at);
        prop_assume!(drawn.is_some());
        let (site, cycle) = drawn.unwrap();
        let f = FaultEvent { site, kind: BitFault::Flip, at: FaultTime { tile: 0, cycle }, duration: 1 }.activate(0);
        let map = StepMap::new(p, sched, hw).unwrap();
        let (_, hits) = memory::hits(&map, f).unwrap();
        let r = replay(p, sched, hw, Some(f)).unwrap();
        let read = |h: &WordHit| Read { instr: h.instr, buf: h.buf, elem: h.elem, part: h.part };
        let why = format!("{} on {:?} {rows}x{cols} batch {batch} {placement:?}: flip {site} at cycle {cycle}", MODELS[model], DATAFLOWS[df]);
        if unit == Unit::Dma {
            // Sets: several misdirected words may land on one element.
            let predicted: BTreeSet<Read> = hits.iter().filter(|h| h.written).map(read).collect();
            let written: BTreeSet<Read> = r.written.iter().copied().collect();
            prop_assert_eq!(predicted, written, "written: {}", why);
            let predicted: BTreeSet<Read> = hits.iter().filter(|h| !h.written).map(read).collect();
            let seen: BTreeSet<Read> = r.changed.iter().copied().collect();
            prop_assert_eq!(predicted, seen, "read: {}", why);
        } else {
            let mut predicted: Vec<Read> = hits.iter().map(|h| {
                assert_eq!(h.source, WordSource::Fault(f));
                assert!(!h.written);
                read(h)
            }).collect();
            let mut seen = r.changed;
            predicted.sort();
            seen.sort();
            prop_assert_eq!(predicted, seen, "{}", why);
            prop_assert!(r.written.is_empty());
        }
    }
}
