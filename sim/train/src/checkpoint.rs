//! Checkpoints of the golden training state, saved and restored bit for bit.
//!
//! A checkpoint is a directory:
//!
//! ```text
//! <dir>/checkpoint.json                manifest (below); renamed into place last
//! <dir>/<tensor name>.step-<N>.npy     one little-endian float32 C-order array per parameter and
//!                                      per optimizer-state tensor, stamped with the step
//!                                      (e.g. fc1.weight.step-000200.npy)
//! ```
//!
//! The manifest holds `format` (= 1), `model`, `step` (steps completed), `optimizer` (the
//! graph's `OptimizerSpec`), `precision` (MXU input format), `batch`, `seed`, the data-order RNG
//! as `batcher` (ChaCha8 seed/stream/word position, the epoch's sample order and cursor), and
//! `tensors`: name, file, shape and an FNV-1a checksum of the raw bits of each tensor, checked
//! on load. `.npy` float32 keeps every bit, so a restored run continues exactly as the
//! uninterrupted one would.

use crate::dataset::BatcherState;
use crate::error::{io_err, Result, TrainError};
use crate::exec::MxuFormat;
use crate::npy;
use crate::state::{ModelState, Tensor32};
use faultline_graph::OptimizerSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Name of the manifest inside a checkpoint directory.
pub const MANIFEST: &str = "checkpoint.json";
/// Version written to and required in `format`.
pub const FORMAT: u32 = 1;

/// Everything needed to continue a run exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Model name.
    pub model: String,
    /// Optimizer and its hyper-parameters.
    pub optimizer: OptimizerSpec,
    /// MXU input format the run uses.
    pub precision: MxuFormat,
    /// Batch size.
    pub batch: usize,
    /// Run seed (data split and initialisation).
    pub seed: u64,
    /// Parameters, optimizer state and step.
    pub state: ModelState,
    /// Data-order RNG and position.
    pub batcher: BatcherState,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    model: String,
    step: u64,
    optimizer: OptimizerSpec,
    precision: MxuFormat,
    batch: usize,
    seed: u64,
    batcher: BatcherState,
    tensors: Vec<TensorEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorEntry {
    name: String,
    file: String,
    shape: Vec<usize>,
    fnv1a: String,
}

/// File name of a tensor at a step: its name with path separators replaced, stamped with the
/// step so that a new checkpoint never overwrites the files of the one it replaces.
fn file_name(name: &str, step: u64) -> String {
    format!("{}.step-{step:06}.npy", name.replace(['/', '\\'], "_"))
}

