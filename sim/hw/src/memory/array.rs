//! One memory array as plain words, with its two access paths (see [`super`] for their fault
//! semantics).

use crate::config::HwConfig;
use crate::error::HwError;
use crate::fault::ActiveFault;
use crate::fault::Unit;
use std::collections::BTreeMap;

/// One memory array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    /// Which memory this is (`Ub`, `Acc`, `Wbuf`, `Dram`).
    pub unit: Unit,
    /// Width of a word in bits.
    pub word_bits: u32,
    /// Word contents (functional state).
    data: Vec<u32>,
    /// Cycle of each word's last timed write (0 = reset / poked).
    last_write: Vec<u64>,
    /// Injected faults per word, sorted by start cycle.
    faults: BTreeMap<u64, Vec<ActiveFault>>,
}

impl Memory {
    /// An all-zero memory of `words` words.
    pub fn new(unit: Unit, words: u64, word_bits: u32) -> Memory {
        let n = words as usize;
        Memory { unit, word_bits, data: vec![0; n], last_write: vec![0; n], faults: BTreeMap::new() }
    }

    /// The unified buffer of `cfg`.
    pub fn unified_buffer(cfg: &HwConfig) -> Memory {
        let s = &cfg.memory.unified_buffer;
        Memory::new(Unit::Ub, s.words(), s.word_bits)
    }

    /// The accumulator SRAM of `cfg`.
    pub fn accumulator(cfg: &HwConfig) -> Memory {
        let s = &cfg.memory.accumulator;
        Memory::new(Unit::Acc, s.words(), s.word_bits)
    }

    /// The weight buffer of `cfg`.
    pub fn weight_buffer(cfg: &HwConfig) -> Memory {
        let s = &cfg.memory.weight_buffer;
        Memory::new(Unit::Wbuf, s.words(), s.word_bits)
    }

    /// A DRAM window of `words` 32-bit words (only the part an op touches is materialised).
    pub fn dram(words: u64) -> Memory {
        Memory::new(Unit::Dram, words, 32)
    }

    /// Number of words.
    pub fn words(&self) -> u64 {
        self.data.len() as u64
    }

    #[inline]
    fn mask(&self) -> u32 {
        if self.word_bits >= 32 {
            u32::MAX
        } else {
            (1 << self.word_bits) - 1
        }
    }

    /// Functional read: the stored bits, no time, no faults. `None` past the end.
    pub fn peek(&self, addr: u64) -> Option<u32> {
        self.data.get(addr as usize).copied()
    }

    /// Functional write (masked to the word width): no time, no faults. Returns false past the
    /// end.
    pub fn poke(&mut self, addr: u64, bits: u32) -> bool {
        let m = self.mask();
        match self.data.get_mut(addr as usize) {
            Some(w) => {
                *w = bits & m;
                true
            }
            None => false,
        }
    }

    /// Registers a fault on a word of this memory (its site's instance is the word address).
    pub fn inject(&mut self, f: ActiveFault) -> Result<(), HwError> {
        let (addr, bit) = (f.event.site.instance[0] as u64, f.event.site.bit);
        if f.event.site.unit != self.unit || addr >= self.words() || bit >= self.word_bits {
            return Err(HwError::BadSite {
                site: f.event.site.to_string(),
                why: format!("the {} memory has {} words of {} bits", self.unit.name(), self.words(), self.word_bits),
            });
        }
        let v = self.faults.entry(addr).or_default();
        v.push(f);
        v.sort_by_key(|f| f.start);
        Ok(())
    }

    /// Timed read at cycle `t`: the stored bits with every fault that struck since the last
    /// write (cycles `last_write..t`) applied. Out-of-range addresses read 0.
    #[inline]
    pub fn read(&self, addr: u64, t: u64) -> u32 {
        let Some(&v) = self.data.get(addr as usize) else { return 0 };
        if self.faults.is_empty() {
            return v;
        }
        let Some(fs) = self.faults.get(&addr) else { return v };
        let w = self.last_write[addr as usize];
        fs.iter().filter(|f| f.acts_between(w, t)).fold(v, |v, f| f.apply(v))
    }

    /// Timed write at cycle `t` (masked to the word width). Out-of-range writes are dropped.
    #[inline]
    pub fn write(&mut self, addr: u64, bits: u32, t: u64) {
        let m = self.mask();
        if let Some(d) = self.data.get_mut(addr as usize) {
            *d = bits & m;
            self.last_write[addr as usize] = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultEvent;
    use crate::fault::FaultSite;

    fn flip(unit: Unit, addr: u64, bit: u32, at: u64) -> ActiveFault {
        FaultEvent::flip(FaultSite::word(unit, addr, bit), 0, at).activate(0)
    }

    #[test]
    fn flips_are_seen_after_and_erased_by_writes() {
        let mut m = Memory::new(Unit::Ub, 16, 32);
        m.write(3, 0x10, 5);
        m.inject(flip(Unit::Ub, 3, 0, 7)).unwrap();
        assert_eq!(m.read(3, 7), 0x10, "a flip at 7 commits at the end of cycle 7");
        assert_eq!(m.read(3, 8), 0x11);
        assert_eq!(m.read(3, 100), 0x11);
        assert_eq!(m.read(2, 100), 0);
        m.write(3, 0x20, 9);
        assert_eq!(m.read(3, 10), 0x20, "overwritten");
        assert_eq!(m.peek(3), Some(0x20));
    }

    #[test]
    fn flip_before_write_is_dead_and_stuck_at_persists() {
        let mut m = Memory::new(Unit::Acc, 4, 16);
        m.inject(flip(Unit::Acc, 1, 2, 3)).unwrap();
        m.write(1, 0xffff_0000, 4);
        assert_eq!(m.read(1, 9), 0, "masked to 16 bits, flip before the write");
        m.inject(FaultEvent::stuck(FaultSite::word(Unit::Acc, 2, 1), true, 0, 10, 10).activate(0)).unwrap();
        m.write(2, 0, 15);
        assert_eq!(m.read(2, 16), 2, "a write during a stuck-at is forced too");
        m.write(2, 0, 25);
        assert_eq!(m.read(2, 26), 0, "written after the stuck-at ended");
        assert!(m.inject(flip(Unit::Acc, 9, 0, 0)).is_err());
        assert!(m.inject(flip(Unit::Acc, 0, 16, 0)).is_err());
    }
}
