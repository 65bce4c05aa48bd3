//! Faults on the training clock reach every site class: for each class there is a
//! cycle of a training step at which a flip of one of its bits corrupts exactly the output of
//! the instruction running then (the predicted tensor), and a cycle at which its unit is idle
//! and the same flip is masked in hardware (the step's result is bit-identical to golden).

use faultline_graph::ModelSpec;
use faultline_hw::fault::SiteKind;
use faultline_hw::isa::{ExecUnit, Instr};
use faultline_hw::{Dataflow, FaultSite, HwConfig, Register, SiteClass, Unit};
use faultline_train::inject::{self, space};
use faultline_train::{data::source, ModelState, StepFault, TrainOptions, Trainer};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn trainer(dataflow: Dataflow) -> Trainer {
    small_trainer("mlp-digits", 8, |hw| hw.mxu.dataflow = dataflow)
}

/// A trainer of a shipped model on tpu-8x8 (changed by `edit`) with batch `batch`.
fn small_trainer(model: &str, batch: usize, edit: impl FnOnce(&mut HwConfig)) -> Trainer {
    let spec = ModelSpec::load(root().join(format!("models/{model}.ron"))).unwrap();
    let mut hw = HwConfig::load(root().join("configs/tpu-8x8.ron")).unwrap();
    edit(&mut hw);
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    Trainer::new(&spec, &hw, data, TrainOptions { batch, eval_every: 0, ..TrainOptions::default() }).unwrap()
}

/// The trainer's next batch and the fault-free step on it: the state after the step with the
/// loss's bits.
fn golden_step(t: &Trainer) -> (Vec<f32>, Vec<u32>, (ModelState, u32)) {
    let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
    let mut state = t.state.clone();
    let loss = t.exec.step(&mut state, &x, &y).unwrap().loss.to_bits();
    (x, y, (state, loss))
}

/// One step from `t`'s state with fault `f`: the report, and the state after the step with the
/// loss's bits.
fn faulty_step(t: &Trainer, f: &StepFault, x: &[f32], y: &[u32]) -> (inject::InjectionReport, (ModelState, u32)) {
    let (injection, report) = inject::resolve(&t.exec, &t.schedule, f).unwrap();
    let mut s = t.state.clone();
    let out = t.exec.step_with_fault(&mut s, x, y, injection.as_ref()).unwrap();
    (inject::complete(report, out.effect.as_ref()), (s, out.loss.to_bits()))
}

/// The bit to flip: the exponent's top bit of a float register, bit 0 of a one-bit one.
fn bit(class: SiteClass, cfg: &HwConfig) -> u32 {
    let w = class.width(cfg);
    if w > 1 {
        w - 2
    } else {
        0
    }
}

#[test]
fn every_mxu_and_vpu_class_is_live_in_a_step_and_masked_when_its_unit_is_idle() {
    for dataflow in [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary] {
        let t = trainer(dataflow);
        let hw = &t.exec.hw;
        let p = t.exec.program();
        let (x, y, golden) = golden_step(&t);
        let first = |pred: &dyn Fn(&Instr) -> bool| (0..p.instrs.len()).find(|&i| pred(&p.instrs[i])).unwrap();
        let gemm = first(&|i| matches!(i, Instr::Gemm { .. }));
        let vpu2 = first(&|i| matches!(i, Instr::Vpu { ins, .. } if ins.len() == 2));
        let reduce = first(&|i| i.name().starts_with("reduce"));
        for class in SiteClass::all(hw) {
            if !matches!(class.unit, Unit::Mxu | Unit::Vpu) || class.kind() != SiteKind::FlipFlop {
                continue;
            }
            // A middle row: the digits' first pixels (array row 0 in the first folds) are mostly 0,
            // which masks operand faults there.
            let site = match class.unit {
                Unit::Mxu => FaultSite::pe(hw.mxu.rows / 2, 0, class.register, bit(class, hw)),
                _ => FaultSite::lane(0, class.register, bit(class, hw)),
            };
            // Operand registers c and d feed only three- and four-input instructions (the fused
            // optimizer ops), which training graphs do not issue: they are dead in training.
            let dead_in_training = matches!(class.register, Register::OpC | Register::OpD);
            let target = match (class.unit, class.register) {
                (Unit::Mxu, _) => gemm,
                (_, Register::LaneAcc) => reduce,
                _ => vpu2,
            };
            let start = t.schedule.instrs[target].start;
            let cycles = t.schedule.instrs[target].cycles;
            let live = (0..cycles).find_map(|c| {
                let f = StepFault { kind: faultline_num::BitFault::Flip, site, step: 1, cycle: start + c, duration: 1 };
                let (r, s) = faulty_step(&t, &f, &x, &y);
                assert!(r.unit_busy && r.instr == target, "{class}: {r}");
                (!r.masked()).then_some((r, s))
            });
            match (live, dead_in_training) {
                (Some((r, s)), false) => {
                    let out = p.instrs[target].writes()[0];
                    assert_eq!(r.buffer, p.buffers[out.index()].name, "{class}: {r}");
                    assert!(r.corrupted >= 1 && r.corrupted <= r.elements, "{class}: {r}");
                    if class.register == Register::Psum {
                        assert_eq!(r.corrupted, 1, "a psum flip corrupts one output: {r}");
                    }
                    assert!(s != golden, "{class}: the corruption must reach the step's state or loss: {r}");
                }
                (None, true) => {}
                (live, dead) => panic!("{class} ({dataflow:?}): live {:?}, expected dead: {dead}", live.map(|l| l.0)),
            }
            // Dead time: the unit is idle (the other unit's instruction is running).
            let idle = (0..p.instrs.len())
                .find(|&i| p.instrs[i].unit() != if class.unit == Unit::Mxu { ExecUnit::Mxu } else { ExecUnit::Vpu })
                .unwrap();
            let f = StepFault {
                kind: faultline_num::BitFault::Flip,
                site,
                step: 1,
                cycle: t.schedule.instrs[idle].start,
                duration: 1,
            };
            let (r, s) = faulty_step(&t, &f, &x, &y);
            assert!(!r.unit_busy && r.masked(), "{class}: {r}");
            assert!(s == golden, "{class}: an idle-unit fault changed the step: {r}");
        }
    }
}

