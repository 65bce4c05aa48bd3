//! Tiling: when one instruction's tensors do not fit the SRAMs, placement cuts it into row
//! tiles (GEMMs along M, or along K with accumulation; VPU ops by rows or samples; column
//! reductions continuing from the previous tile's sums) that move their rows by DMA. A tiled
//! step must be the untiled step to the bit, on every path, and memory faults must land on
//! the words the tiles actually move.

use faultline_graph::ModelSpec;
use faultline_hw::isa::{Instr, View};
use faultline_hw::{ExecMode, HwConfig, PlacementConfig, Unit, WordChoice};
use faultline_train::{data::source, inject, MxuFormat, OptimizerKind, StepFault, TrainOptions, Trainer};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A trainer of `model` (batch 16, Adam) on tpu-8x8 with `sram_bytes` of unified buffer and
/// of accumulators.
fn trainer(model: &str, sram_bytes: u64, precision: MxuFormat, mode: ExecMode) -> Trainer {
    trainer_placed(model, sram_bytes, precision, mode, PlacementConfig::default())
}

/// [`trainer`] with `placement`.
fn trainer_placed(
    model: &str,
    sram_bytes: u64,
    precision: MxuFormat,
    mode: ExecMode,
    placement: PlacementConfig,
) -> Trainer {
    let spec = ModelSpec::load(root().join(format!("models/{model}.ron"))).unwrap();
    let mut hw = HwConfig::load(root().join("configs/tpu-8x8.ron")).unwrap();
    hw.placement = placement;
    hw.memory.unified_buffer.bytes = sram_bytes;
    hw.memory.accumulator.bytes = sram_bytes;
    hw.dram.fault_sites = true;
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    let options = TrainOptions {
        batch: 16,
        optimizer: OptimizerKind::Adam,
        precision,
        mode,
        eval_every: 0,
        ..Default::default()
    };
    Trainer::new(&spec, &hw, data, options).unwrap()
}

/// 16 KiB SRAMs: too small for cnn-small and transformer-tiny at batch 16 without tiling.
const TIGHT: u64 = 16 * 1024;

/// The loss bits and every state tensor's bits after one step from the trainer's state.
fn step(t: &Trainer, x: &[f32], y: &[u32]) -> (u32, Vec<(String, Vec<u32>)>, u64) {
    let mut s = t.state.clone();
    let o = t.exec.step(&mut s, x, y).unwrap();
    let state = s.tensors.iter().map(|(k, v)| (k.clone(), v.bits())).collect();
    (o.loss.to_bits(), state, o.cycles)
}

#[test]
fn a_tiled_step_is_the_untiled_step_to_the_bit() {
    for model in ["cnn-small", "transformer-tiny"] {
        for precision in [MxuFormat::Bf16, MxuFormat::Fp32] {
            let roomy = trainer(model, 1 << 20, precision, ExecMode::Functional);
            let tight = trainer(model, TIGHT, precision, ExecMode::Functional);
            let (p, q) = (roomy.exec.program(), tight.exec.program());
            let tiles = |p: &faultline_graph::Program| p.tags.iter().filter(|t| t.tile.is_some()).count();
            assert_eq!(tiles(p), 0, "{model}: 1 MiB SRAMs need no tiles");
            assert!(tiles(q) > 0, "{model}: 16 KiB SRAMs must tile");
            // Every kind of cut is exercised: row tiles loaded from an offset, K tiles of a GEMM
            // adding to the result, and column reductions continuing their sums.
            let has = |f: &dyn Fn(&Instr) -> bool| q.instrs.iter().any(f);
            assert!(has(&|i| matches!(i, Instr::Dma { src_offset, .. } if *src_offset > 0)), "{model}");
            assert!(has(&|i| matches!(i, Instr::Dma { dst_offset, .. } if *dst_offset > 0)), "{model}");
            assert!(has(&|i| matches!(i, Instr::Gemm { acc: true, .. })), "{model}: no K tile");
            assert!(has(&|i| matches!(i, Instr::Vpu { acc: true, .. })), "{model}: no reduction tile");
            if model == "cnn-small" {
                let im2col =
                    |i: &Instr| matches!(i, Instr::Vpu { ins, .. } if matches!(ins[0].view, View::Im2Col { .. }));
                let whole = p.instrs.iter().filter(|i| im2col(i)).count();
                assert!(q.instrs.iter().filter(|i| im2col(i)).count() > whole, "{model}: im2col is not cut by samples");
            }
            let (x, y) = roomy.data.train.gather(&roomy.batcher.clone().next_indices());
            let (want, got) = (step(&roomy, &x, &y), step(&tight, &x, &y));
            assert!((want.0, &want.1) == (got.0, &got.1), "{model} ({precision}): tiling changed a value");
            // The static schedule is what the tiled step issues, and tiling costs DMA time.
            assert_eq!(got.2, tight.schedule.total_cycles, "{model} ({precision})");
            assert!(got.2 > want.2, "{model} ({precision}): {} vs {}", got.2, want.2);
            let cyc = trainer(model, TIGHT, precision, ExecMode::CycleLevel);
            assert!(step(&cyc, &x, &y) == got, "{model} ({precision}): cycle-level differs");
        }
    }
}

