//! Fault events ([`FaultEvent`]) and how they act on a unit's clock ([`ActiveFault`],
//! [`FaultSchedule`]).

use crate::config::HwConfig;
use crate::error::{one_line, HwError};
use crate::fault::{FaultSite, Unit};
use crate::ExecMode;
use faultline_num::BitFault;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The text form of a [`FaultEvent`], with an example, as quoted in parse errors.
pub const FAULT_FORM: &str = "KIND:SITE@TILE:CYCLE[+DURATION] with KIND flip, stuck0 or stuck1 and \
    +DURATION (cycles, >= 1) for stuck-ats only, e.g. flip:mxu.pe[3][5].psum[30]@0:40 or \
    stuck1:ub.word[0x40][7]@2:0+100";

/// When a fault strikes: cycle `cycle` counted from the start of tile `tile`.
///
/// For the MXU a tile is a fold of the array's schedule (`mxu::Schedule`, the same in `gemm`,
/// `op` and training, in every execution mode), starting when its first activation enters the
/// array; for the VPU, one vector of an instruction from its issue. Memory, DMA and sequencer
/// sites are placed on a program's clock by `faultline_train::inject` instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FaultTime {
    /// The tile (fold, vector or op tile) in schedule order.
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

/// `KIND:SITE@TILE:CYCLE[+DURATION]`; `+DURATION` is written when it is not 1.
impl fmt::Display for FaultEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}@{}:{}", self.kind, self.site, self.at.tile, self.at.cycle)?;
        if self.duration != 1 {
            write!(f, "+{}", self.duration)?;
        }
        Ok(())
    }
}

/// Parses [`FAULT_FORM`]: `flip:mxu.pe[3][5].psum[30]@0:40`, `stuck1:ub.word[0x40][7]@2:0+100`.
/// Numbers are decimal; a duration is at least 1 and only given to stuck-ats (a flip acts once).
impl FromStr for FaultEvent {
    type Err = HwError;
    fn from_str(text: &str) -> Result<FaultEvent, HwError> {
        let err = |why: String| HwError::FaultParse { text: text.to_string(), why };
        let (kind, rest) = text.split_once(':').ok_or_else(|| err("no `:` after KIND".into()))?;
        let kind: BitFault = kind
            .parse()
            .map_err(|_| err(format!("unknown fault kind `{}` (expected flip, stuck0 or stuck1)", one_line(kind))))?;
        let (site, when) = rest.rsplit_once('@').ok_or_else(|| err("no `@` before TILE:CYCLE".into()))?;
        let site: FaultSite = site.parse().map_err(|e: HwError| err(e.to_string()))?;
        let (tile, cycle) = when.split_once(':').ok_or_else(|| err("no `:` between TILE and CYCLE".into()))?;
        let (cycle, duration) = match cycle.split_once('+') {
            Some((c, d)) => (c, Some(d)),
            None => (cycle, None),
        };
        let num = |s: &str, what: &str| -> Result<u64, HwError> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err(format!("{what} `{}` is not a non-negative decimal integer", one_line(s))));
            }
            s.parse().map_err(|_| err(format!("{what} `{s}` is larger than {}", u64::MAX)))
        };
        let tile = num(tile, "TILE")?;
        let tile = usize::try_from(tile).map_err(|_| err(format!("TILE `{tile}` is larger than {}", usize::MAX)))?;
        let cycle = num(cycle, "CYCLE")?;
        let duration = match duration {
            None => 1,
            Some(_) if kind == BitFault::Flip => {
                return Err(err("a flip acts once; +DURATION is for stuck0 and stuck1 only".into()))
            }
            Some(d) => match num(d, "DURATION")? {
                0 => return Err(err("DURATION must be at least 1 cycle".into())),
                d => d,
            },
        };
        Ok(FaultEvent { site, kind, at: FaultTime { tile, cycle }, duration })
    }
}

