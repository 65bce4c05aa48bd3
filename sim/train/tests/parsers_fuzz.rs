//! Fuzz-style property tests of the train crate's file parsers: `.npy` arrays, IDX files and
//! checkpoint manifests, fed mutated valid files and random bytes. Whatever the input: no
//! panic, no unbounded allocation, and either a value or an error that is exactly one line.

use faultline_hw::budget::HostMemory;
use faultline_hw::fuzz::{apply, edit, mutate};
use faultline_train::{data::idx, data::npy, Checkpoint, TrainOptions, Trainer};
use proptest::prelude::*;
use std::path::Path;

fn one_line<T>(r: faultline_train::Result<T>) -> Result<(), TestCaseError> {
    if let Err(e) = r {
        prop_assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
    }
    Ok(())
}

fn valid_npys(dir: &Path) -> Vec<Vec<u8>> {
    let f = dir.join("v.npy");
    npy::write_f32(&f, &[3, 4], &(0..12).map(|i| i as f32 * 0.5).collect::<Vec<_>>()).unwrap();
    let a = std::fs::read(&f).unwrap();
    npy::write_labels(&f, &[0, 3, 1, 2]).unwrap();
    vec![a, std::fs::read(&f).unwrap()]
}

/// A small real checkpoint (2 steps of mlp-digits) to mutate.
fn checkpoint_dir() -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let spec = faultline_graph::ModelSpec::load(root.join("models/mlp-digits.ron")).unwrap();
    let hw = faultline_hw::HwConfig::load(root.join("configs/tpu-8x8.ron")).unwrap();
    let data = faultline_train::data::source::shipped(&spec, 1, &HostMemory::default()).unwrap();
    let mut t = Trainer::new(&spec, &hw, data, TrainOptions { batch: 4, ..Default::default() }).unwrap();
    t.step().unwrap();
    t.step().unwrap();
    let d = tempfile::tempdir().unwrap();
    t.checkpoint().save(d.path()).unwrap();
    d
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn npy_files_never_panic(which in 0usize..2, edits in prop::collection::vec(edit(), 1..4),
                             random in prop::collection::vec(any::<u8>(), 0..120), use_random in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let bytes = if use_random { random } else { mutate(&valid_npys(dir.path())[which], &edits) };
        let f = dir.path().join("x.npy");
        std::fs::write(&f, &bytes).unwrap();
        let mem = HostMemory::new(1 << 20, "--max-memory");
        one_line(npy::read_f32(&f))?;
        one_line(npy::read_f32_shaped(&f, &[3, 4]))?;
        one_line(npy::read_inputs(&f, &mem))?;
        one_line(npy::read_labels(&f))?;
    }

    #[test]
    fn idx_files_never_panic(edits in prop::collection::vec(edit(), 1..4), images in any::<bool>()) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
        let name = if images { "digits-images-idx3-ubyte" } else { "digits-labels-idx1-ubyte" };
        let bytes = mutate(&std::fs::read(root.join(name)).unwrap(), &edits);
        one_line(idx::parse_idx(&bytes, Path::new(name)))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn checkpoint_manifests_never_panic(edits in prop::collection::vec(edit(), 1..4),
                                        random in prop::collection::vec(any::<u8>(), 0..400),
                                        use_random in any::<bool>()) {
        thread_local!(static CK: tempfile::TempDir = checkpoint_dir());
        if use_random {
            // Random bytes as the manifest file, read as `--resume` reads it (not UTF-8 included),
            // beside no tensor files: nothing loads.
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("checkpoint.json"), &random).unwrap();
            let e = Checkpoint::load(dir.path()).map(|_| ()).unwrap_err();
            prop_assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
            let e = Checkpoint::load_newest(dir.path(), |_, _| ()).map(|_| ()).unwrap_err();
            prop_assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
            return Ok(());
        }
        CK.with(|d| -> Result<(), TestCaseError> {
            let text = std::fs::read_to_string(d.path().join("checkpoint.json")).unwrap();
            let mutated = apply(&text, &edits);
            match Checkpoint::from_manifest(&mutated, d.path()) {
                // What passes every check has the saved state: tensors are checksummed, and
                // their files are named by the step.
                Ok(c) => prop_assert_eq!(c.state, Checkpoint::from_manifest(&text, d.path()).unwrap().state),
                Err(e) => prop_assert!(!e.to_string().contains('\n'), "multi-line error: {e}"),
            }
            Ok(())
        })?;
    }
}
