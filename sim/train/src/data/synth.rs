//! Generated toy datasets: 2-D spirals and blobs, and a token-sequence task for transformers.

use super::dataset::Dataset;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::f32::consts::PI;

/// `classes` interleaved spiral arms in 2-D, `n_per_class` points each, with angular noise.
pub fn spirals(n_per_class: usize, classes: usize, noise: f32, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut x = Vec::new();
    let mut y = Vec::new();
    for c in 0..classes {
        for i in 0..n_per_class {
            let r = i as f32 / n_per_class.max(1) as f32;
            let t = c as f32 * 2.0 * PI / classes as f32 + 4.0 * r + noise * rng.gen_range(-1.0f32..1.0);
            x.extend_from_slice(&[r * t.sin(), r * t.cos()]);
            y.push(c as u32);
        }
    }
    Dataset::new("spirals", vec![2], x, y, classes.max(1)).expect("generator output is consistent")
}

/// `classes` Gaussian-ish blobs in `dim` dimensions around random centres in [-3, 3]^dim.
pub fn blobs(n: usize, classes: usize, dim: usize, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let centres: Vec<f32> = (0..classes * dim).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
    let mut x = Vec::with_capacity(n * dim);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let c = i % classes;
        for d in 0..dim {
            // Sum of three uniforms: bell-shaped, bounded, and platform-independent.
            let g: f32 = (0..3).map(|_| rng.gen_range(-1.0f32..1.0)).sum::<f32>() * 0.5;
            x.push(centres[c * dim + d] + g);
        }
        y.push(c as u32);
    }
    Dataset::new("blobs", vec![dim], x, y, classes.max(1)).expect("generator output is consistent")
}

/// "Majority token": sequences of `seq_len` token ids from `0..vocab` (stored as f32); tokens
/// `0..classes` are class tokens, the rest distractors. One class token occurs strictly more
/// often than every other class token, and the label is that token. Solving it needs
/// information from every position, which is what attention or pooling provides.
pub fn majority_tokens(n: usize, vocab: usize, classes: usize, seq_len: usize, seed: u64) -> Dataset {
    assert!(
        classes >= 2 && classes <= vocab && seq_len >= 3,
        "majority_tokens needs 2 <= classes <= vocab and seq_len >= 3"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut x = Vec::with_capacity(n * seq_len);
    let mut y = Vec::with_capacity(n);
    let mut seq = vec![0usize; seq_len];
    for i in 0..n {
        let winner = i % classes;
        loop {
            // Bias toward the winner, then redraw until it is the strict majority.
            for t in seq.iter_mut() {
                *t = if rng.gen_bool(0.3) { winner } else { rng.gen_range(0..vocab) };
            }
            let mut count = vec![0usize; vocab];
            seq.iter().for_each(|&t| count[t] += 1);
            if (0..classes).all(|v| v == winner || count[v] < count[winner]) {
                break;
            }
        }
        x.extend(seq.iter().map(|&t| t as f32));
        y.push(winner as u32);
    }
    Dataset::new("majority-tokens", vec![seq_len], x, y, classes).expect("generator output is consistent")
}

/// Token-id samples `[T]` as one-hot rows `[T, vocab]` (ids outside `0..vocab` give zero rows).
pub fn one_hot_tokens(d: &Dataset, vocab: usize) -> Dataset {
    let mut x = Vec::with_capacity(d.x.len() * vocab);
    for &t in &d.x {
        x.extend((0..vocab).map(|v| if t == v as f32 { 1.0 } else { 0.0 }));
    }
    let mut shape = d.sample_shape.clone();
    shape.push(vocab);
    Dataset {
        name: d.name.clone(),
        sample_shape: shape,
        x,
        y: d.y.clone(),
        num_classes: d.num_classes,
        label_len: d.label_len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_labels_and_determinism() {
        let s = spirals(20, 3, 0.2, 1);
        assert_eq!((s.len(), s.sample_shape.clone(), s.num_classes), (60, vec![2], 3));
        assert_eq!(s, spirals(20, 3, 0.2, 1));
        let b = blobs(30, 3, 4, 2);
        assert_eq!((b.len(), b.sample_len()), (30, 4));
        let m = majority_tokens(50, 8, 4, 8, 3);
        assert_eq!(m, majority_tokens(50, 8, 4, 8, 3));
        for i in 0..m.len() {
            let seq = &m.x[i * 8..(i + 1) * 8];
            let mut count = [0; 8];
            seq.iter().for_each(|&t| count[t as usize] += 1);
            let w = m.y[i] as usize;
            assert!(w < 4 && (0..4).all(|v| v == w || count[v] < count[w]), "{seq:?} label {w}");
        }
        let oh = one_hot_tokens(&m, 8);
        assert_eq!(oh.sample_shape, [8, 8]);
        assert_eq!(oh.x[..8].iter().sum::<f32>(), 1.0);
        assert_eq!(oh.x[m.x[0] as usize], 1.0);
    }
}
