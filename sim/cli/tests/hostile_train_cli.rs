//! Hostile input to `faultline train` never panics, aborts or trains silently on something
//! wrong: each case is one line on stderr, exit status 2. Children run with a 2 GiB address
//! space, so a guard that allocates before it checks fails here instead of passing slowly.

mod common;
use common::faultline_limited;
use faultline_train::data::{idx, npy};
use std::path::Path;

/// Children run with a 2 GiB address space.
const LIMIT: u64 = 2 << 30;

fn refused(args: &[&str], want: &str) {
    let out = faultline_limited(args, LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(err.starts_with("error: ") && err.contains(want), "{args:?}: expected `{want}` in {err}");
}

fn train<'a>(model: &'a str, config: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["train", "--model", model, "--config", config, "--steps", "3"];
    v.extend_from_slice(extra);
    v
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const MLP: &str = "models/mlp-digits.ron";
const CNN: &str = "models/cnn-small.ron";
const HW: &str = "configs/tpu-32x32.ron";

#[test]
fn nonfinite_data_and_weights_are_refused_unless_allowed() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let mut x = vec![0.5f32; 40 * 64];
    x[3 * 64 + 17] = f32::NAN;
    npy::write_f32(&data.join("x.npy"), &[40, 64], &x).unwrap();
    npy::write_labels(&data.join("y.npy"), &(0..40).map(|i| i % 10).collect::<Vec<_>>()).unwrap();
    refused(&train(MLP, HW, &["--data", s(&data)]), "x.npy: value at index [3, 17] is NaN");
    let out = faultline_limited(&train(MLP, HW, &["--data", s(&data), "--allow-nonfinite", "--batch", "8"]), LIMIT);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let w = d.path().join("w");
    std::fs::create_dir(&w).unwrap();
    let mut fc1 = vec![0.1f32; 64 * 64];
    fc1[64 * 2 + 5] = f32::INFINITY;
    npy::write_f32(&w.join("fc1.weight.npy"), &[64, 64], &fc1).unwrap();
    npy::write_f32(&w.join("fc1.bias.npy"), &[64], &[0.0; 64]).unwrap();
    npy::write_f32(&w.join("fc2.weight.npy"), &[64, 10], &[0.1; 640]).unwrap();
    npy::write_f32(&w.join("fc2.bias.npy"), &[10], &[0.0; 10]).unwrap();
    refused(&train(MLP, HW, &["--init-weights", s(&w)]), "fc1.weight.npy: value at index [2, 5] is inf");
}

#[test]
fn data_whose_layout_does_not_fit_the_model_is_refused() {
    let d = tempfile::tempdir().unwrap();
    // 4x16 images have 64 pixels, as cnn-small's 8x8x1 input, but are not 8x8 images.
    std::fs::write(d.path().join("train-images-idx3-ubyte"), idx::encode_idx(&[30, 4, 16], &[7; 30 * 64])).unwrap();
    std::fs::write(d.path().join("train-labels-idx1-ubyte"), idx::encode_idx(&[30], &[1; 30])).unwrap();
    refused(&train(CNN, HW, &["--data", s(d.path())]), "expected samples of shape [8, 8, 1]");
    // A header that claims far more data than the file has.
    // A file cut short: its header claims more data than it holds.
    let x = d.path().join("x.npy");
    npy::write_f32(&x, &[9, 64], &[0.0; 9 * 64]).unwrap();
    let len = std::fs::metadata(&x).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&x).unwrap().set_len(len - 100).unwrap();
    npy::write_labels(&d.path().join("y.npy"), &[0; 9]).unwrap();
    refused(&train(MLP, HW, &["--data", s(d.path())]), "more data than the file");
    // A header length of almost 4 GiB in a 20-byte file: refused before it is allocated.
    std::fs::write(&x, b"\x93NUMPY\x02\x00\xf0\xff\xff\xff{'descr'").unwrap();
    refused(&train(MLP, HW, &["--data", s(d.path())]), "header declares 4294967280 header bytes, more than");
}