/// Faults through the trainer: the record of the faulted step carries the report, the others
/// none; a bad fault is refused before training; two in one step are refused.
#[test]
fn trainer_injects_on_its_clock_and_refuses_bad_faults() {
    let mut t = trainer(Dataflow::WeightStationary);
    let gemm = t.exec.program().instrs.iter().position(|i| matches!(i, Instr::Gemm { .. })).unwrap();
    let at = t.schedule.instrs[gemm].start + 10;
    let f: StepFault = format!("flip:mxu.pe[0][0].psum[30]@step=2,cycle={at}").parse().unwrap();
    t.set_faults(vec![f]).unwrap();
    let r1 = t.step().unwrap();
    let r2 = t.step().unwrap();
    assert!(r1.injection.is_none());
    let rep = r2.injection.unwrap();
    assert_eq!((rep.instr, rep.op.as_str()), (gemm, "gemm"), "{rep}");
    let json = serde_json::to_string(&r1).unwrap();
    assert!(!json.contains("injection"), "fault-free records keep the landed schema: {json}");
    let end = t.schedule.total_cycles;
    for (text, why) in [
        ("flip:seq.tile[16]@step=3,cycle=0".to_string(), "bit 16 out of range".to_string()),
        (format!("flip:mxu.pe[0][0].psum[30]@step=3,cycle={end}"), format!("ends at cycle {end}")),
        ("flip:mxu.pe[9][0].psum[30]@step=3,cycle=0".into(), "pe[9][0]".into()),
    ] {
        let e = t.set_faults(vec![text.parse().unwrap()]).unwrap_err().to_string();
        assert!(e.contains(&why), "{text}: {e}");
    }
    let twice = vec![
        "flip:mxu.pe[0][0].psum[30]@step=3,cycle=0".parse().unwrap(),
        "flip:mxu.pe[0][1].psum[30]@step=3,cycle=5".parse().unwrap(),
    ];
    assert!(t.set_faults(twice).unwrap_err().to_string().contains("same step"));
}

/// A trial restores a snapshot and replays one step with a fault; restoring again and stepping
/// without one gives the golden step back, bit for bit, and so does the run after it.
#[test]
fn snapshots_restore_the_run_exactly() {
    let mut golden = trainer(Dataflow::WeightStationary);
    let records: Vec<_> = (0..4).map(|_| golden.step().unwrap()).collect();
    let mut t = trainer(Dataflow::WeightStationary);
    t.step().unwrap();
    t.step().unwrap();
    let snap = t.snapshot();
    for cycle in [10, 500, 900] {
        let f = StepFault {
            kind: faultline_num::BitFault::Flip,
            site: FaultSite::pe(4, 0, Register::Psum, 30),
            step: 3,
            cycle,
            duration: 1,
        };
        let r = t.step_with(Some(&f)).unwrap();
        assert!(r.injection.is_some());
        assert!(t.snapshot() != snap);
        t.restore_snapshot(&snap);
    }
    assert_eq!(t.snapshot(), snap);
    let bad = StepFault {
        kind: faultline_num::BitFault::Flip,
        site: FaultSite::pe(4, 0, Register::Psum, 30),
        step: 5,
        cycle: 0,
        duration: 1,
    };
    assert!(t.step_with(Some(&bad)).unwrap_err().to_string().contains("coming step is 3"));
    assert_eq!(t.step().unwrap(), records[2]);
    assert_eq!(t.step().unwrap(), records[3]);
    assert_eq!(t.state, golden.state);
}

