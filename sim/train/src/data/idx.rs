//! MNIST IDX files (`train-images-idx3-ubyte` etc.): a big-endian header of magic
//! `0x00 0x00 <type> <ndims>`, `ndims` u32 dimensions, then the data. Only unsigned-byte data
//! (type `0x08`) occurs in MNIST and is supported.

use super::dataset::{Dataset, Split};
use crate::error::{io_err, Result, TrainError};
use faultline_hw::budget::HostMemory;
use faultline_hw::files::read_capped;
use std::path::{Path, PathBuf};

/// A parsed IDX file of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Values, row-major.
    pub data: Vec<u8>,
}

/// Parses IDX bytes; `file` is used in errors.
pub fn parse_idx(bytes: &[u8], file: &Path) -> Result<IdxArray> {
    let bad = |detail: String| TrainError::Idx { file: file.to_path_buf(), detail };
    if bytes.len() < 4 {
        return Err(bad(format!("file is {} bytes, shorter than the 4-byte magic", bytes.len())));
    }
    if bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08 || bytes[3] == 0 {
        return Err(bad(format!(
            "bad magic {:02x} {:02x} {:02x} {:02x}: expected 00 00 08 <ndims> (unsigned-byte data, e.g. 00 00 08 03 for images)",
            bytes[0], bytes[1], bytes[2], bytes[3]
        )));
    }
    let nd = bytes[3] as usize;
    let head = 4 + 4 * nd;
    if bytes.len() < head {
        return Err(bad(format!("header declares {nd} dimensions but the file ends after {} bytes", bytes.len())));
    }
    let dims: Vec<usize> = (0..nd)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize)
        .collect();
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
    if bytes.len() - head != n {
        return Err(bad(format!("dimensions {dims:?} need {n} data bytes, found {}", bytes.len() - head)));
    }
    Ok(IdxArray { dims, data: bytes[head..].to_vec() })
}

/// Reads and parses an IDX file; the file, and its data as f32 (4 bytes a value), must fit `mem`.
pub fn read_idx(path: &Path, mem: &HostMemory) -> Result<IdxArray> {
    let bytes = read_capped(path, mem.limit / 4).map_err(io_err(path))?;
    parse_idx(&bytes, path)
}

