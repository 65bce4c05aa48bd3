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
//! The manifest holds `format` (= 2), `step` (steps completed), the [`RunIdentity`] (model
//! name and digest, hardware config name and digest, optimizer, MXU precision, batch, seed,
//! evaluation interval, and the data: where it came from, its sizes and a digest of every
//! value), the data-order RNG as `batcher` (ChaCha8 seed/stream/word position, the epoch's
//! sample order and cursor), and `tensors`: name, file, shape and an FNV-1a checksum of the raw
//! bits of each tensor. `.npy` float32 keeps every bit, so a restored run continues exactly as
//! the uninterrupted one would.
//!
//! Loading trusts nothing in the manifest: the step is bounded by [`MAX_STEPS`], every tensor
//! appears once under the file name its step implies, each file's shape and checksum must
//! match, and the batcher state must be the one its seed reaches after `step` batches.

use crate::data::dataset::{Batcher, BatcherState};
use crate::data::npy;
use crate::error::{io_err, Result, TrainError};
use crate::exec::MxuFormat;
use crate::state::{ModelState, Tensor32};
use crate::trainer::MAX_STEPS;
use faultline_graph::OptimizerSpec;
use faultline_hw::files::{read_text_capped, TEXT_FILE_LIMIT};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Name of the manifest inside a checkpoint directory.
pub const MANIFEST: &str = "checkpoint.json";
/// Version written to and required in `format`.
pub const FORMAT: u32 = 2;

/// Where a run's data came from and a digest of every value in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataIdentity {
    /// The `--data` directory as given, or `None` for the shipped dataset that fits the model.
    pub dir: Option<PathBuf>,
    /// Dataset name (e.g. `digits8x8`, `mnist`).
    pub name: String,
    /// Training samples.
    pub train_samples: usize,
    /// Held-out samples.
    pub test_samples: usize,
    /// FNV-1a over both splits' sample shape, input bits and labels (hex).
    pub digest: String,
}

/// Everything that defines a training run, apart from its state: a resumed run must have the
/// same identity as the run that wrote the checkpoint (the execution mode may differ: it never
/// changes a bit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunIdentity {
    /// Model name.
    pub model: String,
    /// FNV-1a of the model definition (hex), so an edited model file with the same name is caught.
    pub model_digest: String,
    /// Hardware config name.
    pub hw: String,
    /// FNV-1a of the hardware config as executed (hex): array shape, lanes and memories decide
    /// accumulation order, hence the bits.
    pub hw_digest: String,
    /// Optimizer and its hyper-parameters.
    pub optimizer: OptimizerSpec,
    /// MXU input format.
    pub precision: MxuFormat,
    /// Batch size.
    pub batch: usize,
    /// Run seed (data split, initialisation, batch order).
    pub seed: u64,
    /// Test-accuracy interval (it decides which trace records carry `test_accuracy`).
    pub eval_every: u64,
    /// The data.
    pub data: DataIdentity,
}

