//! The shipped 8x8 digits: the UCI optical-digits test set (1797 handwritten samples, 43
//! writers; see `data/README.md`), embedded as IDX files and read with the same loader as MNIST.

use super::dataset::Dataset;
use super::idx::parse_idx;
use std::path::Path;

/// Side of the square image.
pub const SIDE: usize = 8;

/// Raw IDX bytes of the images (1797 x 8 x 8, values 0..=16).
const IMAGES: &[u8] = include_bytes!("../../data/digits-images-idx3-ubyte");
/// Raw IDX bytes of the labels (1797, values 0..=9).
const LABELS: &[u8] = include_bytes!("../../data/digits-labels-idx1-ubyte");

/// Number of samples in the shipped set.
pub const DEFAULT_LEN: usize = 1797;

/// The whole shipped set: shape `[64]`, values scaled to [0, 1] (count / 16), 10 classes.
pub fn digits() -> Dataset {
    let img = parse_idx(IMAGES, Path::new("sim/train/data/digits-images-idx3-ubyte")).expect("shipped IDX is valid");
    let lab = parse_idx(LABELS, Path::new("sim/train/data/digits-labels-idx1-ubyte")).expect("shipped IDX is valid");
    let x = img.data.iter().map(|&v| v as f32 / 16.0).collect();
    let y = lab.data.iter().map(|&v| v as u32).collect();
    Dataset::new("digits8x8", vec![SIDE * SIDE], x, y, 10).expect("shipped digits are consistent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_set_has_the_documented_shape_and_classes() {
        let d = digits();
        assert_eq!(d.len(), DEFAULT_LEN);
        assert_eq!(d.x.len(), DEFAULT_LEN * 64);
        assert!(d.x.iter().all(|v| (0.0..=1.0).contains(v)));
        let mut per_class = [0usize; 10];
        for &y in &d.y {
            per_class[y as usize] += 1;
        }
        // The UCI test set's class counts (174 eights .. 183 threes).
        assert_eq!(per_class, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
        // First sample is a zero (its well-known image starts 0 0 5 13 9 1 0 0).
        assert_eq!(d.y[0], 0);
        assert_eq!(&d.x[..8], &[0.0, 0.0, 5.0 / 16.0, 13.0 / 16.0, 9.0 / 16.0, 1.0 / 16.0, 0.0, 0.0]);
    }

    #[test]
    fn nearest_neighbour_classifier_is_accurate() {
        // Sanity of the data: 1-nearest-neighbour on a 1000/797 split is well above 90%.
        let d = digits();
        let dist = |i: usize, j: usize| (0..64).map(|p| (d.x[i * 64 + p] - d.x[j * 64 + p]).powi(2)).sum::<f32>();
        let test = 1000..d.len();
        let correct = test
            .clone()
            .filter(|&i| {
                let nn = (0..1000).min_by(|&a, &b| dist(i, a).total_cmp(&dist(i, b))).unwrap();
                d.y[nn] == d.y[i]
            })
            .count();
        assert!(correct * 100 >= test.len() * 95, "1-NN got {correct}/{}", test.len());
    }
}
