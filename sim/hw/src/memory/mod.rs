//! The memory path: unified buffer, accumulator SRAM, weight buffer and DRAM as plain word
//! arrays ([`Memory`]), and the DMA engine that moves words between them ([`dma`]).
//!
//! Each word holds one element in its low `word_bits` bits. Two access paths, kept apart as in
//! gem5:
//! * **functional** [`Memory::peek`] / [`Memory::poke`]: no time, no faults (loading inputs,
//!   reading results, the functional twin);
//! * **timed** [`Memory::read`] / [`Memory::write`] at a cycle, which see injected faults.
//!
//! # Fault semantics
//!
//! Within one cycle, writes happen first (a read in the same cycle sees the new value: write
//! bypass), then reads, then faults (the commit boundary, as in [`crate::fault`]). So a flip
//! of a word bit at cycle `c` is seen by every read of that word at a cycle `> c` until the word
//! is next written; a write at a cycle `>= c` erases it. A stuck-at forces its bit at every
//! commit of its active range, so it also corrupts writes made while it is active.
//!
//! Faults are applied lazily at read time from the word's last write cycle, so a golden run
//! costs nothing extra. This requires the accesses to any one word to be issued in time order,
//! which the op schedule guarantees (a buffer is refilled only after its last read).
//! Addresses outside the array (possible only under an address fault) read as 0, and writes to
//! them are dropped.

mod array;
pub mod dma;

pub use array::Memory;