/// One clock, one vocabulary: a fault placed on the training clock acts exactly as the same
/// fault given to the GEMM alone (as `faultline gemm --fault KIND:SITE@TILE:CYCLE` takes it) at
/// the fold and cycle the training report names: the same outputs are corrupted.
#[test]
fn a_training_fault_is_the_gemm_fault_at_the_reported_fold_and_cycle() {
    use faultline_hw::fault::FaultTime;
    use faultline_hw::isa::MatOperand;
    use faultline_hw::{mxu, ExecMode, FaultEvent, FaultSchedule, Matrix};
    let t = trainer(Dataflow::WeightStationary);
    let p = t.exec.program();
    let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
    let g = p.instrs.iter().position(|i| matches!(i, Instr::Gemm { .. })).unwrap();
    let Instr::Gemm { a, b, m, k, n, .. } = p.instrs[g].clone() else { unreachable!() };
    let origin = t.schedule.instrs[g].start;
    // The first GEMM multiplies the batch by fc1's weights, neither transposed.
    assert!(matches!((a, b), (MatOperand { transposed: false, .. }, MatOperand { transposed: false, .. })));
    let bf16 = |v: &[f32]| v.iter().map(|&f| faultline_num::f32_to_bf16_bits(f)).collect::<Vec<_>>();
    let am = Matrix { rows: m, cols: k, data: bf16(&x) };
    let bm = Matrix { rows: k, cols: n, data: bf16(&t.state.tensors["fc1.weight"].data) };
    let golden = mxu::gemm(&t.exec.hw, &am, &bm, ExecMode::Functional, &FaultSchedule::none()).unwrap().out;
    for (site, cycle) in [("mxu.pe[4][0].psum[30]", 40), ("mxu.pe[2][3].weight[14]", 70), ("mxu.pe[4][5].act[14]", 95)]
    {
        let site: FaultSite = site.parse().unwrap();
        let f = StepFault { kind: faultline_num::BitFault::Flip, site, step: 1, cycle: origin + cycle, duration: 1 };
        let (r, _) = faulty_step(&t, &f, &x, &y);
        let at = FaultTime { tile: r.tile.unwrap(), cycle: r.tile_cycle.unwrap() };
        let alone = mxu::gemm(
            &t.exec.hw,
            &am,
            &bm,
            ExecMode::CycleLevel,
            &FaultSchedule::one(FaultEvent::flip(site, at.tile, at.cycle)),
        )
        .unwrap()
        .out;
        // The same outputs, wrong by the same amounts (a fault one cycle off would hit another
        // value).
        let diffs = alone.diff(&golden);
        let err = |(i, j): (usize, usize)| {
            let (f, g) = (f32::from_bits(alone.get(i, j)) as f64, f32::from_bits(golden.get(i, j)) as f64);
            if f.is_finite() && g.is_finite() {
                (f - g).abs()
            } else {
                f64::INFINITY
            }
        };
        let max = diffs.iter().map(|&d| err(d)).fold(0.0, f64::max);
        assert_eq!((diffs.len(), max), (r.corrupted, r.max_abs_error), "{r}");
        assert!(r.corrupted > 0, "{r}: pick a live fault");
    }
}

