//! The data a run trains on, and the readers and writers of its files.
//!
//! * [`dataset`]: in-memory labelled datasets, seeded train/test splits and minibatch order.
//! * [`digits`], [`mnist`], [`text`], [`synth`]: the shipped datasets (the embedded 8x8 digits,
//!   5,000 MNIST digits and six Shakespeare tragedies with their byte-level tokenizer;
//!   generated spirals, blobs and token sequences), deterministic.
//! * [`idx`], [`npy`]: MNIST IDX files and `.npy` arrays (datasets, and weights for
//!   initialisation and checkpoints), with errors that name the file.
//! * [`source`]: which data a run uses: a shipped dataset that fits the model, or a directory
//!   of `.npy` or IDX files.

pub mod dataset;
pub mod digits;
pub mod idx;
pub mod mnist;
pub mod npy;
pub mod source;
pub mod synth;
pub mod text;
