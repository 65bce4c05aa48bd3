//! Running the `faultline` binary from the repository root, as a user would.

use std::process::{Command, Output};

/// Runs `faultline ARGS` in the repository root.
pub fn faultline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run faultline")
}

/// Runs `faultline ARGS`, which must succeed, and parses its standard output as one JSON object.
#[allow(dead_code)] // not every test binary parses JSON through this helper
pub fn faultline_json(args: &[&str]) -> serde_json::Value {
    let out = faultline(args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}
