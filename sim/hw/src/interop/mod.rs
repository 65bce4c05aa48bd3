//! Other simulators' inputs and numbers, read as they are.
//!
//! * [`scalesim`]: SCALE-Sim's run configs and topologies, and its counts for each layer.
//! * [`scalesim_reports`]: SCALE-Sim's three reports of a run (compute, bandwidth, detailed
//!   access), written as it writes them.

pub mod scalesim;
pub mod scalesim_reports;
