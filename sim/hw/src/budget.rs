//! Host memory a command may use: a limit checked against an estimate *before* anything large
//! is allocated (file reads are bounded by [`crate::files`]).
//!
//! Every command estimates what it will allocate from its arguments alone (with checked
//! arithmetic: an estimate that overflows `u64` is "more than any limit") and refuses, with an
//! error naming the work and the limit, what exceeds [`HostMemory::limit`].

use crate::error::HwError;

/// The host-memory limit of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// Bytes a command may allocate for its data (estimates are checked against this).
    pub limit: u64,
    /// How a user raises the limit, quoted in errors (e.g. `--max-memory`).
    pub raise_with: &'static str,
}

impl HostMemory {
    /// Default limit: 4 GiB, well below the machines this runs on, far above every shipped
    /// workload (the largest, a cycle-level 512x512x512 GEMM on a 128x128 array, needs ~10 MB).
    pub const DEFAULT_LIMIT: u64 = 4 << 30;

    /// A limit of `limit` bytes, raised with `raise_with`.
    pub const fn new(limit: u64, raise_with: &'static str) -> HostMemory {
        HostMemory { limit, raise_with }
    }

    /// Checks an estimate (`None`: it overflowed `u64`) of the bytes `what` needs.
    pub fn check(&self, what: &str, estimate: Option<u64>) -> Result<(), HwError> {
        match estimate {
            Some(b) if b <= self.limit => Ok(()),
            needed => Err(HwError::HostMemory {
                what: what.to_string(),
                needed: needed.map_or_else(|| "more than 2^64 bytes".to_string(), human_bytes),
                limit: human_bytes(self.limit),
                raise_with: self.raise_with.to_string(),
            }),
        }
    }
}

impl Default for HostMemory {
    fn default() -> HostMemory {
        HostMemory::new(HostMemory::DEFAULT_LIMIT, "--max-memory")
    }
}

/// `a * b * ...` of element counts, `None` on overflow.
pub fn product(dims: &[usize]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
}

/// Sum of byte counts, `None` on overflow.
pub fn sum(parts: &[Option<u64>]) -> Option<u64> {
    parts.iter().try_fold(0u64, |acc, p| acc.checked_add((*p)?))
}

/// `bytes` as a short human-readable size, e.g. `4.0 GiB`, `512 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_are_checked_and_named() {
        let m = HostMemory::new(1 << 20, "--max-memory");
        assert!(m.check("small", Some(1 << 20)).is_ok());
        let e = m.check("gemm 10x10x10", Some((1 << 20) + 1)).unwrap_err().to_string();
        assert!(e.contains("gemm 10x10x10") && e.contains("1.0 MiB") && e.contains("--max-memory"), "{e}");
        let e = m.check("huge", product(&[usize::MAX, 3])).unwrap_err().to_string();
        assert!(e.contains("more than 2^64 bytes"), "{e}");
        assert_eq!(sum(&[Some(1), Some(2)]), Some(3));
        assert_eq!(sum(&[Some(u64::MAX), Some(1)]), None);
        assert_eq!(human_bytes(4 << 30), "4.0 GiB");
        assert_eq!(human_bytes(1000), "1000 B");
    }
}
