//! Which data a run trains on: a shipped dataset chosen to fit the model's input (the real 8x8
//! digits, or generated sequences/spirals/blobs), or a directory of `.npy` arrays or MNIST IDX files.

use super::dataset::{Dataset, Split};
use super::{digits, idx, mnist, npy, synth, text};
use crate::error::{shape_str, Result, TrainError};
use faultline_graph::ModelSpec;
use faultline_hw::budget::{product, HostMemory};
use std::path::Path;

/// How data may be loaded: the host-memory limit, and whether NaN/inf inputs are accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Arrays (as f32) and files must fit this.
    pub mem: HostMemory,
    /// Accept NaN or infinite input values (by default the first one is an error).
    pub allow_nonfinite: bool,
}

/// Fraction of a dataset held out for testing when it has no separate test files.
pub const TEST_FRACTION: f64 = 0.2;

/// The shipped dataset that fits `spec`'s input and outputs, split seeded by `seed`:
/// * 64 input values and 10 outputs: the real 8x8 handwritten digits ([`digits`]), reshaped to the input shape;
/// * 784 input values and 10 outputs: 5,000 real 28x28 MNIST digits ([`mnist`]), likewise;
/// * a language model (`TokenCrossEntropy`) with input `[T]` and 96 outputs: six Shakespeare
///   tragedies as `T` byte tokens predicting the next `T` ([`text`]);
/// * input `[T, V]` with `V >= outputs`: majority-token sequences, one-hot rows ([`synth`]);
/// * input `[2]`: spirals with `outputs` arms; any other `[D]`: `outputs` blobs.
pub fn shipped(spec: &ModelSpec, seed: u64, mem: &HostMemory) -> Result<Split> {
    let c = spec.outputs;
    let inp = &spec.input;
    let numel: usize = inp.iter().product();
    // Generated sets are sized from the model: check before generating (4 bytes a value).
    let fits = |samples: usize| {
        let bytes = product(inp).and_then(|n| n.checked_mul(samples as u64 * 4));
        mem.check(&format!("the shipped dataset for model `{}` ({samples} samples of {inp:?})", spec.name), bytes)
    };
    let lm = spec.loss == faultline_graph::LossSpec::TokenCrossEntropy;
    let ds = if lm && inp.len() == 1 && c == text::VOCAB {
        text::shakespeare(inp[0])?
    } else if lm {
        return Err(TrainError::Data(format!(
            "no shipped text fits language model `{}` (input {}, {} outputs): the shipped corpus needs input [T] and {} outputs (its byte tokens); pass --data DIR",
            spec.name,
            shape_str(inp),
            c,
            text::VOCAB
        )));
    } else if numel == 0 {
        return Err(TrainError::Data(format!("model `{}` has an empty input shape {}", spec.name, shape_str(inp))));
    } else if numel == 64 && c == 10 {
        digits::digits()
    } else if numel == mnist::SIDE * mnist::SIDE && c == 10 {
        mnist::mnist5k()
    } else if inp.len() == 2 && inp[1] >= c && c >= 2 && inp[0] >= 3 {
        fits(2000)?;
        synth::one_hot_tokens(&synth::majority_tokens(2000, inp[1], c, inp[0], seed), inp[1])
    } else if inp == &[2] && c >= 2 {
        fits(300 * c)?;
        synth::spirals(300, c, 0.2, seed)
    } else if inp.len() == 1 && c >= 2 {
        fits(300 * c)?;
        synth::blobs(300 * c, c, inp[0], seed)
    } else {
        return Err(TrainError::Data(format!(
            "no shipped dataset fits model `{}` (input {}, {} outputs); pass --data DIR",
            spec.name,
            shape_str(inp),
            c
        )));
    };
    finish(ds.split(TEST_FRACTION, seed ^ 0x5eed), spec)
}

/// Loads `dir`: `x.npy` + `y.npy` (plus optional `x_test.npy` + `y_test.npy`; otherwise a
/// seeded split), or MNIST IDX files. Inputs are `[N, ...]` float or uint8 arrays; labels
/// `[N]` integers, finite unless `opts.allow_nonfinite`. The per-sample shape must be the
/// model input's (trailing 1s aside, e.g. `[8, 8]` images for an `[8, 8, 1]` input), or either
/// must be flat (`[64]` for `[8, 8, 1]`, or `[8, 8]` images for a `[64]` input).
pub fn load_dir(dir: &Path, spec: &ModelSpec, seed: u64, opts: &LoadOptions) -> Result<Split> {
    if !dir.is_dir() {
        return Err(TrainError::Config(format!("{}: data directory does not exist", dir.display())));
    }
    let (x, y) = (dir.join("x.npy"), dir.join("y.npy"));
    let split = if x.is_file() || y.is_file() {
        let train = npy_pair(&x, &y, spec, opts)?;
        let (xt, yt) = (dir.join("x_test.npy"), dir.join("y_test.npy"));
        if xt.is_file() || yt.is_file() {
            Split { train, test: npy_pair(&xt, &yt, spec, opts)? }
        } else {
            train.split(TEST_FRACTION, seed ^ 0x5eed)
        }
    } else if let Some(s) = idx::mnist_split(dir, seed ^ 0x5eed, &opts.mem)? {
        s
    } else {
        return Err(TrainError::NoDataset { dir: dir.to_path_buf() });
    };
    finish(split, spec)
}

fn npy_pair(x: &Path, y: &Path, spec: &ModelSpec, opts: &LoadOptions) -> Result<Dataset> {
    let a = npy::read_inputs(x, &opts.mem)?;
    npy::check_finite(x, &a.shape, &a.data, opts.allow_nonfinite)?;
    let labels = npy::read_labels(y)?;
    let per: usize = spec.input.iter().product();
    let n = labels.len();
    if a.shape.first() != Some(&n) || a.shape[1..].iter().product::<usize>() != per {
        return Err(TrainError::Shape {
            file: x.to_path_buf(),
            expected: format!(
                "[{n}, {}] or [{n}, ...] with {per} values per sample (model input, {n} labels in {})",
                shape_str(&spec.input).trim_matches(['[', ']']),
                y.display()
            ),
            found: shape_str(&a.shape),
        });
    }
    if let Some((i, &l)) = labels.iter().enumerate().find(|(_, &l)| l as usize >= spec.outputs) {
        return Err(TrainError::Data(format!(
            "{}: label {l} at index {i} does not fit the model's {} outputs",
            y.display(),
            spec.outputs
        )));
    }
    Dataset::new(&x.display().to_string(), a.shape[1..].to_vec(), a.data, labels, spec.outputs)
}

/// Reshapes to the model input and checks labels fit the outputs.
fn finish(s: Split, spec: &ModelSpec) -> Result<Split> {
    for d in [&s.train, &s.test] {
        if d.num_classes > spec.outputs && d.y.iter().any(|&l| l as usize >= spec.outputs) {
            return Err(TrainError::Data(format!(
                "{}: {} classes but model `{}` has {} outputs",
                d.name, d.num_classes, spec.name, spec.outputs
            )));
        }
    }
    if s.test.is_empty() {
        return Err(TrainError::Data(format!("{}: no test samples", s.test.name)));
    }
    s.reshaped(&spec.input)
}
