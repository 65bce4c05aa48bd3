//! Hardware configuration, loaded from RON (`configs/tpu-*.ron`).
//!
//! Every field is typed and documented with its unit. Unknown fields are rejected so that a
//! typo never silently falls back to a default.

use crate::error::ConfigError;
use faultline_num::{NumFormat, Precision};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Dataflow of the systolic array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dataflow {
    /// Weights held in PEs (double-buffered via shadow registers); activations flow right,
    /// partial sums flow down into the accumulators.
    WeightStationary,
    /// Partial sums held in PEs; activations flow right, weights flow down; results drain
    /// down the columns after each tile.
    OutputStationary,
}

impl Dataflow {
    /// Short name used on the command line (`ws`, `os`).
    pub const fn short(self) -> &'static str {
        match self {
            Dataflow::WeightStationary => "ws",
            Dataflow::OutputStationary => "os",
        }
    }
}

/// The matrix unit (systolic array).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MxuConfig {
    /// PE rows (the reduction/K dimension in WS). Count, 1..=1024.
    pub rows: usize,
    /// PE columns (the output/N dimension). Count, 1..=1024.
    pub cols: usize,
    /// Dataflow the array implements.
    pub dataflow: Dataflow,
    /// Format of activation and weight registers: Bf16, Fp32 or Int8.
    pub input_format: NumFormat,
    /// Format of partial sums and accumulators: Fp32 (with Bf16/Fp32 inputs) or Int32 (with Int8).
    pub acc_format: NumFormat,
}

impl MxuConfig {
    /// The validated (input, accumulator) pair. Panics only if `validate` was skipped.
    pub fn precision(&self) -> Precision {
        Precision::from_formats(self.input_format, self.acc_format)
            .expect("MxuConfig::precision on an unvalidated config")
    }
}

/// The whole machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HwConfig {
    /// Human-readable name, e.g. `tpu-32x32`.
    pub name: String,
    /// Core clock in MHz (used to turn cycles into seconds).
    pub clock_mhz: f64,
    /// The matrix unit.
    pub mxu: MxuConfig,
}

impl HwConfig {
    /// Reads, parses and validates a config file.
    pub fn load(path: impl AsRef<Path>) -> Result<HwConfig, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Io { file: path.to_path_buf(), source })?;
        Self::from_ron(&text, path)
    }

    /// Parses and validates RON text; `file` is only used in error messages.
    pub fn from_ron(text: &str, file: impl AsRef<Path>) -> Result<HwConfig, ConfigError> {
        let file = file.as_ref().to_path_buf();
        let cfg: HwConfig = ron::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.clone(),
            line: e.span.start.line,
            col: e.span.start.col,
            message: e.code.to_string(),
        })?;
        cfg.validate(&file)?;
        Ok(cfg)
    }

    /// Checks value ranges that the type system cannot express.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let bad = |field: &str, value: String, allowed: &str| ConfigError::Invalid {
            file: file.to_path_buf(),
            field: field.into(),
            value,
            allowed: allowed.into(),
        };
        if !(1..=1024).contains(&self.mxu.rows) {
            return Err(bad("mxu.rows", self.mxu.rows.to_string(), "allowed: 1 to 1024"));
        }
        if !(1..=1024).contains(&self.mxu.cols) {
            return Err(bad("mxu.cols", self.mxu.cols.to_string(), "allowed: 1 to 1024"));
        }
        if !(self.clock_mhz.is_finite() && self.clock_mhz > 0.0) {
            return Err(bad("clock_mhz", self.clock_mhz.to_string(), "allowed: a positive number of MHz"));
        }
        if Precision::from_formats(self.mxu.input_format, self.mxu.acc_format).is_none() {
            return Err(bad(
                "mxu.acc_format",
                format!("{:?} with input_format {:?}", self.mxu.acc_format, self.mxu.input_format),
                "allowed pairs (input_format, acc_format): (Bf16, Fp32), (Fp32, Fp32), (Int8, Int32)",
            ));
        }
        Ok(())
    }

    /// A small in-memory config for tests and examples.
    pub fn test_config(rows: usize, cols: usize, dataflow: Dataflow, precision: Precision) -> HwConfig {
        HwConfig {
            name: format!("test-{rows}x{cols}"),
            clock_mhz: 1000.0,
            mxu: MxuConfig { rows, cols, dataflow, input_format: precision.input(), acc_format: precision.acc() },
        }
    }
}

/// Placeholder path used in errors for configs not read from a file.
pub fn inline_path() -> PathBuf {
    PathBuf::from("<inline>")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"(
        name: "t",
        clock_mhz: 940.0,
        mxu: (rows: 4, cols: 8, dataflow: WeightStationary, input_format: Bf16, acc_format: Fp32),
    )"#;

    #[test]
    fn parses_a_good_config() {
        let c = HwConfig::from_ron(GOOD, "good.ron").unwrap();
        assert_eq!((c.mxu.rows, c.mxu.cols), (4, 8));
        assert_eq!(c.mxu.precision(), Precision::Bf16Fp32);
    }

    #[test]
    fn unknown_field_names_file_line_and_field() {
        let text = GOOD.replace("rows: 4,", "rows: 4, rowz: 3,");
        let e = HwConfig::from_ron(&text, "cfg/bad.ron").unwrap_err().to_string();
        assert!(e.starts_with("cfg/bad.ron:4:"), "{e}");
        assert!(e.contains("rowz"), "{e}");
    }

    #[test]
    fn bad_enum_value_lists_allowed_values() {
        let text = GOOD.replace("WeightStationary", "RowStationary");
        let e = HwConfig::from_ron(&text, "x.ron").unwrap_err().to_string();
        assert!(e.contains("RowStationary") && e.contains("WeightStationary"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_field() {
        let e = HwConfig::from_ron(&GOOD.replace("rows: 4", "rows: 0"), "x.ron").unwrap_err().to_string();
        assert!(e.contains("mxu.rows") && e.contains("1 to 1024"), "{e}");
        let e = HwConfig::from_ron(&GOOD.replace("Fp32)", "Int32)"), "x.ron").unwrap_err().to_string();
        assert!(e.contains("mxu.acc_format") && e.contains("(Int8, Int32)"), "{e}");
    }

    #[test]
    fn shipped_configs_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        for name in ["tpu-8x8.ron", "tpu-32x32.ron", "tpu-128x128.ron"] {
            HwConfig::load(dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