/// Memory words, the weight buffer and the DMA registers are sites during training too: for
/// each such class there is a cycle at which a flip reaches the buffer the program placed
/// there (the report names it, and the step's result changes), and a cycle at which no live
/// word is there and the step is bit-identical to golden.
#[test]
fn every_memory_and_dma_class_is_live_in_a_step_and_masked_at_a_dead_time() {
    use faultline_graph::program::Role;
    let t = small_trainer("mlp-digits", 8, |hw| hw.dram.fault_sites = true);
    let (hw, p, sched) = (&t.exec.hw, t.exec.program(), &t.schedule);
    let (x, y, golden) = golden_step(&t);
    let gemm = (0..p.instrs.len()).find(|&i| matches!(p.instrs[i], Instr::Gemm { .. })).unwrap();
    // The buffer a word holds: homed there, written by `writer` and read after.
    let homed = |mem: Unit, pick: &dyn Fn(usize) -> bool| {
        let b = (0..p.buffers.len()).find(|&b| p.homes[b].mem == mem && pick(b)).unwrap();
        (p.homes[b].base + p.buffers[b].len as u64 / 2, b)
    };
    let written_by_vpu = |b: usize| {
        p.buffers[b].role == Role::Value
            && p.instrs.iter().any(|i| matches!(i, Instr::Vpu { .. }) && i.writes()[0].index() == b)
    };
    let (ub, ub_buf) = homed(Unit::Ub, &written_by_vpu);
    let (acc, acc_buf) = homed(Unit::Acc, &|b| p.instrs[gemm].writes()[0].index() == b);
    let (dram, dram_buf) = homed(Unit::Dram, &|b| p.buffers[b].role == Role::Input);
    let Instr::Gemm { b: weights, .. } = &p.instrs[gemm] else { unreachable!() };
    let first_load = (0..p.instrs.len()).find(|&i| matches!(p.instrs[i], Instr::Dma { .. })).unwrap();
    let loaded = p.instrs[first_load].writes()[0].index();
    let (r, c) = (hw.mxu.rows as u64, hw.mxu.cols as u64);
    let cases = [
        (FaultSite::word(Unit::Ub, ub, 30), ub_buf),
        (FaultSite::word(Unit::Acc, acc, 30), acc_buf),
        (FaultSite::word(Unit::Dram, dram, 30), dram_buf),
        (FaultSite::word(Unit::Wbuf, (r / 2) * c + 1, 14), weights.buf.index()),
        (FaultSite::control(Unit::Dma, Register::SrcAddr, 3), loaded),
        (FaultSite::control(Unit::Dma, Register::DstAddr, 3), loaded),
    ];
    let classes: Vec<SiteClass> =
        SiteClass::all(hw).into_iter().filter(|c| ExecUnit::of(c.unit).is_none() && c.unit != Unit::Seq).collect();
    for class in &classes {
        assert!(cases.iter().any(|(s, _)| s.class() == *class), "{class} has no case");
    }
    for (site, buf) in cases {
        let fault = |cycle| StepFault { kind: faultline_num::BitFault::Flip, site, step: 1, cycle, duration: 1 };
        let located: Vec<(u64, bool)> = (0..sched.total_cycles)
            .map(|cycle| (cycle, inject::resolve(&t.exec, sched, &fault(cycle)).unwrap().0.is_some()))
            .collect();
        // Words are reused: look from the cycle the expected buffer's writer finishes.
        let id = faultline_hw::isa::BufId(buf as u32);
        let from = (0..p.instrs.len())
            .filter(|&i| p.instrs[i].writes().contains(&id) && !matches!(site.unit, Unit::Wbuf | Unit::Dma))
            .map(|i| sched.instrs[i].start + sched.instrs[i].cycles - 1)
            .max()
            .unwrap_or(0);
        let live = located[from as usize..].iter().find(|l| l.1).unwrap_or_else(|| panic!("{site}: never live")).0;
        let (rep, s) = faulty_step(&t, &fault(live), &x, &y);
        assert_eq!(rep.buffer, p.buffers[buf].name, "{site}@{live}: {rep}");
        assert!(rep.corrupted >= 1, "{site}@{live}: {rep}");
        assert!(s != golden, "{site}@{live}: the corruption must reach the step's state or loss: {rep}");
        let dead = located.iter().find(|l| !l.1).unwrap_or_else(|| panic!("{site}: never dead")).0;
        let (rep, s) = faulty_step(&t, &fault(dead), &x, &y);
        assert!(rep.masked() && s == golden, "{site}@{dead}: {rep}");
    }
}

/// The sequencer's registers are sites during training: a flip of the tile counter or the
/// accumulator address while a GEMM's fold loop uses it corrupts that GEMM's result (and the
/// step), and the same flip while the loop does not use it is masked. The live cycles are
/// exactly those the injection space counts.
#[test]
fn sequencer_classes_are_live_while_a_gemm_loops_and_masked_otherwise() {
    let t = trainer(Dataflow::WeightStationary);
    let (hw, p, sched) = (&t.exec.hw, t.exec.program(), &t.schedule);
    let (x, y, golden) = golden_step(&t);
    let space = space::space(&t.exec, sched);
    for class in SiteClass::all(hw).into_iter().filter(|c| c.unit == Unit::Seq) {
        let site = FaultSite::control(Unit::Seq, class.register, 1);
        let fault = |cycle| StepFault { kind: faultline_num::BitFault::Flip, site, step: 1, cycle, duration: 1 };
        let live: Vec<u64> = (0..sched.total_cycles)
            .filter(|&c| inject::resolve(&t.exec, sched, &fault(c)).unwrap().0.is_some())
            .collect();
        let counted = space.iter().find(|s| s.class == class.pattern()).unwrap().bit_cycles;
        assert_eq!(live.len() as u128 * class.width(hw) as u128, counted, "{class}");
        // The first live cycle: in a GEMM, whose result the report names.
        let (rep, s) = faulty_step(&t, &fault(live[0]), &x, &y);
        let g = rep.instr;
        assert!(matches!(p.instrs[g], Instr::Gemm { .. }), "{rep}");
        assert_eq!(rep.buffer, p.buffers[p.instrs[g].writes()[0].index()].name, "{rep}");
        assert!(rep.corrupted >= 1 && s != golden, "{class}@{}: {rep}", live[0]);
        // A cycle inside the same GEMM at which the register is not in use.
        let (start, end) = (sched.instrs[g].start, sched.instrs[g].start + sched.instrs[g].cycles);
        let dead = (start..end).find(|c| !live.contains(c)).unwrap_or_else(|| panic!("{class}: never dead in {g}"));
        let (rep, s) = faulty_step(&t, &fault(dead), &x, &y);
        assert!(rep.masked() && s == golden && rep.instr == g, "{class}@{dead}: {rep}");
    }
}

