//! Argument syntax shared by several commands.

use anyhow::{Context, Result};
use faultline_hw::fault::{FaultEvent, FaultTime};
use faultline_hw::FaultSite;
use faultline_num::BitFault;

/// Parses a `--fault` value, `KIND:SITE@TILE:CYCLE[+DURATION]`, e.g.
/// `flip:mxu.pe[3][5].psum[30]@0:40` or `stuck1:ub.word[0x40][7]@2:0+100`.
pub fn parse_fault(text: &str) -> Result<FaultEvent> {
    let form = "expected KIND:SITE@TILE:CYCLE[+DURATION], e.g. flip:mxu.pe[3][5].psum[30]@0:40";
    let (kind, rest) = text.split_once(':').with_context(|| format!("--fault `{text}`: {form}"))?;
    let kind: BitFault = kind.parse().with_context(|| format!("--fault `{text}`"))?;
    let (site, when) = rest.rsplit_once('@').with_context(|| format!("--fault `{text}`: {form}"))?;
    let site: FaultSite = site.parse().with_context(|| format!("--fault `{text}`"))?;
    let (tile, cyc) = when.split_once(':').with_context(|| format!("--fault `{text}`: {form}"))?;
    let (cyc, dur) = cyc.split_once('+').unwrap_or((cyc, "1"));
    let num = |s: &str, what: &str| -> Result<u64> {
        s.parse().with_context(|| format!("--fault `{text}`: {what} `{s}` is not a non-negative integer"))
    };
    Ok(FaultEvent {
        site,
        kind,
        at: FaultTime { tile: num(tile, "tile")? as usize, cycle: num(cyc, "cycle")? },
        duration: num(dur, "duration")?.max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_argument_parses() {
        let e = parse_fault("stuck1:mxu.pe[0][1].weight[14]@2:5+100").unwrap();
        assert_eq!(e.site.to_string(), "mxu.pe[0][1].weight[14]");
        assert_eq!((e.kind, e.at.tile, e.at.cycle, e.duration), (BitFault::StuckAt1, 2, 5, 100));
        assert!(parse_fault("zap:mxu.pe[0][1].weight[14]@2:5").is_err());
        assert!(parse_fault("flip:mxu.pe[0][1].weight[14]@x:5").unwrap_err().to_string().contains("tile"));
    }
}
