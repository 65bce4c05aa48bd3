//! Addressing: the [`View`] through which an operand reads its buffer, so that broadcasts,
//! per-row scalars, repeats and im2col/col2im gathers are addressing, not arithmetic.

use super::Window;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The address pattern through which an operand reads its buffer: element `e` of the operand
/// (`0 <= e < n`) is the buffer word given below, counted from the operand's offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum View {
    /// Word `e`.
    Whole,
    /// Word `e / cols`: a per-row scalar repeated across each row of `cols`.
    PerRow {
        /// Row length of the operand.
        cols: usize,
    },
    /// Word `e % len`: a row vector of `len` repeated over the leading dimensions.
    Cycle {
        /// Length of the repeated vector.
        len: usize,
    },
    /// `[N, D] -> [N, T, D]`: word `(e / (T*D)) * D + e % D`.
    RepeatRows {
        /// Row length `D`.
        d: usize,
        /// Repeats `T`.
        t: usize,
    },
    /// The im2col matrix `[N*OH*OW, KH*KW*C]` of an NHWC image (zero in the padding).
    Im2Col {
        /// Kernel window.
        window: Window,
        /// Image shape `[N, H, W, C]`.
        image: [usize; 4],
    },
    /// Image-shaped `[N, H, W, C]`: for kernel offset `tap`, the im2col entry (of a `cols`
    /// buffer `[N*OH*OW, KH*KW*C]`) that was copied from each pixel at that offset, zero where
    /// that offset copied nothing. Col2im is the sum of these over the taps.
    Col2ImTap {
        /// Kernel window.
        window: Window,
        /// Image shape `[N, H, W, C]`.
        image: [usize; 4],
        /// Kernel offset `kh_i * KW + kw_j`.
        tap: usize,
    },
    /// One kernel offset's columns of the im2col matrix of an NHWC image: `[N*OH*OW, C]`, row
    /// `(n*OH + oh)*OW + ow` holding the pixel that offset `tap` of that window covers (zero in
    /// the padding). Pooling reads a window tap by tap without building the whole matrix.
    Im2ColTap {
        /// Kernel window.
        window: Window,
        /// Image shape `[N, H, W, C]`.
        image: [usize; 4],
        /// Kernel offset `kh_i * KW + kw_j`.
        tap: usize,
    },
    /// [`View::Col2ImTap`] for a buffer holding only kernel offset `tap`'s columns (`[N*OH*OW,
    /// C]`, as [`View::Im2ColTap`] reads them): image-shaped, each pixel the entry of the window
    /// whose offset `tap` covered it, zero where none did. The adjoint of `Im2ColTap`.
    TapToImage {
        /// Kernel window.
        window: Window,
        /// Image shape `[N, H, W, C]`.
        image: [usize; 4],
        /// Kernel offset `kh_i * KW + kw_j`.
        tap: usize,
    },
    /// The buffer holds groups of a row-major `[A, B, C]` block; the view reads each as
    /// `[B, A, C]` (its first two axes swapped): element `(b, a, c)` of group `g` is word
    /// `g*A*B*C + (a*B + b)*C + c`. Splitting attention heads (`[T, H, dh] -> [H, T, dh]`) and
    /// merging them back are such swaps; a `Copy` through it transposes.
    Transpose {
        /// `A`, the buffer's outer axis (the view's middle one).
        a: usize,
        /// `B`, the buffer's middle axis (the view's outer one).
        b: usize,
        /// `C`, the contiguous run both keep.
        c: usize,
    },
}

impl View {
    /// Buffer words (past the operand's offset) the view reads for an operand of `n` elements.
    pub fn span(&self, n: usize) -> usize {
        match *self {
            View::Whole => n,
            View::PerRow { cols } => n.div_ceil(cols.max(1)),
            View::Cycle { len } => len.min(n),
            View::RepeatRows { t, .. } => n / t.max(1),
            View::Im2Col { image, .. } | View::Im2ColTap { image, .. } => image.iter().product(),
            View::Col2ImTap { window, image, .. } => {
                let (oh, ow) = window.output_hw(image[1], image[2]).unwrap_or((0, 0));
                image[0] * oh * ow * window.kh * window.kw * image[3]
            }
            View::TapToImage { window, image, .. } => {
                let (oh, ow) = window.output_hw(image[1], image[2]).unwrap_or((0, 0));
                image[0] * oh * ow * image[3]
            }
            View::Transpose { .. } => n,
        }
    }

