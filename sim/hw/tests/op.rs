//! Whole ops through DMA, SRAM, MXU/VPU: twin equality, memory and control faults, timing.

use faultline_hw::fault::{FaultEvent, FaultSchedule};
use faultline_hw::fault::{FaultSite, Register, SiteClass, Unit};
use faultline_hw::mxu;
use faultline_hw::op::{self, ConvShape, OpKind};
use faultline_hw::{Dataflow, ExecMode, HwConfig, HwError, Matrix};
use faultline_num::{f32_to_bf16_bits, Precision};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn cfg(r: usize, c: usize, df: Dataflow) -> HwConfig {
    HwConfig::test_config(r, c, df, Precision::Bf16Fp32)
}

fn bf16s(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| f32_to_bf16_bits(rng.gen_range(-2.0f32..2.0))).collect()
}

fn f32s(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-3.0f32..3.0).to_bits()).collect()
}

fn inputs_for(kind: &OpKind, seed: u64) -> Vec<Vec<u32>> {
    inputs_prec(kind, seed, Precision::Bf16Fp32)
}

fn inputs_prec(kind: &OpKind, seed: u64, prec: Precision) -> Vec<Vec<u32>> {
    let gemm = matches!(kind, OpKind::Matmul { .. } | OpKind::Conv2d(_));
    kind.input_lens()
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let s = seed.wrapping_mul(7).wrapping_add(i as u64);
            let mut v = match (gemm, prec) {
                (true, Precision::Bf16Fp32) => bf16s(l, s),
                (true, Precision::Int8Int32) => bf16s(l, s).iter().map(|&b| b & 0xff).collect(),
                _ => f32s(l, s),
            };
            if let OpKind::Adam { .. } = kind {
                if i == 3 {
                    // Second moments are non-negative.
                    v.iter_mut().for_each(|b| *b &= 0x7fff_ffff);
                }
            }
            v
        })
        .collect()
}

fn run(
    c: &HwConfig,
    kind: &OpKind,
    ins: &[Vec<u32>],
    mode: ExecMode,
    f: &FaultSchedule,
) -> Result<op::OpOutput, HwError> {
    let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
    op::run(c, kind, &refs, mode, f)
}

fn golden(c: &HwConfig, kind: &OpKind, ins: &[Vec<u32>]) -> Vec<Vec<u32>> {
    run(c, kind, ins, ExecMode::Functional, &FaultSchedule::none()).unwrap().out
}

