//! Stuck-at faults that outlast one instruction (up to the whole step, as campaigns draw them)
//! act on every instruction, transfer or GEMM of the site's unit that runs while they are
//! active: a register stuck-at on each instruction it overlaps, a DMA address-register stuck-at
//! on each transfer, a sequencer stuck-at on each GEMM's fold loop. The report names the first
//! instruction whose outputs the fault corrupts, and a stuck-at that starts while its unit is
//! idle is no longer masked when it lasts into the unit's next instruction.

use faultline_graph::ModelSpec;
use faultline_hw::isa::ExecUnit;
use faultline_hw::{ExecMode, HwConfig};
use faultline_num::BitFault;
use faultline_train::{data::source, inject, InjectionReport, StepFault, TrainOptions, TrainState, Trainer};
use std::collections::BTreeSet;
use std::path::Path;

/// mlp-digits on tpu-32x32, batch 8, stepping in `mode`.
fn trainer(mode: ExecMode) -> Trainer {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec = ModelSpec::load(root.join("models/mlp-digits.ron")).unwrap();
    let hw = HwConfig::load(root.join("configs/tpu-32x32.ron")).unwrap();
    let data = source::shipped(&spec, 1, &Default::default()).unwrap();
    Trainer::new(&spec, &hw, data, TrainOptions { batch: 8, eval_every: 0, mode, ..TrainOptions::default() }).unwrap()
}

/// A step's loss and state, as bits (a fault may leave NaNs, unequal to themselves).
type Bits = (u64, Vec<(String, Vec<u32>)>);

/// The first step from `snap` with the upset `upset` (none: fault-free): its report and bits.
/// The trainer is put back at `snap`.
fn step(t: &mut Trainer, snap: &TrainState, upset: &[StepFault]) -> (Option<InjectionReport>, Bits) {
    t.restore_snapshot(snap);
    let r = t.step_with_upset(upset).unwrap();
    let state = t.state.tensors.iter().map(|(k, v)| (k.clone(), v.bits())).collect();
    t.restore_snapshot(snap);
    (r.injection, (r.loss.to_bits(), state))
}

/// [`step`] with one fault, which must be reported.
fn faulty(t: &mut Trainer, snap: &TrainState, f: StepFault) -> (InjectionReport, Bits) {
    let (r, bits) = step(t, snap, &[f]);
    (r.expect("a faulty step is reported"), bits)
}

/// A stuck-at-1 on `site` in step 1 from `cycle` for `duration` cycles.
fn stuck1(site: &str, cycle: u64, duration: u64) -> StepFault {
    StepFault { kind: BitFault::StuckAt1, site: site.parse().unwrap(), step: 1, cycle, duration }
}

/// The instructions of the step on `unit`, in program order.
fn on(t: &Trainer, unit: ExecUnit) -> Vec<usize> {
    (0..t.schedule.instrs.len()).filter(|&i| t.schedule.instrs[i].unit == unit).collect()
}

/// A stuck-at on a partial sum of the PE every GEMM uses, lasting the whole step (from cycle
/// 0, while the MXU is idle), corrupts every GEMM: it is reported on the first GEMM, exactly
/// as the same stuck-at over that GEMM alone, and the step differs from the same stuck-at
/// placed on any one GEMM.
#[test]
fn a_whole_step_psum_stuck_at_corrupts_every_gemm() {
    let mut t = trainer(ExecMode::Functional);
    let snap = t.snapshot();
    let sched = t.schedule.clone();
    let gemms = on(&t, ExecUnit::Mxu);
    assert!(gemms.len() >= 3, "{gemms:?}");
    let site = "mxu.pe[0][0].psum[30]";
    let (_, golden) = step(&mut t, &snap, &[]);
    let (rep, long) = faulty(&mut t, &snap, stuck1(site, 0, sched.total_cycles));
    assert!(!rep.masked() && rep.unit_busy, "the MXU idles at cycle 0, but the stuck-at lasts: {rep}");
    assert_eq!((rep.instr, rep.op.as_str(), rep.tile, rep.tile_cycle), (gemms[0], "gemm", Some(0), Some(0)), "{rep}");
    assert!(long != golden, "{rep}");
    for &g in &gemms {
        let c = sched.instrs[g];
        let (alone, one) = faulty(&mut t, &snap, stuck1(site, c.start, c.cycles));
        assert!(!alone.masked() && alone.instr == g, "GEMM {g} alone: {alone}");
        if g == gemms[0] {
            // Same instruction, same inputs, same fault in it: the same effect.
            let effect = |r: &InjectionReport| (r.corrupted, r.elements, r.max_abs_error.to_bits(), r.buffer.clone());
            assert_eq!(effect(&rep), effect(&alone), "{rep} vs {alone}");
        }
        assert!(one != long, "the whole-step stuck-at must reach more than GEMM {g}: {rep} vs {alone}");
    }
}

