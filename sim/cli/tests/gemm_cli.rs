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
    for df in ["ws", "os", "is"] {
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
fn input_stationary_is_weight_stationary_to_the_bit_and_names_faulty_outputs() {
    let (is, ws) = (gemm_json(&["--dataflow", "is"]), gemm_json(&["--dataflow", "ws"]));
    assert_eq!(is["output_checksum"], ws["output_checksum"]);
    assert_eq!(is["dataflow"], "is");
    // 8x8 IS on 20x13x9: ceil(13/8) * ceil(20/8) = 6 folds of 9 streamed columns.
    assert_eq!((is["folds"].as_u64(), is["compute_cycles"].as_u64()), (Some(6), Some(54)));
    // PE (7, 2) of fold 0 holds A[2][7]; column nn of W passes it at 1 + nn + 7 + 2: a psum
    // flip at cycle 14 hits out[2][4] only (the second k-fold adds to it).
    let j = gemm_json(&["--dataflow", "is", "--fault", "flip:mxu.pe[7][2].psum[30]@0:14"]);
    assert_eq!(j["corrupted_outputs"], 1);
    assert_eq!(j["corrupted_positions"][0], serde_json::json!([2, 4]));
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

fn abft_json(n: &str, extra: &[&str]) -> serde_json::Value {
    let mut args =
        vec!["gemm", "--config", "configs/tpu-32x32-int8.ron", "--m", "64", "--k", "64", "--n", n, "--abft", "--json"];
    args.extend_from_slice(extra);
    faultline_json(&args)
}

#[test]
fn abft_checksum_columns_are_free_in_a_ragged_tile_and_cost_a_fold_otherwise() {
    // n = 30 leaves 2 free columns in the 32-wide last tile: the 2 digit columns ride there.
    let free = abft_json("30", &[]);
    assert_eq!(free["digits"], 2);
    assert_eq!(free["fault_free_residuals_zero"], true);
    assert_eq!(free["fused_folds"], free["plain_folds"]);
    // n = 32 fills the tile: the digit columns take a second column of folds.
    let fold = abft_json("32", &[]);
    assert_eq!(fold["fault_free_residuals_zero"], true);
    assert_eq!(fold["fused_folds"].as_u64().unwrap(), 2 * fold["plain_folds"].as_u64().unwrap());
    assert!(fold["overhead_percent"].as_f64().unwrap() > 10.0 * free["overhead_percent"].as_f64().unwrap());
}

#[test]
fn abft_reports_what_a_fault_did_and_whether_the_check_saw_it() {
    // A psum flip in C's column 5 corrupts one output and is detected.
    let j = abft_json("30", &["--fault", "flip:mxu.pe[3][5].psum[30]@0:40"]);
    assert_eq!(
        (j["outcome"].as_str(), j["c_corrupted"].as_bool(), j["detected"].as_bool()),
        (Some("detected"), Some(true), Some(true))
    );
    assert_eq!(j["corrupted_outputs"], 1);
    // The same flip in column 30 (digit column 0) leaves C intact: a false alarm.
    let j = abft_json("30", &["--fault", "flip:mxu.pe[3][30].psum[3]@0:40"]);
    assert_eq!(j["outcome"], "false_alarm");
    assert_eq!((j["corrupted_outputs"].as_u64(), j["changed_checksum_outputs"].as_u64()), (Some(0), Some(1)));
}

#[test]
fn abft_trials_are_deterministic_and_add_up() {
    let one = abft_json("30", &["--trials", "400", "--threads", "1"]);
    let two = abft_json("30", &["--trials", "400", "--threads", "2"]);
    assert_eq!(one["outcomes"], two["outcomes"], "the trials do not depend on the thread count");
    assert_eq!(one["by_class"], two["by_class"]);
    let o = &one["outcomes"];
    let get = |k: &str| o[k].as_u64().unwrap();
    let all = ["masked", "checksum_only", "false_alarm", "detected", "silent"];
    assert_eq!(all.iter().map(|k| get(k)).sum::<u64>(), 400);
    assert_eq!(one["c_corrupted"].as_u64().unwrap(), get("detected") + get("silent"));
    assert_eq!(one["detection"]["n"], one["c_corrupted"]);
    assert_eq!(one["detection"]["k"].as_u64().unwrap(), get("detected"));
    assert!(get("detected") > 0 && get("masked") > 0);
    // A different seed draws different flips.
    assert_ne!(abft_json("30", &["--trials", "400", "--seed", "8"])["outcomes"], one["outcomes"]);
}

#[test]
fn abft_needs_an_int8_config() {
    let out = faultline(&["gemm", "--config", "configs/tpu-8x8.ron", "--m", "4", "--k", "4", "--n", "4", "--abft"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: ") && err.contains("--abft") && err.contains("bf16"), "{err}");
    let out =
        faultline(&["gemm", "--config", "configs/tpu-8x8.ron", "--m", "4", "--k", "4", "--n", "4", "--trials", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--abft"));
}
