//! The vector unit: `L` fp32 lanes with per-lane operand, accumulator and result registers,
//! stepped one clock at a time, plus its bit-exact functional twin.
//!
//! Every non-matmul op of training (elementwise, reductions, optimizer updates) runs here. Data
//! are raw fp32 bits (`u32`); [`run_f32`] is a convenience wrapper for `f32` slices.
//!
//! One concern per file: `ops.rs` (the vocabulary, [`VpuOp`]), `lane.rs` (one lane's
//! arithmetic, [`lane_op`], shared by both models), `schedule.rs` (the closed-form issue
//! schedule, [`timing`]), `functional.rs` (the functional twin), `cycle.rs` (the stepped lanes,
//! [`LaneState`]) and `run.rs` (the checked entry points, [`run`], that pick one by mode).
//!
//! # Registers (fault sites)
//!
//! Each lane `l` has operand registers `a`, `b`, `c`, `d` (`vpu.lane[l].a[bit]` ...; input `i`
//! of the op goes to operand register `i`), a reduction accumulator `acc` and a result register
//! `out`. The ALU between operands and `out` is `D = vpu.pipeline_depth` cycles deep; its
//! internal stages are not fault sites.
//!
//! # Cycle model (the schedule is the same in every mode)
//!
//! Element `e` of an elementwise op goes to lane `e % L` of vector `v = e / L`; there are
//! `V = ceil(n / L)` vectors. An op with `k` outputs (1; Momentum 2; Adam 3) issues one vector
//! every `k` cycles (one result register, one write-back per cycle):
//!
//! ```text
//! t_v = v * k                         operand registers latch vector v (end of cycle t_v)
//! t_v + 1 + j                         ALU reads the operands for output j (0 <= j < k)
//! t_v + j + D                         `out` latches output j (end of cycle)
//! t_v + j + D + 1                     write-back reads `out`
//! cycles = V * k + D + 1
//! ```
//!
//! So a fault in an operand register at cycle `c` (D/Q commit semantics, see [`crate::fault`])
//! reaches every output of its vector whose read cycle is `> c`; a fault in `out` at cycle `c`
//! corrupts the value written back at `c + 1`.
//!
//! **Reductions** view the input as a row-major matrix with `cols` columns, reduced with `⊕`
//! (`+` or [`max_f32`]).
//! * [`Axis::Col`] (one result per column): column group `g` (columns `gL..gL+L`) streams its
//!   rows as vectors, one per cycle; lane accumulators load the first row and then
//!   `acc = acc ⊕ a` (latched the cycle after the operand). `out` latches `acc` one cycle after
//!   the group's last vector; the next group's first vector issues right behind (ii = 1).
//!   `cycles = rows * groups + 3`.
//! * [`Axis::Row`] (one result per row): row `r` streams `nv = ceil(cols/L)` vectors; lane `l`
//!   accumulates columns `l, l+L, ...`; then a tree of `S = ceil(log2(min(cols, L)))` stages
//!   (stage `s`: `acc[l] = acc[l] ⊕ acc[l + 2^s]` for `l % 2^(s+1) == 0`, both lanes holding
//!   data), then lane 0's `out` latches `acc[0]`. The next row issues `nv + S` cycles after the
//!   previous one: `cycles = rows * (nv + S) + 3`.
//!
//! Fault times: `FaultTime { tile: v, cycle }` is cycle `cycle` after the issue cycle of vector
//! `v` (vectors numbered in issue order).
//!
//! # Arithmetic (bit-exact, identical in both modes)
//!
//! Plain IEEE-754 binary32 operations with round-to-nearest-even (no fused multiply-add: Rust
//! never contracts `a * b + c`). `recip(x) = 1 / x` and `rsqrt(x) = 1 / sqrt(x)` are correctly
//! rounded IEEE operations (rsqrt rounds twice). `exp` is the host libm's `f32::exp`; both
//! paths call the same [`lane_op`] function, so they agree bit for bit on one host (results may
//! differ across libms in the last ulp). Every result is stored with NaN canonicalised
//! ([`faultline_num::canonical_f32_bits`]).

mod cycle;
mod functional;
mod lane;
mod ops;
mod run;
mod schedule;
#[cfg(test)]
mod tests;

pub use cycle::LaneState;
pub use lane::{lane_op, max_f32, min_f32};
pub use ops::{Axis, Cmp, VpuOp};
pub use run::{run, run_f32, run_in_place, run_into, run_into_gathered, run_observed, Chunked, VpuOutput};
pub use schedule::{element_cycle, element_cycles, timing, try_timing, vector_at, VpuStats};
