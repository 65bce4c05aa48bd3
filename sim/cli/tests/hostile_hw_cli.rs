//! Hostile input to `faultline gemm`, `op` and `sites`: sizes near 2^64, shapes that overflow,
//! work larger than the host-memory limit or the simulated DRAM, configs outside their ranges
//! or endless, fault strings that do not parse and fault times after the operation. Each must be
//! refused quickly with exit status 2 and one line on stderr, `error: ...`, naming the reason;
//! never a panic, an abort, a hang or a wrong number.
//!
//! Every child runs with its address space limited to 1 GiB, far above what any refusal
//! needs, so a guard that allocates before it checks fails this test rather than passing slowly.

mod common;
use common::faultline_limited;

const ADDRESS_SPACE: u64 = 1 << 30;

/// A config file: the shipped tpu-8x8 with `from` replaced by `to` (which must occur).
fn config(dir: &std::path::Path, name: &str, from: &str, to: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/tpu-8x8.ron");
    let text = std::fs::read_to_string(root).unwrap();
    assert!(text.contains(from), "{from}");
    let p = dir.join(name);
    std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
    p.to_str().unwrap().to_string()
}

fn refused(args: &[&str], want: &str) {
    let out = faultline_limited(args, ADDRESS_SPACE);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: status {:?}, stderr {err}", out.status);
    assert!(err.starts_with("error: ") && err.lines().count() == 1 && err.ends_with('\n'), "{args:?}: {err:?}");
    assert!(err.contains(want), "{args:?}: want `{want}` in {err}");
    assert!(!err.contains("panicked") && out.stdout.is_empty(), "{args:?}: {err}");
}

const C8: &str = "configs/tpu-8x8.ron";
const MAX: &str = "18446744073709551615";

#[test]
fn huge_sizes_are_refused_before_allocating() {
    for (args, want) in [
        (vec!["gemm", "--config", C8, "--m", MAX, "--k", "1", "--n", "1"], "needs more than 2^64 bytes of host memory"),
        (vec!["gemm", "--config", C8, "--m", "1", "--k", MAX, "--n", MAX], "needs more than 2^64 bytes"),
        (
            vec!["gemm", "--config", C8, "--m", "1000000000", "--k", "1000000000", "--n", "1000000000"],
            "more than the limit of 4.0 GiB (raise it with --max-memory)",
        ),
        // 4 GB of operands and 4 GB of output: past the 4 GiB default in either mode.
        (
            vec!["gemm", "--config", C8, "--m", "1000000000", "--k", "1", "--n", "1"],
            "gemm 1000000000x1x1 needs 7.5 GiB",
        ),
        (
            vec!["gemm", "--config", C8, "--m", "1000000000", "--k", "1", "--n", "1", "--mode", "functional"],
            "more than the limit of 4.0 GiB",
        ),
        (
            vec!["gemm", "--config", C8, "--m", "64", "--k", "64", "--n", "64", "--max-memory", "1K"],
            "needs 54.9 KiB of host memory, more than the limit of 1.0 KiB",
        ),
        (
            vec!["op", "--config", C8, "--op", "matmul", "--m", MAX, "--k", "1", "--n", "1"],
            "total more than 2^64 bytes",
        ),
        (
            vec!["op", "--config", C8, "--op", "adam", "--n", MAX],
            "adam 18446744073709551615: its inputs and outputs total",
        ),
        (vec!["op", "--config", C8, "--op", "relu", "--n", "1000000000000"], "needs 8000000000000 bytes of DRAM"),
        (
            vec!["op", "--config", C8, "--op", "softmax", "--rows", "4294967296", "--cols", "4294967296"],
            "does not fit 64 bits",
        ),
        (vec!["op", "--config", C8, "--op", "matmul", "--m", "10000000", "--k", "32", "--n", "32"], "bytes of DRAM"),
        (
            vec![
                "op", "--config", C8, "--op", "conv2d", "--h", "100000", "--w", "100000", "--c-in", "64", "--c-out",
                "64",
            ],
            "bytes of DRAM, the config has 268435456 (`dram.bytes`)",
        ),
        (
            vec![
                "op", "--config", C8, "--op", "conv2d", "--h", "4", "--w", "4", "--c-in", "1", "--c-out", "1", "--pad",
                MAX,
            ],
            "the padded input (h or w + 2 * pad) does not fit 64 bits",
        ),
        (
            vec![
                "op", "--config", C8, "--op", "conv2d", "--h", "4", "--w", "4", "--c-in", "1", "--c-out", "1",
                "--kernel", "9", "--pad", "0",
            ],
            "the kernel must fit the padded input",
        ),
        (vec!["gemm", "--config", C8, "--m", "-1", "--k", "1", "--n", "1"], "see `faultline gemm --help`"),
        (vec!["gemm", "--config", C8, "--m", "18446744073709551616", "--k", "1", "--n", "1"], "--m"),
    ] {
        refused(&args, want);
    }
}

