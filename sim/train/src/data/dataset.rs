//! In-memory labelled datasets, seeded train/test splits and minibatch order.

use crate::error::{shape_str, Result, TrainError};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// A labelled classification dataset: `len()` samples of `sample_shape` f32 values each.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Short name for messages, e.g. `digits8x8`.
    pub name: String,
    /// Shape of one sample, e.g. `[64]`, `[1, 8, 8]`, or `[8]` (token ids stored as f32).
    pub sample_shape: Vec<usize>,
    /// Samples, row-major, `len() * sample_len()` values.
    pub x: Vec<f32>,
    /// Class labels in `0..num_classes`, `label_len` per sample.
    pub y: Vec<u32>,
    /// Number of classes.
    pub num_classes: usize,
    /// Labels per sample: 1, or one per position of a sequence (a language model's next
    /// tokens).
    pub label_len: usize,
}

impl Dataset {
    /// Builds a dataset, checking that `x` and `y` agree and labels are in range.
    pub fn new(name: &str, sample_shape: Vec<usize>, x: Vec<f32>, y: Vec<u32>, num_classes: usize) -> Result<Dataset> {
        Dataset::sequences(name, sample_shape, x, y, 1, num_classes)
    }

    /// [`Dataset::new`] with `label_len` labels per sample (`y` holds them sample by sample).
    pub fn sequences(
        name: &str,
        sample_shape: Vec<usize>,
        x: Vec<f32>,
        y: Vec<u32>,
        label_len: usize,
        num_classes: usize,
    ) -> Result<Dataset> {
        let per: usize = sample_shape.iter().product();
        if per == 0 {
            return Err(TrainError::Data(format!("{name}: empty sample shape {}", shape_str(&sample_shape))));
        }
        if label_len == 0 || !y.len().is_multiple_of(label_len) {
            return Err(TrainError::Data(format!("{name}: {} labels are not {label_len} per sample", y.len())));
        }
        if x.len() * label_len != per * y.len() {
            return Err(TrainError::Data(format!(
                "{name}: {} labels but {} input values ({} per sample of shape {})",
                y.len() / label_len,
                x.len(),
                per,
                shape_str(&sample_shape)
            )));
        }
        if let Some((i, &l)) = y.iter().enumerate().find(|(_, &l)| l as usize >= num_classes) {
            return Err(TrainError::Data(format!(
                "{name}: label {l} of sample {} is not below the {num_classes} classes",
                i / label_len
            )));
        }
        Ok(Dataset { name: name.into(), sample_shape, x, y, num_classes, label_len })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.y.len() / self.label_len.max(1)
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Values per sample.
    pub fn sample_len(&self) -> usize {
        self.sample_shape.iter().product()
    }

    /// The samples at `idx`, in that order, as a new dataset.
    pub fn subset(&self, idx: &[usize]) -> Dataset {
        let (x, y) = self.gather(idx);
        Dataset {
            name: self.name.clone(),
            sample_shape: self.sample_shape.clone(),
            x,
            y,
            num_classes: self.num_classes,
            label_len: self.label_len,
        }
    }

    /// Inputs and labels of the samples at `idx`, concatenated.
    pub fn gather(&self, idx: &[usize]) -> (Vec<f32>, Vec<u32>) {
        let (per, l) = (self.sample_len(), self.label_len);
        let mut x = Vec::with_capacity(idx.len() * per);
        let mut y = Vec::with_capacity(idx.len() * l);
        for &i in idx {
            x.extend_from_slice(&self.x[i * per..(i + 1) * per]);
            y.extend_from_slice(&self.y[i * l..(i + 1) * l]);
        }
        (x, y)
    }

    /// The same data viewed with another sample shape: the same shape but for trailing 1s
    /// (`[8, 8]` as `[8, 8, 1]`), or a flattening / unflattening of equal size (`[64]` as
    /// `[8, 8, 1]` and back). Anything else (`[4, 16]` as `[8, 8, 1]`) would scramble samples.
    pub fn reshaped(mut self, shape: &[usize]) -> Result<Dataset> {
        let trim = |s: &[usize]| -> Vec<usize> {
            let keep = s.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
            s[..keep].to_vec()
        };
        let flat = shape.len() == 1 || self.sample_shape.len() == 1;
        let same_size = shape.iter().product::<usize>() == self.sample_len();
        if !same_size || !(flat || trim(shape) == trim(&self.sample_shape)) {
            return Err(TrainError::Shape {
                file: format!("<dataset {}>", self.name).into(),
                expected: format!("samples of shape {} (from the model input)", shape_str(shape)),
                found: format!("samples of shape {}", shape_str(&self.sample_shape)),
            });
        }
        self.sample_shape = shape.to_vec();
        Ok(self)
    }

    /// Splits into train and test parts after a seeded shuffle; `test_fraction` in (0, 1).
    pub fn split(&self, test_fraction: f64, seed: u64) -> Split {
        let mut idx: Vec<usize> = (0..self.len()).collect();
        idx.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        let n_test = ((self.len() as f64 * test_fraction).round() as usize).clamp(1.min(self.len()), self.len());
        let (test, train) = idx.split_at(n_test);
        Split { train: self.subset(train), test: self.subset(test) }
    }
}

/// A train part and a held-out test part of one dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// Samples trained on.
    pub train: Dataset,
    /// Held-out samples for evaluation.
    pub test: Dataset,
}

