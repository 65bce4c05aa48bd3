//! The DMA engine: moves tiles between DRAM and the on-chip SRAMs.
//!
//! # Cost model
//!
//! One engine, transfers in program order, data phases one at a time; requests are pipelined so
//! a transfer's fixed overhead overlaps the previous transfer's data phase (see
//! [`crate::timing`]). A transfer of `bytes` bytes between DRAM and an SRAM alone costs
//!
//! ```text
//! overhead = dma.setup_cycles + dram.latency_cycles
//! bw       = min(dram.bandwidth_bytes_per_cycle, SRAM port bandwidth)   (bytes / cycle)
//! cycles   = overhead + ceil(bytes / bw)                                (0 bytes: no transfer)
//! ```
//!
//! where the SRAM port bandwidth is `banks * write_ports * word_bytes` for loads into the SRAM
//! and `banks * read_ports * word_bytes` for stores out of it. Word `i` (of `eb` bytes) of a
//! transfer started at `s` moves at cycle `s + overhead + floor(i * eb / bw)`.
//!
//! # Address registers (fault sites)
//!
//! The engine's `dma.src_addr` and `dma.dst_addr` registers are loaded with the first word's
//! addresses when a transfer's data phase starts (`start + overhead`) and advanced by the address generator after every word
//! (`+1` along a row, `+stride` at a row end, wrapping in 32 bits). A fault changes the register
//! and therefore every later word of that transfer (the next transfer reloads it).

use crate::config::{HwConfig, SramConfig};
use crate::fault::ActiveFault;
use serde::{Deserialize, Serialize};

/// Direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// DRAM to SRAM.
    Load,
    /// SRAM to DRAM.
    Store,
}

/// One scheduled transfer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    /// Load or store.
    pub dir: Direction,
    /// Bytes moved.
    pub bytes: u64,
    /// Cycle the request goes out (its data phase starts `overhead` cycles later).
    pub start: u64,
    /// Cycle the last data moved + 1 (the data phase is free again).
    pub end: u64,
    /// Tile the transfer belongs to.
    pub tile: usize,
    /// Index among the tile's loads (or stores).
    pub part: usize,
}

/// Effective bandwidth of a transfer to/from `sram`, bytes per cycle.
pub fn bandwidth(cfg: &HwConfig, sram: &SramConfig, dir: Direction) -> f64 {
    if cfg.dram.bandwidth_bytes_per_cycle.is_infinite() {
        return f64::INFINITY;
    }
    let port = match dir {
        Direction::Load => sram.write_bytes_per_cycle(),
        Direction::Store => sram.read_bytes_per_cycle(),
    };
    cfg.dram.bandwidth_bytes_per_cycle.min(port)
}

/// Fixed cycles of every transfer (`setup + DRAM latency`); `None` if the sum does not fit 64
/// bits (impossible within the config's ranges, which [`HwConfig::validate`] checks).
pub fn overhead(cfg: &HwConfig) -> Option<u64> {
    cfg.dma.setup_cycles.checked_add(cfg.dram.latency_cycles)
}

/// Cycles of a transfer of `bytes` bytes at bandwidth `bw` (see the module docs); `None` if the
/// count does not fit 64 bits.
pub fn transfer_cycles(cfg: &HwConfig, bytes: u64, bw: f64) -> Option<u64> {
    if bytes == 0 {
        return Some(0);
    }
    overhead(cfg)?.checked_add(data_cycles(bytes, bw)?)
}

/// `ceil(bytes / bw)` (0 for infinite bandwidth); `None` if it does not fit 64 bits or `bw` is
/// not a positive number (a float-to-integer cast would saturate or give 0 instead).
pub fn data_cycles(bytes: u64, bw: f64) -> Option<u64> {
    if bw == f64::INFINITY {
        return Some(0);
    }
    let c = (bytes as f64 / bw).ceil();
    // 2^64 as f64 is exact; every float below it converts exactly (NaN fails both tests).
    (bw > 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&c)).then_some(c as u64)
}

/// Cycle at which word `i` of `eb` bytes moves, for a transfer started at `start`. Saturating:
/// within a transfer of the op's schedule the result is at most the transfer's end, which
/// [`crate::timing::plan`] computed with checked arithmetic, so it never saturates there.
pub fn word_cycle(cfg: &HwConfig, start: u64, i: u64, eb: u64, bw: f64) -> u64 {
    let d = if bw.is_infinite() { 0 } else { (i.saturating_mul(eb) as f64 / bw).floor() as u64 };
    start.saturating_add(overhead(cfg).unwrap_or(u64::MAX)).saturating_add(d)
}

