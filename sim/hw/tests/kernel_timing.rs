//! One op's whole-op tile timing (`faultline_hw::kernel::timing`, the SCALE-Sim comparison's cost
//! model): compute-bound and DMA-bound times, double buffering, and clear errors for ops that do
//! not fit. Running an op, with faults, is `faultline_train::kernel` (`train/tests/kernel.rs`).

use faultline_hw::kernel::{self, ConvShape, KernelSpec};
use faultline_hw::mxu;
use faultline_hw::{Dataflow, HwConfig};
use faultline_num::Precision;

fn cfg(r: usize, c: usize, df: Dataflow) -> HwConfig {
    HwConfig::test_config(r, c, df, Precision::Bf16Fp32)
}

/// A config with a slow DRAM so that DMA word times are spread out.
fn slow(mut c: HwConfig, bw: f64, lat: u64) -> HwConfig {
    c.dram.bandwidth_bytes_per_cycle = bw;
    c.dram.latency_cycles = lat;
    c.dma.setup_cycles = 3;
    c
}

/// Every dataflow.
const DATAFLOWS: [Dataflow; 3] = [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary];

#[test]
fn infinite_bandwidth_op_time_is_mxu_time() {
    for df in DATAFLOWS {
        let c = cfg(4, 5, df);
        for (m, k, n) in [(7, 9, 11), (1, 1, 1), (16, 4, 5)] {
            let t = kernel::timing(&c, &KernelSpec::Matmul { m, k, n }).unwrap();
            let mx = mxu::gemm_timing(&c.mxu, m, k, n);
            assert_eq!(t.total_cycles, mx.total_cycles, "{df:?} {m}x{k}x{n}");
            assert_eq!(t.compute_cycles, mx.total_cycles);
            assert_eq!(t.stall_cycles, 0);
        }
        let cv = ConvShape { batch: 2, h: 6, w: 5, c_in: 3, c_out: 7, kh: 3, kw: 3, stride: 1, pad: 1 };
        let (m, k, n) = cv.gemm();
        let t = kernel::timing(&c, &KernelSpec::Conv2d(cv)).unwrap();
        assert_eq!(t.total_cycles, mxu::gemm_timing(&c.mxu, m, k, n).total_cycles);
    }
}

#[test]
fn dma_bound_time_is_bytes_over_bandwidth_plus_documented_overhead() {
    let bw = 2.0;
    let c = slow(cfg(4, 4, Dataflow::WeightStationary), bw, 0);
    let kind = KernelSpec::Matmul { m: 4, k: 64, n: 16 };
    let t = kernel::timing(&c, &kind).unwrap();
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
    let kind = KernelSpec::Matmul { m: 16, k: 32, n: 4 };
    let t = kernel::timing(&c, &kind).unwrap();
    assert_eq!(t.bound, "dma", "the first load and the last store are exposed");
    assert_eq!(t.stall_cycles, t.tiles[0].compute_start, "only fold 0 waited for data");
    let mx = mxu::gemm_timing(&c.mxu, 16, 32, 4).total_cycles;
    let last_store = t.transfers.last().unwrap();
    assert_eq!(t.total_cycles, last_store.end);
    assert_eq!(t.total_cycles, t.tiles[0].compute_start + mx + (last_store.end - last_store.start));
    // With one buffer every load waits for the previous fold: strictly slower.
    let mut c1 = c.clone();
    c1.dma.buffers = 1;
    let t1 = kernel::timing(&c1, &kind).unwrap();
    assert_eq!(t1.stall_cycles, t.stall_cycles + 7 * 2);
    assert_eq!(t1.total_cycles, t.total_cycles + 7 * 2);
}

#[test]
fn sram_overflow_is_a_clear_error_not_a_panic() {
    let mut c = cfg(4, 4, Dataflow::WeightStationary);
    c.memory.unified_buffer.bytes = 4096;
    let kind = KernelSpec::Matmul { m: 64, k: 32, n: 4 };
    let e = kernel::timing(&c, &kind).unwrap_err().to_string();
    assert!(
        e.contains("matmul 64x32x4") && e.contains("unified buffer") && e.contains("8192") && e.contains("4096"),
        "{e}"
    );
    assert!(e.contains("memory.unified_buffer.bytes"), "{e}");
    // A softmax row that cannot fit two buffers of (input + output).
    let e = kernel::timing(&c, &KernelSpec::Softmax { rows: 2, cols: 300 }).unwrap_err().to_string();
    assert!(e.contains("softmax 2x300") && e.contains("4800") && e.contains("4096"), "{e}");
    // Accumulator too small for the output.
    c.memory.unified_buffer.bytes = 1 << 20;
    c.memory.accumulator.bytes = 1024;
    let e = kernel::timing(&c, &KernelSpec::Matmul { m: 64, k: 4, n: 8 }).unwrap_err().to_string();
    assert!(e.contains("accumulator") && e.contains("2048") && e.contains("1024"), "{e}");
    // Large VPU inputs are cut into chunks instead.
    c.memory.unified_buffer.bytes = 4096;
    let kind = KernelSpec::Adam { n: 1000, lr: 0.1, b1: 0.9, b2: 0.99, eps: 1e-6, t: 1 };
    let t = kernel::timing(&c, &kind).unwrap();
    assert!(t.tiles.len() > 1);
}