    /// The smallest run of operand elements (of `n`) that a tile may start at a multiple of, so
    /// that the tile reads a contiguous part of the buffer through the same kind of view.
    pub(super) fn row_unit(&self, n: usize) -> Option<usize> {
        match *self {
            View::Whole => Some(1),
            View::PerRow { cols } => Some(cols),
            View::Cycle { len } => Some(len),
            View::RepeatRows { d, t } => Some(d * t),
            View::Transpose { a, b, c } => Some(a * b * c),
            // One sample's im2col rows (or image).
            View::Im2Col { image, .. }
            | View::Col2ImTap { image, .. }
            | View::Im2ColTap { image, .. }
            | View::TapToImage { image, .. } => (image[0] > 0 && n.is_multiple_of(image[0])).then(|| n / image[0]),
        }
    }

    /// Narrows the view of an `n`-element operand (and the operand's `offset`) to elements
    /// `e0 .. e0 + len`, both multiples of [`View::row_unit`].
    pub(super) fn skip(&mut self, offset: &mut usize, e0: usize, len: usize, n: usize) {
        // An image view's operand elements and buffer words per sample.
        let (per_sample, words) = match *self {
            View::Im2Col { image, .. }
            | View::Col2ImTap { image, .. }
            | View::Im2ColTap { image, .. }
            | View::TapToImage { image, .. } => {
                let samples = image[0].max(1);
                (n / samples, self.span(n) / samples)
            }
            _ => (1, 1),
        };
        match self {
            View::Whole => *offset += e0,
            View::PerRow { cols } => *offset += e0 / *cols,
            View::Cycle { .. } => {}
            View::RepeatRows { t, .. } => *offset += e0 / *t,
            View::Transpose { .. } => *offset += e0,
            View::Im2Col { image, .. }
            | View::Col2ImTap { image, .. }
            | View::Im2ColTap { image, .. }
            | View::TapToImage { image, .. } => {
                *offset += e0 / per_sample * words;
                image[0] = len / per_sample;
            }
        }
    }

    /// The operand elements (of `n`) that read word `x` through this view, ascending.
    pub fn readers(&self, x: usize, n: usize) -> Vec<usize> {
        if x >= self.span(n) {
            return Vec::new();
        }
        match *self {
            View::Whole => vec![x],
            View::PerRow { cols } => (x * cols..((x + 1) * cols).min(n)).collect(),
            View::Cycle { len } => (x..n).step_by(len.max(1)).collect(),
            View::RepeatRows { d, t } => {
                let (r, c) = (x / d.max(1), x % d.max(1));
                (0..t).map(|k| (r * t + k) * d + c).filter(|&e| e < n).collect()
            }
            View::Transpose { a, b, c } => {
                let (g, r) = (x / (a * b * c), x % (a * b * c));
                let (ai, bi, ci) = (r / (b * c), r / c % b, r % c);
                vec![g * a * b * c + (bi * a + ai) * c + ci].into_iter().filter(|&e| e < n).collect()
            }
            View::Im2Col { .. } | View::Col2ImTap { .. } | View::Im2ColTap { .. } | View::TapToImage { .. } => {
                // Word i gathered as i + 1, so that the zeros the view reads no word for
                // (padding, taps that copied nothing) are told apart.
                let idx: Vec<u32> = (1..=self.span(n) as u32).collect();
                let got = self.gather(&idx, n);
                (0..n).filter(|&e| got[e] == x as u32 + 1).collect()
            }
        }
    }