/// Serialises unsigned-byte data as IDX (for tests and exporting).
pub fn encode_idx(dims: &[usize], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for &d in dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

/// Finds an MNIST file by its two usual spellings (`train-images-idx3-ubyte`, `train-images.idx3-ubyte`).
pub fn find_mnist_file(dir: &Path, stem: &str, kind: &str) -> Option<PathBuf> {
    [format!("{stem}-{kind}"), format!("{stem}.{kind}")].into_iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

fn load_pair(images: &Path, labels: &Path, mem: &HostMemory) -> Result<Dataset> {
    let im = read_idx(images, mem)?;
    let lb = read_idx(labels, mem)?;
    if im.dims.len() < 2 {
        return Err(TrainError::Idx {
            file: images.into(),
            detail: format!("expected images of shape [N, rows, cols], found {:?}", im.dims),
        });
    }
    if lb.dims.len() != 1 || lb.dims[0] != im.dims[0] {
        return Err(TrainError::Idx {
            file: labels.into(),
            detail: format!("expected labels of shape [{}] to match the images, found {:?}", im.dims[0], lb.dims),
        });
    }
    let classes = lb.data.iter().copied().max().map_or(1, |m| m as usize + 1).max(10);
    let x = im.data.iter().map(|&b| b as f32 / 255.0).collect();
    Dataset::new("mnist", im.dims[1..].to_vec(), x, lb.data.iter().map(|&l| l as u32).collect(), classes)
}

/// Loads MNIST from `dir`: the `train-*` pair for training and the `t10k-*` pair as the test
/// split (if absent, `None` is returned for the test part). Pixels are scaled to [0, 1].
pub fn load_mnist(dir: &Path, mem: &HostMemory) -> Result<Option<(Dataset, Option<Dataset>)>> {
    let (Some(ti), Some(tl)) =
        (find_mnist_file(dir, "train-images", "idx3-ubyte"), find_mnist_file(dir, "train-labels", "idx1-ubyte"))
    else {
        return Ok(None);
    };
    let train = load_pair(&ti, &tl, mem)?;
    let test =
        match (find_mnist_file(dir, "t10k-images", "idx3-ubyte"), find_mnist_file(dir, "t10k-labels", "idx1-ubyte")) {
            (Some(i), Some(l)) => Some(load_pair(&i, &l, mem)?),
            _ => None,
        };
    Ok(Some((train, test)))
}

/// Convenience: MNIST as a [`Split`] (held-out `t10k` files, or a seeded 1/6 split of `train`).
pub fn mnist_split(dir: &Path, seed: u64, mem: &HostMemory) -> Result<Option<Split>> {
    Ok(load_mnist(dir, mem)?.map(|(train, test)| match test {
        Some(test) => Split { train, test },
        None => train.split(1.0 / 6.0, seed),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_mnist_dir() {
        let dir = tempfile::tempdir().unwrap();
        let img: Vec<u8> = (0..3 * 2 * 2).map(|v| v as u8 * 20).collect();
        std::fs::write(dir.path().join("train-images-idx3-ubyte"), encode_idx(&[3, 2, 2], &img)).unwrap();
        std::fs::write(dir.path().join("train-labels.idx1-ubyte"), encode_idx(&[3], &[7, 0, 9])).unwrap();
        let s = mnist_split(dir.path(), 1, &HostMemory::default()).unwrap().unwrap();
        assert_eq!(s.train.len() + s.test.len(), 3);
        let (train, test) = load_mnist(dir.path(), &HostMemory::default()).unwrap().unwrap();
        assert!(test.is_none());
        assert_eq!((train.sample_shape.clone(), train.y.clone(), train.num_classes), (vec![2, 2], vec![7, 0, 9], 10));
        assert_eq!(train.x[1], 20.0 / 255.0);
        assert!(load_mnist(&dir.path().join("none"), &HostMemory::default()).unwrap().is_none());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let _ = parse_idx(&bytes, Path::new("x"));
        }

        #[test]
        fn encode_parse_round_trip(dims in proptest::collection::vec(0usize..4, 1..4), fill in 0u8..255) {
            let n: usize = dims.iter().product();
            let data = vec![fill; n];
            let a = parse_idx(&encode_idx(&dims, &data), Path::new("x")).unwrap();
            proptest::prop_assert_eq!(a, IdxArray { dims, data });
        }
    }

    #[test]
    fn bad_magic_and_lengths_are_named() {
        let p = Path::new("data/train-images-idx3-ubyte");
        let e = parse_idx(&[0, 0, 0x0d, 3, 0, 0, 0, 1], p).unwrap_err().to_string();
        assert!(
            e.contains("train-images-idx3-ubyte")
                && e.contains("bad magic 00 00 0d 03")
                && e.contains("expected 00 00 08"),
            "{e}"
        );
        let e = parse_idx(&encode_idx(&[2, 2], &[1, 2, 3]), p).unwrap_err().to_string();
        assert!(e.contains("need 4 data bytes, found 3"), "{e}");
        assert!(parse_idx(&[0, 0], p).is_err());
        assert!(parse_idx(&[0, 0, 8, 2, 0, 0], p).is_err());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train-images-idx3-ubyte"), encode_idx(&[2, 1, 1], &[1, 2])).unwrap();
        std::fs::write(dir.path().join("train-labels-idx1-ubyte"), encode_idx(&[3], &[1, 2, 3])).unwrap();
        let e = load_mnist(dir.path(), &HostMemory::default()).unwrap_err().to_string();
        assert!(e.contains("train-labels-idx1-ubyte") && e.contains("[2]"), "{e}");
    }
}