#[test]
fn wrong_machines_sizes_and_files_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let int8 = d.path().join("int8.ron");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/tpu-8x8.ron")).unwrap();
    std::fs::write(&int8, text.replace("input_format: Bf16", "input_format: Int8").replace("Fp32", "Int32")).unwrap();
    refused(&train(MLP, s(&int8), &[]), "training needs floating-point MXU inputs");
    let big = d.path().join("big.ron");
    std::fs::write(
        &big,
        r#"(name: "big", input: [100000, 100000], outputs: 10, loss: SoftmaxCrossEntropy,
            layers: [(name: "fc", op: Dense(units: 10))])"#,
    )
    .unwrap();
    refused(&train(s(&big), HW, &[]), "at most 268435456 elements");
    let conv = d.path().join("conv.ron");
    std::fs::write(
        &conv,
        r#"(name: "conv", input: [4000, 4000, 3], outputs: 10, loss: SoftmaxCrossEntropy,
            layers: [(name: "c", op: Conv2d(filters: 64, kernel: 3)), (name: "f", op: Flatten), (name: "d", op: Dense(units: 10))])"#,
    )
    .unwrap();
    refused(&train(s(&conv), HW, &[]), "at most 268435456 elements");
    let wide = d.path().join("wide.ron");
    std::fs::write(
        &wide,
        r#"(name: "wide", input: [16000], outputs: 10, loss: SoftmaxCrossEntropy,
            layers: [(name: "fc", op: Dense(units: 16000)), (name: "out", op: Dense(units: 10))])"#,
    )
    .unwrap();
    refused(&train(s(&wide), HW, &[]), "of host memory, more than the limit of 4.0 GiB");
    refused(&train(MLP, HW, &["--max-memory", "64K"]), "more than the limit of 64.0 KiB (raise it with --max-memory)");
    refused(&train("/dev/zero", HW, &[]), "/dev/zero: cannot read model: a character device, not a regular file");
    refused(&["train", "--model", MLP, "--config", HW, "--steps", "18446744073709551615"], "is not in 1..=16777216");
    refused(&train(MLP, HW, &["--batch", "18446744073709551615"]), "--batch");
    refused(&train(MLP, HW, &["--batch", "0"]), "--batch");
    refused(&train(MLP, HW, &["--batch", "5000"]), "batch size 5000 must be between 1 and the");
    refused(&train(MLP, HW, &["--lr", "nan"]), "--lr NaN: the learning rate must be a positive number");
}

#[test]
fn hand_edited_checkpoints_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let ck = d.path().join("ck");
    let out = faultline_limited(&train(MLP, HW, &["--save-checkpoint", s(&ck)]), LIMIT);
    assert!(out.status.success());
    let manifest = ck.join("checkpoint.json");
    let good = std::fs::read_to_string(&manifest).unwrap();
    let resume = ["train", "--model", MLP, "--config", HW, "--steps", "6", "--resume", s(&ck)];
    for (from, to, want) in [
        ("\"step\": 3", "\"step\": 18446744073709551615", "past the largest supported step"),
        ("\"step\": 3", "\"step\": 0", "a step-0 checkpoint names it"),
        ("\"seed\": 1", "\"seed\": 2", "not that of seed 2"),
        ("\"format\": 2", "\"format\": 1", "format 1 is not supported"),
    ] {
        assert!(good.contains(from), "{from} not in the manifest");
        std::fs::write(&manifest, good.replacen(from, to, 1)).unwrap();
        refused(&resume, want);
    }
    let v: serde_json::Value = serde_json::from_str(&good).unwrap();
    let pos = v["batcher"]["word_pos"].as_str().unwrap().to_string();
    std::fs::write(&manifest, good.replacen(&pos, "340282366920938463463374607431768211455", 1)).unwrap();
    refused(&resume, "batcher state is not that of seed 1");
}
