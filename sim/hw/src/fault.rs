//! Fault events for the cycle-level model, applied at the clock's commit boundary.
//!
//! Each clock computes the next state from the current one and then commits it (D/Q). Faults
//! act on the committed state: a flip at cycle `t` inverts the bit in the value latched at the
//! end of cycle `t`, so everything that reads the register at cycle `t + 1` sees it. A stuck-at
//! forces the bit at every commit of its cycle range. Because faults touch only committed state,
//! their effect does not depend on the order in which PEs are evaluated.

use crate::config::HwConfig;
use crate::error::HwError;
use crate::sites::{FaultSite, Unit};
use crate::ExecMode;
use faultline_num::BitFault;
use serde::{Deserialize, Serialize};

/// When a fault strikes: cycle `cycle` counted from the start of tile (fold) `tile`.
///
/// A tile starts at the cycle its first activation enters the array; the tile schedule is the
/// one `mxu::gemm_timing` documents, the same in every execution mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FaultTime {
    /// Fold index in schedule order.
    pub tile: usize,
    /// Cycle offset within the tile (may run past the tile into the next one's overlap).
    pub cycle: u64,
}

/// One fault: what, where, when, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FaultEvent {
    /// The bit.
    pub site: FaultSite,
    /// Flip or stuck-at.
    pub kind: BitFault,
    /// First cycle the fault acts on.
    pub at: FaultTime,
    /// Number of cycles a stuck-at stays active (>= 1). Ignored for flips, which act once.
    pub duration: u64,
}

impl FaultEvent {
    /// A single-event upset of `site` at cycle `cycle` of tile `tile`.
    pub fn flip(site: FaultSite, tile: usize, cycle: u64) -> FaultEvent {
        FaultEvent { site, kind: BitFault::Flip, at: FaultTime { tile, cycle }, duration: 1 }
    }

    /// A stuck-at-`value` of `site` for `duration` cycles from cycle `cycle` of tile `tile`.
    pub fn stuck(site: FaultSite, value: bool, tile: usize, cycle: u64, duration: u64) -> FaultEvent {
        let kind = if value { BitFault::StuckAt1 } else { BitFault::StuckAt0 };
        FaultEvent { site, kind, at: FaultTime { tile, cycle }, duration: duration.max(1) }
    }

    /// Number of commits the fault acts on.
    pub fn active_cycles(&self) -> u64 {
        match self.kind {
            BitFault::Flip => 1,
            _ => self.duration.max(1),
        }
    }

    /// The fault resolved to absolute cycles, given its tile's first cycle. Saturates, so an
    /// absurd user-given cycle is a fault that never fires, not an overflow.
    pub fn activate(&self, tile_start: u64) -> ActiveFault {
        let start = tile_start.saturating_add(self.at.cycle);
        ActiveFault { event: *self, start, end: start.saturating_add(self.active_cycles()) }
    }
}

/// A fault event resolved to the absolute commits `[start, end)` it acts on: the one form every
/// model (stepped registers, lazily read memories and address registers) injects from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ActiveFault {
    /// The event (site, kind, tile-relative time).
    pub event: FaultEvent,
    /// First commit the fault acts on.
    pub start: u64,
    /// One past the last commit.
    pub end: u64,
}

impl ActiveFault {
    /// Whether the fault acts at the commit of cycle `t` (models stepped every cycle).
    pub fn acts_at(&self, t: u64) -> bool {
        (self.start..self.end).contains(&t)
    }

    /// Whether the fault acts on a value that was last written at cycle `from` and is read at
    /// cycle `to` (models that apply faults lazily, at read time): some commit of `[from, to)`
    /// is in its range. For a flip that is "struck in `[from, to)`"; for a stuck-at, "active at
    /// any time the value was held".
    pub fn acts_between(&self, from: u64, to: u64) -> bool {
        self.start < to && self.end > from
    }

    /// The fault's bit operation applied to `bits`.
    pub fn apply(&self, bits: u32) -> u32 {
        self.event.kind.apply(bits, self.event.site.bit)
    }
}

/// The faults active during one operation (empty for a golden run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultSchedule {
    /// Events, in any order.
    pub events: Vec<FaultEvent>,
}

impl FaultSchedule {
    /// No faults.
    pub fn none() -> FaultSchedule {
        FaultSchedule::default()
    }

    /// A schedule of one event.
    pub fn one(e: FaultEvent) -> FaultSchedule {
        FaultSchedule { events: vec![e] }
    }

    /// True when there is nothing to inject.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Checks that faults can be placed: only in cycle-level execution (a fault needs registers
    /// to live in), at a site that exists on `cfg` and belongs to one of `units` (the units the
    /// operation runs on), in one of its `tiles` tiles (called `what` in the message).
    pub fn check(
        &self,
        cfg: &HwConfig,
        mode: ExecMode,
        units: &[Unit],
        tiles: usize,
        what: &str,
    ) -> Result<(), HwError> {
        for e in &self.events {
            let bad = |why: String| HwError::BadSite { site: e.site.to_string(), why };
            if mode != ExecMode::CycleLevel {
                return Err(bad("faults need cycle-level execution".into()));
            }
            if !units.contains(&e.site.unit) {
                let names: Vec<&str> = units.iter().map(|u| u.name()).collect();
                return Err(bad(format!("this operation runs on {} only", names.join(", "))));
            }
            e.site.validate(cfg)?;
            if e.at.tile >= tiles {
                return Err(bad(format!("tile {} out of range, the operation has {tiles} {what}", e.at.tile)));
            }
        }
        Ok(())
    }
}
