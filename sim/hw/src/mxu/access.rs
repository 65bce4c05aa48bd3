//! A GEMM's demand on its memories, cycle by cycle: when the array reads each operand word
//! and writes each result word, fold by fold.
//!
//! SCALE-Sim builds these as demand matrices (one row per cycle); here they are formulas on
//! the fold [`Schedule`], written once. Everything that moves GEMM words through memories at
//! their cycles takes its times from here: the training fault path (which reads of a word a
//! memory fault reaches, in a training step or in `faultline op`'s one-op program) and the
//! real-memory replay that checks it. Times count from the fold's start (`T_f`, [`crate::mxu::Fold::start`]);
//! indices are the whole GEMM's (`A[m][k]`, `W[k][n]`, `out[m][n]`).
//!
//! | dataflow | `A[m][k]` read | `W[k][n]` read (weight buffer) | result written |
//! |---|---|---|---|
//! | WS | `1 + m + i` | `i + j` | row `m` at `m + R + nc` |
//! | OS | `k + i` | `k + j` | row `i` at `period - 1 - i` (bottom row first) |
//! | IS | `i + j` | `1 + n + i` | column `n` at `n + R + mr` |
//!
//! (`i = k - k0` for WS and IS, `m - m0` for OS; `j = n - n0` for WS and OS, `m - m0` for IS.)
//! A fold that adds to earlier K folds reads each result word in its write cycle, before
//! writing it back.
//!
//! The weight buffer holds one tile per slot, the tile element at [`Schedule::weight_word`]:
//! WS `R x C` words (`W[k0+i][n0+j]` at `i * C + j`), OS `K x C` (`W[k][n0+j]` at `k * C + j`),
//! IS `R x N` (`W[k0+i][n]` at `i * N + n`); fold `f` uses slot `f mod slots`.

use super::Schedule;
use crate::config::{Dataflow, MxuConfig};
use crate::fault::ActiveFault;
use crate::memory::dma::AddrReg;

/// Words of one weight-buffer tile slot of an `M x K x N` GEMM on `cfg` (the slot's size does
/// not depend on `M`).
pub fn weight_slot_words(cfg: &MxuConfig, k: usize, n: usize) -> usize {
    slot_words(cfg.dataflow, cfg.rows, cfg.cols, k, n)
}

fn slot_words(df: Dataflow, rows: usize, cols: usize, k: usize, n: usize) -> usize {
    match df {
        Dataflow::WeightStationary => rows * cols,
        Dataflow::OutputStationary => k * cols,
        Dataflow::InputStationary => rows * n,
    }
}

/// One line of results a fold writes in one cycle: `len` elements from `out[m][n]`, along
/// a row (WS, OS) or down a column (IS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultLine {
    /// Index of the line within the fold (the row for WS and OS, the column for IS).
    pub line: usize,
    /// Write cycle, from the fold's start.
    pub cycle: u64,
    /// First element's row.
    pub m: usize,
    /// First element's column.
    pub n: usize,
    /// Elements in the line.
    pub len: usize,
    /// Whether the line runs down a column (IS) rather than along a row.
    pub down: bool,
}

impl ResultLine {
    /// Element `j` of the line: its `(m, n)`.
    #[inline]
    pub fn element(&self, j: usize) -> (usize, usize) {
        if self.down {
            (self.m + j, self.n)
        } else {
            (self.m, self.n + j)
        }
    }

    /// Words between consecutive elements of the line in a row-major `M x N` result.
    #[inline]
    pub fn stride(&self, n: usize) -> usize {
        if self.down {
            n
        } else {
            1
        }
    }
}

/// A fold's operand demand in closed form, for loops over a whole tile: every dataflow's
/// skew advances one cycle per tile row and per tile column, so `A[m0+i][k0+j]` is read at
/// `a + i + j`, `W[k0+i][n0+j]` at `w + i + j`, kept at word `i * row + j` of the slot
/// ([`Schedule::skew`]; the same times and words as the per-element methods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skew {
    /// When the fold reads `A[m0][k0]`, from its start.
    pub a: u64,
    /// When the fold reads `W[k0][n0]`, from its start.
    pub w: u64,
    /// Words between consecutive rows of the weight tile in its slot.
    pub row: usize,
}

impl Schedule {
    /// Whether fold `c` computes output `(m, n)`.
    #[inline]
    pub fn fold_has_output(&self, c: usize, m: usize, n: usize) -> bool {
        let f = &self.folds[c];
        (f.m0..f.m0 + f.mr).contains(&m) && (f.n0..f.n0 + f.nc).contains(&n)
    }

