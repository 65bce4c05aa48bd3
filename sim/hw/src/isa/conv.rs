//! Convolution geometry: a kernel window's output size and the im2col layout, written once
//! (views, graph lowering and whole-op convolutions all use it).

use serde::{Deserialize, Serialize};

/// Window geometry of a convolution (square stride and zero padding on all four sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Window {
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride in both directions (>= 1).
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
}

impl Window {
    /// Output (height, width) for an input of `h x w`, or `None` if the kernel does not fit.
    pub fn output_hw(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        let pad = self.padding.checked_mul(2)?;
        let (ph, pw) = (h.checked_add(pad)?, w.checked_add(pad)?);
        if self.kh == 0 || self.kw == 0 || self.stride == 0 || ph < self.kh || pw < self.kw {
            return None;
        }
        Some(((ph - self.kh) / self.stride + 1, (pw - self.kw) / self.stride + 1))
    }

    /// Walks the im2col layout of an NHWC image of shape `img = [N, H, W, C]`: calls
    /// `f(row, offset, src)` for every im2col row (output pixel, row-major over N, OH, OW) and
    /// kernel offset (`offset = kh_i * KW + kw_j`, outer loop `kh_i`) that lands inside the
    /// image, in that order, with `src` the image offset of channel 0. Entry `(row, col)` of the
    /// im2col matrix, `col = offset * C + c`, is image element `src + c`; entries not visited
    /// are padding (zero). The one definition of the im2col layout.
    pub fn for_each_im2col_pixel(&self, img: &[usize], mut f: impl FnMut(usize, usize, usize)) {
        let (n, h, wd, c) = (img[0], img[1], img[2], img[3]);
        let Some((oh, ow)) = self.output_hw(h, wd) else { return };
        for b in 0..n {
            for y0 in 0..oh {
                for x0 in 0..ow {
                    let row = (b * oh + y0) * ow + x0;
                    for i in 0..self.kh {
                        let Some(y) = (y0 * self.stride + i).checked_sub(self.padding).filter(|&y| y < h) else {
                            continue;
                        };
                        for j in 0..self.kw {
                            let Some(x) = (x0 * self.stride + j).checked_sub(self.padding).filter(|&x| x < wd) else {
                                continue;
                            };
                            f(row, i * self.kw + j, ((b * h + y) * wd + x) * c);
                        }
                    }
                }
            }
        }
    }
}
