//! End-to-end checks of `faultline scalesim` as a user runs it: SCALE-Sim's files in, its three
//! reports out with its column names, its counts under its convention and Faultline's under
//! the other, any array size SCALE-Sim runs, layer names that need quoting, and inputs refused
//! by name: a config field Faultline does not model, files past the text cap, and topologies
//! whose layers need more host memory than the limit (checked before they are built).

mod common;
use common::{faultline, faultline_limited};
use std::path::Path;

/// Rows of a SCALE-Sim style CSV (`, `-separated, a trailing comma, quoted where a field needs
/// it) as name -> value maps, read by a CSV reader; every row has the header's field count.
fn report(path: &Path) -> Vec<std::collections::HashMap<String, String>> {
    let mut rd = csv::ReaderBuilder::new().trim(csv::Trim::All).from_path(path).unwrap();
    let head = rd.headers().unwrap().clone();
    rd.records()
        .map(|r| {
            let r = r.unwrap();
            assert_eq!(r.len(), head.len(), "{}: {r:?}", path.display());
            head.iter().map(str::to_string).zip(r.iter().map(str::to_string)).collect()
        })
        .collect()
}

/// The shipped SCALE-Sim config with each `(from, to)` replaced (each must occur), written to `dir`.
fn config(dir: &Path, edits: &[(&str, &str)]) -> String {
    let mut cfg =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/scalesim-32x32.cfg")).unwrap();
    for (from, to) in edits {
        assert!(cfg.contains(from), "{from}");
        cfg = cfg.replace(from, to);
    }
    let p = dir.join("run.cfg");
    std::fs::write(&p, cfg).unwrap();
    p.to_str().unwrap().to_string()
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
    let bad = config(d.path(), &[("SparsitySupport : false", "SparsitySupport : true")]);
    let o = faultline(&["scalesim", "--config", &bad, "--topology", "topologies/test-gemms.csv"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("field `sparsity.SparsitySupport` = true: False"), "{err}");
    let topo = d.path().join("t.csv");
    std::fs::write(&topo, "Layer, M, N, K,\nx, 4, 4,\n").unwrap();
    let o = faultline(&["scalesim", "--config", "configs/scalesim-32x32.cfg", "--topology", topo.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("line 2: row` = x, 4, 4: 4 fields, as the header has"), "{err}");
}

/// SCALE-Sim runs a 128x128 array with 64 KB SRAMs; so does Faultline, on a machine whose banks
/// are derived from the array (the base tpu-32x32 has 32, the array takes 128 words a cycle).
#[test]
fn a_128x128_array_with_64_kb_srams_runs() {
    let d = tempfile::tempdir().unwrap();
    let cfg = config(
        d.path(),
        &[
            ("ArrayHeight:    32", "ArrayHeight:    128"),
            ("ArrayWidth:     32", "ArrayWidth:     128"),
            ("IfmapSramSzkB:    256", "IfmapSramSzkB:    64"),
            ("FilterSramSzkB:   256", "FilterSramSzkB:   64"),
            ("OfmapSramSzkB:    128", "OfmapSramSzkB:    64"),
        ],
    );
    let out = d.path().join("out");
    let o = faultline(&[
        "scalesim",
        "--config",
        &cfg,
        "--topology",
        "topologies/test-gemms.csv",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("on 128x128 ws (7 layers"), "{stdout}");
    assert!(stdout.contains("note: memory.unified_buffer.banks 32 -> 128, so that banks * ports >= 128"), "{stdout}");
    let c = report(&out.join("COMPUTE_REPORT.csv"));
    // square64 on 128x128 WS: one fold, 64 + 2*128 + 128 - 2 cycles, the last one's index.
    assert_eq!((c[0]["Layer"].as_str(), c[0]["Total Cycles"].as_str()), ("square64", "445"));
    assert_eq!(c.len(), 7);
}

/// Layer names are the topology's, whatever they hold: `a,b` (quoted in SCALE-Sim's CSV) and a
/// quote come back from every report through a CSV reader, each row as wide as its header.
#[test]
fn layer_names_with_commas_and_quotes_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let topo = d.path().join("t.csv");
    std::fs::write(&topo, "Layer, M, N, K,\n\"a,b\", 4, 4, 4,\nq\"x, 2, 2, 2,\n\"y\"\"z\", 3, 3, 3,\n").unwrap();
    let out = d.path().join("out");
    for conv in ["scalesim", "faultline"] {
        let o = faultline(&[
            "scalesim",
            "--config",
            "configs/scalesim-32x32.cfg",
            "--topology",
            topo.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--convention",
            conv,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        for name in ["COMPUTE_REPORT.csv", "BANDWIDTH_REPORT.csv", "DETAILED_ACCESS_REPORT.csv"] {
            let rows = report(&out.join(name));
            let names: Vec<&str> = rows.iter().map(|r| r["Layer"].as_str()).collect();
            assert_eq!(names, ["a,b", "q\"x", "y\"z"], "{name}");
            assert_eq!(rows[0]["M"], "4", "{name}");
        }
    }
    // Where nothing needs quoting, the rows are SCALE-Sim's `, `-separated text as before.
    let text = std::fs::read_to_string(out.join("COMPUTE_REPORT.csv")).unwrap();
    assert!(text.starts_with("LayerID, Total Cycles (incl. prefetch), Total Cycles, Stall Cycles,"), "{text}");
    assert!(text.lines().all(|l| l.ends_with(',')), "{text}");
    assert!(text.contains(",\" a,b\", 4, 4, 4, "), "{text}");
}

const ADDRESS_SPACE: u64 = 1 << 30;

/// `faultline ARGS` (address space limited) must fail with one line on stderr containing `want`;
/// returns that line.
fn refused(args: &[&str], want: &str) -> String {
    let out = faultline_limited(args, ADDRESS_SPACE);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: status {:?}, stderr {err}", out.status);
    assert!(err.starts_with("error: ") && err.lines().count() == 1, "{args:?}: {err:?}");
    assert!(err.contains(want), "{args:?}: want `{want}` in {err}");
    assert!(out.stdout.is_empty(), "{args:?}");
    err.into_owned()
}

/// A topology of `rows` copies of `row` under a GEMM header, in `dir`.
fn topology(dir: &Path, name: &str, header: &str, row: &str, rows: usize) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{header}\n{}", row.repeat(rows))).unwrap();
    p.to_str().unwrap().to_string()
}

const GEMM: &str = "Layer, M, N, K,";
const CONV: &str = "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,";

/// What a topology needs for its layers is checked against --max-memory before they are built:
/// a million rows (12 MB of text) under 64 MiB, and 200 depth-wise rows of 65,536 channels (a
/// layer each, 13 million) under the default 4 GiB. A hundred thousand rows fit 64 MiB, and run
/// in that much address space.
#[test]
fn topologies_are_held_to_the_memory_limit() {
    let d = tempfile::tempdir().unwrap();
    let million = topology(d.path(), "m.csv", GEMM, "l, 1, 1, 1,\n", 1_000_000);
    let base = ["scalesim", "--config", "configs/scalesim-32x32.cfg", "--mode", "functional", "--topology"];
    let err = refused(&[&["--max-memory", "64M"][..], &base, &[&million]].concat(), "(1000000 layers) needs");
    assert!(err.contains("more than the limit of 64.0 MiB (raise it with --max-memory)"), "{err}");
    let dp = topology(d.path(), "dp.csv", CONV, "DP, 1, 1, 1, 1, 65536, 1, 1,\n", 200);
    refused(&[&base[..], &[&dp]].concat(), "(13107200 layers) needs");
    let small = topology(d.path(), "s.csv", GEMM, "l, 1, 1, 1,\n", 100_000);
    let out = faultline_limited(&[&["--max-memory", "64M"][..], &base, &[&small]].concat(), 256 << 20);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(100000 layers,"));
}

/// SCALE-Sim's files are text, read with the 16 MiB cap: past it (a config or a topology that
/// would parse) or endless, they are refused, not read whole.
#[test]
fn configs_and_topologies_past_the_text_cap_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let cfg =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/scalesim-32x32.cfg")).unwrap();
    let big_cfg = d.path().join("big.cfg");
    std::fs::write(&big_cfg, format!("{cfg}{}", "# padding\n".repeat(2 << 20))).unwrap();
    let big_topo = topology(d.path(), "big.csv", GEMM, "layer, 1, 1, 1,\n", 1 << 20);
    let (c, t) = (big_cfg.to_str().unwrap(), big_topo.as_str());
    let gemms = "topologies/test-gemms.csv";
    let cfg32 = "configs/scalesim-32x32.cfg";
    for (args, want) in [
        (
            ["scalesim", "--config", c, "--topology", gemms],
            "big.cfg: cannot read SCALE-Sim config: file is larger than 16.0 MiB",
        ),
        (
            ["scalesim", "--config", cfg32, "--topology", t],
            "big.csv: cannot read SCALE-Sim topology: file is larger than 16.0 MiB",
        ),
        (
            ["scalesim", "--config", "/dev/zero", "--topology", gemms],
            "/dev/zero: cannot read SCALE-Sim config: a character device, not a regular file",
        ),
        (
            ["scalesim", "--config", cfg32, "--topology", "/dev/zero"],
            "/dev/zero: cannot read SCALE-Sim topology: a character device, not a regular file",
        ),
    ] {
        refused(&args, want);
    }
}