/// Everything needed to continue a run exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// What run this is a state of.
    pub run: RunIdentity,
    /// Parameters, optimizer state and step.
    pub state: ModelState,
    /// Data-order RNG and position.
    pub batcher: BatcherState,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    step: u64,
    run: RunIdentity,
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
        let previous: Vec<String> = read_text_capped(&dir.join(MANIFEST), TEXT_FILE_LIMIT)
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
            step: self.state.step,
            run: self.run.clone(),
            batcher: self.batcher.clone(),
            tensors: tensors.to_vec(),
        };
        let path = dir.join(MANIFEST);
        let partial = dir.join(format!("{MANIFEST}.partial"));
        let text = serde_json::to_string_pretty(&m).expect("manifest serialises");
        std::fs::write(&partial, text + "\n").map_err(io_err(&partial))?;
        std::fs::rename(&partial, &path).map_err(io_err(&path))
    }

    /// Reads a checkpoint directory, verifying the manifest (see the module docs) and every
    /// tensor's shape and checksum.
    pub fn load(dir: &Path) -> Result<Checkpoint> {
        let path = dir.join(MANIFEST);
        if !path.is_file() && dir.is_dir() {
            return Err(TrainError::Checkpoint {
                file: path,
                detail: "missing: this checkpoint is incomplete (a save was interrupted before its manifest was \
                         committed) or the directory is not a checkpoint; resume from an earlier step-* \
                         checkpoint, or pass their parent directory to --resume to pick the newest complete one"
                    .into(),
            });
        }
        let text = read_text_capped(&path, TEXT_FILE_LIMIT).map_err(io_err(&path))?;
        Self::from_manifest(&text, dir)
    }

    /// Parses and checks manifest text; tensor files are read from `dir`.
    pub fn from_manifest(text: &str, dir: &Path) -> Result<Checkpoint> {
        let path = dir.join(MANIFEST);
        let bad = |detail: String| TrainError::Checkpoint { file: path.clone(), detail };
        // The format is checked first so an old checkpoint gets a clear message, not a list of
        // missing fields.
        #[derive(Deserialize)]
        struct Version {
            format: u32,
        }
        let v: Version = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if v.format != FORMAT {
            return Err(bad(format!(
                "format {} is not supported (expected {FORMAT}; format 1 checkpoints lack the run identity needed \
                 to verify a resume)",
                v.format
            )));
        }
        let m: Manifest = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if m.step > MAX_STEPS {
            return Err(bad(format!("step {} is past the largest supported step {MAX_STEPS}", m.step)));
        }
        let mut names = std::collections::BTreeSet::new();
        for e in &m.tensors {
            let want = file_name(&e.name, m.step);
            if e.file != want {
                return Err(bad(format!(
                    "tensor `{}` is in file `{}`, but a step-{} checkpoint names it `{want}`",
                    e.name, e.file, m.step
                )));
            }
            if !names.insert(&e.name) {
                return Err(bad(format!("tensor `{}` is listed twice", e.name)));
            }
        }
        let batcher = Batcher::from_state_at(&m.batcher, m.run.seed, m.step).map_err(bad)?;
        if batcher.batch() != m.run.batch {
            return Err(bad(format!("batcher batch {} differs from the run's batch {}", batcher.batch(), m.run.batch)));
        }
        if m.batcher.perm.len() != m.run.data.train_samples {
            return Err(bad(format!(
                "batcher orders {} samples, the run's data has {} training samples",
                m.batcher.perm.len(),
                m.run.data.train_samples
            )));
        }
        let mut tensors = BTreeMap::new();
        for e in &m.tensors {
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
        Ok(Checkpoint { run: m.run, state: ModelState { tensors, step: m.step }, batcher: m.batcher })
    }

    /// The checkpoint in `dir`, or, if `dir` holds no manifest but `step-N` checkpoints (what
    /// `--checkpoint-every` writes), the newest of those that loads completely; incomplete or
    /// damaged ones are skipped and reported through `skipped`. The final checkpoint in `dir`
    /// itself, if there is one, wins when it is at least as new.
    pub fn load_newest(dir: &Path, mut skipped: impl FnMut(&Path, &TrainError)) -> Result<Checkpoint> {
        let mut steps: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("step-").and_then(|n| n.parse::<u64>().ok()).map(|n| (n, e.path()))
            })
            .collect();
        if steps.is_empty() {
            return Checkpoint::load(dir);
        }
        // The newest step checkpoint that loads, then the final one (`dir` itself) if newer.
        steps.sort_by_key(|s| std::cmp::Reverse(s.0));
        let count = steps.len();
        let mut best = None;
        for (_, p) in steps {
            match Checkpoint::load(&p) {
                Ok(c) => {
                    best = Some(c);
                    break;
                }
                Err(e) => skipped(&p, &e),
            }
        }
        if dir.join(MANIFEST).is_file() {
            match Checkpoint::load(dir) {
                Ok(c) if best.as_ref().is_none_or(|b: &Checkpoint| c.state.step >= b.state.step) => best = Some(c),
                Ok(_) => {}
                Err(e) => skipped(dir, &e),
            }
        }
        best.ok_or_else(|| TrainError::Checkpoint {
            file: dir.to_path_buf(),
            detail: format!("none of the {count} step checkpoints in this directory is complete"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::dataset::Batcher;

    /// Moves a checkpoint to another step, keeping its batcher consistent with the step.
    fn at_step(c: &mut Checkpoint, step: u64) {
        let mut b = Batcher::new(10, 4, 3).unwrap();
        b.advance(step);
        c.batcher = b.state();
        c.state.step = step;
    }

    fn sample() -> Checkpoint {
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "fc1.weight".into(),
            Tensor32 { shape: vec![2, 3], data: vec![1.0, -0.0, f32::MIN_POSITIVE / 8.0, 1e-30, 3.5, -7.25] },
        );
        tensors.insert("fc1.weight.adam_m".into(), Tensor32 { shape: vec![2, 3], data: vec![0.1; 6] });
        let mut b = Batcher::new(10, 4, 3).unwrap();
        b.next_indices();
        b.advance(16);
        Checkpoint {
            run: RunIdentity {
                model: "m".into(),
                model_digest: "00".into(),
                hw: "h".into(),
                hw_digest: "01".into(),
                optimizer: OptimizerSpec::adam(1e-3),
                precision: MxuFormat::Bf16,
                batch: 4,
                seed: 3,
                eval_every: 10,
                data: DataIdentity {
                    dir: None,
                    name: "d".into(),
                    train_samples: 10,
                    test_samples: 2,
                    digest: "02".into(),
                },
            },
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
        at_step(&mut c, 18);
        let tensor_files: Vec<String> = c.write_tensors(&dir).unwrap().into_iter().map(|e| e.file).collect();
        std::fs::write(dir.join(format!("{MANIFEST}.partial")), "{ torn").unwrap();
        let mut before = c.clone();
        at_step(&mut before, 17);
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

    fn edit(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(MANIFEST)).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(dir.join(MANIFEST), v.to_string()).unwrap();
        Checkpoint::load(dir).unwrap_err().to_string()
    }

    #[test]
    fn hand_edited_manifests_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let fresh = || {
            sample().save(d).unwrap();
        };
        fresh();
        let e = edit(d, |v| v["step"] = serde_json::json!(u64::MAX));
        assert!(e.contains("past the largest supported step"), "{e}");
        fresh();
        let e = edit(d, |v| v["step"] = serde_json::json!(16));
        assert!(e.contains("a step-16 checkpoint names it"), "{e}");
        fresh();
        let e = edit(d, |v| v["batcher"]["word_pos"] = serde_json::json!("340282366920938463463374607431768211455"));
        assert!(e.contains("batcher state is not that of seed 3"), "{e}");
        fresh();
        let e = edit(d, |v| v["run"]["seed"] = serde_json::json!(4));
        assert!(e.contains("not that of seed 4"), "{e}");
        fresh();
        let e = edit(d, |v| {
            let t = v["tensors"][0].clone();
            v["tensors"].as_array_mut().unwrap().push(t);
        });
        assert!(e.contains("listed twice"), "{e}");
        fresh();
        let e = edit(d, |v| v["format"] = serde_json::json!(1));
        assert!(e.contains("format 1 is not supported"), "{e}");
        fresh();
        let e = edit(d, |v| v["run"]["data"]["train_samples"] = serde_json::json!(11));
        assert!(e.contains("11 training samples"), "{e}");
    }

    #[test]
    fn torn_checkpoints_are_refused_with_a_hint_and_skipped_when_picking_the_newest() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let mut c = sample();
        c.save(&r.join("step-000017")).unwrap();
        // A save of step 18 torn before its manifest was committed.
        at_step(&mut c, 18);
        c.write_tensors(&r.join("step-000018")).unwrap();
        let e = Checkpoint::load(&r.join("step-000018")).unwrap_err().to_string();
        assert!(e.contains("incomplete") && e.contains("--resume"), "{e}");
        let mut skipped = vec![];
        let got = Checkpoint::load_newest(r, |p, _| skipped.push(p.to_path_buf())).unwrap();
        assert_eq!(got.state.step, 17);
        assert_eq!(skipped, vec![r.join("step-000018")]);
        // A completed newer one wins.
        c.save(&r.join("step-000018")).unwrap();
        assert_eq!(Checkpoint::load_newest(r, |_, _| {}).unwrap().state.step, 18);
        let empty = tempfile::tempdir().unwrap();
        assert!(Checkpoint::load_newest(empty.path(), |_, _| {}).unwrap_err().to_string().contains("incomplete"));
    }
}
