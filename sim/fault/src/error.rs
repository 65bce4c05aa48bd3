//! Errors of campaigns: a bad spec names its file, line and field; a bad output directory or
//! record file names the path and line.

use faultline_hw::error::one_line;
use std::path::{Path, PathBuf};

/// `path` as an error shows it: on one line, whatever characters the path holds (a file name
/// may contain a newline).
fn shown(path: &Path) -> String {
    one_line(&path.display().to_string())
}

/// Anything a campaign can fail with.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// A file could not be read or written (the cause follows in the error chain, which the
    /// CLI prints joined: `path: cause`).
    #[error("{}", shown(path))]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// RON syntax error, unknown or missing field, wrong type.
    #[error(transparent)]
    Parse(#[from] faultline_hw::files::RonError),
    /// A field parsed but its value cannot be used.
    #[error("{}: field `{field}` = {value}: {allowed}", shown(file))]
    Invalid {
        /// The spec file.
        file: PathBuf,
        /// Dotted path of the field, e.g. `sampling.n`.
        field: String,
        /// The value as written.
        value: String,
        /// What would be accepted.
        allowed: String,
    },
    /// A campaign output (records, summary, shard files) that does not fit the campaign.
    #[error("{}: {why}", shown(path))]
    Output {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Training or injection failed.
    #[error(transparent)]
    Train(#[from] faultline_train::TrainError),
    /// The machine refused something.
    #[error(transparent)]
    Hw(#[from] faultline_hw::HwError),
    /// A model file could not be loaded.
    #[error(transparent)]
    Graph(#[from] faultline_graph::GraphError),
    /// A hardware config could not be loaded.
    #[error(transparent)]
    Config(#[from] faultline_hw::ConfigError),
    /// The simulator contradicted itself (a fault predicted dead corrupted something, or a
    /// hardware-masked fault changed the state): a bug, never a user error.
    #[error("internal inconsistency: {0}")]
    Inconsistent(String),
    /// A trial could not be replayed ([`crate::replay`]): its inputs changed since it ran, or
    /// its fault has nothing to step.
    #[error("{0}")]
    Replay(String),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, FaultError>;

impl FaultError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> FaultError {
        let path = path.into();
        move |source| FaultError::Io { path, source }
    }
}
