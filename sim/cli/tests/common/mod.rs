//! Running the `faultline` binary from the repository root, as a user would.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// Lines of the file `p` (0 if it does not exist).
#[allow(dead_code)] // not every test binary counts lines
pub fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map_or(0, |t| t.lines().count())
}

/// Starts `faultline campaign SPEC --out OUT ARGS` at cycle level on one thread and kills it
/// (`kill -9`) once `records.jsonl` holds `at` lines, before it ends; returns the lines then.
#[allow(dead_code)] // not every test binary kills a campaign
pub fn run_and_kill(spec: &str, out: &Path, args: &[&str], at: usize) -> usize {
    let out_arg = out.to_str().expect("a UTF-8 path");
    let mut child = Command::new(env!("CARGO_BIN_EXE_faultline"))
        .args(["campaign", spec, "--out", out_arg, "--threads", "1", "--mode", "cycle"])
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (records, start) = (out.join("records.jsonl"), Instant::now());
    while lines(&records) < at {
        assert!(child.try_wait().unwrap().is_none(), "the campaign ended before it could be killed");
        assert!(start.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    lines(&records)
}
