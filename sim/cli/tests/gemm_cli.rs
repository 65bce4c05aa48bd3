//! End-to-end checks of `faultline gemm` as a user runs it.

mod common;
use common::{faultline, faultline_json};

fn gemm_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["gemm", "--config", "configs/tpu-8x8.ron", "--m", "20", "--k", "13", "--n", "9", "--json"];
    args.extend_from_slice(extra);
    faultline_json(&args)
}

#[test]
fn json_has_the_documented_fields_and_modes_agree() {
    for df in ["ws", "os"] {
        let c = gemm_json(&["--mode", "cycle", "--dataflow", df]);
        let f = gemm_json(&["--mode", "functional", "--dataflow", df]);
        for key in ["total_cycles", "compute_cycles", "folds", "utilization", "macs", "output_checksum"] {
            assert!(c.get(key).is_some(), "missing {key}");
            assert_eq!(c[key], f[key], "{key} differs between modes ({df})");
        }
        assert_eq!(c["macs"], 20 * 13 * 9);
    }
    // A different seed gives different inputs, hence a different checksum.
    assert_ne!(gemm_json(&["--seed", "1"])["output_checksum"], gemm_json(&["--seed", "2"])["output_checksum"]);
}

#[test]
fn a_fault_reports_the_corrupted_outputs() {
    // 8x8 WS; a psum flip at PE (7, 2) at cycle 1 + m + 7 + 2 of fold 0 hits the partial sum of
    // output (m, 2) only; the second k-fold adds to the corrupted value, so it stays corrupted.
    let j = gemm_json(&["--fault", "flip:mxu.pe[7][2].psum[30]@0:14"]);
    assert_eq!(j["corrupted_outputs"], 1);
    assert_eq!(j["corrupted_positions"][0], serde_json::json!([4, 2]));
}

#[test]
fn bad_input_is_one_clear_line_and_exit_2() {
    for (args, want) in [
        (vec!["gemm", "--config", "configs/missing.ron", "--m", "1", "--k", "1", "--n", "1"], "configs/missing.ron"),
        (vec!["gemm", "--config", "configs/tpu-8x8.ron", "--m", "0", "--k", "1", "--n", "1"], "--m must be at least 1"),
        (
            vec![
                "gemm",
                "--config",
                "configs/tpu-8x8.ron",
                "--m",
                "1",
                "--k",
                "1",
                "--n",
                "1",
                "--fault",
                "flip:mxu.pe[8][0].psum[0]@0:0",
            ],
            "allowed 0..8",
        ),
    ] {
        let out = faultline(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error: ") && err.contains(want), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
