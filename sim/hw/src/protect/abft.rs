//! Algorithm-based fault tolerance for int8 GEMMs with exact integer checksums.
//!
//! Li et al., "Efficient Soft-Error Detection for Low-precision Deep Learning Recommendation
//! Models" (S. Li, J. Huang, P. T. P. Tang, D. Khudia, J. Park, H. D. Dixit, Z. Chen;
//! arXiv:2103.00130, 2021; IEEE BigData) protect quantized int8 GEMMs with int32 accumulation by
//! a checksum of the weights multiplied in the same GEMM, reporting over 95% detection at under
//! 20% overhead. This module is that scheme for the MXU's [`Precision::Int8Int32`] arithmetic.
//!
//! # The fused GEMM
//!
//! For `C = A * W` (`A` m x k, `W` k x n, int8), the weight checksum is the vector of row sums
//! `s = W * 1` (`s[r] = sum_j W[r][j]`, wrapping int32). `s` does not fit the int8 input
//! registers, so it enters the array as `d` signed base-256 digit columns `D` (k x d, every
//! digit in `[-128, 127]`): `s = sum_t 256^t * D[:, t] (mod 2^32)`, with `d` the fewest (1..=4)
//! that represent every row sum ([`digits_needed`]). [`augment`] builds `[W | D]`
//! (k x (n + d)); one GEMM on the MXU gives `[C | A * D]`. The checksum columns are real MXU
//! work, and what they cost depends on the column tiling: when the ragged last column tile of
//! `W` has `d` free columns (`0 < n mod cols <= cols - d`) they ride in it with no extra fold
//! (weight stationary: at most `d` more cycles for the wider tile's results to leave the array;
//! output stationary: nothing); otherwise (`n` a multiple of `cols`, or too little room) they
//! take a whole extra column of folds.
//!
//! # Exactness
//!
//! The MXU's int32 accumulation wraps: every output is its exact integer value mod 2^32
//! ([`faultline_num::Int8Int32`]). [`residuals`] computes, per output row `i`,
//! `r[i] = sum_{j<n} C[i][j] - sum_t 256^t * C[i][n+t]`, also mod 2^32. In the ring Z/2^32,
//! `sum_t 256^t (A D)[i][t] = sum_r A[i][r] sum_t 256^t D[r][t] = sum_r A[i][r] s[r]
//! = sum_r A[i][r] sum_j W[r][j] = sum_j C[i][j]`, so:
//!
//! * a fault-free GEMM has every residual exactly 0, for every input: no rounding, no
//!   tolerance, no false positive;
//! * any error that changes a row's sum of `C` mod 2^32 (in particular any change to a single
//!   element of `C`) gives that row a nonzero residual;
//! * an error confined to the checksum columns leaves `C` correct: it is either a nonzero
//!   residual (a benign false alarm) or, when it changes `C[i][n+t]` by a multiple of
//!   `2^(32-8t)`, invisible and harmless ([`AbftOutcome::ChecksumOnly`]); never a silent `C`;
//! * what the check cannot see is an error the fused GEMM computes consistently, e.g. a
//!   corrupted activation that meets every column of its row, data and checksum alike
//!   (`A' * [W | D]` is a correct GEMM of the wrong input), or errors in several elements of
//!   one row that cancel mod 2^32.
//!
//! [`Precision::Int8Int32`]: faultline_num::Precision::Int8Int32

use crate::matrix::Matrix;
use serde::{Deserialize, Serialize};

/// The most digit columns a checksum can need: `256^4 = 2^32`, so four digits represent every
/// int32 mod 2^32.
pub const MAX_DIGITS: usize = 4;

/// Reads int8 bits as the MXU does (the low 8 bits, two's complement).
#[inline]
fn int8(bits: u32) -> i32 {
    bits as u8 as i8 as i32
}

/// Row sums `s = W * 1` of an int8 matrix (raw int8 bits), wrapping int32.
pub fn row_sums(w: &Matrix) -> Vec<i32> {
    (0..w.rows)
        .map(|r| w.data[r * w.cols..(r + 1) * w.cols].iter().fold(0i32, |s, &b| s.wrapping_add(int8(b))))
        .collect()
}