/// A stuck-at that starts while the MXU idles before a GEMM and lasts into it acts on the GEMM
/// from its first cycle, exactly as the part of it inside the GEMM; one that ends before the
/// GEMM starts is masked.
#[test]
fn a_stuck_at_from_an_idle_mxu_into_a_gemm_is_not_masked() {
    let mut t = trainer(ExecMode::Functional);
    let snap = t.snapshot();
    let g = on(&t, ExecUnit::Mxu)[0];
    let c = t.schedule.instrs[g];
    assert!(t.schedule.locate(ExecUnit::Mxu, c.start - 10).is_none(), "the MXU idles before its first GEMM");
    let site = "mxu.pe[0][0].psum[30]";
    let (_, golden) = step(&mut t, &snap, &[]);
    let (rep, s) = faulty(&mut t, &snap, stuck1(site, c.start - 10, 40));
    assert!(!rep.masked() && rep.unit_busy, "{rep}");
    assert_eq!((rep.instr, rep.tile, rep.tile_cycle), (g, Some(0), Some(0)), "{rep}");
    let (inside, s_inside) = faulty(&mut t, &snap, stuck1(site, c.start, 30));
    assert_eq!((rep.corrupted, rep.max_abs_error.to_bits()), (inside.corrupted, inside.max_abs_error.to_bits()));
    assert!(s == s_inside && s != golden, "{rep} vs {inside}");
    let (rep, s) = faulty(&mut t, &snap, stuck1(site, c.start - 10, 10));
    assert!(rep.masked() && !rep.unit_busy && s == golden, "it ends as the GEMM starts: {rep}");
}

/// With several faulted GEMMs the report names the first whose outputs the fault corrupts: a
/// stuck-at on a column of the array that the fc2 forward GEMM (10 output columns) leaves
/// unused, lasting from its start into the next GEMM (64 output columns), is masked in the
/// first and reported on the second, as that GEMM's fault alone (the first left the step
/// unchanged, so the second's inputs are the fault-free ones).
#[test]
fn the_report_names_the_first_gemm_the_fault_corrupts() {
    let mut t = trainer(ExecMode::Functional);
    let snap = t.snapshot();
    let p = t.exec.program();
    let gemms = on(&t, ExecUnit::Mxu);
    let n = |g: usize| match p.instrs[g] {
        faultline_hw::isa::Instr::Gemm { n, .. } => n,
        _ => unreachable!(),
    };
    let k = gemms.windows(2).position(|w| n(w[0]) <= 20 && n(w[1]) > 20).expect("a narrow GEMM before a wide one");
    let (narrow, wide) = (gemms[k], gemms[k + 1]);
    let (cn, cw) = (t.schedule.instrs[narrow], t.schedule.instrs[wide]);
    let site = "mxu.pe[0][20].psum[30]";
    let (r, _) = faulty(&mut t, &snap, stuck1(site, cn.start, cn.cycles));
    assert!(r.masked() && r.unit_busy && r.instr == narrow, "column 20 is unused by GEMM {narrow}: {r}");
    let (alone, s_alone) = faulty(&mut t, &snap, stuck1(site, cw.start, cw.cycles));
    assert!(!alone.masked() && alone.instr == wide, "{alone}");
    let (rep, s) = faulty(&mut t, &snap, stuck1(site, cn.start, cw.start + cw.cycles - cn.start));
    assert_eq!((rep.instr, rep.tile, rep.tile_cycle), (wide, Some(0), Some(0)), "{rep}");
    assert_eq!((rep.op.as_str(), &rep.node, &rep.buffer), (alone.op.as_str(), &alone.node, &alone.buffer), "{rep}");
    assert_eq!((rep.corrupted, rep.elements), (alone.corrupted, alone.elements), "{rep}");
    assert!(s == s_alone, "{rep}");
}