#[test]
fn bad_configs_name_the_file_field_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let lat = config(d, "lat.ron", "latency_cycles: 100", &format!("latency_cycles: {MAX}"));
    let setup = config(d, "setup.ron", "setup_cycles: 8", "setup_cycles: 99999999999");
    let bw = config(d, "bw.ron", "bandwidth_bytes_per_cycle: 16.0", "bandwidth_bytes_per_cycle: 1e-17");
    let name = config(d, "name.ron", "name: \"tpu-8x8\"", "name: \"\"");
    let clock = config(d, "clock.ron", "clock_mhz: 940.0", "clock_mhz: 0.000001");
    // A unified buffer of 16-bit words cannot hold the fp32 values a program keeps there.
    let ub = config(
        d,
        "ub.ron",
        "unified_buffer: (bytes: 131072, word_bits: 32",
        "unified_buffer: (bytes: 1073741824, word_bits: 16",
    );
    let dev_zero = "/dev/zero";
    for (args, want) in [
        // The example: this 16x8x8 matmul used to report 102 cycles (304 when valid).
        (
            vec!["op", "--config", &lat, "--op", "matmul", "--m", "16", "--k", "8", "--n", "8"],
            "field `dram.latency_cycles` = 18446744073709551615: allowed: 0 to 1000000 cycles",
        ),
        (vec!["gemm", "--config", &lat, "--m", "16", "--k", "8", "--n", "8"], "lat.ron: field `dram.latency_cycles`"),
        (vec!["sites", "--config", &setup], "field `dma.setup_cycles` = 99999999999: allowed: 0 to 1000000 cycles"),
        (
            vec!["op", "--config", &bw, "--op", "relu", "--n", "8"],
            "`dram.bandwidth_bytes_per_cycle` = 1e-17: allowed: 0.01 to 1048576.0 bytes per cycle, or inf",
        ),
        (vec!["sites", "--config", &name], "field `name`"),
        (
            vec!["gemm", "--config", &clock, "--m", "1", "--k", "1", "--n", "1"],
            "field `clock_mhz` = 1e-6: allowed: 1.0 to 100000.0 MHz",
        ),
        (
            vec!["op", "--config", &ub, "--op", "matmul", "--m", "8", "--k", "8", "--n", "8", "--mode", "cycle"],
            "memory.unified_buffer.word_bits must be 32",
        ),
        (
            vec!["gemm", "--config", dev_zero, "--m", "1", "--k", "1", "--n", "1"],
            "/dev/zero: cannot read hardware config: a character device, not a regular file",
        ),
        (vec!["op", "--config", dev_zero, "--op", "relu", "--n", "1"], "a character device, not a regular file"),
        (vec!["sites", "--config", dev_zero], "a character device, not a regular file"),
        (
            vec!["op", "--config", C8, "--op", "relu", "--n", "8", "--dram-bw", "1e-17"],
            "--dram-bw: configs/tpu-8x8.ron: field `dram.bandwidth_bytes_per_cycle` = 1e-17",
        ),
        (
            vec!["op", "--config", C8, "--op", "relu", "--n", "8", "--dram-bw=-4"],
            "`dram.bandwidth_bytes_per_cycle` = -4.0",
        ),
        (
            vec!["op", "--config", C8, "--op", "relu", "--n", "8", "--dram-bw", "NaN"],
            "`dram.bandwidth_bytes_per_cycle` = NaN",
        ),
        (vec!["op", "--config", C8, "--op", "relu", "--n", "8", "--dram-bw", "1e300"], "1e300"),
    ] {
        refused(&args, want);
    }
}

