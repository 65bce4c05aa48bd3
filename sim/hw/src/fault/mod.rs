//! The fault vocabulary: where a fault strikes (a site) and when and how (an event).
//!
//! # Sites
//!
//! Every injectable bit of the machine, with one address each.
//!
//! A [`FaultSite`] is `unit.element[i][j].register[bit]`, e.g. `mxu.pe[3][5].psum[30]` or
//! `mxu.pe[0][7].weight_shadow[14]`. Memories (added with the memory system) print as
//! `ub.word[0x1f40][7]`: the word is the element and there is no register name. The text form is
//! stable (traces and reports key on it) and `parse(display(x)) == x`.
//!
//! Sites are grouped in [`SiteClass`]es (one per unit/register pair); a class knows its element
//! dimensions and bit width for a given [`HwConfig`](crate::HwConfig), so campaigns can count bits per class (for
//! AVF/FIT) and sample sites uniformly by bit index.
//!
//! # Events
//!
//! Fault events for the cycle-level model, applied at the clock's commit boundary.
//!
//! Each clock computes the next state from the current one and then commits it (D/Q). Faults
//! act on the committed state: a flip at cycle `t` inverts the bit in the value latched at the
//! end of cycle `t`, so everything that reads the register at cycle `t + 1` sees it. A stuck-at
//! forces the bit at every commit of its cycle range. Because faults touch only committed state,
//! their effect does not depend on the order in which PEs are evaluated.
//!
//! A [`FaultEvent`] has one text form, `KIND:SITE@TILE:CYCLE[+DURATION]` ([`FAULT_FORM`]), the
//! same for every command and trace: [`FaultEvent`]'s `Display` writes it and its `FromStr`
//! parses it back (`parse(display(e)) == e`).

mod event;
mod site;

pub use event::{ActiveFault, FaultEvent, FaultSchedule, FaultTime, FaultWindow, FAULT_FORM};
pub use site::{
    addr_bits, glob_match, FaultSite, Register, SiteClass, SiteKind, Unit, DMA_ADDR_BITS, TILE_COUNTER_BITS,
};
