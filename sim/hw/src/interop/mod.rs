//! Other simulators' inputs and numbers, read as they are.
//!
//! * [`scalesim`]: SCALE-Sim's run configs and topologies, and its counts for each layer.

pub mod scalesim;