/// Input stationary trains like the others, to the bit of weight stationary (its GEMMs give
/// WS's bits), and its memory and sequencer faults are mapped like theirs (from
/// [`faultline_hw::mxu::access`]): a tile-counter flip as the first GEMM issues runs its folds
/// out of turn and corrupts its result.
#[test]
fn input_stationary_trains_like_ws_and_maps_sequencer_faults() {
    let ws = small_trainer("mlp-digits", 4, |hw| hw.mxu.dataflow = Dataflow::WeightStationary);
    let is = small_trainer("mlp-digits", 4, |hw| hw.mxu.dataflow = Dataflow::InputStationary);
    let (x, y) = is.data.train.gather(&is.batcher.clone().next_indices());
    let (mut s_ws, mut s_is) = (ws.state.clone(), is.state.clone());
    let l_ws = ws.exec.step(&mut s_ws, &x, &y).unwrap().loss.to_bits();
    let l_is = is.exec.step(&mut s_is, &x, &y).unwrap().loss.to_bits();
    assert!(l_ws == l_is && s_ws == s_is, "IS and WS steps differ");
    let p = is.exec.program();
    let g = (0..p.instrs.len()).find(|&i| matches!(p.instrs[i], Instr::Gemm { .. })).unwrap();
    let event = faultline_hw::FaultEvent {
        site: FaultSite::control(Unit::Seq, Register::TileCounter, 0),
        kind: faultline_num::BitFault::Flip,
        at: faultline_hw::fault::FaultTime { tile: 0, cycle: is.schedule.instrs[g].start },
        duration: 1,
    };
    let inj = faultline_train::exec::Injection::sequencer(g, event.activate(0));
    let mut s = is.state.clone();
    let out = is.exec.step_with_fault(&mut s, &x, &y, Some(&inj)).unwrap();
    let e = out.effect.unwrap();
    assert!(e.instr == g && e.corrupted > 0, "{e:?}");
}

/// The sequencer's fault-free fold loop (each fold's partial sums from its own weight tile,
/// added into the result in fold order) is the GEMM, to the bit: a sequencer fault injected
/// into every GEMM of every shipped model at a cycle its registers are not used changes
/// nothing, in every dataflow.
#[test]
fn a_fault_free_fold_loop_reproduces_every_gemm_to_the_bit() {
    for model in ["mlp-digits", "cnn-small", "transformer-tiny"] {
        for dataflow in [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary] {
            let t = small_trainer(model, 4, |hw| hw.mxu.dataflow = dataflow);
            let (p, sched) = (t.exec.program(), &t.schedule);
            let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
            let mut state = t.state.clone();
            let loss = t.exec.step(&mut state, &x, &y).unwrap().loss.to_bits();
            for g in (0..p.instrs.len()).filter(|&i| matches!(p.instrs[i], Instr::Gemm { .. })) {
                // The last cycle of the GEMM: after its last fold started, so the counter is
                // never read again.
                let at = sched.instrs[g].start + sched.instrs[g].cycles - 1;
                let event = faultline_hw::FaultEvent {
                    site: FaultSite::control(Unit::Seq, Register::TileCounter, 0),
                    kind: faultline_num::BitFault::Flip,
                    at: faultline_hw::fault::FaultTime { tile: 0, cycle: at },
                    duration: 1,
                };
                let inj = faultline_train::exec::Injection::sequencer(g, event.activate(0));
                let mut s = t.state.clone();
                let out = t.exec.step_with_fault(&mut s, &x, &y, Some(&inj)).unwrap();
                let e = out.effect.unwrap();
                assert!(e.corrupted == 0 && e.instr == g, "{model} {dataflow:?} gemm {g}: {e:?}");
                assert!(s == state && out.loss.to_bits() == loss, "{model} {dataflow:?} gemm {g}");
            }
        }
    }
}

