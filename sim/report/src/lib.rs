//! Reports: a campaign's records folded back onto the hardware. Reads `fault::record` files
//! only and never runs the simulator, except [`vcd`], which replays one trial.

pub mod error;

pub use error::{ReportError, Result};
