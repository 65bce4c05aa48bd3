//! The functional twin: the lanes' per-element operation sequence, without registers or
//! clocks, vectorised.

use super::lane::{combine, tree};
use super::schedule::tree_stages;
use super::{lane_op, Axis, VpuOp};
use crate::config::HwConfig;
use faultline_num::canonical_f32_bits;

/// The functional twin: the same per-element operation sequence, without registers or clocks.
pub(super) fn functional(cfg: &HwConfig, op: &VpuOp, inputs: &[&[u32]], n: usize) -> Vec<Vec<u32>> {
    let mut out = vec![vec![0u32; op.out_len(n)]; op.outputs()];
    let mut slices: Vec<&mut [u32]> = out.iter_mut().map(|o| &mut o[..]).collect();
    functional_into(cfg, op, inputs, n, &mut slices);
    out
}

/// [`functional`] writing output `j` into `outs[j]` (at least [`VpuOp::out_len`] words each;
/// what they held is overwritten).
pub(super) fn functional_into(cfg: &HwConfig, op: &VpuOp, inputs: &[&[u32]], n: usize, outs: &mut [&mut [u32]]) {
    let l = cfg.vpu.lanes;
    match op.reduction() {
        None => elementwise(op, inputs, n, outs),
        Some((cols, Axis::Col, is_max)) => {
            let x = &inputs[0][..n];
            let out = &mut outs[0][..cols];
            for (o, &v) in out.iter_mut().zip(&x[..cols]) {
                *o = lane_op(op, 0, [v, 0, 0, 0]);
            }
            if is_max {
                column_sums::<true>(out, &x[cols..]);
            } else {
                column_sums::<false>(out, &x[cols..]);
            }
        }
        Some((cols, Axis::Row, is_max)) => {
            let (x, out) = (&inputs[0][..n], &mut outs[0][..n / cols]);
            if is_max {
                row_sums::<true>(x, cols, l, out)
            } else {
                row_sums::<false>(x, cols, l, out)
            }
        }
    }
}

/// [`functional`] of a one-input elementwise op, on `data` in place.
pub(super) fn unary_in_place(op: &VpuOp, data: &mut [u32]) {
    match *op {
        // A copy through a gathered view (im2col, repeats) is the common case: a literal op
        // makes it a branch-free loop.
        VpuOp::Copy => data.iter_mut().for_each(|x| *x = lane_op(&VpuOp::Copy, 0, [*x, 0, 0, 0])),
        _ => data.iter_mut().for_each(|x| *x = lane_op(op, 0, [*x, 0, 0, 0])),
    }
}

/// Folds the rows of `x` (row-major, `out.len()` columns) into `out`, each column in row
/// order ([`combine`]). Column by column the sequence is the lanes'; across columns it runs
/// in vectors (the op is a constant, so the loop has no branch).
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn column_sums<const MAX: bool>(out: &mut [u32], x: &[u32]) {
    for row in x.chunks_exact(out.len()) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o = combine(MAX, *o, v);
        }
    }
}

/// Reduces each row of `x` (`cols` wide) into `out` as the lanes do: lane `i` folds elements
/// `i, i + l, i + 2l, ...` in order, then the tree combines the lanes. All lanes' folds run as
/// one vector loop per group of `l` elements (each lane's sequence unchanged).
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn row_sums<const MAX: bool>(x: &[u32], cols: usize, l: usize, out: &mut [u32]) {
    let valid = cols.min(l);
    let stages = tree_stages(valid);
    let mut acc = vec![0u32; valid];
    for (row, o) in x.chunks_exact(cols).zip(out) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a = canonical_f32_bits(f32::from_bits(v));
        }
        for group in row[valid..].chunks(l) {
            for (a, &v) in acc.iter_mut().zip(group) {
                *a = combine(MAX, *a, v);
            }
        }
        tree(&mut acc, valid, stages, MAX);
        *o = acc[0];
    }
}

/// The functional twin of an elementwise/optimizer op: [`lane_op`] on every element, output
/// `j` into `outs[j]`. The op is
/// matched once and each common op gets a loop with [`lane_op`] inlined on a literal op, so it
/// compiles to a branch-free, vectorised loop (same function, same bits; several times faster
/// than dispatching per element). Compiled for AVX2 as well and picked at run time.
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn elementwise(op: &VpuOp, inputs: &[&[u32]], n: usize, outs: &mut [&mut [u32]]) {
    // Plain loops, not `map().collect()`: `collect` is compiled without AVX2 and could not
    // inline a closure that has it, so it would call the closure once per element.
    #[inline(always)]
    fn map1(out: &mut [u32], a: &[u32], f: impl Fn(u32) -> u32) {
        for (o, &x) in out.iter_mut().zip(a) {
            *o = f(x);
        }
    }
    #[inline(always)]
    fn map2(out: &mut [u32], a: &[u32], b: &[u32], f: impl Fn(u32, u32) -> u32) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    }
    let get = |i: usize| inputs.get(i).map_or(&[][..], |v| &v[..n.min(v.len())]);
    let (a, b, c, d) = (get(0), get(1), get(2), get(3));
    use VpuOp::*;
    match *op {
        Copy => map1(outs[0], a, |x| lane_op(&Copy, 0, [x, 0, 0, 0])),
        Relu => map1(outs[0], a, |x| lane_op(&Relu, 0, [x, 0, 0, 0])),
        Neg => map1(outs[0], a, |x| lane_op(&Neg, 0, [x, 0, 0, 0])),
        Exp => map1(outs[0], a, |x| lane_op(&Exp, 0, [x, 0, 0, 0])),
        Recip => map1(outs[0], a, |x| lane_op(&Recip, 0, [x, 0, 0, 0])),
        Rsqrt => map1(outs[0], a, |x| lane_op(&Rsqrt, 0, [x, 0, 0, 0])),
        AddScalar(s) => map1(outs[0], a, |x| lane_op(&AddScalar(s), 0, [x, 0, 0, 0])),
        MulScalar(s) => map1(outs[0], a, |x| lane_op(&MulScalar(s), 0, [x, 0, 0, 0])),
        Clamp(b) => map1(outs[0], a, |x| lane_op(&Clamp(b), 0, [x, 0, 0, 0])),
        Add => map2(outs[0], a, b, |x, y| lane_op(&Add, 0, [x, y, 0, 0])),
        Sub => map2(outs[0], a, b, |x, y| lane_op(&Sub, 0, [x, y, 0, 0])),
        Mul => map2(outs[0], a, b, |x, y| lane_op(&Mul, 0, [x, y, 0, 0])),
        Max => map2(outs[0], a, b, |x, y| lane_op(&Max, 0, [x, y, 0, 0])),
        Min => map2(outs[0], a, b, |x, y| lane_op(&Min, 0, [x, y, 0, 0])),
        ReluGrad => map2(outs[0], a, b, |x, y| lane_op(&ReluGrad, 0, [x, y, 0, 0])),
        Sgd { lr } => map2(outs[0], a, b, |x, y| lane_op(&Sgd { lr }, 0, [x, y, 0, 0])),
        _ => {
            let at = |v: &[u32], e: usize| v.get(e).copied().unwrap_or(0);
            for (j, out) in outs.iter_mut().enumerate() {
                for (e, o) in out[..n].iter_mut().enumerate() {
                    *o = lane_op(op, j, [a[e], at(b, e), at(c, e), at(d, e)]);
                }
            }
        }
    }
}
