//! `faultline program`: the listing is the program a training step runs (its cycles are what
//! `train` reports per step) and its injection space covers every MXU and VPU class.

mod common;
use common::{faultline, faultline_json};

#[test]
fn program_lists_what_train_runs() {
    for (model, config) in [("mlp-digits", "tpu-32x32"), ("cnn-small", "tpu-8x8"), ("transformer-tiny", "tpu-128x128")]
    {
        let (m, c) = (format!("models/{model}.ron"), format!("configs/{config}.ron"));
        let common = ["--model", &m, "--config", &c, "--batch", "8", "--optimizer", "adam", "--json"];
        let p = faultline_json(&[&["program"][..], &common].concat());
        let t = faultline_json(&[&["train", "--steps", "1"][..], &common].concat());
        assert_eq!(p["cycles_per_step"], t["cycles_per_step"], "{model} on {config}");
        let rows = p["instructions"].as_array().unwrap();
        assert_eq!(rows.len() as u64, t["instructions_per_step"].as_u64().unwrap());
        // Each unit runs one instruction at a time, in program order; the step ends with the last.
        let mut end = std::collections::BTreeMap::new();
        // (DMA transfers overlap each other's fixed overhead; the graph crate's tests check them.)
        for r in rows.iter().filter(|r| r["unit"] != "dma") {
            let (start, cycles) = (r["start"].as_u64().unwrap(), r["cycles"].as_u64().unwrap());
            let free = end.insert(r["unit"].as_str().unwrap().to_string(), start + cycles).unwrap_or(0);
            assert!(start >= free, "instruction overlaps its unit's previous one: {r}");
        }
        let last = rows.iter().map(|r| r["start"].as_u64().unwrap() + r["cycles"].as_u64().unwrap()).max();
        assert_eq!(last, p["cycles_per_step"].as_u64());
        let busy = |u: &str| rows.iter().filter(|r| r["unit"] == u).map(|r| r["cycles"].as_u64().unwrap()).sum::<u64>();
        assert_eq!(
            (busy("mxu"), busy("vpu")),
            (p["mxu_busy_cycles"].as_u64().unwrap(), p["vpu_busy_cycles"].as_u64().unwrap())
        );
        let classes: Vec<&str> =
            p["injection_space"].as_array().unwrap().iter().map(|c| c["class"].as_str().unwrap()).collect();
        for class in
            ["mxu.pe[*][*].psum", "vpu.lane[*].out", "ub.word[*]", "acc.word[*]", "wbuf.word[*]", "dma.src_addr"]
        {
            assert!(classes.contains(&class), "{class} not in {classes:?}");
        }
        // Memories have dead words (before a value is written, after its last read). The tile
        // counter of a one-fold GEMM is read only when it is loaded: on a large array it can
        // be dead all step.
        for c in p["injection_space"].as_array().unwrap() {
            let (live, dead) =
                (c["bit_cycles"].as_u64().unwrap_or(u64::MAX), c["idle_bit_cycles"].as_u64().unwrap_or(0));
            assert!((live > 0 || c["class"] == "seq.tile") && dead > 0, "{c}");
        }
    }
    // Nothing runs, so no dataset is needed: a batch larger than the shipped digits lowers too.
    let big = faultline_json(&[
        "program",
        "--model",
        "models/mlp-digits.ron",
        "--config",
        "configs/tpu-32x32.ron",
        "--batch",
        "1024",
        "--json",
    ]);
    let gemm = big["instructions"].as_array().unwrap().iter().find(|r| r["op"] == "gemm").unwrap();
    assert_eq!(gemm["shape"], "1024x64x64");
    let out = faultline(&["program", "--model", "models/mlp-digits.ron", "--config", "configs/tpu-32x32.ron"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("55 instructions, 6424 cycles per step") && text.contains("ln"), "{text}");
    assert!(text.contains("input@0@ub[0x0]") && text.contains("load"), "{text}");
}

/// `program --precision` lowers the step of a run at that precision: its injection space counts
/// that run's register widths (fp32: 32-bit weights), as `sites --precision` lists them, and
/// its cycles are what `train --precision` reports.
#[test]
fn program_takes_the_runs_precision() {
    let common = ["--model", "models/mlp-digits.ron", "--config", "configs/tpu-32x32.ron", "--json"];
    let bits = |p: &serde_json::Value, class: &str| {
        p["injection_space"].as_array().unwrap().iter().find(|c| c["class"] == class).unwrap()["bits"].clone()
    };
    let bf16 = faultline_json(&[&["program"][..], &common].concat());
    assert_eq!((bf16["precision"].as_str(), bits(&bf16, "mxu.pe[*][*].weight").as_u64()), (Some("bf16"), Some(16384)));
    let p = faultline_json(&[&["program", "--precision", "fp32"][..], &common].concat());
    let s = faultline_json(&["sites", "--config", "configs/tpu-32x32.ron", "--precision", "fp32", "--json"]);
    let t = faultline_json(&[&["train", "--steps", "1", "--precision", "fp32"][..], &common].concat());
    assert_eq!(p["precision"], "fp32");
    assert_eq!(p["cycles_per_step"], t["cycles_per_step"]);
    for class in ["mxu.pe[*][*].weight", "wbuf.word[*]", "ub.word[*]"] {
        let listed = s["classes"].as_array().unwrap().iter().find(|c| c["class"] == class).unwrap()["bits"].clone();
        assert_eq!(bits(&p, class), listed, "{class}");
    }
    assert_eq!(bits(&p, "mxu.pe[*][*].weight"), 32768);
}