    /// When fold `c` reads `A[m][k]` into the array, from the fold's start; `None` if it does
    /// not read it.
    #[inline]
    pub fn a_read(&self, c: usize, m: usize, k: usize) -> Option<u64> {
        let f = &self.folds[c];
        if !(f.m0..f.m0 + f.mr).contains(&m) || !(f.k0..f.k0 + f.kr).contains(&k) {
            return None;
        }
        let (i, im) = (k - f.k0, m - f.m0);
        Some(match self.dataflow {
            Dataflow::WeightStationary => 1 + m + i,
            Dataflow::OutputStationary => k + im,
            Dataflow::InputStationary => i + im,
        } as u64)
    }

    /// When fold `c` reads `W[k][n]` from the weight buffer into the array, from the fold's
    /// start; `None` if it does not read it.
    #[inline]
    pub fn w_read(&self, c: usize, k: usize, n: usize) -> Option<u64> {
        let f = &self.folds[c];
        if !(f.k0..f.k0 + f.kr).contains(&k) || !(f.n0..f.n0 + f.nc).contains(&n) {
            return None;
        }
        let (i, j) = (k - f.k0, n - f.n0);
        Some(match self.dataflow {
            Dataflow::WeightStationary => i + j,
            Dataflow::OutputStationary => k + j,
            Dataflow::InputStationary => 1 + n + i,
        } as u64)
    }

    /// The last cycle (from the fold's start) fold `c` reads a weight of its tile: every
    /// dataflow's weight read time grows with `k` and `n`, so it is the tile's last corner's.
    pub fn last_w_read(&self, c: usize) -> u64 {
        let f = &self.folds[c];
        self.w_read(c, f.k0 + f.kr.max(1) - 1, f.n0 + f.nc.max(1) - 1).unwrap_or(0)
    }

    /// Fold `c`'s operand timing and weight layout in closed form ([`Skew`]).
    pub fn skew(&self, c: usize) -> Skew {
        let f = &self.folds[c];
        let row = if self.dataflow == Dataflow::InputStationary { self.n } else { self.cols };
        let a = self.a_read(c, f.m0, f.k0).unwrap_or(0);
        Skew { a, w: self.w_read(c, f.k0, f.n0).unwrap_or(0), row }
    }

    /// Words of one weight-buffer tile slot.
    pub fn weight_slot_words(&self) -> usize {
        slot_words(self.dataflow, self.rows, self.cols, self.k, self.n)
    }

    /// Where fold `c`'s tile keeps `W[k][n]` within its slot; `None` if the fold does not
    /// use it.
    #[inline]
    pub fn weight_word(&self, c: usize, k: usize, n: usize) -> Option<usize> {
        let f = &self.folds[c];
        if !(f.k0..f.k0 + f.kr).contains(&k) || !(f.n0..f.n0 + f.nc).contains(&n) {
            return None;
        }
        let (i, j) = (k - f.k0, n - f.n0);
        Some(match self.dataflow {
            Dataflow::WeightStationary => i * self.cols + j,
            Dataflow::OutputStationary => k * self.cols + j,
            Dataflow::InputStationary => i * self.n + n,
        })
    }

    /// The weight `W[k][n]` that fold `c`'s tile keeps in word `word` of its slot; `None` for
    /// a word the tile leaves unused.
    pub fn weight_at(&self, c: usize, word: usize) -> Option<(usize, usize)> {
        let f = &self.folds[c];
        let width = if self.dataflow == Dataflow::InputStationary { self.n } else { self.cols };
        let (row, col) = (word / width, word % width);
        let (k, n) = match self.dataflow {
            Dataflow::WeightStationary => (f.k0 + row, f.n0 + col),
            Dataflow::OutputStationary => (row, f.n0 + col),
            Dataflow::InputStationary => (f.k0 + row, col),
        };
        (self.weight_word(c, k, n) == Some(word)).then_some((k, n))
    }

    /// The result lines fold `c` writes, in write order (WS rows top first, OS rows bottom
    /// first, IS columns left first).
    pub fn result_lines(&self, c: usize) -> Vec<ResultLine> {
        let f = self.folds[c];
        let line = |line, cycle, m, n, len, down| ResultLine { line, cycle, m, n, len, down };
        match self.dataflow {
            Dataflow::WeightStationary => {
                (0..self.m).map(|m| line(m, (m + self.rows + f.nc) as u64, m, f.n0, f.nc, false)).collect()
            }
            Dataflow::OutputStationary => {
                (0..f.mr).rev().map(|i| line(i, self.period - 1 - i as u64, f.m0 + i, f.n0, f.nc, false)).collect()
            }
            Dataflow::InputStationary => {
                (0..self.n).map(|n| line(n, (n + self.rows + f.mr) as u64, f.m0, n, f.mr, true)).collect()
            }
        }
    }