impl Checkpoint {
    /// Writes the checkpoint into `dir` (created if needed), replacing any checkpoint there.
    ///
    /// Crash-safe: tensors go to files stamped with the step, the manifest is written to a
    /// temporary file and renamed over `checkpoint.json` (the atomic commit), and only then are
    /// files that just the previous manifest referenced removed. At every moment the manifest on
    /// disk describes a complete checkpoint.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let previous: Vec<String> = std::fs::read_to_string(dir.join(MANIFEST))
            .ok()
            .and_then(|t| serde_json::from_str::<Manifest>(&t).ok())
            .map(|m| m.tensors.into_iter().map(|e| e.file).collect())
            .unwrap_or_default();
        let tensors = self.write_tensors(dir)?;
        self.commit_manifest(dir, &tensors)?;
        for f in previous.iter().filter(|f| !tensors.iter().any(|t| &t.file == *f) && !f.contains(['/', '\\'])) {
            let _ = std::fs::remove_file(dir.join(f)); // best effort: a leftover costs only space
        }
        Ok(())
    }

    /// Writes every tensor's `.npy` file (the part of a save that a crash may tear).
    fn write_tensors(&self, dir: &Path) -> Result<Vec<TensorEntry>> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut tensors = Vec::new();
        for (name, t) in &self.state.tensors {
            let file = file_name(name, self.state.step);
            npy::write_f32(&dir.join(&file), &t.shape, &t.data)?;
            tensors.push(TensorEntry {
                name: name.clone(),
                file,
                shape: t.shape.clone(),
                fnv1a: format!("{:016x}", t.checksum()),
            });
        }
        Ok(tensors)
    }

    /// Atomically replaces the manifest with one naming `tensors`.
    fn commit_manifest(&self, dir: &Path, tensors: &[TensorEntry]) -> Result<()> {
        let m = Manifest {
            format: FORMAT,
            model: self.model.clone(),
            step: self.state.step,
            optimizer: self.optimizer,
            precision: self.precision,
            batch: self.batch,
            seed: self.seed,
            batcher: self.batcher.clone(),
            tensors: tensors.to_vec(),
        };
        let path = dir.join(MANIFEST);
        let partial = dir.join(format!("{MANIFEST}.partial"));
        let text = serde_json::to_string_pretty(&m).expect("manifest serialises");
        std::fs::write(&partial, text + "\n").map_err(io_err(&partial))?;
        std::fs::rename(&partial, &path).map_err(io_err(&path))
    }

    /// Reads a checkpoint directory, verifying every tensor's shape and checksum.
    pub fn load(dir: &Path) -> Result<Checkpoint> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
        let bad = |detail: String| TrainError::Checkpoint { file: path.clone(), detail };
        let m: Manifest = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if m.format != FORMAT {
            return Err(bad(format!("format {} is not supported (expected {FORMAT})", m.format)));
        }
        let mut tensors = BTreeMap::new();
        for e in &m.tensors {
            if e.file.contains(['/', '\\']) || e.file.starts_with('.') {
                return Err(bad(format!("tensor file `{}` must be a plain file name", e.file)));
            }
            let a = npy::read_f32_shaped(&dir.join(&e.file), &e.shape)?;
            let t = Tensor32 { shape: a.shape, data: a.data };
            let sum = format!("{:016x}", t.checksum());
            if sum != e.fnv1a {
                return Err(TrainError::Checkpoint {
                    file: dir.join(&e.file),
                    detail: format!("checksum mismatch: manifest says {}, file has {sum}", e.fnv1a),
                });
            }
            tensors.insert(e.name.clone(), t);
        }
        Ok(Checkpoint {
            model: m.model,
            optimizer: m.optimizer,
            precision: m.precision,
            batch: m.batch,
            seed: m.seed,
            state: ModelState { tensors, step: m.step },
            batcher: m.batcher,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::Batcher;

    fn sample() -> Checkpoint {
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "fc1.weight".into(),
            Tensor32 { shape: vec![2, 3], data: vec![1.0, -0.0, f32::MIN_POSITIVE / 8.0, 1e-30, 3.5, -7.25] },
        );
        tensors.insert("fc1.weight.adam_m".into(), Tensor32 { shape: vec![2, 3], data: vec![0.1; 6] });
        let mut b = Batcher::new(10, 4, 3).unwrap();
        b.next_indices();
        Checkpoint {
            model: "m".into(),
            optimizer: OptimizerSpec::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            precision: MxuFormat::Bf16,
            batch: 4,
            seed: 3,
            state: ModelState { tensors, step: 17 },
            batcher: b.state(),
        }
    }

    #[test]
    fn round_trip_is_exact() {
        let dir = tempfile::tempdir().unwrap();
        let c = sample();
        c.save(dir.path()).unwrap();
        let r = Checkpoint::load(dir.path()).unwrap();
        assert_eq!(r, c);
        for (k, t) in &c.state.tensors {
            assert_eq!(r.state.tensors[k].bits(), t.bits());
        }
    }

    #[test]
    fn corruption_is_detected_and_named() {
        let dir = tempfile::tempdir().unwrap();
        sample().save(dir.path()).unwrap();
        let f = dir.path().join("fc1.weight.step-000017.npy");
        npy::write_f32(&f, &[2, 3], &[0.0; 6]).unwrap();
        let e = Checkpoint::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("fc1.weight.step-000017.npy") && e.contains("checksum mismatch"), "{e}");
        npy::write_f32(&f, &[3, 2], &[0.0; 6]).unwrap();
        let e = Checkpoint::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("expected [2, 3], found [3, 2]"), "{e}");
        std::fs::write(dir.path().join(MANIFEST), "{}").unwrap();
        assert!(Checkpoint::load(dir.path()).unwrap_err().to_string().contains("checkpoint.json"));
    }

    #[test]
    fn saving_over_a_checkpoint_is_atomic() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        let mut c = sample();
        c.save(&dir).unwrap();
        let first: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        // A crash while writing the next save's tensors leaves extra files and a torn temporary
        // manifest: the committed manifest still describes a complete checkpoint.
        c.state.step += 1;
        let tensor_files: Vec<String> = c.write_tensors(&dir).unwrap().into_iter().map(|e| e.file).collect();
        std::fs::write(dir.join(format!("{MANIFEST}.partial")), "{ torn").unwrap();
        let mut before = c.clone();
        before.state.step -= 1;
        assert_eq!(Checkpoint::load(&dir).unwrap(), before);
        // A completed save commits the new step and removes files only the old one used.
        c.save(&dir).unwrap();
        assert_eq!(Checkpoint::load(&dir).unwrap(), c);
        for f in &first {
            let f = f.to_str().unwrap();
            if f.ends_with(".npy") {
                assert!(!dir.join(f).exists(), "{f} of the previous checkpoint should be gone");
            }
        }
        assert!(tensor_files.iter().all(|f| dir.join(f).exists()));
    }
}