#[test]
fn fault_strings_and_times_outside_the_operation_are_refused() {
    let g = ["gemm", "--config", C8, "--m", "16", "--k", "8", "--n", "8", "--fault"];
    let with = |base: &[&'static str], f: &'static str| {
        let mut v = base.to_vec();
        v.push(f);
        v
    };
    let mm =
        ["op", "--config", C8, "--op", "matmul", "--m", "16", "--k", "8", "--n", "8", "--mode", "cycle", "--fault"];
    let relu = ["op", "--config", C8, "--op", "relu", "--n", "16", "--fault"];
    for (args, want) in [
        // 16x8x8 on 8x8: one fold, 32 cycles. Cycle 31 is its last, so 32 on is after it.
        (with(&g, "flip:mxu.pe[3][5].weight[14]@0:99999"), "cycle 99999 of fold 0 is after the GEMM ends at cycle 32"),
        (
            with(&g, "stuck1:mxu.pe[3][5].psum[2]@0:32+5"),
            "`mxu.pe[3][5].psum[2]` cannot be injected: cycle 32 of fold 0",
        ),
        (with(&g, "flip:mxu.pe[3][5].psum[2]@0:18446744073709551615"), "is after the GEMM ends"),
        // The op's run: 328 cycles, so 328 on is after it.
        (with(&mm, "flip:ub.word[0x0][0]@cycle=328"), "cycle 328 is after the op matmul 16x8x8 ends at cycle 328"),
        (with(&mm, "flip:mxu.pe[0][0].psum[0]@cycle=99999"), "is after the op matmul 16x8x8 ends at cycle 328"),
        (with(&relu, "flip:vpu.lane[0].a[0]@cycle=99999"), "cycle 99999 is after the op relu 16 ends at cycle 229"),
        (with(&relu, "flip:vpu.lane[0].a[0]@0:5"), "expected KIND:SITE@cycle=C[,for=N]"),
        (with(&relu, "flip:vpu.lane[0].a[0]@step=1,cycle=5"), "unknown key `step` (cycle, for)"),
        (with(&g, "flip:mxu.pe[3][5].weight[14]@1:0"), "tile 1 out of range, the operation has 1 folds"),
        (with(&g, "zap:mxu.pe[3][5].weight[14]@0:1"), "unknown fault kind `zap`"),
        (with(&g, "flip:mxu.pe[3][5].weight[14]@0:1+4"), "a flip acts once"),
        (with(&g, "stuck0:mxu.pe[3][5].weight[14]@0:1+0"), "DURATION must be at least 1 cycle"),
        (
            with(&g, "flip:mxu.pe[3][5].weight[14]@99999999999999999999999:0"),
            "TILE `99999999999999999999999` is larger than",
        ),
        (with(&g, "flip:mxu.pe[3][5].weight[14]@-1:0"), "TILE `-1` is not a non-negative decimal integer"),
        (
            with(&g, "flip:mxu.pe[3][5]\n.weight[14]@0:1"),
            "--fault: cannot parse fault `flip:mxu.pe[3][5]\\n.weight[14]@0:1`",
        ),
        (with(&g, "flip:mxu.pe[99999999999][5].weight[14]@0:1"), "is not an index"),
        (with(&g, "flip"), "expected KIND:SITE@TILE:CYCLE[+DURATION]"),
    ] {
        refused(&args, want);
    }
}

/// The limit does not get in the way of valid work: the README's examples still run under it.
#[test]
fn valid_runs_fit_the_limits() {
    for args in [
        vec!["gemm", "--config", "configs/tpu-32x32.ron", "--m", "128", "--k", "64", "--n", "256"],
        vec![
            "gemm",
            "--config",
            C8,
            "--m",
            "16",
            "--k",
            "8",
            "--n",
            "8",
            "--fault",
            "flip:mxu.pe[3][5].weight[14]@0:31",
        ],
        vec![
            "op",
            "--config",
            "configs/tpu-32x32.ron",
            "--op",
            "conv2d",
            "--h",
            "14",
            "--w",
            "14",
            "--c-in",
            "64",
            "--c-out",
            "64",
            "--mode",
            "cycle",
        ],
        vec![
            "op",
            "--config",
            "configs/tpu-128x128.ron",
            "--op",
            "softmax",
            "--rows",
            "64",
            "--cols",
            "1000",
            "--mode",
            "cycle",
        ],
        vec!["sites", "--config", "configs/tpu-128x128.ron"],
    ] {
        let out = faultline_limited(&args, ADDRESS_SPACE);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
