//! Argument syntax shared by several commands.

use anyhow::{Context, Result};
use faultline_hw::fault::FaultEvent;
use faultline_hw::files::DirLock;
use faultline_hw::HwConfig;
use faultline_train::MxuFormat;
use std::path::Path;

/// Locks the output directory `dir` (given as `flag`) for this process, creating it if needed:
/// a second command writing there fails at once, naming it, instead of mixing its files in.
pub fn lock_output(flag: &str, dir: &Path) -> Result<DirLock> {
    DirLock::acquire(dir).with_context(|| format!("{flag} {}", dir.display()))
}

/// Parses a `--fault` value: [`FaultEvent`]'s one text form, `KIND:SITE@TILE:CYCLE[+DURATION]`,
/// e.g. `flip:mxu.pe[3][5].psum[30]@0:40` or `stuck1:ub.word[0x40][7]@2:0+100`.
pub fn parse_fault(text: &str) -> Result<FaultEvent> {
    text.parse().context("--fault")
}

/// The MXU input format a `--precision` value names (`bf16` or `fp32`), or without one the
/// format a run on `hw` takes by default ([`MxuFormat::default_for`]).
pub fn precision(given: Option<&str>, hw: &HwConfig) -> Result<MxuFormat> {
    Ok(given.map(str::parse).transpose()?.unwrap_or_else(|| MxuFormat::default_for(hw)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultline_num::BitFault;

    #[test]
    fn fault_argument_parses() {
        let e = parse_fault("stuck1:mxu.pe[0][1].weight[14]@2:5+100").unwrap();
        assert_eq!(e.site.to_string(), "mxu.pe[0][1].weight[14]");
        assert_eq!((e.kind, e.at.tile, e.at.cycle, e.duration), (BitFault::StuckAt1, 2, 5, 100));
        assert!(parse_fault("zap:mxu.pe[0][1].weight[14]@2:5").is_err());
        let e = format!("{:#}", parse_fault("flip:mxu.pe[0][1].weight[14]@x:5").unwrap_err());
        assert!(e.starts_with("--fault: ") && e.contains("TILE"), "{e}");
    }
}