/// The first `d` signed base-256 digits of `s` (least significant first, each in
/// `[-128, 127]`), with `sum_t 256^t * digit[t] == s (mod 2^32)` whenever `d` is at least
/// [`digits_needed`] of `s` (always for `d = 4`). Unused entries are 0.
///
/// # Panics
/// If `d` is not in `1..=4`.
pub fn digits(s: i32, d: usize) -> [i8; MAX_DIGITS] {
    assert!((1..=MAX_DIGITS).contains(&d), "digit count {d} not in 1..={MAX_DIGITS}");
    let mut out = [0i8; MAX_DIGITS];
    let mut x = s as i64;
    for o in out.iter_mut().take(d) {
        let digit = x as u8 as i8;
        *o = digit;
        // Exact: `x - digit` is a multiple of 256.
        x = (x - digit as i64) >> 8;
    }
    out
}

/// `sum_t 256^t * digits[t]`, wrapping int32 (what the residual computes from the checksum
/// columns).
pub fn reconstruct(digits: &[i8]) -> i32 {
    digits.iter().rev().fold(0i32, |acc, &g| acc.wrapping_mul(256).wrapping_add(g as i32))
}

/// The fewest digits (1..=4) whose [`digits`] reconstruct every one of `sums` exactly mod 2^32.
pub fn digits_needed(sums: &[i32]) -> usize {
    (1..MAX_DIGITS).find(|&d| sums.iter().all(|&s| reconstruct(&digits(s, d)[..d]) == s)).unwrap_or(MAX_DIGITS)
}

/// The fused weight matrix `[W | D]` (k x (n + d), raw int8 bits) and `d`: `W` followed by the
/// base-256 digit columns of its row sums (module docs). One GEMM `A * [W | D]` yields `C`
/// and its checksum columns.
pub fn augment(w: &Matrix) -> (Matrix, usize) {
    let sums = row_sums(w);
    let d = digits_needed(&sums);
    let fused = Matrix::from_fn(w.rows, w.cols + d, |r, c| {
        if c < w.cols {
            w.get(r, c) & 0xff
        } else {
            digits(sums[r], d)[c - w.cols] as u8 as u32
        }
    });
    (fused, d)
}

/// For each row `i` of a fused output `[C | A * D]` (raw int32 bits, `n + d` columns),
/// `sum_{j<n} C[i][j] - sum_t 256^t * C[i][n+t]`, wrapping int32: all zero on a fault-free
/// GEMM, whatever the inputs (module docs).
///
/// # Panics
/// If `out` does not have `n + d` columns or `d` is not in `1..=4`.
pub fn residuals(out: &Matrix, n: usize, d: usize) -> Vec<i32> {
    assert!((1..=MAX_DIGITS).contains(&d), "digit count {d} not in 1..={MAX_DIGITS}");
    assert_eq!(out.cols, n + d, "a fused output has n + d = {} columns, this one {}", n + d, out.cols);
    (0..out.rows)
        .map(|i| {
            let row = &out.data[i * out.cols..(i + 1) * out.cols];
            let sum = row[..n].iter().fold(0i32, |s, &b| s.wrapping_add(b as i32));
            let check = row[n..].iter().rev().fold(0i32, |acc, &b| acc.wrapping_mul(256).wrapping_add(b as i32));
            sum.wrapping_sub(check)
        })
        .collect()
}

/// `C` (the first `n` columns) of a fused output.
pub fn data_part(out: &Matrix, n: usize) -> Matrix {
    Matrix::from_fn(out.rows, n.min(out.cols), |r, c| out.get(r, c))
}

/// What one fault did to a fused GEMM, judged against its fault-free output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AbftOutcome {
    /// Output unchanged, data and checksum columns alike.
    Masked,
    /// `C` unchanged, checksum columns changed, every residual still 0 (a change by a multiple
    /// of `2^(32-8t)` in digit column `t`): harmless and unseen.
    ChecksumOnly,
    /// `C` unchanged but some residual nonzero: a benign false alarm.
    FalseAlarm,
    /// `C` corrupted and some residual nonzero.
    Detected,
    /// `C` corrupted and every residual 0: silent data corruption.
    Silent,
}

