//! The one error type of the graph crate.

use std::path::PathBuf;

/// Anything that can go wrong loading a model, building its training graph or evaluating it.
///
/// Every variant names where the problem is: the model file (or `<inline>`), the node or layer,
/// and for shapes the expected and the found shape.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The model file could not be read.
    #[error("{file}: cannot read model")]
    Io {
        /// Path of the model file.
        file: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// RON syntax error, unknown op or field, missing field or wrong type.
    #[error(transparent)]
    Parse(#[from] faultline_hw::files::RonError),
    /// A node's inputs do not have the shapes its op needs.
    #[error("{file}: node `{node}` ({op}): expected {expected}, found {found}")]
    Shape {
        /// Model file (or `<inline>`).
        file: PathBuf,
        /// Node (or layer) name.
        node: String,
        /// Op name, e.g. `matmul`.
        op: String,
        /// What the op needs, e.g. `b: [64, *]`.
        expected: String,
        /// What it got, e.g. `b: [32, 10]`.
        found: String,
    },
    /// A layer names an input that no earlier layer (or `input`) defines.
    #[error("{file}: layer `{node}`: unknown input `{input}` (defined so far: {known})")]
    UnknownInput {
        /// Model file.
        file: PathBuf,
        /// Layer that names the input.
        node: String,
        /// The name that was not found.
        input: String,
        /// Names that would have been accepted.
        known: String,
    },
    /// Two nodes or layers have the same name.
    #[error("{file}: duplicate name `{node}`")]
    Duplicate {
        /// Model file.
        file: PathBuf,
        /// The repeated name.
        node: String,
    },
    /// A value that parses but is not allowed (zero kernel, wrong input count, ...).
    #[error("{file}: node `{node}`: {message}")]
    Invalid {
        /// Model file.
        file: PathBuf,
        /// Node or layer name (or `model` / `optimizer`).
        node: String,
        /// What is wrong and what would be accepted.
        message: String,
    },
    /// Evaluation was not given a value for a placeholder (input, label, step, parameter or
    /// optimizer state).
    #[error("missing {kind} `{name}` (expected shape {expected:?})")]
    MissingValue {
        /// `input`, `label`, `step`, `parameter` or `optimizer state`.
        kind: &'static str,
        /// Node name of the placeholder.
        name: String,
        /// Its shape.
        expected: Vec<usize>,
    },
    /// A value was given with the wrong shape.
    #[error("value `{name}`: expected shape {expected:?}, found {found:?}")]
    ValueShape {
        /// Node name of the placeholder.
        name: String,
        /// Shape the graph needs.
        expected: Vec<usize>,
        /// Shape that was given.
        found: Vec<usize>,
    },
    /// The graph has a cycle (only possible for hand-built graphs).
    #[error("graph has a cycle through node `{node}`")]
    Cycle {
        /// A node on the cycle.
        node: String,
    },
    /// A tensor an instruction needs on chip does not fit the SRAM, even with every other
    /// value spilled to DRAM.
    #[error("{hw}: {detail}")]
    DoesNotFit {
        /// Hardware config name.
        hw: String,
        /// Which tensor, how many words, and what the SRAM holds.
        detail: String,
    },
}