/// A result row the accumulator address sends away leaves its words holding what they held
/// before the GEMM, and the later K folds add to that: with the fc1 GEMM's last row of fold 0
/// sent far out of its result (the top address bit flipped just before that row's write), the
/// row's first column tile is exactly the GEMM over the remaining K folds (added to +0: no
/// value lived there before), not the fault-free result plus them.
#[test]
fn a_row_sent_away_leaves_the_words_before_the_gemm_for_later_folds_to_add_to() {
    use faultline_hw::isa::{self, BufId, Dest, MatOperand};
    use faultline_train::inject::memory::WordSource;
    let t = trainer(Dataflow::WeightStationary);
    let (hw, p, sched) = (&t.exec.hw, t.exec.program(), &t.schedule);
    let (x, y) = t.data.train.gather(&t.batcher.clone().next_indices());
    let golden = t.exec.step_buffers(&t.state, &x, &y).unwrap();
    let g = (0..p.instrs.len()).find(|&i| matches!(p.instrs[i], Instr::Gemm { .. })).unwrap();
    let Instr::Gemm { a, b, out, m, k, n, .. } = p.instrs[g] else { unreachable!() };
    let (r, c) = (hw.mxu.rows, hw.mxu.cols);
    assert!(k > r && n >= c && m >= 2, "fc1 needs several K folds: {m}x{k}x{n}");
    assert_eq!(p.homes[out.buf.index()].base, 0, "fc1's result is the first thing in the accumulators");
    // Fold 0's row m-1 is written at issue + (m - 1) + R + C.
    let row_write = sched.instrs[g].start + (m - 1 + r + c) as u64;
    let width = SiteClass { unit: Unit::Seq, register: Register::AccAddr }.width(hw);
    let event = faultline_hw::FaultEvent {
        site: FaultSite::control(Unit::Seq, Register::AccAddr, width - 1),
        kind: faultline_num::BitFault::Flip,
        at: faultline_hw::fault::FaultTime { tile: 0, cycle: row_write - 1 },
        duration: 1,
    };
    let inj = t.exec.words_of_sequencer_fault(g, event.activate(0), &golden).unwrap();
    // The oracle: row m-1 of A without its first R columns, times B's first C columns without
    // its first R rows, as one GEMM.
    let row = m - 1;
    let a_rest: Vec<u32> = (r..k)
        .map(|kk| golden[a.buf.index()][a.offset + if a.transposed { kk * m + row } else { row * k + kk }])
        .collect();
    let b_rest: Vec<u32> = (r..k)
        .flat_map(|kk| (0..c).map(move |j| (kk, j)))
        .map(|(kk, j)| golden[b.buf.index()][b.offset + if b.transposed { j * k + kk } else { kk * n + j }])
        .collect();
    let op = |buf: u32| MatOperand { buf: BufId(buf), offset: 0, transposed: false };
    let sub = Instr::Gemm { a: op(0), b: op(1), out: Dest::whole(BufId(2)), m: 1, k: k - r, n: c, acc: false };
    let mut bufs = vec![a_rest, b_rest, Vec::new()];
    isa::execute(hw, &sub, &mut bufs, faultline_hw::ExecMode::Functional, &faultline_hw::FaultSchedule::none())
        .unwrap();
    assert_eq!(bufs[2].len(), c);
    for (j, &want) in bufs[2].iter().enumerate() {
        let elem = out.offset + row * n + j;
        let hit = inj.hits().iter().find(|h| h.buf == out.buf && h.elem == elem).expect("the row's words change");
        assert_eq!(hit.source, WordSource::Bits(want), "column {j}");
    }
}

/// The injection space never calls a live pair dead: for every site class of every shipped
/// model's step, faults at random (bit, cycle) pairs outside the live windows are masked in
/// hardware (resolved to nothing, or run and bit-identical).
#[test]
fn pairs_outside_the_live_windows_are_masked() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
    for model in ["mlp-digits", "cnn-small", "transformer-tiny"] {
        let t = small_trainer(model, 4, |hw| hw.dram.fault_sites = true);
        let (hw, sched) = (&t.exec.hw, &t.schedule);
        let (x, y, golden) = golden_step(&t);
        let windows = space::windows(&t.exec, sched);
        for class in SiteClass::all(hw) {
            let (mut dead, mut ran) = (0, 0);
            for _ in 0..400 {
                let site = class.site_at(hw, rng.gen_range(0..class.bit_count(hw))).unwrap();
                let cycle = rng.gen_range(0..sched.total_cycles);
                if windows.iter().any(|w| w.contains(hw, &site, cycle)) {
                    continue;
                }
                dead += 1;
                let fault = StepFault { kind: faultline_num::BitFault::Flip, site, step: 1, cycle, duration: 1 };
                if inject::resolve(&t.exec, sched, &fault).unwrap().0.is_none() {
                    continue;
                }
                ran += 1;
                let (rep, s) = faulty_step(&t, &fault, &x, &y);
                assert!(rep.masked() && s == golden, "{model}: {fault} is outside every live window: {rep}");
            }
            assert!(dead > 0, "{model}: {class} has no dead pair in 400 draws");
            let _ = ran;
        }
    }
}

