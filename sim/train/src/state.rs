//! The trainable state of a model: parameters and optimizer state as fp32 tensors, by name,
//! and how it is initialised (from a seed or from a directory of `.npy` files).

use crate::data::npy;
use crate::error::{shape_str, Result, TrainError};
use faultline_graph::TrainGraph;
use std::collections::BTreeMap;
use std::path::Path;

/// Adds a hint to a shape error when the file holds the transpose of a 2-D parameter, the
/// usual mistake with PyTorch `nn.Linear` weights (stored `[out, in]`; the model wants `[in, out]`).
fn transposed_hint(e: TrainError, want: &[usize]) -> TrainError {
    match e {
        TrainError::Shape { file, expected, found }
            if want.len() == 2 && found == shape_str(&[want[1], want[0]]) && want[0] != want[1] =>
        {
            TrainError::Shape {
                file,
                expected,
                found: format!("{found} (the transpose: save PyTorch Linear weights as `weight.T`)"),
            }
        }
        e => e,
    }
}

/// A dense row-major fp32 tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor32 {
    /// Shape.
    pub shape: Vec<usize>,
    /// Values.
    pub data: Vec<f32>,
}

impl Tensor32 {
    /// Zeros of a shape.
    pub fn zeros(shape: &[usize]) -> Tensor32 {
        Tensor32 { shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
    }

    /// Checksum of the shape and raw bits ([`faultline_hw::matrix::bits_checksum`]).
    pub fn checksum(&self) -> u64 {
        faultline_hw::matrix::bits_checksum(&self.shape, self.data.iter().map(|v| v.to_bits()))
    }

    /// Raw bits of the values (for bit-exact comparisons).
    pub fn bits(&self) -> Vec<u32> {
        self.data.iter().map(|v| v.to_bits()).collect()
    }
}

/// Parameters and optimizer state by name, plus the number of steps taken.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelState {
    /// Every parameter and optimizer-state tensor of the graph, by node name.
    pub tensors: BTreeMap<String, Tensor32>,
    /// Training steps completed (the next step is `step + 1`).
    pub step: u64,
}

impl ModelState {
    /// Parameters from the graph's seeded initialisers (rounded to fp32), zero optimizer state.
    pub fn from_seed(tg: &TrainGraph, seed: u64) -> ModelState {
        let tensors = tg
            .initial_state(seed)
            .into_iter()
            .map(|(k, t)| (k, Tensor32 { shape: t.shape, data: t.data.iter().map(|&v| v as f32).collect() }))
            .collect();
        ModelState { tensors, step: 0 }
    }

    /// Parameters from `dir/<param name>.npy` (float32 or float64, exactly the parameter's
    /// shape, C order, finite unless `allow_nonfinite`), optimizer state and running statistics at
    /// their initial values. Errors name the
    /// file and expected vs found.
    pub fn from_npy_dir(tg: &TrainGraph, dir: &Path, allow_nonfinite: bool) -> Result<ModelState> {
        if !dir.is_dir() {
            return Err(TrainError::Config(format!("{}: initial-weights directory does not exist", dir.display())));
        }
        let mut tensors = BTreeMap::new();
        for p in tg.params() {
            let file = dir.join(format!("{}.npy", p.name));
            if !file.is_file() {
                return Err(TrainError::MissingParam { file, param: p.name.clone(), shape: shape_str(&p.shape) });
            }
            let a = npy::read_f32_shaped(&file, &p.shape).map_err(|e| transposed_hint(e, &p.shape))?;
            npy::check_finite(&file, &a.shape, &a.data, allow_nonfinite)?;
            tensors.insert(p.name.clone(), Tensor32 { shape: a.shape, data: a.data });
        }
        for s in &tg.opt_state {
            let mut t = Tensor32::zeros(&s.shape);
            if s.init == faultline_graph::Init::Ones {
                t.data.fill(1.0);
            }
            tensors.insert(s.name.clone(), t);
        }
        Ok(ModelState { tensors, step: 0 })
    }

    /// Checks that the state has exactly the graph's tensors with the graph's shapes.
    pub fn check(&self, tg: &TrainGraph, origin: &Path) -> Result<()> {
        let want: BTreeMap<&str, &[usize]> = tg
            .params()
            .iter()
            .map(|p| (p.name.as_str(), p.shape.as_slice()))
            .chain(tg.opt_state.iter().map(|s| (s.name.as_str(), s.shape.as_slice())))
            .collect();
        for (name, shape) in &want {
            let t = self.tensors.get(*name).ok_or_else(|| TrainError::Checkpoint {
                file: origin.to_path_buf(),
                detail: format!("no tensor `{name}` (the model needs shape {})", shape_str(shape)),
            })?;
            if t.shape != *shape || t.data.len() != shape.iter().product::<usize>() {
                return Err(TrainError::Shape {
                    file: origin.join(format!("{name}.npy")),
                    expected: shape_str(shape),
                    found: shape_str(&t.shape),
                });
            }
        }
        if let Some(extra) = self.tensors.keys().find(|k| !want.contains_key(k.as_str())) {
            return Err(TrainError::Checkpoint {
                file: origin.to_path_buf(),
                detail: format!("tensor `{extra}` is not part of this model/optimizer"),
            });
        }
        Ok(())
    }
}
