//! The host-memory estimate of a GEMM (`mxu::gemm_host_bytes`) bounds what a run really
//! allocates: a counting global allocator records the peak of live heap bytes while a run
//! generates its operands, runs and compares, and the estimate must be at least that peak (and
//! not wildly above it, or the `--max-memory` guard would refuse work that fits).
//!
//! Only the measuring thread's allocations count: the test harness's own thread prints (and
//! allocates) while the test runs, which made the peak depend on timing.

use faultline_hw::fault::{FaultEvent, FaultSchedule};
use faultline_hw::fault::{FaultSite, Register};
use faultline_hw::mxu::{gemm, gemm_host_bytes};
use faultline_hw::{Dataflow, ExecMode, HwConfig, Matrix};
use faultline_num::Precision;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;

// Signed: the measuring thread may free blocks it allocated before it started counting.
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Whether this thread's allocations are counted (set by [`peak`]'s caller thread).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn counted() -> bool {
    COUNTED.try_with(Cell::get).unwrap_or(false)
}

fn grew(by: usize) {
    if counted() {
        let now = LIVE.fetch_add(by as isize, Ordering::SeqCst) + by as isize;
        PEAK.fetch_max(now, Ordering::SeqCst);
    }
}

fn shrank(by: usize) {
    if counted() {
        LIVE.fetch_sub(by as isize, Ordering::SeqCst);
    }
}

// SAFETY: every call forwards to the system allocator with the caller's arguments; the counters
// only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        grew(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        grew(l.size());
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        shrank(l.size());
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // Counted as alloc-then-free: a moving realloc holds both blocks for a moment.
        grew(new);
        shrank(l.size());
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak live heap bytes this thread holds above the starting level while `f` runs.
fn peak(f: impl FnOnce()) -> u64 {
    COUNTED.with(|c| c.set(true));
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    f();
    (PEAK.load(Ordering::SeqCst) - base).max(0) as u64
}

fn bits(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ salt) >> 8) & 0x3f7f).collect()
}

fn check(what: &str, estimate: u64, used: u64) {
    assert!(used <= estimate, "{what}: used {used} bytes, estimated {estimate}");
    // Loose on purpose (the estimate is a bound, and small runs are dominated by fixed costs),
    // but a bound hundreds of times too high would refuse work that fits.
    assert!(estimate <= 8 * used + (1 << 20), "{what}: estimated {estimate} bytes, used {used}");
}

#[test]
fn estimates_bound_the_peak_of_real_runs() {
    for df in [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary] {
        let cfg = HwConfig::test_config(8, 8, df, Precision::Bf16Fp32);
        for (m, k, n) in [(2000, 16, 8), (8, 16, 3000), (64, 300, 64), (1, 1, 1)] {
            for (mode, fault) in
                [(ExecMode::Functional, false), (ExecMode::CycleLevel, false), (ExecMode::CycleLevel, true)]
            {
                let est = gemm_host_bytes(&cfg, m, k, n, mode, fault).unwrap();
                let used = peak(|| {
                    let a = Matrix { rows: m, cols: k, data: bits(m * k, 1) };
                    let w = Matrix { rows: k, cols: n, data: bits(k * n, 2) };
                    let f = match fault {
                        true => FaultSchedule::one(FaultEvent::flip(FaultSite::pe(0, 0, Register::Psum, 30), 0, 3)),
                        false => FaultSchedule::none(),
                    };
                    let res = gemm(&cfg, &a, &w, mode, &f).unwrap();
                    if fault {
                        let golden = gemm(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none()).unwrap();
                        std::hint::black_box(golden.out.diff(&res.out));
                    }
                });
                check(&format!("gemm {m}x{k}x{n} {df:?} {mode:?} fault={fault}"), est, used);
            }
        }
    }
}
