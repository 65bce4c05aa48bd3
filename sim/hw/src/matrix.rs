//! Row-major matrices of raw register bits.

/// Fills `out` (`rows x cols`, row-major) from `s`, which holds its transpose (`[cols][rows]`),
/// each word through `f`; in square blocks, so that a block's reads and writes stay in a few
/// cache lines.
#[inline(always)]
pub(crate) fn untranspose_into<T>(s: &[u32], rows: usize, cols: usize, out: &mut [T], f: impl Fn(u32) -> T) {
    const B: usize = 16;
    for p0 in (0..cols).step_by(B) {
        let pe = (p0 + B).min(cols);
        for i0 in (0..rows).step_by(B) {
            for i in i0..(i0 + B).min(rows) {
                for (d, p) in out[i * cols + p0..i * cols + pe].iter_mut().zip(p0..) {
                    *d = f(s[p * rows + i]);
                }
            }
        }
    }
}

/// FNV-1a over the dimensions and then the raw bits (each as a little-endian u64): changes if
/// any bit does; the one checksum used for matrices, tensors and checkpoints.
pub fn bits_checksum(dims: &[usize], bits: impl IntoIterator<Item = u32>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    dims.iter().for_each(|&d| eat(d as u64));
    bits.into_iter().for_each(|v| eat(v as u64));
    h
}

/// A row-major matrix whose elements are raw bits of some [`faultline_num::NumFormat`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Matrix {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// `rows * cols` elements, row-major.
    pub data: Vec<u32>,
}

impl Matrix {
    /// An all-zero-bits matrix.
    pub fn zeros(rows: usize, cols: usize) -> Matrix {
        Matrix { rows, cols, data: vec![0; rows * cols] }
    }

    /// Builds a matrix from a function of (row, col).
    pub fn from_fn(rows: usize, cols: usize, mut f: impl FnMut(usize, usize) -> u32) -> Matrix {
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                data.push(f(r, c));
            }
        }
        Matrix { rows, cols, data }
    }

    /// Element at (row, col).
    #[inline]
    pub fn get(&self, r: usize, c: usize) -> u32 {
        self.data[r * self.cols + c]
    }

    /// Sets element (row, col).
    #[inline]
    pub fn set(&mut self, r: usize, c: usize, v: u32) {
        self.data[r * self.cols + c] = v;
    }

    /// The transpose (`cols x rows`).
    pub fn transpose(&self) -> Matrix {
        Matrix::from_fn(self.cols, self.rows, |i, j| self.get(j, i))
    }

    /// A checksum of the shape and the raw bits ([`bits_checksum`]).
    pub fn checksum(&self) -> u64 {
        bits_checksum(&[self.rows, self.cols], self.data.iter().copied())
    }

    /// Positions (row, col) where two same-shaped matrices differ in any bit.
    pub fn diff(&self, other: &Matrix) -> Vec<(usize, usize)> {
        assert_eq!((self.rows, self.cols), (other.rows, other.cols), "diff of differently shaped matrices");
        (0..self.data.len())
            .filter(|&i| self.data[i] != other.data[i])
            .map(|i| (i / self.cols, i % self.cols))
            .collect()
    }
}