    /// Fold `c`'s result lines as the sequencer writes them when the fold starts at cycle
    /// `at`: each line, its write cycle, and the address its first word goes to. The address
    /// comes from `seq.acc_addr` (`width` bits, with `faults` on it): loaded with the first
    /// line's address (`base` plus the line's first element, row-major) when that line is
    /// written, then advanced by the golden step to each next line's.
    pub fn line_addresses(
        &self,
        c: usize,
        at: u64,
        base: u64,
        width: u32,
        faults: &[ActiveFault],
    ) -> Vec<(ResultLine, u64, u64)> {
        let lines = self.result_lines(c);
        let golden = |l: &ResultLine| base + (l.m * self.n + l.n) as u64;
        let Some(first) = lines.first() else { return Vec::new() };
        let mut reg = AddrReg::new(golden(first), width, at + first.cycle, faults);
        let mut out = Vec::with_capacity(lines.len());
        for (idx, l) in lines.iter().enumerate() {
            let t = at + l.cycle;
            out.push((*l, t, reg.use_at(t)));
            if let Some(next) = lines.get(idx + 1) {
                reg.advance(golden(next) as i64 - golden(l) as i64);
            }
        }
        out
    }

    /// When fold `c` writes output `(m, n)`, from the fold's start; `None` if it does not.
    #[inline]
    pub fn result_write(&self, c: usize, m: usize, n: usize) -> Option<u64> {
        if !self.fold_has_output(c, m, n) {
            return None;
        }
        let f = &self.folds[c];
        Some(match self.dataflow {
            Dataflow::WeightStationary => (m + self.rows + f.nc) as u64,
            Dataflow::OutputStationary => self.period - 1 - (m - f.m0) as u64,
            Dataflow::InputStationary => (n + self.rows + f.mr) as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn schedule(df: Dataflow, r: usize, c: usize, m: usize, k: usize, n: usize) -> Schedule {
        let cfg: MxuConfig = crate::HwConfig::test_config(r, c, df, faultline_num::Precision::Bf16Fp32).mxu;
        Schedule::new(&cfg, m, k, n).unwrap()
    }

    proptest! {
        /// Every output is written once per fold computing it, by exactly one line, at the
        /// cycle `result_write` names; every operand a fold reads has a read time iff the fold
        /// covers it, the one `skew` gives; a weight word and `weight_at` are inverse and stay
        /// inside the slot.
        #[test]
        fn lines_reads_and_weight_words_agree(
            df in prop_oneof![Just(Dataflow::WeightStationary), Just(Dataflow::OutputStationary), Just(Dataflow::InputStationary)],
            r in 1usize..5, c in 1usize..5, m in 1usize..9, k in 1usize..9, n in 1usize..9,
        ) {
            let s = schedule(df, r, c, m, k, n);
            for (fi, f) in s.folds.iter().enumerate() {
                let mut written = vec![0usize; m * n];
                for l in s.result_lines(fi) {
                    for j in 0..l.len {
                        let (mm, nn) = l.element(j);
                        prop_assert_eq!(s.result_write(fi, mm, nn), Some(l.cycle));
                        written[mm * n + nn] += 1;
                    }
                }
                for mm in 0..m {
                    for nn in 0..n {
                        prop_assert_eq!(written[mm * n + nn], usize::from(s.fold_has_output(fi, mm, nn)));
                    }
                    for kk in 0..k {
                        let covers = (f.m0..f.m0 + f.mr).contains(&mm) && (f.k0..f.k0 + f.kr).contains(&kk);
                        prop_assert_eq!(s.a_read(fi, mm, kk).is_some(), covers);
                    }
                }
                let skew = s.skew(fi);
                for (i, j) in (0..f.mr).flat_map(|i| (0..f.kr).map(move |j| (i, j))) {
                    prop_assert_eq!(s.a_read(fi, f.m0 + i, f.k0 + j), Some(skew.a + (i + j) as u64));
                }
                for (i, j) in (0..f.kr).flat_map(|i| (0..f.nc).map(move |j| (i, j))) {
                    prop_assert_eq!(s.w_read(fi, f.k0 + i, f.n0 + j), Some(skew.w + (i + j) as u64));
                    prop_assert_eq!(s.weight_word(fi, f.k0 + i, f.n0 + j), Some(i * skew.row + j));
                }
                for kk in 0..k {
                    for nn in 0..n {
                        let w = s.weight_word(fi, kk, nn);
                        prop_assert_eq!(w.is_some(), s.w_read(fi, kk, nn).is_some());
                        if let Some(w) = w {
                            prop_assert!(w < s.weight_slot_words());
                            prop_assert_eq!(s.weight_at(fi, w), Some((kk, nn)));
                        }
                    }
                }
            }
        }
    }
}