fn faulty(c: &HwConfig, kind: &OpKind, ins: &[Vec<u32>], e: FaultEvent) -> Vec<Vec<u32>> {
    run(c, kind, ins, ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap().out
}

/// A config with a slow DRAM so that DMA word times are spread out.
fn slow(mut c: HwConfig, bw: f64, lat: u64) -> HwConfig {
    c.dram.bandwidth_bytes_per_cycle = bw;
    c.dram.latency_cycles = lat;
    c.dma.setup_cycles = 3;
    c
}

fn any_kind() -> impl Strategy<Value = OpKind> {
    prop_oneof![
        (1usize..9, 1usize..11, 1usize..9).prop_map(|(m, k, n)| OpKind::Matmul { m, k, n }),
        (1usize..3, 2usize..6, 2usize..6, 1usize..4, 1usize..6, 1usize..3, 0usize..2).prop_map(
            |(b, h, w, ci, co, s, p)| {
                OpKind::Conv2d(ConvShape {
                    batch: b,
                    h,
                    w,
                    c_in: ci,
                    c_out: co,
                    kh: 2.min(h),
                    kw: 2.min(w),
                    stride: s,
                    pad: p,
                })
            }
        ),
        (1usize..40).prop_map(|n| OpKind::Relu { n }),
        (1usize..5, 1usize..9).prop_map(|(rows, cols)| OpKind::Softmax { rows, cols }),
        (1usize..30).prop_map(|n| OpKind::Adam { n, lr: 1e-2, b1: 0.9, b2: 0.999, eps: 1e-8, t: 3 }),
    ]
}

/// Every dataflow.
const DATAFLOWS: [Dataflow; 3] = [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Results through the full memory path equal the functional twin, bit for bit, for any
    /// dataflow, bandwidth and buffering; and the timing is the same in both modes.
    #[test]
    fn memory_path_equals_functional_twin(kind in any_kind(), df in 0usize..3, prec in 0usize..3, bw in prop_oneof![Just(f64::INFINITY), Just(3.0), Just(64.0)],
                                          buffers in 1usize..3, seed in any::<u64>()) {
        let df = DATAFLOWS[df];
        let prec = Precision::ALL[prec];
        let mut c = slow(HwConfig::test_config(3, 4, df, prec), bw, 5);
        c.dma.buffers = buffers;
        c.vpu.lanes = 3;
        c.vpu.pipeline_depth = 2;
        let ins = inputs_prec(&kind, seed, prec);
        let f = run(&c, &kind, &ins, ExecMode::Functional, &FaultSchedule::none()).unwrap();
        let s = run(&c, &kind, &ins, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap();
        prop_assert_eq!(&f.out, &s.out);
        prop_assert_eq!(&f.timing, &s.timing);
    }
}

#[test]
fn conv_twin_matches_explicit_im2col_gemm() {
    let c = cfg(4, 4, Dataflow::WeightStationary);
    let cv = ConvShape { batch: 1, h: 5, w: 5, c_in: 3, c_out: 6, kh: 3, kw: 3, stride: 1, pad: 1 };
    let kind = OpKind::Conv2d(cv);
    let ins = inputs_for(&kind, 1);
    let (_, k, n) = cv.gemm();
    let w = Matrix { rows: k, cols: n, data: ins[1].clone() };
    let want = mxu::gemm(&c, &cv.im2col(&ins[0]), &w, ExecMode::Functional, &FaultSchedule::none()).unwrap().out.data;
    assert_eq!(run(&c, &kind, &ins, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap().out[0], want);
}

/// Matmul 6x4x4 on a 4x4 WS array (one fold), DRAM latency 10 + setup 3: A and W land at 13,
/// when fold 0 starts.
fn small_matmul() -> (HwConfig, OpKind, Vec<Vec<u32>>) {
    let c = slow(cfg(4, 4, Dataflow::WeightStationary), f64::INFINITY, 10);
    let kind = OpKind::Matmul { m: 6, k: 4, n: 4 };
    let ins = inputs_for(&kind, 3);
    (c, kind, ins)
}

fn matmul_with_a(c: &HwConfig, a: &[u32], w: &[u32], m: usize, k: usize, n: usize) -> Vec<u32> {
    let a = Matrix { rows: m, cols: k, data: a.to_vec() };
    let w = Matrix { rows: k, cols: n, data: w.to_vec() };
    mxu::gemm(c, &a, &w, ExecMode::Functional, &FaultSchedule::none()).unwrap().out.data
}

#[test]
fn ub_flip_corrupts_exactly_the_element_read_after_it() {
    let (c, kind, ins) = small_matmul();
    let t = op::timing(&c, &kind).unwrap();
    // Infinite bandwidth: every word of the A and W loads lands at 0 + 3 + 10 = 13 (the two
    // requests are pipelined); fold 0 starts there.
    assert_eq!(t.tiles[0].compute_start, 13);
    // A[2][1] is UB word 9, read at cs + 1 + 2 + 1 = 17. Flip bit 14 at cycle 15.
    let e = FaultEvent::flip(FaultSite::word(Unit::Ub, 9, 14), 0, 15);
    let got = faulty(&c, &kind, &ins, e);
    let mut a = ins[0].clone();
    a[9] ^= 1 << 14;
    assert_eq!(got[0], matmul_with_a(&c, &a, &ins[1], 6, 4, 4));
    assert_ne!(got, golden(&c, &kind, &ins));
    // Flipped at 17 the read at 17 does not see it (commit boundary); nor before the load (12).
    for cyc in [17, 12] {
        let e = FaultEvent::flip(FaultSite::word(Unit::Ub, 9, 14), 0, cyc);
        assert_eq!(faulty(&c, &kind, &ins, e), golden(&c, &kind, &ins), "cycle {cyc}");
    }
    // A flip of a bit above the bf16 element (UB words are 32 bits) does not reach the MXU.
    let e = FaultEvent::flip(FaultSite::word(Unit::Ub, 9, 20), 0, 15);
    assert_eq!(faulty(&c, &kind, &ins, e), golden(&c, &kind, &ins));
}

#[test]
fn acc_flip_corrupts_one_output_and_weight_slot_refill_erases_flips() {
    let (c, kind, ins) = small_matmul();
    let t = op::timing(&c, &kind).unwrap();
    // Fold 0 starts at 13; row 5 is written at 13 + 5 + 4 + 4 = 26, the store starts at 27.
    assert_eq!(t.tiles[0].ready, 27);
    let e = FaultEvent::flip(FaultSite::word(Unit::Acc, 5 * 4 + 2, 31), 0, 26);
    let got = faulty(&c, &kind, &ins, e);
    let mut want = golden(&c, &kind, &ins);
    want[0][5 * 4 + 2] ^= 1 << 31;
    assert_eq!(got, want);

    // K = 12 on a 4x4 array: three folds share two weight slots; fold 2 refills slot 0. At
    // 4 bytes/cycle word 0 of the refill lands 8 cycles before fold 2 starts.
    let c = slow(cfg(4, 4, Dataflow::WeightStationary), 4.0, 10);
    let kind = OpKind::Matmul { m: 2, k: 12, n: 4 };
    let ins = inputs_for(&kind, 5);
    let t = op::timing(&c, &kind).unwrap();
    let refill = t.transfers.iter().find(|tr| tr.tile == 2).unwrap();
    assert_eq!(refill.end, t.tiles[2].compute_start);
    // Fold 0 reads wbuf word 0 at its start; flipping it after that and before the refill is
    // dead (the word is overwritten before it is read again).
    let cyc = t.tiles[0].compute_start + 1;
    assert!(cyc < refill.start + 13);
    let e = FaultEvent::flip(FaultSite::word(Unit::Wbuf, 0, 3), 0, cyc);
    assert_eq!(faulty(&c, &kind, &ins, e), golden(&c, &kind, &ins));
    // Flipped after the refill wrote it and before fold 2's read, it corrupts W[8][0].
    let at = t.tiles[2].compute_start - 1 - t.tiles[2].origin;
    let e = FaultEvent::flip(FaultSite::word(Unit::Wbuf, 0, 3), 2, at);
    let mut w = ins[1].clone();
    w[8 * 4] ^= 1 << 3;
    assert_eq!(faulty(&c, &kind, &ins, e)[0], matmul_with_a(&c, &ins[0], &w, 2, 12, 4));
}

#[test]
fn acc_address_flip_writes_rows_to_the_predicted_wrong_address() {
    let (c, kind, ins) = small_matmul();
    let g = golden(&c, &kind, &ins)[0].clone();
    let row = |r: usize| g[r * 4..r * 4 + 4].to_vec();
    // Rows are written at 13 + m + 8: row 0 at 21, row 1 at 22. Flip bit 3 of acc_addr at 21:
    // row 1 goes to 4 ^ 8 = 12 (row 3's place); the register then advances by 4 per row, so rows
    // 2, 3 land at 16, 20 (rows 4, 5) and rows 4, 5 at 24, 28 (outside the output).
    let e = FaultEvent::flip(FaultSite::control(Unit::Seq, Register::AccAddr, 3), 0, 21);
    let got = faulty(&c, &kind, &ins, e)[0].clone();
    let want: Vec<u32> = [row(0), vec![0; 4], vec![0; 4], row(1), row(2), row(3)].concat();
    assert_eq!(got, want);
}

#[test]
fn tile_counter_flip_repeats_a_tile_and_skips_another() {
    let c = cfg(4, 4, Dataflow::WeightStationary);
    // K = 8: fold 0 (k 0..4, overwrite), fold 1 (k 4..8, add).
    let kind = OpKind::Matmul { m: 3, k: 8, n: 4 };
    let ins = inputs_for(&kind, 9);
    let t = op::timing(&c, &kind).unwrap();
    // The counter increments to 1 at fold 0's start; flip bit 0 right after: slot 1 runs fold 0
    // again (overwrite with the first K half), fold 1 never runs.
    let e = FaultEvent::flip(FaultSite::control(Unit::Seq, Register::TileCounter, 0), 0, t.tiles[0].compute_start);
    let got = faulty(&c, &kind, &ins, e);
    let a: Vec<u32> = (0..3).flat_map(|m| ins[0][m * 8..m * 8 + 4].to_vec()).collect();
    assert_eq!(got[0], matmul_with_a(&c, &a, &ins[1][..16], 3, 4, 4));
}

#[test]
fn dma_source_address_flip_reads_the_wrong_dram_words() {
    // 4 bytes/cycle of bf16: 2 words per cycle; the A load (24 words) runs from 13 to 25.
    let c = slow(cfg(4, 4, Dataflow::WeightStationary), 4.0, 10);
    let kind = OpKind::Matmul { m: 6, k: 4, n: 4 };
    let ins = inputs_for(&kind, 3);
    // Word i moves at 13 + floor(i / 2). Flip src bit 4 at cycle 18: words 12.. (moved at 19..)
    // read from golden + 16 instead (12 ^ 16 = 28, and the register keeps counting up from
    // there): A words 12..23 read DRAM words 28..39, which hold W[1..4][..] (W starts at 24).
    let e = FaultEvent::flip(FaultSite::control(Unit::Dma, Register::SrcAddr, 4), 0, 18);
    let got = faulty(&c, &kind, &ins, e);
    let dram: Vec<u32> = [ins[0].clone(), ins[1].clone()].concat();
    let a: Vec<u32> = (0..24).map(|i| if i < 12 { ins[0][i] } else { dram[i + 16] }).collect();
    assert_eq!(got[0], matmul_with_a(&c, &a, &ins[1], 6, 4, 4));
}

#[test]
fn vpu_op_ub_flip_and_lane_fault() {
    // 4 bytes/cycle: fp32 word i of the input lands at 13 + i; the chunk starts at 23.
    let c = slow(cfg(4, 4, Dataflow::WeightStationary), 4.0, 10);
    let kind = OpKind::Relu { n: 10 };
    let ins = vec![(0..10).map(|i| (i as f32 + 1.0).to_bits()).collect::<Vec<u32>>()];
    let t = op::timing(&c, &kind).unwrap();
    assert_eq!(t.tiles[0].compute_start, 23);
    // Input element 7 is UB word 7, written at 20 and read at the chunk's start: flip its sign
    // at 21. Flipped at 19 it is overwritten by the load.
    let dead = FaultEvent::flip(FaultSite::word(Unit::Ub, 7, 31), 0, 19);
    assert_eq!(faulty(&c, &kind, &ins, dead), ins);
    let e = FaultEvent::flip(FaultSite::word(Unit::Ub, 7, 31), 0, 21);
    let mut want = ins[0].clone();
    want[7] = 0; // relu(-8) = +0
    assert_eq!(faulty(&c, &kind, &ins, e)[0], want);
    // Vector 2 (elements 8, 9) is read at 23 + 2 = 25: a flip of word 9 at 24 reaches it.
    let e = FaultEvent::flip(FaultSite::word(Unit::Ub, 9, 31), 0, 24);
    let mut want = ins[0].clone();
    want[9] = 0;
    assert_eq!(faulty(&c, &kind, &ins, e)[0], want);
    // Outputs live at UB words 10.. (slot 0: 10 inputs then 10 outputs, chunk = 10). Output 9
    // is written back at 23 + 2 + 0 + 1 + 1 = 27 and stored after the chunk (ready = 23 + 5):
    // a flip at 27 corrupts the stored value, one at 26 is overwritten by the write-back.
    assert_eq!(t.tiles[0].ready, 28);
    let e = FaultEvent::flip(FaultSite::word(Unit::Ub, 19, 0), 0, 27);
    let mut want = ins[0].clone();
    want[9] ^= 1;
    assert_eq!(faulty(&c, &kind, &ins, e)[0], want);
    let e = FaultEvent::flip(FaultSite::word(Unit::Ub, 19, 0), 0, 26);
    assert_eq!(faulty(&c, &kind, &ins, e), ins);
    // A lane result register fault: vector 1 (elements 4..8) latches out at 1 + 1 = 2 (D = 1).
    let e = FaultEvent::flip(FaultSite::lane(2, Register::LaneOut, 0), 0, 2);
    let mut want = ins[0].clone();
    want[6] ^= 1;
    assert_eq!(faulty(&c, &kind, &ins, e)[0], want);
}

#[test]
fn infinite_bandwidth_op_time_is_mxu_time() {
    for df in DATAFLOWS {
        let c = cfg(4, 5, df);
        for (m, k, n) in [(7, 9, 11), (1, 1, 1), (16, 4, 5)] {
            let t = op::timing(&c, &OpKind::Matmul { m, k, n }).unwrap();
            let mx = mxu::gemm_timing(&c.mxu, m, k, n);
            assert_eq!(t.total_cycles, mx.total_cycles, "{df:?} {m}x{k}x{n}");
            assert_eq!(t.compute_cycles, mx.total_cycles);
            assert_eq!(t.stall_cycles, 0);
        }
        let cv = ConvShape { batch: 2, h: 6, w: 5, c_in: 3, c_out: 7, kh: 3, kw: 3, stride: 1, pad: 1 };
        let (m, k, n) = cv.gemm();
        let t = op::timing(&c, &OpKind::Conv2d(cv)).unwrap();
        assert_eq!(t.total_cycles, mxu::gemm_timing(&c.mxu, m, k, n).total_cycles);
    }
}

#[test]
fn dma_bound_time_is_bytes_over_bandwidth_plus_documented_overhead() {
    let bw = 2.0;
    let c = slow(cfg(4, 4, Dataflow::WeightStationary), bw, 0);
    let kind = OpKind::Matmul { m: 4, k: 64, n: 16 };
    let t = op::timing(&c, &kind).unwrap();
    assert_eq!(t.bound, "dma");
    assert_eq!(t.load_bytes, (4 * 64 + 64 * 16) * 2);
    assert_eq!(t.store_bytes, 4 * 16 * 4);
    // Every transfer's data phase is ceil(bytes / B) (the SRAM ports, 32 B/cycle, are faster).
    let data: u64 = t.transfers.iter().map(|tr| (tr.bytes as f64 / bw).ceil() as u64).sum();
    assert_eq!(data, (t.load_bytes + t.store_bytes) / 2);
    for tr in &t.transfers {
        assert_eq!(tr.end - tr.start, 3 + (tr.bytes as f64 / bw).ceil() as u64);
    }
    // The documented bound: one overhead before the first data, the data phases back to back,
    // and before the last store the last fold's latency (4 + 4 + 4) plus one more overhead.
    let overhead = 3;
    assert!(t.total_cycles >= overhead + data);
    assert_eq!(t.total_cycles, overhead + data + 12 + overhead);
}

#[test]
fn double_buffering_hides_loads_when_compute_bound() {
    // 4x4 WS, M = 16: one fold every 16 cycles; a weight tile (32 bytes) loads in
    // 3 + 4 + 4 = 11 cycles, once its slot is released 7 cycles into the fold two back. Only
    // the first load is exposed; every later one overlaps compute. With a single buffer the
    // load for fold f+1 can start only 7 cycles into fold f and ends 2 cycles too late.
    let c = slow(cfg(4, 4, Dataflow::WeightStationary), 8.0, 4);
    let kind = OpKind::Matmul { m: 16, k: 32, n: 4 };
    let t = op::timing(&c, &kind).unwrap();
    assert_eq!(t.bound, "dma", "the first load and the last store are exposed");
    assert_eq!(t.stall_cycles, t.tiles[0].compute_start, "only fold 0 waited for data");
    let mx = mxu::gemm_timing(&c.mxu, 16, 32, 4).total_cycles;
    let last_store = t.transfers.last().unwrap();
    assert_eq!(t.total_cycles, last_store.end);
    assert_eq!(t.total_cycles, t.tiles[0].compute_start + mx + (last_store.end - last_store.start));
    // With one buffer every load waits for the previous fold: strictly slower.
    let mut c1 = c.clone();
    c1.dma.buffers = 1;
    let t1 = op::timing(&c1, &kind).unwrap();
    assert_eq!(t1.stall_cycles, t.stall_cycles + 7 * 2);
    assert_eq!(t1.total_cycles, t.total_cycles + 7 * 2);
}

#[test]
fn sram_overflow_is_a_clear_error_not_a_panic() {
    let mut c = cfg(4, 4, Dataflow::WeightStationary);
    c.memory.unified_buffer.bytes = 4096;
    let kind = OpKind::Matmul { m: 64, k: 32, n: 4 };
    let e = op::timing(&c, &kind).unwrap_err().to_string();
    assert!(
        e.contains("matmul 64x32x4") && e.contains("unified buffer") && e.contains("8192") && e.contains("4096"),
        "{e}"
    );
    assert!(e.contains("memory.unified_buffer.bytes"), "{e}");
    let ins = inputs_for(&kind, 0);
    assert!(run(&c, &kind, &ins, ExecMode::CycleLevel, &FaultSchedule::none()).is_err());
    // A softmax row that cannot fit two buffers of (input + output).
    let e = op::timing(&c, &OpKind::Softmax { rows: 2, cols: 300 }).unwrap_err().to_string();
    assert!(e.contains("softmax 2x300") && e.contains("4800") && e.contains("4096"), "{e}");
    // Accumulator too small for the output.
    c.memory.unified_buffer.bytes = 1 << 20;
    c.memory.accumulator.bytes = 1024;
    let e = op::timing(&c, &OpKind::Matmul { m: 64, k: 4, n: 8 }).unwrap_err().to_string();
    assert!(e.contains("accumulator") && e.contains("2048") && e.contains("1024"), "{e}");
    // Large VPU inputs are cut into chunks instead.
    c.memory.unified_buffer.bytes = 4096;
    let kind = OpKind::Adam { n: 1000, lr: 0.1, b1: 0.9, b2: 0.99, eps: 1e-6, t: 1 };
    let t = op::timing(&c, &kind).unwrap();
    assert!(t.tiles.len() > 1);
    let ins = inputs_for(&kind, 2);
    assert_eq!(
        run(&c, &kind, &ins, ExecMode::CycleLevel, &FaultSchedule::none()).unwrap().out,
        golden(&c, &kind, &ins)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// A flip of any bit of any UB word holding an activation corrupts exactly that element iff
    /// it strikes after the DMA wrote the word and before the MXU read it; otherwise nothing.
    #[test]
    fn ub_flip_hits_exactly_its_element_between_write_and_read(m in 1usize..6, k in 1usize..10, n in 1usize..5,
                                                               word in any::<usize>(), bit in 0u32..16, cyc in 0u64..120, seed in any::<u64>()) {
        let c = slow(cfg(3, 4, Dataflow::WeightStationary), 4.0, 2);
        let kind = OpKind::Matmul { m, k, n };
        let ins = inputs_for(&kind, seed);
        let t = op::timing(&c, &kind).unwrap();
        let word = word % (m * k);
        let (mi, ki) = (word / k, word % k);
        // The A load is the first transfer: word i (2 bytes) lands at start + 5 + floor(2i / 4).
        let written = t.transfers[0].start + 5 + (word as u64 * 2) / 4;
        let (f, i) = (ki / 3, ki % 3);
        let read = t.tiles[f].compute_start + 1 + (mi + i) as u64;
        // A fault after the op ends is an error (`fault_times_past_the_op_are_errors`).
        let cyc = cyc % t.total_cycles;
        let e = FaultEvent::flip(FaultSite::word(Unit::Ub, word as u64, bit), 0, cyc);
        let got = faulty(&c, &kind, &ins, e);
        let want = if (written..read).contains(&cyc) {
            let mut a = ins[0].clone();
            a[word] ^= 1 << bit;
            vec![matmul_with_a(&c, &a, &ins[1], m, k, n)]
        } else {
            golden(&c, &kind, &ins)
        };
        prop_assert_eq!(got, want);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Hybrid execution (only faulted tiles stepped) equals full cycle-level execution for any
    /// single fault on any site class the op uses.
    #[test]
    fn hybrid_equals_cycle_level(kind in any_kind(), class in any::<usize>(), idx in any::<u64>(), tile in any::<usize>(),
                                 cyc in 0u64..150, stuck in any::<bool>(), seed in any::<u64>()) {
        let c = slow(cfg(3, 4, Dataflow::WeightStationary), 8.0, 3);
        let ins = inputs_for(&kind, seed);
        let t = op::timing(&c, &kind).unwrap();
        let (site, tile, origin) = op_site(&c, &kind, &t, class, idx, tile);
        // Inside the op: one after its end is an error (`fault_times_past_the_op_are_errors`).
        let cyc = cyc % (t.total_cycles - origin);
        let e = if stuck { FaultEvent::stuck(site, true, tile, cyc, 5) } else { FaultEvent::flip(site, tile, cyc) };
        let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
        let f = FaultSchedule::one(e);
        let full = op::run(&c, &kind, &refs, ExecMode::CycleLevel, &f).unwrap();
        let hybrid = op::run_hybrid(&c, &kind, &refs, &f).unwrap();
        prop_assert_eq!(full, hybrid);
    }
}

/// A site of a class the op uses (picked by `class` and `idx`; memory sites among the first 64
/// words, where the op's data lives), a tile, and the origin its fault times count from.
fn op_site(
    c: &HwConfig,
    kind: &OpKind,
    t: &faultline_hw::timing::OpTiming,
    class: usize,
    idx: u64,
    tile: usize,
) -> (FaultSite, usize, u64) {
    let gemm = matches!(kind, OpKind::Matmul { .. } | OpKind::Conv2d(_));
    let classes: Vec<SiteClass> = SiteClass::all(c)
        .into_iter()
        .filter(|k| match k.unit {
            Unit::Mxu | Unit::Acc | Unit::Wbuf => gemm,
            Unit::Vpu => !gemm,
            _ => true,
        })
        .collect();
    let class = classes[class % classes.len()];
    let site = class.site_at(c, idx % class.bit_count(c).min(64 * class.width(c) as u64)).unwrap();
    let tile = tile % t.tiles.len();
    // The array's faults count from the fold's start in its own continuous schedule, which
    // starts at the first tile's compute start.
    let origin = match (site.unit, kind.gemm_dims()) {
        (Unit::Mxu, Some((m, k, n))) => {
            t.tiles[0].compute_start + mxu::Schedule::new(&c.mxu, m, k, n).unwrap().folds[tile].start
        }
        (Unit::Mxu | Unit::Vpu, _) => t.tiles[tile].compute_start,
        _ => t.tiles[tile].origin,
    };
    (site, tile, origin)
}

#[test]
fn dram_faults_when_enabled() {
    let (mut c, kind, ins) = small_matmul();
    let e = FaultEvent::flip(FaultSite::word(Unit::Dram, 9, 14), 0, 5);
    let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
    let err = op::run(&c, &kind, &refs, ExecMode::CycleLevel, &FaultSchedule::one(e)).unwrap_err().to_string();
    assert!(err.contains("fault_sites"), "{err}");
    c.dram.fault_sites = true;
    // DRAM word 9 is A[2][1]; the DMA reads it at 13: a flip at 5 is loaded, one at 13 is not.
    let mut a = ins[0].clone();
    a[9] ^= 1 << 14;
    assert_eq!(faulty(&c, &kind, &ins, e)[0], matmul_with_a(&c, &a, &ins[1], 6, 4, 4));
    let late = FaultEvent::flip(FaultSite::word(Unit::Dram, 9, 14), 0, 13);
    assert_eq!(faulty(&c, &kind, &ins, late), golden(&c, &kind, &ins));
    // Words outside the op's footprint hold nothing it reads.
    let far = FaultEvent::flip(FaultSite::word(Unit::Dram, 1 << 20, 0), 0, 0);
    assert_eq!(faulty(&c, &kind, &ins, far), golden(&c, &kind, &ins));
}

// ---------------------------------------------------------------- hostile shapes, configs, times

/// Element and byte counts past 64 bits are `Shape` errors naming the op (they used to panic
/// with "capacity overflow" or wrap), and ops past the DRAM are refused before anything
/// proportional to them exists; `host_bytes` reports the same errors first.
#[test]
fn hostile_shapes_are_errors_naming_the_op() {
    let c = cfg(4, 4, Dataflow::WeightStationary);
    let adam = |n| OpKind::Adam { n, lr: 0.1, b1: 0.9, b2: 0.99, eps: 1e-6, t: 1 };
    let conv =
        |h, pad| OpKind::Conv2d(ConvShape { batch: 1, h, w: h, c_in: 64, c_out: 64, kh: 3, kw: 3, stride: 1, pad });
    for (kind, want) in [
        (
            OpKind::Matmul { m: usize::MAX, k: 1, n: 1 },
            "matmul 18446744073709551615x1x1: its inputs and outputs total more than 2^64 bytes",
        ),
        (
            OpKind::Matmul { m: 1 << 32, k: 1 << 32, n: 1 },
            "A's elements = 4294967296 x 4294967296 does not fit 64 bits",
        ),
        (adam(usize::MAX), "adam 18446744073709551615: its inputs and outputs total more than 2^64"),
        (OpKind::Softmax { rows: 1 << 40, cols: 1 << 40 }, "elements = 1099511627776 x 1099511627776 does not fit"),
        (conv(4, usize::MAX / 2), "the padded input (h or w + 2 * pad) does not fit 64 bits"),
        (conv(1 << 30, 1), "input elements = 1 x 1073741824 x 1073741824 x 64 does not fit 64 bits"),
        (OpKind::Matmul { m: 0, k: 1, n: 1 }, "every dimension must be at least 1"),
        (OpKind::Relu { n: 1_000_000_000_000 }, "needs 8000000000000 bytes of DRAM"),
        (conv(100_000, 1), "`dram.bytes`"),
        (OpKind::Matmul { m: 10_000_000, k: 32, n: 32 }, "needs 2560004096 bytes of DRAM"),
    ] {
        let e = op::timing(&c, &kind).unwrap_err().to_string();
        assert!(e.contains(want), "{kind:?}: {e}");
        for mode in [ExecMode::Functional, ExecMode::CycleLevel] {
            assert_eq!(op::host_bytes(&c, &kind, mode).unwrap_err().to_string(), e);
        }
    }
    // Saturating accessors never wrap to a small length.
    assert_eq!(OpKind::Matmul { m: 1 << 32, k: 1 << 32, n: 1 }.input_lens(), vec![usize::MAX; 2]);
}

/// A config outside its ranges (as a caller could build by hand) makes cycle counts overflow:
/// an error naming the fields that drive them, where the op used to report a wrapped total
/// (102 cycles for this matmul with `latency_cycles: 2^64 - 1`; 304 with the shipped 100).
#[test]
fn cycle_overflow_names_the_config_fields() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tpu-8x8.ron");
    let mut c = HwConfig::load(&path).unwrap();
    let kind = OpKind::Matmul { m: 16, k: 8, n: 8 };
    assert_eq!(op::timing(&c, &kind).unwrap().total_cycles, 304);
    c.dram.latency_cycles = u64::MAX;
    let e = op::timing(&c, &kind).unwrap_err().to_string();
    assert!(e.contains("matmul 16x8x8") && e.contains("`dma.setup_cycles` + `dram.latency_cycles`"), "{e}");
    assert!(c.validate(&path).unwrap_err().to_string().contains("dram.latency_cycles"));
    c.dram.latency_cycles = u64::MAX / 2;
    let e = op::timing(&c, &kind).unwrap_err().to_string();
    assert!(e.contains("overflows 64 bits") && e.contains("dram.latency_cycles"), "{e}");
    c.dram.latency_cycles = 100;
    c.dram.bandwidth_bytes_per_cycle = 1e-17;
    let e = op::timing(&c, &kind).unwrap_err().to_string();
    assert!(e.contains("dram.bandwidth_bytes_per_cycle"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// For any op, site class and tile: a fault at the op's last cycle (counted from the origin
    /// the site's path uses) is accepted in cycle and hybrid mode, one a cycle later is an error
    /// naming the site, the tile and cycle given and the op's length (it used to report
    /// nothing corrupted).
    #[test]
    fn fault_times_past_the_op_are_errors(kind in any_kind(), class in any::<usize>(), idx in any::<u64>(),
                                          tile in any::<usize>(), seed in any::<u64>()) {
        let c = slow(cfg(3, 4, Dataflow::WeightStationary), 8.0, 3);
        let ins = inputs_for(&kind, seed);
        let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
        let t = op::timing(&c, &kind).unwrap();
        let (site, tile, origin) = op_site(&c, &kind, &t, class, idx, tile);
        let last = t.total_cycles - 1 - origin;
        let ok = FaultSchedule::one(FaultEvent::flip(site, tile, last));
        prop_assert!(op::run(&c, &kind, &refs, ExecMode::CycleLevel, &ok).is_ok());
        prop_assert!(op::run_hybrid(&c, &kind, &refs, &ok).is_ok());
        let late = FaultSchedule::one(FaultEvent::flip(site, tile, last + 1));
        let e = op::run(&c, &kind, &refs, ExecMode::CycleLevel, &late).unwrap_err().to_string();
        prop_assert_eq!(op::run_hybrid(&c, &kind, &refs, &late).unwrap_err().to_string(), e.clone());
        let want = format!("cycle {} of tile {tile}", last + 1);
        prop_assert!(e.contains(&site.to_string()) && e.contains(&want), "{}", e);
        let end = format!("is after the op {} ends at cycle {}", kind.describe(), t.total_cycles);
        prop_assert!(e.contains(&end), "{}", e);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// One machine, one clock: an MXU register fault means the same in an op as in a bare GEMM
    /// (and so as in training, whose GEMMs are bare GEMMs). The op's outputs equal the GEMM's
    /// for the same fault string, whatever stalls the op's DMA puts between its folds, in both
    /// dataflows; among them faults that reach the next fold through the shadow registers.
    #[test]
    fn an_mxu_fault_means_the_same_in_an_op_and_a_gemm(
        m in 1usize..9, k in 1usize..12, n in 1usize..9, df in 0usize..3, stalls in any::<bool>(),
        reg in 0usize..6, row in 0usize..3, col in 0usize..4, bit in 0u32..16, tile in any::<usize>(),
        at in any::<u64>(), stuck in any::<bool>(), seed in any::<u64>(),
    ) {
        let df = DATAFLOWS[df];
        let c = if stalls { slow(cfg(3, 4, df), 4.0, 9) } else { cfg(3, 4, df) };
        let kind = OpKind::Matmul { m, k, n };
        let ins = inputs_for(&kind, seed);
        let s = mxu::Schedule::new(&c.mxu, m, k, n).unwrap();
        let regs = [Register::Act, Register::Valid, Register::Weight, Register::Psum, Register::WeightShadow, Register::Swap];
        let reg = match (df, regs[reg]) {
            (Dataflow::OutputStationary, Register::WeightShadow | Register::Swap) => Register::WeightValid,
            (_, r) => r,
        };
        let bit = if matches!(reg, Register::Valid | Register::Swap | Register::WeightValid) { 0 } else { bit };
        let tile = tile % s.folds.len();
        let cycle = at % (s.total_cycles - s.folds[tile].start);
        let site = FaultSite::pe(row, col, reg, bit);
        let e = if stuck { FaultEvent::stuck(site, true, tile, cycle, 7) } else { FaultEvent::flip(site, tile, cycle) };
        let f = FaultSchedule::one(e);
        let a = Matrix { rows: m, cols: k, data: ins[0].clone() };
        let w = Matrix { rows: k, cols: n, data: ins[1].clone() };
        let bare = mxu::gemm(&c, &a, &w, ExecMode::CycleLevel, &f).unwrap().out.data;
        let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
        let op = op::run(&c, &kind, &refs, ExecMode::CycleLevel, &f).unwrap();
        prop_assert_eq!(&op.out[0], &bare);
        prop_assert_eq!(op::run_hybrid(&c, &kind, &refs, &f).unwrap().out, op.out);
    }
}

/// An MXU register fault and a fault elsewhere in one op run are refused with a reason, not
/// run with one of them silently ignored.
#[test]
fn mxu_and_memory_faults_in_one_op_run_are_an_error() {
    let (c, kind, ins) = small_matmul();
    let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
    let f = FaultSchedule {
        events: vec![
            FaultEvent::flip(FaultSite::pe(0, 0, Register::Psum, 30), 0, 3),
            FaultEvent::flip(FaultSite::word(Unit::Ub, 0, 30), 0, 1),
        ],
    };
    let e = op::run(&c, &kind, &refs, ExecMode::CycleLevel, &f).unwrap_err().to_string();
    assert!(e.contains("mxu.pe[0][0].psum[30]") && e.contains("not both"), "{e}");
}
