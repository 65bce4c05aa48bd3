//! Running the `faultline` binary from the repository root, as a user would.

use std::process::{Command, Output};

/// Runs `faultline ARGS` in the repository root.
#[allow(dead_code)] // not every test binary runs it this way
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

/// Runs `faultline ARGS` in the repository root with its address space limited to `bytes`
/// (`RLIMIT_AS`, on Unix), so that a command which allocates before checking its memory
/// estimate fails (allocation error) instead of merely running slowly.
#[allow(dead_code)] // used by the hostile-input tests only
pub fn faultline_limited(args: &[&str], bytes: u64) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_faultline"));
    cmd.args(args).current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    limit_address_space(&mut cmd, bytes);
    cmd.output().expect("run faultline")
}

/// Limits the address space of the process `cmd` starts to `bytes` (`RLIMIT_AS`, on Unix).
#[allow(dead_code)] // used by the hostile-input tests only
pub fn limit_address_space(cmd: &mut Command, bytes: u64) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let limit = libc::rlimit { rlim_cur: bytes as libc::rlim_t, rlim_max: bytes as libc::rlim_t };
        // SAFETY: runs in the forked child before exec; setrlimit is async-signal-safe and the
        // closure allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (cmd, bytes);
}
