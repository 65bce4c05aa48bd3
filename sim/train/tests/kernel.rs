//! One op run as a training step runs it (`faultline op`, [`Kernel`]): its results are its
//! units' results, both modes agree to the bit, and a fault means the same as in a bare GEMM
//! and as in training (a unified-buffer word is live from its load to its last read).

use faultline_graph::reference;
use faultline_graph::Tensor;
use faultline_hw::fault::{FaultEvent, FaultSchedule, FaultSite, Register, Unit};
use faultline_hw::isa::Instr;
use faultline_hw::kernel::{ConvShape, KernelSpec};
use faultline_hw::mxu;
use faultline_hw::{Dataflow, ExecMode, HwConfig, Matrix};
use faultline_num::{BitFault, Precision};
use faultline_train::kernel::Kernel;
use faultline_train::{MxuFormat, StepFault};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

const DATAFLOWS: [Dataflow; 3] = [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary];

fn cfg(r: usize, c: usize, df: Dataflow) -> HwConfig {
    HwConfig::test_config(r, c, df, Precision::Bf16Fp32)
}

/// Random fp32 inputs in `[-2, 2)` (Adam's second moments non-negative).
fn inputs(kind: &KernelSpec, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let adam = matches!(kind, KernelSpec::Adam { .. });
    let lens = kind.input_lens();
    let draw = |i: usize, rng: &mut ChaCha8Rng| {
        let x: f32 = rng.gen_range(-2.0..2.0);
        if adam && i == 3 { x.abs() } else { x }.to_bits()
    };
    lens.iter().enumerate().map(|(i, &l)| (0..l).map(|_| draw(i, &mut rng)).collect()).collect()
}

fn any_kind() -> impl Strategy<Value = KernelSpec> {
    prop_oneof![
        (1usize..9, 1usize..11, 1usize..9).prop_map(|(m, k, n)| KernelSpec::Matmul { m, k, n }),
        (1usize..3, 2usize..6, 2usize..6, 1usize..4, 1usize..6, 1usize..3, 0usize..2).prop_map(
            |(b, h, w, ci, co, s, p)| {
                let (kh, kw) = (2.min(h), 2.min(w));
                KernelSpec::Conv2d(ConvShape { batch: b, h, w, c_in: ci, c_out: co, kh, kw, stride: s, pad: p })
            }
        ),
        (1usize..40).prop_map(|n| KernelSpec::Relu { n }),
        (1usize..5, 1usize..9).prop_map(|(rows, cols)| KernelSpec::Softmax { rows, cols }),
        (1usize..30).prop_map(|n| KernelSpec::Adam { n, lr: 1e-2, b1: 0.9, b2: 0.999, eps: 1e-8, t: 3 }),
    ]
}

/// The MXU's operand bits of fp32 `x` in `format` (its input converter's).
fn operand(x: &[u32], format: MxuFormat) -> Vec<u32> {
    x.iter().map(|&b| faultline_hw::isa::to_input(format.input(), b)).collect()
}