/// Where the faults of one operation may land: in one of its `tiles` tiles, at a cycle before
/// the operation ends. Each execution path gives the origins its fault times count from (see the
/// module docs of [`crate::mxu`] and [`crate::vpu`]).
pub struct FaultWindow<'a> {
    /// The operation, for messages, e.g. `GEMM` or `op matmul 16x8x8`.
    pub op: String,
    /// What one tile is called (`fold`, `vector`, `tile`).
    pub tile_name: &'static str,
    /// Number of tiles.
    pub tiles: usize,
    /// One past the operation's last cycle, in the operation's own clock.
    pub end: u64,
    /// The cycle (operation clock) that fault times on `site` in tile `tile` count from;
    /// called only with `tile < tiles`.
    pub origin: &'a dyn Fn(usize, &FaultSite) -> u64,
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
    /// operation runs on), in one of the window's tiles and before the operation ends (a fault
    /// after the end could only report "nothing corrupted", which would be a wrong answer).
    pub fn check(&self, cfg: &HwConfig, mode: ExecMode, units: &[Unit], window: &FaultWindow) -> Result<(), HwError> {
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
            let (name, tiles) = (window.tile_name, window.tiles);
            if e.at.tile >= tiles {
                return Err(bad(format!("tile {} out of range, the operation has {tiles} {name}s", e.at.tile)));
            }
            let origin = (window.origin)(e.at.tile, &e.site);
            match origin.checked_add(e.at.cycle) {
                Some(t) if t < window.end => {}
                at => {
                    // The operation's own cycle, when it differs from the tile-relative one.
                    let abs = match at {
                        Some(_) if origin == 0 => String::new(),
                        Some(t) => format!(" (cycle {t} of the {})", window.op),
                        None => String::new(),
                    };
                    return Err(bad(format!(
                        "cycle {} of {name} {}{abs} is after the {} ends at cycle {}",
                        e.at.cycle, e.at.tile, window.op, window.end
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dataflow;
    use crate::fault::{Register, SiteClass};
    use faultline_num::Precision;
    use proptest::prelude::*;

    #[test]
    fn text_form_parses_and_prints() {
        let e: FaultEvent = "stuck1:mxu.pe[0][1].weight[14]@2:5+100".parse().unwrap();
        assert_eq!(e, FaultEvent::stuck(FaultSite::pe(0, 1, Register::Weight, 14), true, 2, 5, 100));
        assert_eq!(e.to_string(), "stuck1:mxu.pe[0][1].weight[14]@2:5+100");
        let f: FaultEvent = "flip:ub.word[64][7]@0:40".parse().unwrap();
        assert_eq!(f, FaultEvent::flip(FaultSite::word(Unit::Ub, 64, 7), 0, 40));
        assert_eq!(f.to_string(), "flip:ub.word[0x40][7]@0:40", "addresses print in hex");
        let s: FaultEvent = "stuck0:seq.tile[3]@1:0".parse().unwrap();
        assert_eq!((s.kind, s.duration), (BitFault::StuckAt0, 1));
        assert_eq!(s.to_string(), "stuck0:seq.tile[3]@1:0");
    }

    #[test]
    fn bad_text_is_one_line_quoting_it_with_the_expected_form() {
        for (text, why) in [
            ("", "no `:` after KIND"),
            ("zap:mxu.pe[0][1].weight[14]@2:5", "unknown fault kind `zap`"),
            ("flip:mxu.pe[0][1].weight[14]", "no `@`"),
            ("flip:mxu.pe[0][1].weight[14]@2", "no `:` between TILE and CYCLE"),
            ("flip:mxu.pe[0][1].weight[14]@x:5", "TILE `x` is not a non-negative decimal integer"),
            ("flip:mxu.pe[0][1].weight[14]@-1:5", "TILE `-1`"),
            ("flip:mxu.pe[0][1].weight[14]@+1:5", "TILE `+1`"),
            ("flip:mxu.pe[0][1].weight[14]@1:", "CYCLE ``"),
            ("flip:mxu.pe[0][1].weight[14]@1:99999999999999999999", "CYCLE `99999999999999999999` is larger than"),
            ("flip:mxu.pe[0][1].weight[14]@1:5+3", "a flip acts once"),
            ("stuck0:mxu.pe[0][1].weight[14]@1:5+0", "DURATION must be at least 1"),
            ("stuck0:mxu.pe[0][1].weight[14]@1:5+", "DURATION ``"),
            ("flip:mxu.pe[0].weight[14]@1:5", "cannot parse fault site `mxu.pe[0].weight[14]`"),
            ("flip:mxu.pe[0][1]\n.weight[14]@1:5", "\\n"),
            ("fl\u{1b}ip:x@1:5", "fl\\u{1b}ip"),
        ] {
            let e = text.parse::<FaultEvent>().unwrap_err().to_string();
            assert!(e.starts_with("cannot parse fault `"), "{e}");
            assert!(e.contains(why), "{text:?}: {e}");
            assert!(e.contains("expected KIND:SITE@TILE:CYCLE[+DURATION]"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn window_refuses_times_after_the_end_and_nothing_before() {
        let cfg = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        let origin = |t: usize, _: &FaultSite| 10 * t as u64;
        let w = FaultWindow { op: "GEMM".into(), tile_name: "fold", tiles: 3, end: 35, origin: &origin };
        let site = FaultSite::pe(1, 1, Register::Psum, 3);
        let at = |tile, cycle| {
            FaultSchedule::one(FaultEvent::flip(site, tile, cycle)).check(&cfg, ExecMode::CycleLevel, &[Unit::Mxu], &w)
        };
        assert!(at(0, 34).is_ok() && at(2, 14).is_ok() && at(1, 0).is_ok());
        let e = at(2, 15).unwrap_err().to_string();
        assert!(e.contains("cycle 15 of fold 2 (cycle 35 of the GEMM) is after the GEMM ends at cycle 35"), "{e}");
        let e = at(0, 99999).unwrap_err().to_string();
        assert!(e.contains("cycle 99999 of fold 0 is after the GEMM ends at cycle 35"), "{e}");
        let e = at(1, u64::MAX).unwrap_err().to_string();
        assert!(e.contains(&format!("cycle {} of fold 1 is after", u64::MAX)), "{e}");
        let e = at(3, 0).unwrap_err().to_string();
        assert!(e.contains("tile 3 out of range, the operation has 3 folds"), "{e}");
    }

    /// Any event on any site of any class of either dataflow (DRAM sites enabled).
    fn any_event() -> impl Strategy<Value = FaultEvent> {
        let classes: Vec<(HwConfig, SiteClass)> = [Dataflow::WeightStationary, Dataflow::OutputStationary]
            .into_iter()
            .flat_map(|df| {
                let mut c = HwConfig::test_config(5, 7, df, Precision::Bf16Fp32);
                c.dram.fault_sites = true;
                SiteClass::all(&c).into_iter().map(move |k| (c.clone(), k))
            })
            .collect();
        let kinds = prop_oneof![Just(BitFault::Flip), Just(BitFault::StuckAt0), Just(BitFault::StuckAt1)];
        (0..classes.len(), any::<u64>(), kinds, any::<usize>(), any::<u64>(), 1..=u64::MAX).prop_map(
            move |(i, idx, kind, tile, cycle, duration)| {
                let (c, class) = &classes[i];
                let site = class.site_at(c, idx % class.bit_count(c)).expect("index below the bit count");
                let duration = if kind == BitFault::Flip { 1 } else { duration };
                FaultEvent { site, kind, at: FaultTime { tile, cycle }, duration }
            },
        )
    }

    proptest! {
        /// `parse(display(e)) == e` for every site class, fault kind, tile, cycle and duration.
        #[test]
        fn text_form_round_trips(e in any_event()) {
            prop_assert_eq!(e.to_string().parse::<FaultEvent>().unwrap(), e);
        }
    }
}