// ---------------------------------------------------------------- hostile shapes, configs

/// Element and byte counts past 64 bits are `Shape` errors naming the op (they used to panic
/// with "capacity overflow" or wrap), and ops past the DRAM are refused before anything
/// proportional to them exists; `timing_host_bytes` reports the same errors first.
#[test]
fn hostile_shapes_are_errors_naming_the_op() {
    let c = cfg(4, 4, Dataflow::WeightStationary);
    let adam = |n| KernelSpec::Adam { n, lr: 0.1, b1: 0.9, b2: 0.99, eps: 1e-6, t: 1 };
    let conv =
        |h, pad| KernelSpec::Conv2d(ConvShape { batch: 1, h, w: h, c_in: 64, c_out: 64, kh: 3, kw: 3, stride: 1, pad });
    for (kind, want) in [
        (
            KernelSpec::Matmul { m: usize::MAX, k: 1, n: 1 },
            "matmul 18446744073709551615x1x1: its inputs and outputs total more than 2^64 bytes",
        ),
        (
            KernelSpec::Matmul { m: 1 << 32, k: 1 << 32, n: 1 },
            "A's elements = 4294967296 x 4294967296 does not fit 64 bits",
        ),
        (adam(usize::MAX), "adam 18446744073709551615: its inputs and outputs total more than 2^64"),
        (KernelSpec::Softmax { rows: 1 << 40, cols: 1 << 40 }, "elements = 1099511627776 x 1099511627776 does not fit"),
        (conv(4, usize::MAX / 2), "the padded input (h or w + 2 * pad) does not fit 64 bits"),
        (conv(1 << 30, 1), "input elements = 1 x 1073741824 x 1073741824 x 64 does not fit 64 bits"),
        (KernelSpec::Matmul { m: 0, k: 1, n: 1 }, "every dimension must be at least 1"),
        (KernelSpec::Relu { n: 1_000_000_000_000 }, "needs 8000000000000 bytes of DRAM"),
        (conv(100_000, 1), "`dram.bytes`"),
        (KernelSpec::Matmul { m: 10_000_000, k: 32, n: 32 }, "needs 2560004096 bytes of DRAM"),
    ] {
        let e = kernel::timing(&c, &kind).unwrap_err().to_string();
        assert!(e.contains(want), "{kind:?}: {e}");
        assert_eq!(kernel::timing_host_bytes(&c, &kind).unwrap_err().to_string(), e);
    }
    // Saturating accessors never wrap to a small length.
    assert_eq!(KernelSpec::Matmul { m: 1 << 32, k: 1 << 32, n: 1 }.input_lens(), vec![usize::MAX; 2]);
}

/// A config outside its ranges (as a caller could build by hand) makes cycle counts overflow:
/// an error naming the fields that drive them, where the op used to report a wrapped total
/// (102 cycles for this matmul with `latency_cycles: 2^64 - 1`; 304 with the shipped 100).
#[test]
fn cycle_overflow_names_the_config_fields() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tpu-8x8.ron");
    let mut c = HwConfig::load(&path).unwrap();
    let kind = KernelSpec::Matmul { m: 16, k: 8, n: 8 };
    assert_eq!(kernel::timing(&c, &kind).unwrap().total_cycles, 304);
    c.dram.latency_cycles = u64::MAX;
    let e = kernel::timing(&c, &kind).unwrap_err().to_string();
    assert!(e.contains("matmul 16x8x8") && e.contains("`dma.setup_cycles` + `dram.latency_cycles`"), "{e}");
    assert!(c.validate(&path).unwrap_err().to_string().contains("dram.latency_cycles"));
    c.dram.latency_cycles = u64::MAX / 2;
    let e = kernel::timing(&c, &kind).unwrap_err().to_string();
    assert!(e.contains("overflows 64 bits") && e.contains("dram.latency_cycles"), "{e}");
    c.dram.latency_cycles = 100;
    c.dram.bandwidth_bytes_per_cycle = 1e-17;
    let e = kernel::timing(&c, &kind).unwrap_err().to_string();
    assert!(e.contains("dram.bandwidth_bytes_per_cycle"), "{e}");
}