    /// The `n` operand words read from `src` (which starts at the operand's offset).
    pub fn gather<'a>(&self, src: &'a [u32], n: usize) -> Cow<'a, [u32]> {
        match *self {
            View::Whole => Cow::Borrowed(&src[..n]),
            // Built with slice copies and fills, without zeroing first.
            View::PerRow { cols } => {
                let mut out = Vec::with_capacity(n);
                for &s in &src[..n / cols] {
                    out.resize(out.len() + cols, s);
                }
                Cow::Owned(out)
            }
            View::Cycle { len } => {
                let mut out = Vec::with_capacity(n);
                while len > 0 && out.len() < n {
                    out.extend_from_slice(&src[..len.min(n - out.len())]);
                }
                Cow::Owned(out)
            }
            View::RepeatRows { d, t } => {
                let mut out = Vec::with_capacity(n);
                for row in src[..n / t].chunks(d) {
                    for _ in 0..t {
                        out.extend_from_slice(row);
                    }
                }
                Cow::Owned(out)
            }
            View::Im2Col { .. }
            | View::Col2ImTap { .. }
            | View::Im2ColTap { .. }
            | View::TapToImage { .. }
            | View::Transpose { .. } => {
                let mut out = vec![0u32; n];
                self.gather_into(src, n, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// [`View::gather`] into the first `n` words of `out`, every one of them written (for `n`
    /// whole rows of the view; a `Cycle` of length 0 writes zeros where `gather` reads nothing).
    pub fn gather_into(&self, src: &[u32], n: usize, out: &mut [u32]) {
        let out = &mut out[..n];
        match *self {
            // A whole im2col matrix is written pixel by pixel along the one definition of its
            // layout, without finding each pixel's place from its index as a range must.
            View::Im2Col { window, image } => {
                let c = image[3];
                let cols = window.kh * window.kw * c;
                out.fill(0);
                window.for_each_im2col_pixel(&image, |row, off, from| {
                    let dst = row * cols + off * c;
                    copy_short(&mut out[dst..dst + c], &src[from..from + c]);
                });
            }
            _ => self.gather_range(src, 0, out),
        }
    }

    /// Elements `start .. start + out.len()` of [`View::gather`] into `out`, every one of them
    /// written, without gathering the rest: for an operand read a cache-sized chunk at a time.
    /// Each element's word is found from its index, segment by segment (a row of a repeat,
    /// a pixel's channels of an image view).
    pub fn gather_range(&self, src: &[u32], start: usize, out: &mut [u32]) {
        if out.is_empty() {
            return;
        }
        let end = start + out.len();
        match *self {
            View::Whole => out.copy_from_slice(&src[start..end]),
            View::PerRow { cols } => segments(start, out, cols, |row, _, o| o.fill(src[row])),
            View::Cycle { len: 0 } => out.fill(0),
            View::Cycle { len } => {
                // The part of the first period, then one whole period, doubled until full.
                let off = start % len;
                let first = (len - off).min(out.len());
                out[..first].copy_from_slice(&src[off..off + first]);
                repeat(&mut out[first..], &src[..len]);
            }
            View::RepeatRows { d, t } => segments(start, out, d * t, |row, off, o| {
                // Row `row` of the source, repeated t times; `o` starts `off` into the repeats.
                let src = &src[row * d..(row + 1) * d];
                let first = (d - off % d).min(o.len());
                o[..first].copy_from_slice(&src[off % d..off % d + first]);
                repeat(&mut o[first..], src);
            }),
            // A segment is one run of `C`: run `(b, a)` of group `g` is the buffer's `(a, b)`.
            View::Transpose { a, b, c } => segments(start, out, c, |seg, off, o| {
                let (g, r) = (seg / (a * b), seg % (a * b));
                let at = (g * a * b + (r % a) * b + r / a) * c + off;
                copy_short(o, &src[at..at + o.len()]);
            }),
            View::Im2Col { window, image } | View::Im2ColTap { window, image, .. } => {
                let [_, h, w, c] = image;
                let Some((oh, ow)) = window.output_hw(h, w) else { return out.fill(0) };
                // Kernel offsets per row: all of them, or the one a tap view reads.
                let (taps, only) = match *self {
                    View::Im2ColTap { tap, .. } => (1, Some(tap)),
                    _ => (window.kh * window.kw, None),
                };
                // A segment is one (row, kernel offset) pair's channels.
                segments(start, out, c, |seg, ch, o| {
                    let (row, tap) = (seg / taps, only.unwrap_or(seg % taps));
                    let (i, j) = (tap / window.kw, tap % window.kw);
                    let (b, y0, x0) = (row / (oh * ow), row / ow % oh, row % ow);
                    let y = (y0 * window.stride + i).checked_sub(window.padding).filter(|&y| y < h);
                    let x = (x0 * window.stride + j).checked_sub(window.padding).filter(|&x| x < w);
                    match (y, x) {
                        (Some(y), Some(x)) => {
                            let from = ((b * h + y) * w + x) * c + ch;
                            copy_short(o, &src[from..from + o.len()]);
                        }
                        _ => fill_short(o),
                    }
                });
            }
            View::Col2ImTap { window, image, tap } | View::TapToImage { window, image, tap } => {
                let [_, h, w, c] = image;
                let Some((oh, ow)) = window.output_hw(h, w) else { return out.fill(0) };
                // A row of the buffer read, and where in it this offset's channels start.
                let (cols, first) = match *self {
                    View::TapToImage { .. } => (c, 0),
                    _ => (window.kh * window.kw * c, tap * c),
                };
                let s = window.stride;
                let (i, j) = (tap / window.kw, tap % window.kw);
                // The output coordinate whose window put tap (i, j) on image coordinate `y`.
                let from = |y: usize, k: usize, o: usize| {
                    (y + window.padding).checked_sub(k).filter(|v| v % s == 0).map(|v| v / s).filter(|&v| v < o)
                };
                // Pixels are walked in order, their coordinates kept as they go, and each
                // column's output column looked up: no division per pixel, which holds as few
                // as a handful of channels.
                let x0s: Vec<Option<usize>> = (0..w).map(|x| from(x, j, ow)).collect();
                let mut e = start;
                let (p, ch) = (e / c.max(1), e % c.max(1));
                let (mut b, mut y, mut x) = (p / (h * w), p / w % h, p % w);
                let mut skip = ch;
                let mut y0 = from(y, i, oh);
                while e < end {
                    let stop = (e + c - skip).min(end);
                    let o = &mut out[e - start..stop - start];
                    match (y0, x0s[x]) {
                        (Some(y0), Some(x0)) => {
                            let at = ((b * oh + y0) * ow + x0) * cols + first + skip;
                            copy_short(o, &src[at..at + o.len()]);
                        }
                        _ => fill_short(o),
                    }
                    (e, skip) = (stop, 0);
                    x += 1;
                    if x == w {
                        x = 0;
                        y += 1;
                        if y == h {
                            (y, b) = (0, b + 1);
                        }
                        y0 = from(y, i, oh);
                    }
                }
            }
        }
    }
}

/// Calls `fill(segment, offset, part)` for each `unit`-element segment of the elements
/// `start .. start + out.len()`, `part` its piece of `out` and `offset` where that piece starts
/// within the segment (only the first piece starts inside one).
fn segments(start: usize, out: &mut [u32], unit: usize, mut fill: impl FnMut(usize, usize, &mut [u32])) {
    let unit = unit.max(1);
    let (mut seg, mut off) = (start / unit, start % unit);
    let mut rest = out;
    while !rest.is_empty() {
        let (part, tail) = rest.split_at_mut((unit - off).min(rest.len()));
        fill(seg, off, part);
        (seg, off, rest) = (seg + 1, 0, tail);
    }
}

/// Covers `0..len` (below 8) with at most two pieces of one width (4, 2 or 1) that may
/// overlap: `$part` with `$at` and `$w` bound to each piece's start and width. A loop over the
/// words would be compiled into a library `memcpy`/`memset` call (LeNet's 1- and 6-channel
/// pixels spent a quarter of a step in such calls); constant widths are a few moves. A macro,
/// as LLVM would not inline a closure called twice.
macro_rules! short_tail {
    ($len:expr, |$at:ident, $w:ident| $part:expr) => {{
        let len: usize = $len;
        debug_assert!(len < 8);
        let $w = match len {
            0 => 0,
            1 => 1,
            2 | 3 => 2,
            _ => 4,
        };
        if $w > 0 {
            let $at = 0;
            $part;
            if len > $w {
                let $at = len - $w;
                $part;
            }
        }
    }};
}

/// `dst.copy_from_slice(src)` for the few channels of one pixel, in eight-word pieces the
/// compiler keeps in registers: a library `memcpy` call per pixel cost more than its copy (a
/// sixth of a ResNet-20 step went to calls copying 64 bytes).
#[inline(always)]
fn copy_short(dst: &mut [u32], src: &[u32]) {
    let (mut d, mut s) = (dst.chunks_exact_mut(8), src.chunks_exact(8));
    for (d, s) in (&mut d).zip(&mut s) {
        let piece: [u32; 8] = s.try_into().expect("eight words");
        d.copy_from_slice(&piece);
    }
    let (d, s) = (d.into_remainder(), s.remainder());
    short_tail!(d.len(), |at, w| match w {
        4 => piece::<4>(&mut d[at..], &s[at..]),
        2 => piece::<2>(&mut d[at..], &s[at..]),
        _ => d[at] = s[at],
    });
}

/// `out.fill(0)` for one pixel's channels, as [`copy_short`] copies them.
#[inline(always)]
fn fill_short(out: &mut [u32]) {
    let mut d = out.chunks_exact_mut(8);
    for d in &mut d {
        d.copy_from_slice(&[0; 8]);
    }
    let d = d.into_remainder();
    short_tail!(d.len(), |at, w| match w {
        4 => piece::<4>(&mut d[at..], &[0; 4]),
        2 => piece::<2>(&mut d[at..], &[0; 2]),
        _ => d[at] = 0,
    });
}

/// The first `W` words of `src` over those of `dst`, a constant-length copy (a few moves).
#[inline(always)]
fn piece<const W: usize>(dst: &mut [u32], src: &[u32]) {
    let x: [u32; W] = src[..W].try_into().expect("W words");
    dst[..W].copy_from_slice(&x);
}

/// Fills `out` with `period` repeated from its first word: one copy, then the filled part
/// doubled (a few long copies instead of one per period).
fn repeat(out: &mut [u32], period: &[u32]) {
    let p = period.len().min(out.len());
    out[..p].copy_from_slice(&period[..p]);
    let mut filled = p;
    while filled < out.len() && filled > 0 {
        let k = filled.min(out.len() - filled);
        out.copy_within(..k, filled);
        filled += k;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `View::readers` says exactly which elements read each word, as a gather of the view
    /// does, for every kind (the im2col ones with strides that skip pixels and with padding);
    /// a gather into a slice writes what `gather` returns, and nothing past it.
    #[test]
    fn a_view_reads_exactly_the_words_its_gather_reads() {
        let image = [2, 5, 5, 3];
        let views = [
            (View::Whole, 12),
            (View::PerRow { cols: 4 }, 12),
            (View::Cycle { len: 5 }, 15),
            (View::RepeatRows { d: 3, t: 2 }, 12),
            (View::Im2Col { window: Window { kh: 2, kw: 2, stride: 3, padding: 0 }, image }, 2 * 2 * 2 * 12),
            (View::Im2Col { window: Window { kh: 3, kw: 3, stride: 1, padding: 1 }, image }, 2 * 25 * 27),
            (View::Col2ImTap { window: Window { kh: 2, kw: 2, stride: 3, padding: 0 }, image, tap: 3 }, 150),
            (View::Col2ImTap { window: Window { kh: 3, kw: 3, stride: 1, padding: 1 }, image, tap: 1 }, 150),
            (View::Col2ImTap { window: Window { kh: 3, kw: 3, stride: 2, padding: 1 }, image, tap: 5 }, 150),
            (View::Cycle { len: 1 }, 9),
            (View::PerRow { cols: 1 }, 6),
            (View::Im2ColTap { window: Window { kh: 2, kw: 2, stride: 2, padding: 0 }, image, tap: 3 }, 2 * 2 * 2 * 3),
            (View::Im2ColTap { window: Window { kh: 3, kw: 3, stride: 2, padding: 1 }, image, tap: 0 }, 2 * 3 * 3 * 3),
            (View::TapToImage { window: Window { kh: 2, kw: 2, stride: 2, padding: 0 }, image, tap: 1 }, 150),
            (View::TapToImage { window: Window { kh: 3, kw: 3, stride: 1, padding: 1 }, image, tap: 7 }, 150),
            (View::Transpose { a: 3, b: 4, c: 5 }, 120),
            (View::Transpose { a: 2, b: 3, c: 1 }, 12),
            (View::Transpose { a: 4, b: 1, c: 2 }, 16),
        ];
        for (view, n) in views {
            let span = view.span(n);
            // Word i gathered as i + 1: a 0 is an element that reads no word.
            let idx: Vec<u32> = (1..=span as u32).collect();
            let read = view.gather(&idx, n);
            let mut into = vec![7u32; n + 2];
            view.gather_into(&idx, n, &mut into);
            assert_eq!(&into[..n], &read[..], "{view:?}: gather_into");
            assert_eq!(&into[n..], &[7, 7], "{view:?}: gather_into wrote past n");
            // Ranges that start and end inside segments (rows, pixels), and single elements.
            for (s, len) in [(0, n), (1, n - 1), (5, 7), (n / 3, n / 2), (n - 1, 1), (4, 0)] {
                let len = len.min(n - s);
                let mut part = vec![7u32; len + 1];
                view.gather_range(&idx, s, &mut part[..len]);
                assert_eq!(&part[..len], &read[s..s + len], "{view:?}: gather_range from {s}, {len} elements");
                assert_eq!(part[len], 7, "{view:?}: gather_range wrote past its range");
            }
            for x in 0..span + 3 {
                let readers: Vec<usize> = (0..n).filter(|&e| read[e] == x as u32 + 1).collect();
                assert_eq!(view.readers(x, n), readers, "{view:?}, word {x}");
            }
        }
    }

    /// A tap view is its column block of the full im2col matrix, and the adjoint tap view reads
    /// a packed block as `Col2ImTap` reads that block of a full `cols` buffer.
    #[test]
    fn tap_views_are_the_full_views_column_blocks() {
        let image = [2, 5, 4, 3];
        for window in [
            Window { kh: 2, kw: 2, stride: 2, padding: 0 },
            Window { kh: 3, kw: 2, stride: 1, padding: 1 },
            Window { kh: 3, kw: 3, stride: 2, padding: 1 },
        ] {
            let (oh, ow) = window.output_hw(5, 4).unwrap();
            let (p, c, taps) = (2 * oh * ow, 3, window.kh * window.kw);
            let img: Vec<u32> = (1..=image.iter().product::<usize>() as u32).collect();
            let full = View::Im2Col { window, image }.gather(&img, p * taps * c).into_owned();
            let cols: Vec<u32> = (1..=(p * taps * c) as u32).collect();
            for tap in 0..taps {
                let one = View::Im2ColTap { window, image, tap }.gather(&img, p * c).into_owned();
                let block: Vec<u32> = full.chunks(taps * c).flat_map(|r| r[tap * c..(tap + 1) * c].to_vec()).collect();
                assert_eq!(one, block, "{window:?} tap {tap}");
                let packed: Vec<u32> = cols.chunks(taps * c).flat_map(|r| r[tap * c..(tap + 1) * c].to_vec()).collect();
                let n = image.iter().product();
                let want = View::Col2ImTap { window, image, tap }.gather(&cols, n).into_owned();
                assert_eq!(View::TapToImage { window, image, tap }.gather(&packed, n).into_owned(), want);
            }
        }
    }
}
