//! Training numerics are pinned: for every shipped model, config, MXU precision and optimizer,
//! 12 steps give exactly the losses, final test accuracy and final tensors (FNV-1a of their
//! bits) recorded in `data/landed-numerics.json` from the executor as it first landed
//! (commit 66d5859). A change of the machine's structure (memory path, instruction schedule,
//! tiling) must not change a bit; a deliberate numerics change regenerates the file and says so.

use faultline_graph::ModelSpec;
use faultline_hw::HwConfig;
use faultline_train::{data::source, MxuFormat, OptimizerKind, TrainOptions, Trainer};
use std::path::Path;

#[test]
fn every_model_config_precision_and_optimizer_reproduces_the_landed_numerics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("sim/train/tests/data/landed-numerics.json")).unwrap())
            .unwrap();
    let want = want.as_object().unwrap();
    assert_eq!(want.len(), 54);
    for (key, w) in want {
        let parts: Vec<&str> = key.split('/').collect();
        let spec = ModelSpec::load(root.join(format!("models/{}.ron", parts[0]))).unwrap();
        let hw = HwConfig::load(root.join(format!("configs/{}.ron", parts[1]))).unwrap();
        let options = TrainOptions {
            precision: parts[2].parse::<MxuFormat>().unwrap(),
            optimizer: parts[3].parse::<OptimizerKind>().unwrap(),
            eval_every: 0,
            ..TrainOptions::default()
        };
        let data = source::shipped(&spec, options.seed, &Default::default()).unwrap();
        let mut t = Trainer::new(&spec, &hw, data, options).unwrap();
        let s = t.run(12, |_, _| Ok(())).unwrap();
        // Losses are fp32 values; compared as such (JSON parsing may miss an f64 by an ulp).
        let bits = |v: &[f64]| v.iter().map(|&x| (x as f32).to_bits()).collect::<Vec<_>>();
        let losses: Vec<f64> = w["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(bits(&s.losses), bits(&losses), "{key}: losses");
        let acc = w["test_accuracy"].as_f64().unwrap();
        assert!((s.test_accuracy - acc).abs() < 1e-12, "{key}: test accuracy {} vs {acc}", s.test_accuracy);
        for (name, sum) in w["tensors"].as_object().unwrap() {
            let got = format!("{:016x}", t.state.tensors[name].checksum());
            assert_eq!(&got, sum.as_str().unwrap(), "{key}: tensor {name}");
        }
    }
}
