//! One lane's arithmetic, shared by both models so they agree bit for bit: [`lane_op`], the
//! reduction combine and the cross-lane tree.

use super::VpuOp;
use faultline_num::canonical_f32_bits;

/// `max` as the VPU computes it: NaN if either is NaN, `max(-0, +0) = +0`.
#[inline]
pub fn max_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a > b {
        a
    } else if b > a {
        b
    } else {
        f32::from_bits(a.to_bits() & b.to_bits())
    }
}

/// `min` as the VPU computes it: NaN if either is NaN, `min(-0, +0) = -0`.
#[inline]
pub fn min_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a < b {
        a
    } else if b < a {
        b
    } else {
        f32::from_bits(a.to_bits() | b.to_bits())
    }
}

/// Output `j` of an elementwise/optimizer op on one lane's operands (fp32 bits in, canonical
/// fp32 bits out). Both execution modes call exactly this function.
#[inline(always)]
pub fn lane_op(op: &VpuOp, j: usize, x: [u32; 4]) -> u32 {
    let [a, b, c, d] = x.map(f32::from_bits);
    let r = match *op {
        VpuOp::Copy => a,
        VpuOp::Add => a + b,
        VpuOp::Sub => a - b,
        VpuOp::Mul => a * b,
        VpuOp::Max => max_f32(a, b),
        VpuOp::Min => min_f32(a, b),
        VpuOp::AddScalar(s) => a + s,
        VpuOp::MulScalar(s) => a * s,
        VpuOp::Clamp(b) => min_f32(max_f32(a, -b), b),
        VpuOp::Neg => -a,
        VpuOp::Relu => {
            if a.is_nan() {
                f32::NAN
            } else if a > 0.0 {
                a
            } else {
                0.0
            }
        }
        VpuOp::ReluGrad => {
            if a > 0.0 {
                b
            } else {
                0.0
            }
        }
        VpuOp::Exp => a.exp(),
        VpuOp::Recip => 1.0 / a,
        VpuOp::Rsqrt => 1.0 / a.sqrt(),
        VpuOp::Ln => a.ln(),
        VpuOp::BiasCorrection { beta } => (1.0 / (1.0 - beta.powf(a as f64))) as f32,
        VpuOp::Compare(cmp) => {
            if cmp.eval(a, b) {
                1.0
            } else {
                0.0
            }
        }
        VpuOp::CmpSelect(cmp) => {
            if cmp.eval(a, b) {
                c
            } else {
                d
            }
        }
        VpuOp::ReduceSum { .. } | VpuOp::ReduceMax { .. } => a,
        VpuOp::Sgd { lr } => a - lr * b,
        VpuOp::Momentum { lr, mu } => {
            // (p, g, v)
            let v2 = mu * c + b;
            if j == 0 {
                a - lr * v2
            } else {
                v2
            }
        }
        VpuOp::Adam { lr, b1, b2, eps, t } => {
            // (p, g, m, v)
            let m2 = b1 * c + (1.0 - b1) * b;
            let v2 = b2 * d + (1.0 - b2) * (b * b);
            match j {
                0 => {
                    let t = t.min(i32::MAX as u32) as i32;
                    let bc1 = 1.0 - b1.powi(t);
                    let bc2 = 1.0 - b2.powi(t);
                    a - lr * (m2 / bc1) / ((v2 / bc2).sqrt() + eps)
                }
                1 => m2,
                _ => v2,
            }
        }
    };
    canonical_f32_bits(r)
}

#[inline(always)]
pub(super) fn combine(is_max: bool, acc: u32, x: u32) -> u32 {
    let (p, q) = (f32::from_bits(acc), f32::from_bits(x));
    canonical_f32_bits(if is_max { max_f32(p, q) } else { p + q })
}

/// The cross-lane reduction tree on lane accumulators `acc[..valid]`.
pub(super) fn tree(acc: &mut [u32], valid: usize, stages: u32, is_max: bool) {
    for s in 0..stages {
        tree_stage(acc, valid, s, is_max);
    }
}

pub(super) fn tree_stage(acc: &mut [u32], valid: usize, s: u32, is_max: bool) {
    let h = 1usize << s;
    for l in (0..valid).step_by(2 * h) {
        if l + h < valid {
            acc[l] = combine(is_max, acc[l], acc[l + h]);
        }
    }
}
