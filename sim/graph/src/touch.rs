//! Which words of which buffer each instruction of a program reads and writes: the index the
//! direct form ([`crate::direct`]) and the memory fault path (`train::inject::memory`) search
//! instead of walking the whole program per buffer or per word.

use crate::program::Program;
use std::ops::Range;

/// One instruction's read or write of some words of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touch {
    /// The instruction (program index).
    pub instr: usize,
    /// The words, `first..past the last`.
    pub words: Range<usize>,
    /// A write (else a read).
    pub write: bool,
}

impl Program {
    /// Per buffer, every read and write of its words, in program order (an instruction's reads,
    /// one per operand as [`faultline_hw::isa::Instr::read_ranges`] lists them, before its
    /// writes).
    pub fn touches(&self) -> Vec<Vec<Touch>> {
        let mut touches = vec![Vec::new(); self.buffers.len()];
        for (instr, ins) in self.instrs.iter().enumerate() {
            for (b, words) in ins.read_ranges() {
                touches[b.index()].push(Touch { instr, words, write: false });
            }
            let len = ins.out_len();
            for d in ins.dests() {
                touches[d.buf.index()].push(Touch { instr, words: d.offset..d.offset + len, write: true });
            }
        }
        touches
    }
}
