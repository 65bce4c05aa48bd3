//! End-to-end checks of `faultline sites` and `faultline op` as a user runs them.

mod common;
use common::{faultline, faultline_json};

fn json(args: &[&str]) -> serde_json::Value {
    faultline_json(args)
}

#[test]
fn sites_counts_and_filters() {
    let all = json(&["sites", "--config", "configs/tpu-32x32.ron", "--json"]);
    let classes = all["classes"].as_array().unwrap();
    let find = |c: &str| classes.iter().find(|r| r["class"] == c).unwrap_or_else(|| panic!("no {c}")).clone();
    assert_eq!(find("mxu.pe[*][*].psum")["bits"], 32 * 32 * 32);
    // 512 KiB of 32-bit words.
    assert_eq!(find("ub.word[*]")["bits"], 512 * 1024 * 8);
    assert_eq!(find("ub.word[*]")["kind"], "sram");
    assert_eq!(find("seq.acc_addr")["width"], 17);
    let t = &all["totals"];
    assert_eq!(t["bits"].as_u64().unwrap(), t["flip_flop_bits"].as_u64().unwrap() + t["sram_bits"].as_u64().unwrap());
    let psum = json(&["sites", "--config", "configs/tpu-32x32.ron", "--filter", "mxu.pe[*][*].psum", "--json"]);
    assert_eq!(psum["classes"].as_array().unwrap().len(), 1);
    assert_eq!(psum["totals"]["sram_bits"], 0);
    let out = faultline(&["sites", "--config", "configs/tpu-32x32.ron", "--filter", "gpu.*"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no site class matches"));
}

/// `sites` describes the machine of the run it is asked about: an fp32 run has 32-bit MXU
/// registers and 32-bit weight-buffer words, 2048 of them in tpu-32x32's 8 KiB (bf16: 4096 of
/// 16 bits). The last word and top bit `sites --precision fp32` lists are accepted by an fp32
/// training run; the last word of the default (bf16) listing is not.
#[test]
fn sites_take_the_runs_precision() {
    let c32 = "configs/tpu-32x32.ron";
    let class = |precision: &[&str], c: &str| {
        let all = json(&[&["sites", "--config", c32, "--json"][..], precision].concat());
        let row = all["classes"].as_array().unwrap().iter().find(|r| r["class"] == c).unwrap().clone();
        (
            all["precision"].as_str().unwrap().to_string(),
            row["elements"].as_u64().unwrap(),
            row["width"].as_u64().unwrap(),
        )
    };
    assert_eq!(class(&[], "wbuf.word[*]"), ("bf16".into(), 4096, 16));
    assert_eq!(class(&["--precision", "bf16"], "wbuf.word[*]"), ("bf16".into(), 4096, 16));
    let (_, words, bits) = class(&["--precision", "fp32"], "wbuf.word[*]");
    assert_eq!((words, bits), (2048, 32));
    for reg in ["mxu.pe[*][*].act", "mxu.pe[*][*].weight", "mxu.pe[*][*].weight_shadow"] {
        assert_eq!(class(&["--precision", "fp32"], reg).2, 32, "{reg}");
    }
    let train = |site: String| {
        faultline(&[
            "train",
            "--model",
            "models/mlp-digits.ron",
            "--config",
            c32,
            "--precision",
            "fp32",
            "--steps",
            "1",
            "--eval-every",
            "0",
            "--inject",
            &format!("flip:{site}@step=1,cycle=100"),
        ])
    };
    let ok = train(format!("wbuf.word[{:#x}][{}]", words - 1, bits - 1));
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let bad = train(format!("wbuf.word[{:#x}][0]", 4096 - 1));
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("allowed 0..2048"));
    let out = faultline(&["sites", "--config", c32, "--precision", "fp16"]);
    assert_eq!(out.status.code(), Some(2));
}

/// The first instruction of `unit` in an `op --json` report: (start, cycles).
fn first_on(report: &serde_json::Value, unit: &str) -> (u64, u64) {
    let rows = report["instructions"].as_array().unwrap();
    let row = rows.iter().find(|r| r["unit"] == unit).unwrap();
    (row["start"].as_u64().unwrap(), row["cycles"].as_u64().unwrap())
}

#[test]
fn op_modes_agree_and_a_fault_changes_the_checksum() {
    let base = [
        "op",
        "--config",
        "configs/tpu-8x8.ron",
        "--op",
        "conv2d",
        "--h",
        "6",
        "--w",
        "6",
        "--c-in",
        "4",
        "--c-out",
        "10",
        "--json",
    ];
    let f = json(&base);
    let mut cyc = base.to_vec();
    cyc.extend(["--mode", "cycle"]);
    let c = json(&cyc);
    assert_eq!(f["checksum"], c["checksum"]);
    for key in ["cycles", "instructions", "mxu_busy_cycles", "vpu_busy_cycles", "dma_cycles", "stall_cycles"] {
        assert!(c.get(key).is_some(), "missing {key}");
        assert_eq!(f[key], c[key], "{key}");
    }
    // An accumulator flip after the GEMM wrote output (0, 3) and before the store reads it.
    let (start, cycles) = first_on(&c, "mxu");
    let at = format!("flip:acc.word[0x3][30]@cycle={}", start + cycles);
    let mut faulty = cyc.clone();
    faulty.extend(["--fault", &at]);
    let fj = json(&faulty);
    assert_ne!(fj["checksum"], c["checksum"]);
    assert_eq!(fj["corrupted_positions"], serde_json::json!(["(0,3)"]));
    assert_eq!(fj["injection"]["op"], "store");
    // Functional mode runs the instructions the fault reaches as cycle level does.
    let mut functional: Vec<&str> = faulty.iter().copied().filter(|s| !["--mode", "cycle"].contains(s)).collect();
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("instructions.csv");
    functional.extend(["--csv", csv.to_str().unwrap()]);
    assert_eq!(json(&functional)["checksum"], fj["checksum"]);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("index,start,cycles,unit,op,shape,node,phase,layer,writes\n"), "{text}");
    assert_eq!(text.lines().count(), 1 + c["instructions"].as_array().unwrap().len());
}