impl Split {
    /// FNV-1a over both parts' sample shapes, input bits and labels: the data's identity.
    pub fn digest(&self) -> u64 {
        let part = |d: &Dataset| {
            let dims: Vec<usize> = std::iter::once(d.len()).chain(d.sample_shape.iter().copied()).collect();
            faultline_hw::matrix::bits_checksum(&dims, d.x.iter().map(|v| v.to_bits()).chain(d.y.iter().copied()))
        };
        faultline_hw::matrix::bits_checksum(
            &[],
            [&self.train, &self.test].into_iter().flat_map(|d| {
                let h = part(d);
                [h as u32, (h >> 32) as u32]
            }),
        )
    }

    /// Views both parts with another sample shape.
    pub fn reshaped(self, shape: &[usize]) -> Result<Split> {
        Ok(Split { train: self.train.reshaped(shape)?, test: self.test.reshaped(shape)? })
    }
}

/// Minibatch order: seeded shuffled epochs of fixed-size batches (the last partial batch of an
/// epoch is dropped so every step has the graph's static batch size).
#[derive(Debug, Clone, PartialEq)]
pub struct Batcher {
    rng: ChaCha8Rng,
    perm: Vec<u32>,
    cursor: usize,
    batch: usize,
    epoch: u64,
}

/// The exact state of a [`Batcher`], for checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatcherState {
    /// ChaCha8 seed, hex.
    pub seed: String,
    /// ChaCha8 stream.
    pub stream: u64,
    /// ChaCha8 word position (decimal; a u128).
    pub word_pos: String,
    /// Current epoch's sample order.
    pub perm: Vec<u32>,
    /// Next position in `perm`.
    pub cursor: usize,
    /// Batch size.
    pub batch: usize,
    /// Epochs started so far.
    pub epoch: u64,
}

impl Batcher {
    /// A batcher over `n` samples; fails if `batch` is 0 or larger than `n`.
    pub fn new(n: usize, batch: usize, seed: u64) -> Result<Batcher> {
        if batch == 0 || batch > n {
            return Err(TrainError::Config(format!(
                "batch size {batch} must be between 1 and the {n} training samples"
            )));
        }
        // A distinct stream keeps batch order independent of the split and init RNGs.
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(2);
        let mut b = Batcher { rng, perm: (0..n as u32).collect(), cursor: 0, batch, epoch: 0 };
        b.reshuffle();
        Ok(b)
    }

    fn reshuffle(&mut self) {
        self.perm.shuffle(&mut self.rng);
        self.cursor = 0;
        self.epoch += 1;
    }

    /// Batch size.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Epochs started so far (1 after construction).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Sample indices of the next batch.
    pub fn next_indices(&mut self) -> Vec<usize> {
        self.advance(1);
        self.perm[self.cursor - self.batch..self.cursor].iter().map(|&i| i as usize).collect()
    }

    /// Moves past `batches` batches as [`Batcher::next_indices`] would, without gathering them
    /// (a whole epoch is skipped with one reshuffle).
    pub fn advance(&mut self, batches: u64) {
        let per_epoch = (self.perm.len() / self.batch) as u64;
        let mut left = batches;
        while left > 0 {
            if self.cursor + self.batch > self.perm.len() {
                self.reshuffle();
            }
            let here = ((self.perm.len() - self.cursor) / self.batch) as u64;
            let take = here.min(left).min(per_epoch);
            self.cursor += take as usize * self.batch;
            left -= take;
        }
    }

    /// Snapshot of the exact state.
    pub fn state(&self) -> BatcherState {
        BatcherState {
            seed: hex(&self.rng.get_seed()),
            stream: self.rng.get_stream(),
            word_pos: self.rng.get_word_pos().to_string(),
            perm: self.perm.clone(),
            cursor: self.cursor,
            batch: self.batch,
            epoch: self.epoch,
        }
    }

    /// Restores a snapshot taken by [`Batcher::state`].
    pub fn from_state(s: &BatcherState) -> std::result::Result<Batcher, String> {
        let seed = unhex(&s.seed).ok_or_else(|| format!("batcher seed `{}` is not 64 hex digits", s.seed))?;
        let word_pos: u128 =
            s.word_pos.parse().map_err(|_| format!("batcher word_pos `{}` is not a number", s.word_pos))?;
        if s.batch == 0 || s.batch > s.perm.len() || s.cursor > s.perm.len() {
            return Err(format!("batcher batch {} / cursor {} do not fit {} samples", s.batch, s.cursor, s.perm.len()));
        }
        let mut seen = vec![false; s.perm.len()];
        for &i in &s.perm {
            match seen.get_mut(i as usize) {
                Some(v) if !*v => *v = true,
                _ => return Err(format!("batcher order is not a permutation of 0..{} (entry {i})", s.perm.len())),
            }
        }
        let mut rng = ChaCha8Rng::from_seed(seed);
        rng.set_stream(s.stream);
        rng.set_word_pos(word_pos);
        Ok(Batcher { rng, perm: s.perm.clone(), cursor: s.cursor, batch: s.batch, epoch: s.epoch })
    }

