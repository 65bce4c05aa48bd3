//! End-to-end checks of `faultline scalesim` as a user runs it: SCALE-Sim's files in, its three
//! reports out with its column names, its counts under its convention and Faultline's under
//! the other, and a config field Faultline does not model refused by name.

mod common;
use common::faultline;
use std::path::Path;

/// Rows of a SCALE-Sim style CSV (`, `-separated, a trailing comma) as name -> value maps.
fn report(path: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let cells = |l: &str| l.trim_end_matches(',').split(", ").map(str::to_string).collect::<Vec<_>>();
    let head = cells(lines.next().unwrap());
    lines.map(|l| head.iter().cloned().zip(cells(l)).collect()).collect()
}

#[test]
fn reports_carry_scalesims_counts_or_faultlines() {
    let d = tempfile::tempdir().unwrap();
    let run = |conv: &str| {
        let out = d.path().join(conv);
        let o = faultline(&[
            "scalesim",
            "--config",
            "configs/scalesim-32x32.cfg",
            "--topology",
            "topologies/test-gemms.csv",
            "--out",
            out.to_str().unwrap(),
            "--convention",
            conv,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    };
    let (ss, fl) = (run("scalesim"), run("faultline"));
    for name in ["COMPUTE_REPORT.csv", "BANDWIDTH_REPORT.csv", "DETAILED_ACCESS_REPORT.csv"] {
        assert!(ss.join(name).exists() && fl.join(name).exists(), "{name}");
    }
    let (s, f) = (report(&ss.join("COMPUTE_REPORT.csv")), report(&fl.join("COMPUTE_REPORT.csv")));
    // square64 on 32x32 WS: SCALE-Sim's 4 * (64 + 64 + 32 - 2) - 1; the array's own 1 + 4*64 + 31 + 31 + 1.
    assert_eq!((s[0]["Layer"].as_str(), s[0]["Total Cycles"].as_str()), ("square64", "631"));
    assert_eq!((f[0]["Total Cycles"].as_str(), f[0]["Faultline Array Cycles"].as_str()), ("320", "320"));
    assert_eq!(s[0]["Faultline Array Cycles"], "320");
    // Under Faultline's convention the prefetch column holds its cycles with DMA.
    assert_eq!(f[0]["Total Cycles (incl. prefetch)"], f[0]["Faultline Cycles (with DMA)"]);
    assert_eq!(s[0]["Total Cycles (incl. prefetch)"], "");
    let (sd, fd) = (report(&ss.join("DETAILED_ACCESS_REPORT.csv")), report(&fl.join("DETAILED_ACCESS_REPORT.csv")));
    // ragged (M=100, K=70, N=30): both read the inputs once per column fold and write each
    // output once per K fold (3); Faultline reads back the two folds that add.
    assert_eq!(sd[1]["SRAM IFMAP Reads"], "7000");
    assert_eq!(fd[1]["SRAM IFMAP Reads"], "7000");
    assert_eq!((sd[1]["SRAM OFMAP Writes"].as_str(), fd[1]["SRAM OFMAP Writes"].as_str()), ("9000", "9000"));
    assert_eq!(fd[1]["Faultline Accumulator Reads"], "6000");
    assert_eq!(s.len(), 7);
}

#[test]
fn unsupported_and_bad_inputs_are_named() {
    let d = tempfile::tempdir().unwrap();
    let cfg =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/scalesim-32x32.cfg")).unwrap();
    let bad = d.path().join("sparse.cfg");
    std::fs::write(&bad, cfg.replace("SparsitySupport : false", "SparsitySupport : true")).unwrap();
    let o = faultline(&["scalesim", "--config", bad.to_str().unwrap(), "--topology", "topologies/test-gemms.csv"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("field `sparsity.SparsitySupport` = true: False"), "{err}");
    let topo = d.path().join("t.csv");
    std::fs::write(&topo, "Layer, M, N, K,\nx, 4, 4,\n").unwrap();
    let o = faultline(&["scalesim", "--config", "configs/scalesim-32x32.cfg", "--topology", topo.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("line 2: row` = x, 4, 4: 4 fields, as the header has"), "{err}");
}
