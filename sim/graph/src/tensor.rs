//! A dense row-major f64 tensor: the value type of the reference interpreter and of feeds.

use serde::{Deserialize, Serialize};

/// Dense row-major tensor of f64.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    /// Shape (empty is not used; scalars are `[1]`).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, last index fastest.
    pub data: Vec<f64>,
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor { shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
    }

    /// A tensor from data; `None` if the length does not match the shape.
    pub fn new(shape: &[usize], data: Vec<f64>) -> Option<Tensor> {
        (data.len() == shape.iter().product::<usize>()).then(|| Tensor { shape: shape.to_vec(), data })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One-hot rows `[labels.len(), classes]`; labels `>= classes` give an all-zero row.
    pub fn one_hot(labels: &[usize], classes: usize) -> Tensor {
        let mut t = Tensor::zeros(&[labels.len(), classes]);
        for (r, &l) in labels.iter().enumerate() {
            if l < classes {
                t.data[r * classes + l] = 1.0;
            }
        }
        t
    }

    /// Index of the largest value of each row of a `[N, C]` tensor (first one on ties).
    pub fn argmax_rows(&self) -> Vec<usize> {
        let c = *self.shape.last().unwrap_or(&1);
        if c == 0 {
            return vec![];
        }
        self.data
            .chunks(c)
            .map(|row| row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best }))
            .collect()
    }
}