/// A VPU op reads a broadcast operand word once per element that uses it, each when its vector
/// issues: a bias word flipped after the first row's vector has read it reaches exactly the
/// later rows' reads (each bias word is read by one element per row).
#[test]
fn a_broadcast_word_flipped_mid_instruction_reaches_only_the_later_reads() {
    use faultline_hw::isa::View;
    let t = trainer(Dataflow::WeightStationary);
    let (hw, p, sched) = (&t.exec.hw, t.exec.program(), &t.schedule);
    let (x, y, golden) = golden_step(&t);
    // The first bias add: an elementwise VPU op reading a row vector repeated over the batch.
    let (i, o, len, n) = (0..p.instrs.len())
        .find_map(|i| match &p.instrs[i] {
            Instr::Vpu { ins, n, .. } => ins.iter().find_map(|o| match o.view {
                View::Cycle { len } if *n > len && p.homes[o.buf.index()].mem == Unit::Ub => {
                    Some((i, o.clone(), len, *n))
                }
                _ => None,
            }),
            _ => None,
        })
        .expect("a bias add");
    let readers: Vec<usize> = (0..n).step_by(len).collect();
    let (l, start) = (hw.vpu.lanes, sched.instrs[i].start);
    let read = |e: usize| start + (e / l) as u64;
    assert!(read(readers[1]) > read(readers[0]), "rows issue in different vectors");
    let word = p.homes[o.buf.index()].base + o.offset as u64;
    let fault = StepFault {
        kind: faultline_num::BitFault::Flip,
        site: FaultSite::word(Unit::Ub, word, 30),
        step: 1,
        cycle: read(readers[0]),
        duration: 1,
    };
    let later = readers.iter().filter(|&&e| read(e) > fault.cycle).count();
    let (rep, s) = faulty_step(&t, &fault, &x, &y);
    assert_eq!(rep.instr, i, "{rep}");
    assert_eq!((rep.corrupted, rep.elements), (later, later), "{rep}");
    assert!(later < readers.len() && s != golden, "{rep}");
}

/// A stuck-at lasting over several instructions of its unit is placed on each of them: in each,
/// from the first cycle it is active there (the instruction's fold or vector then) to the
/// instruction's end, exactly the event the same stuck-at cut to that instruction's span
/// resolves to; the step equals the step with those parts injected together. A flip stays on
/// one instruction; an upset's bits join in every instruction.
#[test]
fn a_stuck_at_over_several_instructions_is_its_parts_in_each() {
    use faultline_train::exec::Injection;
    let t = trainer(Dataflow::WeightStationary);
    let sched = &t.schedule;
    let (x, y, golden) = golden_step(&t);
    let on = |u: ExecUnit| (0..sched.instrs.len()).filter(|&i| sched.instrs[i].unit == u).collect::<Vec<_>>();
    let (gemms, vpus) = (on(ExecUnit::Mxu), on(ExecUnit::Vpu));
    let stuck = |site: &str, cycle, duration| StepFault {
        kind: faultline_num::BitFault::StuckAt1,
        site: site.parse().unwrap(),
        step: 1,
        cycle,
        duration,
    };
    // From the middle of the second VPU instruction to the middle of the sixth; and over the
    // whole step on a PE.
    let (a, b) = (sched.instrs[vpus[1]], sched.instrs[vpus[5]]);
    let (from, to) = (a.start + a.cycles / 2, b.start + b.cycles / 2);
    for (f, struck) in [
        (stuck("vpu.lane[0].out[30]", from, to - from), vpus[1..=5].to_vec()),
        (stuck("mxu.pe[4][0].psum[30]", 0, sched.total_cycles), gemms.clone()),
    ] {
        let inj = inject::resolve(&t.exec, sched, &f).unwrap().0.unwrap();
        assert_eq!(inj.instrs().collect::<Vec<_>>(), struck, "{f}");
        let mut parts = Vec::new();
        for &i in &struck {
            let c = sched.instrs[i];
            let (s, e) = (f.cycle.max(c.start), (f.cycle + f.duration).min(c.start + c.cycles));
            let part =
                inject::resolve(&t.exec, sched, &StepFault { cycle: s, duration: e - s, ..f }).unwrap().0.unwrap();
            let Injection::Registers(mut one) = part else { panic!("{f}: {part:?} is not a register fault") };
            assert!(one.len() == 1 && one[0].0 == i, "{f}: {one:?}");
            let (_, faults) = one.remove(0);
            assert_eq!(inj.register_faults(i), Some(&faults), "{f} in instruction {i}");
            parts.push((i, faults));
        }
        // Bits: the stuck-at may leave NaNs, unequal to themselves.
        let run = |inj: &Injection| {
            let mut s = t.state.clone();
            let o = t.exec.step_with_fault(&mut s, &x, &y, Some(inj)).unwrap();
            let bits: Vec<Vec<u32>> = s.tensors.values().map(|v| v.bits()).collect();
            (bits, o.loss.to_bits(), o.effect.unwrap())
        };
        let (s, loss, e) = run(&inj);
        let (s2, loss2, e2) = run(&Injection::registers(parts).unwrap());
        assert!(s == s2 && loss == loss2 && e == e2, "{f}");
        let golden_bits: Vec<Vec<u32>> = golden.0.tensors.values().map(|v| v.bits()).collect();
        assert!((s, loss) != (golden_bits, golden.1) && !e.masked(), "{f}: {e:?}");
        // The effect is the first struck instruction's that the fault corrupts.
        let (rep, _) = faulty_step(&t, &f, &x, &y);
        assert_eq!(rep.instr, e.instr, "{f}");
    }
    // A flip: one instruction, as before.
    let flip = StepFault { kind: faultline_num::BitFault::Flip, ..stuck("mxu.pe[4][0].psum[30]", from, 1) };
    let g = sched.locate(ExecUnit::Mxu, sched.instrs[gemms[1]].start + 7).unwrap().0;
    let inj =
        inject::resolve(&t.exec, sched, &StepFault { cycle: sched.instrs[g].start + 7, ..flip }).unwrap().0.unwrap();
    let Injection::Registers(one) = &inj else { panic!("{inj:?} is not a register fault") };
    assert!(one.len() == 1 && one[0].0 == g && one[0].1.events[0].duration == 1, "{inj:?}");
    // Two bits struck together over the whole step: both in every GEMM.
    let bits =
        [stuck("mxu.pe[4][0].psum[30]", 0, sched.total_cycles), stuck("mxu.pe[4][0].psum[29]", 0, sched.total_cycles)];
    let inj = inject::resolve_upset(&t.exec, sched, &bits).unwrap().0.unwrap();
    assert_eq!(inj.instrs().collect::<Vec<_>>(), gemms);
    assert!(gemms.iter().all(|&g| inj.register_faults(g).unwrap().events.len() == 2), "{inj:?}");
}