#[test]
fn op_errors_are_one_line_and_exit_2() {
    let relu = ["op", "--config", "configs/tpu-8x8.ron", "--op", "relu", "--n", "8", "--fault"];
    let with = |f: &'static str| [&relu[..], &[f]].concat();
    for (args, want) in [
        (
            vec![
                "op",
                "--config",
                "configs/tpu-8x8.ron",
                "--op",
                "matmul",
                "--m",
                "10000000",
                "--k",
                "32",
                "--n",
                "32",
            ],
            "bytes of DRAM",
        ),
        (vec!["op", "--config", "configs/tpu-8x8.ron", "--op", "matmul", "--m", "4"], "needs --k"),
        (with("flip:ub.word[0][0]@0:0"), "expected KIND:SITE@cycle=C"),
        (with("flip:mxu.pe[99][0].psum[0]@cycle=0"), "index 0 is 99, allowed 0..8"),
        (with("stuck1:ub.word[0][0]@cycle=3"), "a stuck-at needs `for=N`"),
    ] {
        let out = faultline(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want) && err.lines().count() == 1, "{args:?}: {err}");
    }
}

/// An MXU fault means the same in `op` as in `gemm`: a weight-shadow flip that reaches the
/// next fold (cycle 21 of fold 0 loads fold 1's weight into PE (2,3)) corrupts the same 16
/// outputs of column 3 in both, the same flip one cycle earlier none; in `op` the cycle counts
/// from the op's start, so it is the GEMM's start plus 21; `op` lists the outputs.
#[test]
fn an_mxu_fault_corrupts_the_same_outputs_in_op_and_gemm() {
    let shape = ["--config", "configs/tpu-8x8.ron", "--m", "16", "--k", "24", "--n", "8"];
    let start = first_on(&json(&[&["op", "--op", "matmul"], &shape[..], &["--json"]].concat()), "mxu").0;
    for (cycle, n) in [(21, 16), (20, 0)] {
        let f = format!("flip:mxu.pe[2][3].weight_shadow[14]@0:{cycle}");
        let g = json(&[&["gemm"], &shape[..], &["--fault", &f, "--json"]].concat());
        let f = format!("flip:mxu.pe[2][3].weight_shadow[14]@cycle={}", start + cycle);
        let o = json(&[&["op", "--op", "matmul"], &shape[..], &["--fault", &f, "--json"]].concat());
        assert_eq!(g["corrupted_outputs"], n);
        assert_eq!(o["corrupted_outputs"], n);
        let cols: Vec<String> = (0..n).map(|r| format!("({r},3)")).collect();
        assert_eq!(o["corrupted_positions"], serde_json::json!(cols));
        let g_cols: Vec<String> =
            g["corrupted_positions"].as_array().unwrap().iter().map(|p| format!("({},{})", p[0], p[1])).collect();
        assert_eq!(g_cols, cols);
    }
}