/// A DMA source-address stuck-at lasting from the first transfer's data phase to the end of
/// the step misdirects every transfer's reads, not just the first's.
#[test]
fn a_long_dma_address_stuck_at_misdirects_every_transfer() {
    let mut t = trainer(ExecMode::Functional);
    let snap = t.snapshot();
    let sched = t.schedule.clone();
    let ovh = t.exec.program().dma_overhead;
    let dmas = on(&t, ExecUnit::Dma);
    let c = sched.instrs[dmas[0]];
    let from = c.start + ovh;
    let site = "dma.src_addr[3]";
    let long = stuck1(site, from, sched.total_cycles - from);
    let (inj, _) = inject::resolve(&t.exec, &sched, &long).unwrap();
    let struck: BTreeSet<usize> = inj.unwrap().hits().iter().filter_map(|h| h.instr).collect();
    assert!(struck.iter().all(|i| dmas.contains(i)), "a source address changes what transfers read: {struck:?}");
    assert!(struck.len() > dmas.len() / 2, "most transfers have a word with address bit 3 clear: {struck:?}");
    let (rep, s) = faulty(&mut t, &snap, long);
    assert!(!rep.masked() && rep.instr == dmas[0], "{rep}");
    let (first, s_first) = faulty(&mut t, &snap, stuck1(site, from, c.start + c.cycles - from));
    assert!(!first.masked() && first.instr == dmas[0], "{first}");
    assert!(rep.corrupted > first.corrupted && s != s_first, "{rep} vs {first}");
}

/// A tile-counter stuck-at lasting from the first GEMM's issue to the end of the step changes
/// every GEMM's fold loop, not just the first's; from cycle 0 (the MXU idle) it is not masked,
/// and its report counts the first GEMM's changed words.
#[test]
fn a_long_sequencer_stuck_at_changes_every_gemm() {
    let mut t = trainer(ExecMode::Functional);
    let snap = t.snapshot();
    let sched = t.schedule.clone();
    let g = on(&t, ExecUnit::Mxu)[0];
    let c = sched.instrs[g];
    let site = "seq.tile[0]";
    let (_, golden) = step(&mut t, &snap, &[]);
    let (rep, s) = faulty(&mut t, &snap, stuck1(site, c.start, sched.total_cycles - c.start));
    assert!(!rep.masked() && rep.unit_busy && rep.instr == g, "{rep}");
    let (first, s_first) = faulty(&mut t, &snap, stuck1(site, c.start, c.cycles));
    assert!(!first.masked() && first.instr == g, "{first}");
    assert!(s != s_first && s != golden, "{rep} vs {first}");
    // From cycle 0, with the MXU idle: the counter is loaded at each GEMM's issue, so this is
    // the stuck-at from the cycle before the first GEMM (which acts on its first read too).
    let (rep0, s0) = faulty(&mut t, &snap, stuck1(site, 0, sched.total_cycles));
    let (rep1, s1) = faulty(&mut t, &snap, stuck1(site, c.start - 1, sched.total_cycles - c.start + 1));
    assert!(!rep0.masked() && rep0.instr == g && s0 == s1 && s0 != s, "{rep0} vs {rep1}");
    assert!(rep0.corrupted <= rep0.elements, "the count is the first GEMM's: {rep0}");
}

/// Long stuck-ats (and an upset of two bits) give the same report, loss and state bits in a
/// functional step (only the faulted instructions at cycle level) and a cycle-level step.
#[test]
fn long_stuck_ats_are_bit_identical_in_functional_and_cycle_level_steps() {
    let mut f = trainer(ExecMode::Functional);
    let mut c = trainer(ExecMode::CycleLevel);
    let (sf, sc) = (f.snapshot(), c.snapshot());
    let total = f.schedule.total_cycles;
    let vpu0 = f.schedule.instrs[on(&f, ExecUnit::Vpu)[0]].start;
    let upsets = [
        vec![stuck1("mxu.pe[0][0].psum[30]", 0, total)],
        vec![stuck1("mxu.pe[3][2].weight[14]", 100, total - 100)],
        vec![stuck1("vpu.lane[0].out[30]", vpu0 + 3, total - vpu0 - 3)],
        vec![stuck1("vpu.lane[1].a[29]", 0, total)],
        vec![stuck1("dma.dst_addr[4]", 0, total)],
        vec![stuck1("seq.tile[0]", 0, total)],
        vec![stuck1("seq.acc_addr[2]", 0, total)],
        vec![stuck1("mxu.pe[0][0].psum[30]", 0, total), stuck1("mxu.pe[0][0].psum[29]", 0, total)],
    ];
    for upset in upsets {
        let (rf, bf) = step(&mut f, &sf, &upset);
        let (rc, bc) = step(&mut c, &sc, &upset);
        let (rf, rc) = (rf.unwrap(), rc.unwrap());
        assert_eq!(rf, rc);
        assert!(bf == bc, "{rf}: functional and cycle-level steps differ");
        if upset[0].site.unit != faultline_hw::Unit::Seq || upset[0].site.register != faultline_hw::Register::AccAddr {
            assert!(!rf.masked(), "pick a live fault: {rf}");
        }
    }
}