impl AbftOutcome {
    /// Every outcome, in reporting order.
    pub const ALL: [AbftOutcome; 5] = [
        AbftOutcome::Masked,
        AbftOutcome::ChecksumOnly,
        AbftOutcome::FalseAlarm,
        AbftOutcome::Detected,
        AbftOutcome::Silent,
    ];

    /// Snake-case name (JSON keys, text labels).
    pub const fn name(self) -> &'static str {
        match self {
            AbftOutcome::Masked => "masked",
            AbftOutcome::ChecksumOnly => "checksum_only",
            AbftOutcome::FalseAlarm => "false_alarm",
            AbftOutcome::Detected => "detected",
            AbftOutcome::Silent => "silent",
        }
    }

    /// Whether `C` (the real result) was corrupted.
    pub const fn corrupted(self) -> bool {
        matches!(self, AbftOutcome::Detected | AbftOutcome::Silent)
    }
}

/// Classifies a faulty fused output against the fault-free one (both `m x (n + d)`).
///
/// # Panics
/// If the shapes differ or do not have `n + d` columns.
pub fn classify(golden: &Matrix, faulty: &Matrix, n: usize, d: usize) -> AbftOutcome {
    assert_eq!((golden.rows, golden.cols), (faulty.rows, faulty.cols), "fused outputs of different shapes");
    let cols = golden.cols;
    let changed = |lo: usize, hi: usize| {
        (0..golden.rows).any(|i| golden.data[i * cols + lo..i * cols + hi] != faulty.data[i * cols + lo..i * cols + hi])
    };
    let flagged = residuals(faulty, n, d).iter().any(|&r| r != 0);
    match (changed(0, n), flagged) {
        (true, true) => AbftOutcome::Detected,
        (true, false) => AbftOutcome::Silent,
        (false, true) => AbftOutcome::FalseAlarm,
        (false, false) if changed(n, n + d) => AbftOutcome::ChecksumOnly,
        (false, false) => AbftOutcome::Masked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_of_extremes() {
        for s in [0, 1, -1, 127, -128, 128, -129, 32639, 32640, -32896, -32897, i32::MAX, i32::MIN, 8_355_711] {
            let d = digits_needed(&[s]);
            assert_eq!(reconstruct(&digits(s, d)[..d]), s, "{s}");
            // Fewest: one digit fewer does not reconstruct it.
            if d > 1 {
                assert_ne!(reconstruct(&digits(s, d - 1)[..d - 1]), s, "{s}");
            }
        }
        assert_eq!(digits_needed(&[127, -128]), 1);
        assert_eq!(digits_needed(&[128]), 2);
        assert_eq!(digits_needed(&[-32896]), 2);
        assert_eq!(digits_needed(&[-32897]), 3);
        assert_eq!(digits_needed(&[i32::MAX]), 4);
        assert_eq!(digits(300, 2)[..2], [44, 1]);
        assert_eq!(digits(200, 2)[..2], [-56, 1]);
    }

    #[test]
    fn classify_sorts_the_five_outcomes() {
        // One row, n = 2, d = 1: C = [3, 4], checksum 7.
        let g = Matrix { rows: 1, cols: 3, data: vec![3, 4, 7] };
        let at = |data: Vec<u32>| classify(&g, &Matrix { rows: 1, cols: 3, data }, 2, 1);
        assert_eq!(residuals(&g, 2, 1), vec![0]);
        assert_eq!(at(vec![3, 4, 7]), AbftOutcome::Masked);
        assert_eq!(at(vec![3, 4, 8]), AbftOutcome::FalseAlarm);
        assert_eq!(at(vec![3, 5, 7]), AbftOutcome::Detected);
        assert_eq!(at(vec![4, 3, 7]), AbftOutcome::Silent);
        // d = 2: digit column 1 changed by 2^24 counts 256 * 2^24 = 0 mod 2^32.
        let g = Matrix { rows: 1, cols: 4, data: vec![3, 4, 7, 0] };
        assert_eq!(
            classify(&g, &Matrix { rows: 1, cols: 4, data: vec![3, 4, 7, 1 << 24] }, 2, 2),
            AbftOutcome::ChecksumOnly
        );
    }
}