    /// Restores a snapshot and checks that it is the state a run seeded with `seed` reaches
    /// after `steps` batches over its samples: the state is a pure function of those, so a
    /// hand-edited or mismatched snapshot (RNG position, order, cursor, epoch) is refused.
    pub fn from_state_at(s: &BatcherState, seed: u64, steps: u64) -> std::result::Result<Batcher, String> {
        let b = Batcher::from_state(s)?;
        let mut replay = Batcher::new(s.perm.len(), s.batch, seed).map_err(|e| e.to_string())?;
        replay.advance(steps);
        if replay != b {
            return Err(format!(
                "batcher state is not that of seed {seed} after {steps} batches of {} over {} samples \
                 (epoch {} cursor {} vs {} {}): the manifest was edited or belongs to another run",
                s.batch,
                s.perm.len(),
                s.epoch,
                s.cursor,
                replay.epoch,
                replay.cursor
            ));
        }
        Ok(b)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy(n: usize) -> Dataset {
        Dataset::new("toy", vec![2], (0..2 * n).map(|v| v as f32).collect(), (0..n as u32).map(|i| i % 3).collect(), 3)
            .unwrap()
    }

    #[test]
    fn new_rejects_inconsistent_data() {
        assert!(Dataset::new("a", vec![2], vec![0.0; 5], vec![0, 1], 2).unwrap_err().to_string().contains("2 labels"));
        assert!(Dataset::new("a", vec![1], vec![0.0; 2], vec![0, 2], 2).unwrap_err().to_string().contains("label 2"));
    }

    #[test]
    fn split_is_a_seeded_partition() {
        let d = toy(50);
        let s = d.split(0.2, 7);
        assert_eq!((s.train.len(), s.test.len()), (40, 10));
        let mut firsts: Vec<f32> = s.train.x.iter().chain(&s.test.x).step_by(2).copied().collect();
        firsts.sort_by(f32::total_cmp);
        assert_eq!(firsts, (0..50).map(|i| (2 * i) as f32).collect::<Vec<_>>());
        assert_eq!(d.split(0.2, 7), s);
        assert_ne!(d.split(0.2, 8), s);
    }

    #[test]
    fn batcher_covers_each_epoch_once_and_restores_exactly() {
        let mut b = Batcher::new(10, 3, 1).unwrap();
        let mut seen: Vec<usize> = (0..3).flat_map(|_| b.next_indices()).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 9, "an epoch never repeats a sample");
        let snap = b.state();
        let json = serde_json::to_string(&snap).unwrap();
        let mut r = Batcher::from_state(&serde_json::from_str(&json).unwrap()).unwrap();
        for _ in 0..10 {
            assert_eq!(b.next_indices(), r.next_indices());
        }
        assert_eq!(b, r);
        assert!(Batcher::new(3, 4, 0).is_err());
    }

    #[test]
    fn advance_equals_repeated_batches_and_snapshots_are_checked_against_replay() {
        for (n, batch, steps) in [(10, 3, 0), (10, 3, 7), (10, 10, 5), (37, 4, 100), (5, 2, 3)] {
            let mut a = Batcher::new(n, batch, 9).unwrap();
            let mut b = a.clone();
            for _ in 0..steps {
                a.next_indices();
            }
            b.advance(steps);
            assert_eq!(a, b, "n {n} batch {batch} steps {steps}");
            assert_eq!(Batcher::from_state_at(&a.state(), 9, steps).unwrap(), a);
            let e = Batcher::from_state_at(&a.state(), 9, steps + 1).unwrap_err();
            assert!(e.contains("seed 9"), "{e}");
            assert!(Batcher::from_state_at(&a.state(), 8, steps).is_err());
            let mut s = a.state();
            s.word_pos = (u128::MAX / 2).to_string();
            assert!(Batcher::from_state_at(&s, 9, steps).is_err(), "a huge RNG position is refused");
        }
    }

    #[test]
    fn reshape_checks_size_and_layout() {
        assert!(toy(3).reshaped(&[1, 2]).is_ok());
        let e = toy(3).reshaped(&[3]).unwrap_err().to_string();
        assert!(e.contains("[3]") && e.contains("[2]"), "{e}");
        let img = |shape: Vec<usize>| Dataset::new("img", shape, vec![0.0; 64], vec![0], 1).unwrap();
        assert!(img(vec![8, 8]).reshaped(&[8, 8, 1]).is_ok());
        assert!(img(vec![8, 8]).reshaped(&[64]).is_ok());
        assert!(img(vec![64]).reshaped(&[8, 8, 1]).is_ok());
        assert!(img(vec![8, 8, 1]).reshaped(&[1, 8, 8]).is_err(), "a channel is not a height");
        let e = img(vec![4, 16]).reshaped(&[8, 8, 1]).unwrap_err().to_string();
        assert!(e.contains("[8, 8, 1]") && e.contains("[4, 16]"), "{e}");
    }
}