/// A DRAM word of a tensor that tiles load from an offset: flipped just before the tile's DMA
/// reads it, exactly that load sees the flipped value (and the step changes); flipped as the
/// DMA reads it, it is masked (that load is the word's one reader).
#[test]
fn a_dram_flip_reaches_the_tile_that_loads_the_word() {
    let t = trainer("cnn-small", TIGHT, MxuFormat::Bf16, ExecMode::Functional);
    let (hw, p, sched) = (&t.exec.hw, t.exec.program(), &t.schedule);
    let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
    let golden = step(&t, &x, &y);
    // A tensor that tiles store to DRAM and later tiles load back, each its rows.
    let (d, src, src_offset) = p
        .instrs
        .iter()
        .enumerate()
        .find_map(|(i, ins)| match *ins {
            Instr::Dma { src, src_offset, .. } if src_offset > 0 => Some((i, src, src_offset)),
            _ => None,
        })
        .expect("a tile loads rows from an offset");
    let word = 5u64;
    let read = faultline_hw::isa::dma_word_cycle(hw, &p.instrs[d], sched.instrs[d].start, word).unwrap();
    let addr = p.homes[src.index()].base + src_offset as u64 + word;
    assert_eq!(p.homes[src.index()].mem, Unit::Dram);
    let fault = |cycle| StepFault {
        kind: faultline_num::BitFault::Flip,
        site: faultline_hw::FaultSite::word(Unit::Dram, addr, 30),
        step: 1,
        cycle,
        duration: 1,
    };
    let run = |f: &StepFault| {
        let (inj, rep) = inject::resolve(&t.exec, sched, f).unwrap();
        let mut s = t.state.clone();
        let o = t.exec.step_with_fault(&mut s, &x, &y, inj.as_ref()).unwrap();
        let state: Vec<(String, Vec<u32>)> = s.tensors.iter().map(|(k, v)| (k.clone(), v.bits())).collect();
        (inject::complete(rep, o.effect.as_ref()), (o.loss.to_bits(), state, o.cycles))
    };
    let (rep, s) = run(&fault(read - 1));
    // The one read of the word that sees the flip is this load's, at the word's place in it.
    assert_eq!((rep.instr, rep.buffer.as_str(), rep.corrupted), (d, p.buffers[src.index()].name.as_str(), 1), "{rep}");
    let (inj, _) = inject::resolve(&t.exec, sched, &fault(read - 1)).unwrap();
    let hits: Vec<(Option<usize>, usize)> = inj.unwrap().hits().iter().map(|h| (h.instr, h.elem)).collect();
    assert_eq!(hits, [(Some(d), src_offset + word as usize)], "{rep}");
    assert!((s.0, &s.1) != (golden.0, &golden.1), "the flip must reach the step: {rep}");
    // That load is the word's only reader (the hits above): from its read on, the flip is masked.
    let (rep, s) = run(&fault(read));
    assert!(rep.masked() && s == golden, "{rep}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

    /// A fault-free step interprets the program's direct form (staged copies read and written
    /// in their DRAM words, their transfers skipped): on any placement (roomy, spilled or
    /// tiled SRAMs; forwarded stores, least recently used words) it leaves the bits the placed program leaves in every buffer the step keeps
    /// (loss, output, checks, next parameters and optimizer state), and issues the same cycles;
    /// also when every released buffer's vector is reused, stale words and all.
    #[test]
    fn the_direct_form_leaves_the_placed_programs_bits(
        model in 0usize..3,
        // From 20 KiB: at 16, mlp-digits' 16 KiB first weight fits nowhere beside what its GEMM needs.
        kib in 20u64..1024,
        fp32 in proptest::prelude::any::<bool>(),
        pool in proptest::prelude::any::<bool>(),
        forward_stored in proptest::prelude::any::<bool>(),
        lru in proptest::prelude::any::<bool>(),
    ) {
        let model = ["mlp-digits", "cnn-small", "transformer-tiny"][model];
        let precision = if fp32 { MxuFormat::Fp32 } else { MxuFormat::Bf16 };
        let words = if lru { WordChoice::LeastRecentlyUsed } else { WordChoice::FirstFit };
        let placement = PlacementConfig { forward_stored, words };
        let mut t = trainer_placed(model, kib * 1024, precision, ExecMode::Functional, placement);
        if pool {
            // Every released buffer's vector goes to a later destination, stale words and all.
            t.exec.pool_from(1);
        }
        let p = t.exec.program();
        let direct = p.direct();
        proptest::prop_assert!(direct.redirected > 0, "{model}: nothing redirected");
        let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
        let placed = t.exec.step_buffers(&t.state, &x, &y).unwrap();
        let mut s = t.state.clone();
        let o = t.exec.step(&mut s, &x, &y).unwrap();
        let tg = &t.exec.tg;
        let want = |node| placed[p.buffer_of(node).unwrap().index()].clone();
        proptest::prop_assert_eq!(o.loss.to_bits(), want(tg.loss)[0]);
        proptest::prop_assert_eq!(o.output.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want(tg.output));
        for (c, r) in tg.checks().iter().zip(&o.checks) {
            proptest::prop_assert_eq!(r.to_bits(), want(c.residual)[0]);
        }
        let next = tg.params.iter().map(|q| (&q.name, q.next)).chain(tg.opt_state.iter().map(|q| (&q.name, q.next)));
        for (name, node) in next {
            proptest::prop_assert_eq!(&s.tensors[name].bits(), &want(node), "{} ({})", model, name);
        }
        proptest::prop_assert_eq!(o.cycles, t.schedule.total_cycles);
    }
}