/// An address register stepped word by word, with faults applied at their commit cycles.
///
/// The register is loaded at cycle `load` with the golden first address; before each use at
/// cycle `t` the faults striking in `[previous use, t)` are applied; after each use it advances
/// by the golden delta to the next address (wrapping in `width` bits).
#[derive(Debug, Clone)]
pub struct AddrReg<'a> {
    value: u64,
    width: u32,
    prev: u64,
    faults: &'a [ActiveFault],
}

impl<'a> AddrReg<'a> {
    /// A register of `width` bits loaded with `first` at cycle `load`; `faults` are the faults
    /// on this register.
    pub fn new(first: u64, width: u32, load: u64, faults: &'a [ActiveFault]) -> AddrReg<'a> {
        AddrReg { value: first & mask(width), width, prev: load, faults }
    }

    /// The register's value when used at cycle `t` (faults in `[previous use, t)` applied).
    pub fn use_at(&mut self, t: u64) -> u64 {
        for f in self.faults.iter().filter(|f| f.acts_between(self.prev, t) && f.event.site.bit < self.width) {
            self.value = f.apply(self.value as u32) as u64 & mask(self.width);
        }
        self.prev = t;
        self.value
    }

    /// Advances by `delta` (the golden address step) after a use.
    pub fn advance(&mut self, delta: i64) {
        self.value = (self.value as i64).wrapping_add(delta) as u64 & mask(self.width);
    }
}

fn mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dataflow;
    use crate::fault::FaultEvent;
    use crate::fault::{FaultSite, Register, Unit};
    use faultline_num::Precision;

    #[test]
    fn transfer_costs() {
        let mut c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        assert_eq!(transfer_cycles(&c, 1000, f64::INFINITY), Some(0));
        assert!(bandwidth(&c, &c.memory.unified_buffer, Direction::Load).is_infinite());
        c.dram.latency_cycles = 10;
        c.dma.setup_cycles = 2;
        c.dram.bandwidth_bytes_per_cycle = 16.0;
        let bw = bandwidth(&c, &c.memory.unified_buffer, Direction::Load);
        // 8 banks x 1 port x 4 bytes = 32 B/cycle of SRAM ports; DRAM's 16 B/cycle is the limit.
        assert_eq!(bw, 16.0);
        assert_eq!(transfer_cycles(&c, 100, bw), Some(12 + 7));
        assert_eq!(word_cycle(&c, 5, 0, 4, bw), 17);
        assert_eq!(word_cycle(&c, 5, 4, 4, bw), 18);
        c.dram.bandwidth_bytes_per_cycle = 1000.0;
        assert_eq!(bandwidth(&c, &c.memory.unified_buffer, Direction::Store), 32.0);
    }

    #[test]
    fn counts_that_do_not_fit_64_bits_are_none_not_wrapped() {
        let mut c = HwConfig::test_config(4, 4, Dataflow::WeightStationary, Precision::Bf16Fp32);
        // A bandwidth below the config's floor: 2^40 bytes at 1e-17 B/cycle is ~1e29 cycles,
        // which `as u64` would saturate and `overhead +` would then wrap.
        assert_eq!(data_cycles(1 << 40, 1e-17), None);
        assert_eq!(data_cycles(100, 0.0), None);
        assert_eq!(data_cycles(100, -4.0), None);
        assert_eq!(data_cycles(100, f64::NAN), None);
        assert_eq!(data_cycles(100, 0.01), Some(10_000));
        c.dram.latency_cycles = u64::MAX;
        c.dma.setup_cycles = 8;
        assert_eq!(overhead(&c), None);
        assert_eq!(transfer_cycles(&c, 64, 16.0), None);
        c.dram.latency_cycles = u64::MAX - 8 - 3;
        assert_eq!(transfer_cycles(&c, 64, 16.0), None, "overhead fits, overhead + data does not");
        assert_eq!(word_cycle(&c, 5, 1 << 62, 8, 1.0), u64::MAX);
    }

    #[test]
    fn address_register_flip_persists_through_increments() {
        let fs = [FaultEvent::flip(FaultSite::control(Unit::Dma, Register::SrcAddr, 4), 0, 3).activate(0)];
        let mut r = AddrReg::new(100, 32, 0, &fs);
        let mut got = vec![];
        for t in 0..6 {
            got.push(r.use_at(t));
            r.advance(1);
        }
        // Flip at cycle 3 commits after the use at 3: uses at 4 and 5 see bit 4 flipped.
        assert_eq!(got, vec![100, 101, 102, 103, 104 ^ 16, 105 ^ 16]);
    }
}
