//! Errors of report generation: each names the file (and line) it concerns.

use std::path::PathBuf;

/// A report error.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be read or written (the cause follows in the error chain).
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A trace file is malformed, or of another schema or campaign.
    #[error("{path}{}: {why}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Trace {
        /// The file.
        path: PathBuf,
        /// 1-based line, for a line of `records.jsonl`.
        line: Option<u64>,
        /// What is wrong.
        why: String,
    },
    /// A figure could not be drawn.
    #[error("figure {name}: {why}")]
    Figure {
        /// Figure file name.
        name: String,
        /// The plotting error.
        why: String,
    },
    /// A campaign directory could not be read (missing, foreign, malformed, too large).
    #[error(transparent)]
    Campaign(#[from] faultline_fault::FaultError),
    /// A host-memory estimate exceeds the limit.
    #[error(transparent)]
    Hw(#[from] faultline_hw::HwError),
    /// Replaying a trial failed.
    #[error("{0}")]
    Replay(String),
}

impl ReportError {
    /// Wraps an I/O error with the path it concerns (for `map_err`).
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ReportError {
        let path = path.into();
        move |source| ReportError::Io { path, source }
    }
}

/// Result of report operations.
pub type Result<T> = std::result::Result<T, ReportError>;