/// The op's f64 reference values, output by output.
fn reference_outputs(k: &Kernel, ins: &[Vec<u32>]) -> Vec<Vec<f64>> {
    let g = &k.graph.graph;
    let mut feeds = BTreeMap::new();
    for (&node, x) in k.graph.inputs.iter().zip(ins) {
        let data = x.iter().map(|&b| f32::from_bits(b) as f64).collect();
        feeds.insert(g.node(node).name.clone(), Tensor::new(&g.node(node).shape, data).unwrap());
    }
    if let Some((node, t)) = k.graph.step {
        feeds.insert(g.node(node).name.clone(), Tensor::new(&[1], vec![t as f64]).unwrap());
    }
    let values = reference::eval(g, &feeds).unwrap();
    k.graph.outputs.iter().map(|&o| values.get(o).unwrap().data.clone()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any op on any dataflow and MXU input format: functional and cycle-level runs give the
    /// same bits and cycles; a matmul or convolution gives the bare GEMM's bits on its operands
    /// (rounded to the input format; a convolution's A is its im2col matrix), and a VPU op its
    /// f64 reference's values to fp32 rounding.
    #[test]
    fn an_op_run_is_its_units_run(kind in any_kind(), df in 0usize..3, fp32 in any::<bool>(), seed in any::<u64>()) {
        let c = cfg(3, 4, DATAFLOWS[df]);
        let format = if fp32 { MxuFormat::Fp32 } else { MxuFormat::Bf16 };
        let ins = inputs(&kind, seed);
        let f = Kernel::new(&kind, &c, ExecMode::Functional, format).unwrap();
        let cy = Kernel::new(&kind, &c, ExecMode::CycleLevel, format).unwrap();
        let (a, b) = (f.run(&ins, &[]).unwrap(), cy.run(&ins, &[]).unwrap());
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.cycles, f.schedule().total_cycles);
        prop_assert_eq!(a.outputs.iter().map(Vec::len).collect::<Vec<_>>(), kind.output_lens());
        if let Some((m, k, n)) = kind.gemm_dims() {
            let x = match kind {
                KernelSpec::Conv2d(s) => s.im2col(&ins[0]).data,
                _ => ins[0].clone(),
            };
            let am = Matrix { rows: m, cols: k, data: operand(&x, format) };
            let wm = Matrix { rows: k, cols: n, data: operand(&ins[1], format) };
            let bare = mxu::gemm(&f.hw, &am, &wm, ExecMode::Functional, &FaultSchedule::none()).unwrap();
            prop_assert_eq!(&a.outputs[0], &bare.out.data);
        } else {
            for (got, want) in a.outputs.iter().zip(reference_outputs(&f, &ins)) {
                for (&g, w) in got.iter().zip(want) {
                    let g = f32::from_bits(g) as f64;
                    prop_assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{kind:?}: {g} vs {w}");
                }
            }
        }
    }

    /// One machine, one clock: an MXU register fault struck at cycle `s + t` of an op whose
    /// GEMM starts at `s` corrupts the op's output exactly as the same fault at cycle `t` of the
    /// bare GEMM, whatever DMA time comes before the GEMM, in every dataflow; among them faults
    /// that reach the next fold through the shadow registers.
    #[test]
    fn an_mxu_fault_means_the_same_in_an_op_and_a_gemm(
        m in 1usize..9, k in 1usize..12, n in 1usize..9, df in 0usize..3,
        reg in 0usize..6, row in 0usize..3, col in 0usize..4, bit in 0u32..16,
        at in any::<u64>(), stuck in any::<bool>(), seed in any::<u64>(),
    ) {
        let df = DATAFLOWS[df];
        let c = cfg(3, 4, df);
        let kind = KernelSpec::Matmul { m, k, n };
        let ins = inputs(&kind, seed);
        let kern = Kernel::new(&kind, &c, ExecMode::Functional, MxuFormat::Bf16).unwrap();
        let regs = [Register::Act, Register::Valid, Register::Weight, Register::Psum, Register::WeightShadow, Register::Swap];
        let reg = match (df, regs[reg]) {
            (Dataflow::OutputStationary, Register::WeightShadow | Register::Swap) => Register::WeightValid,
            (_, r) => r,
        };
        let bit = if matches!(reg, Register::Valid | Register::Swap | Register::WeightValid) { 0 } else { bit };
        let sched = kern.schedule();
        let g = kern.program().instrs.iter().position(|i| matches!(i, Instr::Gemm { .. })).unwrap();
        let s = mxu::Schedule::new(&kern.hw.mxu, m, k, n).unwrap();
        let t = at % s.total_cycles;
        let site = FaultSite::pe(row, col, reg, bit);
        let (kind_f, duration) = if stuck { (BitFault::StuckAt1, 7.min(s.total_cycles - t)) } else { (BitFault::Flip, 1) };
        let fault = StepFault { kind: kind_f, site, step: 1, cycle: sched.instrs[g].start + t, duration };
        let got = kern.run(&ins, &[fault]).unwrap();
        let e = FaultEvent { site, kind: kind_f, at: faultline_hw::fault::FaultTime { tile: 0, cycle: t }, duration };
        let am = Matrix { rows: m, cols: k, data: operand(&ins[0], MxuFormat::Bf16) };
        let wm = Matrix { rows: k, cols: n, data: operand(&ins[1], MxuFormat::Bf16) };
        let bare = mxu::gemm(&kern.hw, &am, &wm, ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap();
        prop_assert_eq!(&got.outputs[0], &bare.out.data);
    }
}

/// A unified-buffer word of `A` is live from the cycle its load writes it to the cycle the GEMM
/// reads it: a flip of `A[0][0]`'s exponent then corrupts output row 0 (weight-stationary: an
/// activation error spreads along its row), and nothing before the load's write or after the
/// read, as the op page of the guide shows.
#[test]
fn a_ub_word_is_live_from_its_load_to_its_read() {
    // The shipped 8x8 machine: its DMA setup and DRAM latency put the load's first write well
    // after the load starts.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let c = HwConfig::load(root.join("configs/tpu-8x8.ron")).unwrap();
    let (m, k, n) = (16, 24, 8);
    let kind = KernelSpec::Matmul { m, k, n };
    let ins = inputs(&kind, 5);
    let kern = Kernel::new(&kind, &c, ExecMode::Functional, MxuFormat::Bf16).unwrap();
    let p = kern.program();
    let sched = kern.schedule();
    let g = p.instrs.iter().position(|i| matches!(i, Instr::Gemm { .. })).unwrap();
    let Instr::Gemm { a, .. } = &p.instrs[g] else { unreachable!() };
    let home = p.home(a.buf).unwrap();
    assert_eq!(home.mem, Unit::Ub, "A is staged into the unified buffer");
    let site = FaultSite::word(Unit::Ub, home.base, 30);
    let load = p.instrs.iter().position(|i| matches!(i, Instr::Dma { dst, .. } if *dst == a.buf)).unwrap();
    let flip = |cycle| {
        let f = StepFault { kind: BitFault::Flip, site, step: 1, cycle, duration: 1 };
        let clean = kern.run(&ins, &[]).unwrap().outputs[0].clone();
        let got = kern.run(&ins, &[f]).unwrap().outputs[0].clone();
        (0..m * n).filter(|&i| got[i] != clean[i]).collect::<Vec<_>>()
    };
    let (gs, ls) = (sched.instrs[g].start, sched.instrs[load].start);
    // WS reads A[0][0] one cycle into the GEMM; a flip at cycle c is seen by reads after c.
    assert_eq!(flip(gs), (0..n).collect::<Vec<_>>());
    assert_eq!(flip(gs + 1), Vec::<usize>::new());
    assert_eq!(flip(ls), Vec::<usize>::new(), "the load writes the word after the flip");
}

/// A fault past the op's last cycle is refused with the op's length, not reported as masked.
#[test]
fn a_fault_after_the_op_is_an_error() {
    let kind = KernelSpec::Relu { n: 40 };
    let kern =
        Kernel::new(&kind, &cfg(4, 4, Dataflow::WeightStationary), ExecMode::Functional, MxuFormat::Bf16).unwrap();
    let end = kern.schedule().total_cycles;
    let f = |cycle| StepFault::parse_on_op(&format!("flip:vpu.lane[1].out[30]@cycle={cycle}")).unwrap();
    assert!(kern.run(&inputs(&kind, 1), &[f(end - 1)]).is_ok());
    let e = kern.run(&inputs(&kind, 1), &[f(end)]).unwrap_err().to_string();
    assert!(e.contains(&format!("cycle {end} is after the op relu 40 ends at cycle {end}")), "{e}");
    let e = StepFault::parse_on_op("flip:vpu.lane[1].out[30]@step=1,cycle=3").unwrap_err().to_string();
    assert!(e.contains("unknown key `step`") && e.contains("@cycle=C"), "{e}");
}
