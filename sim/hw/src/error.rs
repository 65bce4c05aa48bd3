//! Error types of the hardware crate.

use std::path::PathBuf;

/// `s` with control characters (newlines, escapes) written as escapes, so that user text quoted
/// in an error message keeps the message on one line.
pub fn one_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// A hardware config that could not be read, parsed or validated.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read hardware config")]
    Io {
        /// Path of the config file.
        file: PathBuf,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// Another input file (a SCALE-Sim config or topology) could not be read.
    #[error("{file}: cannot read {what}")]
    Read {
        /// Path of the file.
        file: PathBuf,
        /// What the file was to be, e.g. `SCALE-Sim config`.
        what: &'static str,
        /// Underlying I/O error.
        source: std::io::Error,
    },
    /// RON syntax error, unknown field, missing field or wrong type.
    #[error(transparent)]
    Ron(#[from] crate::files::RonError),
    /// A SCALE-Sim config or topology that does not parse.
    #[error("{file}:{line}:{col}: {}", one_line(message))]
    Parse {
        /// Path of the file.
        file: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        col: usize,
        /// What the parser said.
        message: String,
    },
    /// A field parsed but holds a value the hardware cannot have.
    #[error("{file}: field `{field}` = {value}: {allowed}")]
    Invalid {
        /// Path of the config file (or `<inline>`).
        file: PathBuf,
        /// Dotted path of the field, e.g. `mxu.rows`.
        field: String,
        /// The offending value as written.
        value: String,
        /// What would be accepted.
        allowed: String,
    },
}

/// Errors from running operations on the machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HwError {
    /// Operand shapes do not agree.
    #[error("shape mismatch in {op}: {detail}")]
    Shape {
        /// Operation name.
        op: String,
        /// Expected vs found.
        detail: String,
    },
    /// A fault that cannot be placed: the site does not exist on this machine, is not used by the
    /// operation, or its time is outside the operation.
    #[error("fault at `{site}` cannot be injected: {why}")]
    BadSite {
        /// The site as text.
        site: String,
        /// Why it is out of range.
        why: String,
    },
    /// A site string that does not parse.
    #[error("cannot parse fault site `{}`: {why}", one_line(text))]
    SiteParse {
        /// The text given.
        text: String,
        /// What is wrong (user text in it already passed through [`one_line`]).
        why: String,
    },
    /// A fault string (`KIND:SITE@TILE:CYCLE[+DURATION]`) that does not parse.
    #[error("cannot parse fault `{}`: {why}; expected {}", one_line(text), crate::fault::FAULT_FORM)]
    FaultParse {
        /// The text given.
        text: String,
        /// What is wrong (user text in it already passed through [`one_line`]).
        why: String,
    },
    /// A cycle or byte count of an operation does not fit 64 bits (only reachable with configs
    /// or shapes outside the documented ranges); names what drives it.
    #[error("{what}: {quantity} overflows 64 bits; it grows with {drivers}")]
    Overflow {
        /// The operation, with its shape.
        what: String,
        /// What was being computed, e.g. `the DMA schedule's cycle count`.
        quantity: String,
        /// The config fields and/or shape dimensions it grows with.
        drivers: String,
    },
    /// An operation's tiles do not fit an on-chip memory.
    #[error("op {op}: {memory} too small: needs {needed_bytes} bytes ({what}), has {available_bytes} bytes; use a config with a larger `{field}` or a smaller op")]
    SramOverflow {
        /// Operation name and shape.
        op: String,
        /// Memory name (`unified buffer`, `accumulator`, `weight buffer`).
        memory: String,
        /// Config field that sets its size.
        field: String,
        /// What had to fit.
        what: String,
        /// Bytes needed.
        needed_bytes: u64,
        /// Bytes available.
        available_bytes: u64,
    },
    /// A command would need more host memory than its limit allows (checked before allocating).
    #[error("{what} needs {needed} of host memory, more than the limit of {limit} (raise it with {raise_with})")]
    HostMemory {
        /// The work, with its size, e.g. `gemm 1000000000x1x1`.
        what: String,
        /// The estimate, human-readable.
        needed: String,
        /// The limit, human-readable.
        limit: String,
        /// How to raise the limit.
        raise_with: String,
    },
    /// An operation's DRAM footprint exceeds the DRAM.
    #[error("op {op}: needs {needed_bytes} bytes of DRAM, the config has {available_bytes} (`dram.bytes`)")]
    DramOverflow {
        /// Operation name and shape.
        op: String,
        /// Bytes needed.
        needed_bytes: u64,
        /// Bytes available.
        available_bytes: u64,
    },
}
