//! The error type of the train crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading data, weights or checkpoints, or running a step.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file could not be read or written.
    // The I/O error is part of the message, not a `source`, so `{:#}` chains don't repeat it.
    #[error("{file}: {error}")]
    Io {
        /// The file.
        file: PathBuf,
        /// Underlying I/O error.
        error: std::io::Error,
    },
    /// A `.npy` file that is not valid NPY.
    #[error("{file}: not a valid .npy file: {detail}")]
    Npy {
        /// The file.
        file: PathBuf,
        /// What the parser said.
        detail: String,
    },
    /// A `.npy` array of the wrong element type.
    #[error("{file}: wrong dtype: expected {expected}, found {found}")]
    DType {
        /// The file.
        file: PathBuf,
        /// Accepted dtypes, e.g. `<f4 or <f8`.
        expected: String,
        /// The file's dtype string.
        found: String,
    },
    /// An array of the wrong shape.
    #[error("{file}: wrong shape: expected {expected}, found {found}")]
    Shape {
        /// The file (or a description of the tensor).
        file: PathBuf,
        /// Expected shape, e.g. `[64, 32]`.
        expected: String,
        /// Found shape.
        found: String,
    },
    /// A NaN or infinity in input data or initial weights.
    #[error("{file}: value at index {index} is {value}: inputs and initial weights must be finite (pass --allow-nonfinite to keep such values)")]
    NonFinite {
        /// The file.
        file: PathBuf,
        /// Multi-index of the first bad value, e.g. `[3, 17]`.
        index: String,
        /// The value.
        value: f32,
    },
    /// An MNIST IDX file that is malformed.
    #[error("{file}: not a valid IDX file: {detail}")]
    Idx {
        /// The file.
        file: PathBuf,
        /// What is wrong (magic, dims, length).
        detail: String,
    },
    /// An initial-weights directory lacks a parameter's file.
    #[error("{file}: missing initial weights for parameter `{param}` (expected a .npy of shape {shape})")]
    MissingParam {
        /// The file that was looked for.
        file: PathBuf,
        /// The model parameter.
        param: String,
        /// Its shape.
        shape: String,
    },
    /// An optimizer name that is not known.
    #[error("unknown optimizer `{0}` (expected one of: sgd, momentum, adam, adamw)")]
    UnknownOptimizer(String),
    /// A precision name that is not known.
    #[error("unknown precision `{0}` (expected one of: bf16, fp32)")]
    UnknownPrecision(String),
    /// A data directory without a recognised dataset.
    #[error("{dir}: no dataset found (expected x.npy + y.npy, or MNIST IDX files train-images-idx3-ubyte + train-labels-idx1-ubyte)")]
    NoDataset {
        /// The directory.
        dir: PathBuf,
    },
    /// Data that does not fit the model or is inconsistent.
    #[error("dataset: {0}")]
    Data(String),
    /// A checkpoint that cannot be restored.
    #[error("{file}: bad checkpoint: {detail}")]
    Checkpoint {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A trace or run description that cannot be continued.
    #[error("{file}: {detail}")]
    Trace {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The model graph could not be loaded or does not fit the executor.
    #[error("model: {0}")]
    Model(String),
    /// The machine refused an operation.
    #[error(transparent)]
    Hw(#[from] faultline_hw::HwError),
    /// Invalid run settings.
    #[error("{0}")]
    Config(String),
}

/// Result alias of the train crate.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// Formats a shape like `[2, 3]`.
pub fn shape_str(s: &[usize]) -> String {
    format!("{s:?}")
}

pub(crate) fn io_err(file: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TrainError {
    let file = file.into();
    move |error| TrainError::Io { file, error }
}