/// The PEs right of a GEMM's widest fold are dead while it runs, in every dataflow: on the
/// 32x32 array mlp-digits' GEMMs of 10 output columns (the logits and their gradients) leave
/// columns 10..32 idle, and a flip of any MXU register there, at any cycle of the GEMM, leaves
/// the step bit-identical, where the same flip in the last used column does not always.
#[test]
fn pes_right_of_a_gemms_columns_are_dead_in_every_dataflow() {
    for dataflow in [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary] {
        let spec = ModelSpec::load(root().join("models/mlp-digits.ron")).unwrap();
        let mut hw = HwConfig::load(root().join("configs/tpu-32x32.ron")).unwrap();
        hw.mxu.dataflow = dataflow;
        let data = source::shipped(&spec, 1, &Default::default()).unwrap();
        let t = Trainer::new(&spec, &hw, data, TrainOptions { batch: 4, eval_every: 0, ..TrainOptions::default() })
            .unwrap();
        let (hw, p, sched) = (&t.exec.hw, t.exec.program(), &t.schedule);
        let (x, y, golden) = golden_step(&t);
        let windows = space::windows(&t.exec, sched);
        let mut narrow = 0;
        for g in (0..p.instrs.len()).filter(|&i| matches!(p.instrs[i], Instr::Gemm { .. })) {
            let map = faultline_train::inject::gemm_fold::GemmMap::new(hw, &p.instrs[g], sched.instrs[g].start);
            let used = map.unwrap().unwrap().s.as_ws().folds.iter().map(|f| f.nc).max().unwrap();
            if used >= hw.mxu.cols {
                continue;
            }
            narrow += 1;
            let (start, cycles) = (sched.instrs[g].start, sched.instrs[g].cycles);
            for class in SiteClass::all(hw).into_iter().filter(|c| c.unit == Unit::Mxu) {
                let mut live_in_used = false;
                for (k, c) in (start..start + cycles).step_by(3).enumerate() {
                    let row = k % hw.mxu.rows;
                    let fault = |col| StepFault {
                        kind: faultline_num::BitFault::Flip,
                        site: FaultSite::pe(row, col, class.register, bit(class, hw)),
                        step: 1,
                        cycle: c,
                        duration: 1,
                    };
                    let dead = fault(used + k % (hw.mxu.cols - used));
                    assert!(!windows.iter().any(|w| w.contains(hw, &dead.site, c)), "{dataflow:?} {dead}");
                    let (rep, s) = faulty_step(&t, &dead, &x, &y);
                    assert!(rep.masked() && s == golden, "{dataflow:?}: {dead} right of {used} columns: {rep}");
                    if !live_in_used && class.register == Register::Psum {
                        live_in_used = !faulty_step(&t, &fault(used - 1), &x, &y).0.masked();
                    }
                }
                assert!(
                    live_in_used || class.register != Register::Psum,
                    "{dataflow:?}: no psum flip in column {}",
                    used - 1
                );
            }
        }
        assert!(narrow > 0, "{dataflow:?}: no GEMM narrower than the array");
    }
}
