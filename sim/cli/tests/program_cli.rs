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
        for r in rows {
            let (start, cycles) = (r["start"].as_u64().unwrap(), r["cycles"].as_u64().unwrap());
            let free = end.insert(r["unit"].as_str().unwrap().to_string(), start + cycles).unwrap_or(0);
            assert!(start >= free, "instruction overlaps its unit's previous one: {r}");
        }
        assert_eq!(end.values().max().copied(), p["cycles_per_step"].as_u64());
        let busy = |u: &str| rows.iter().filter(|r| r["unit"] == u).map(|r| r["cycles"].as_u64().unwrap()).sum::<u64>();
        assert_eq!(
            (busy("mxu"), busy("vpu")),
            (p["mxu_busy_cycles"].as_u64().unwrap(), p["vpu_busy_cycles"].as_u64().unwrap())
        );
        let classes: Vec<&str> =
            p["injection_space"].as_array().unwrap().iter().map(|c| c["class"].as_str().unwrap()).collect();
        assert!(classes.contains(&"mxu.pe[*][*].psum") && classes.contains(&"vpu.lane[*].out"), "{classes:?}");
        assert!(classes.iter().all(|c| c.starts_with("mxu.") || c.starts_with("vpu.")), "{classes:?}");
    }
    // Nothing runs, so no dataset is needed: a batch larger than the shipped digits lowers too.
    let big = faultline_json(&[
        "program",
        "--model",
        "models/mlp-digits.ron",
        "--config",
        "configs/tpu-32x32.ron",
        "--batch",
        "4096",
        "--json",
    ]);
    assert_eq!(big["instructions"][0]["shape"], "4096x64x64");
    let out = faultline(&["program", "--model", "models/mlp-digits.ron", "--config", "configs/tpu-32x32.ron"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("34 instructions, 2009 cycles per step") && text.contains("ln"), "{text}");
}
