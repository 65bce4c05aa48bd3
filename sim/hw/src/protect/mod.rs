//! Protection of data against the faults the rest of the crate injects.
//!
//! * [`ecc`]: parity and Hsiao SEC-DED codes on SRAM words and registers, decoded on every read.
//! * [`abft`]: exact-checksum ABFT for int8 GEMMs (Li et al. 2021): fused weight checksum
//!   columns and integer residuals.

pub mod abft;
pub mod ecc;
