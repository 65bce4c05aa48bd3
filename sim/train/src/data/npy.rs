//! Reading and writing `.npy` arrays (f32 tensors, integer labels) with errors that name the
//! file and the expected vs found dtype or shape.

use crate::error::{io_err, shape_str, Result, TrainError};
use faultline_hw::budget::HostMemory;
use npyz::{DType, NpyFile, TypeChar, WriterBuilder};
use std::path::Path;

/// An n-dimensional f32 array read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Row-major (C order) values.
    pub data: Vec<f32>,
}

/// Opens an array and checks its header before anything is allocated: C order, and a shape
/// whose data fits in the file (a header claiming `[10^12]` in a 100-byte file is an error, not
/// a terabyte allocation).
fn open(path: &Path) -> Result<NpyFile<std::io::BufReader<std::fs::File>>> {
    use std::io::{Read, Seek};
    let bad = |detail: String| TrainError::Npy { file: path.to_path_buf(), detail };
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    // The pre-header (magic, version, header length) is checked first: the header length must
    // fit the file, else npyz would allocate it (up to 4 GiB) before finding the file short.
    let mut pre = Vec::with_capacity(12);
    (&mut f).take(12).read_to_end(&mut pre).map_err(io_err(path))?;
    let declared = match (pre.get(..6), pre.get(6)) {
        (Some(b"\x93NUMPY"), Some(1)) if pre.len() >= 10 => Some((u64::from(u16::from_le_bytes([pre[8], pre[9]])), 10)),
        (Some(b"\x93NUMPY"), Some(_)) if pre.len() >= 12 => {
            Some((u64::from(u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]])), 12))
        }
        _ => None,
    };
    if let Some((header_len, _)) = declared.filter(|&(h, pre_len)| h > len.saturating_sub(pre_len)) {
        return Err(bad(format!("header declares {header_len} header bytes, more than the file's {len} bytes")));
    }
    f.rewind().map_err(io_err(path))?;
    // Read the header unbuffered, so the file position after it is where the data starts.
    let header = npyz::NpyHeader::from_reader(&mut f).map_err(|e| bad(one_line(&e.to_string())))?;
    let data_len = len.saturating_sub(f.stream_position().map_err(io_err(path))?);
    let npy = NpyFile::with_header(header, std::io::BufReader::new(f));
    if npy.order() != npyz::Order::C && npy.shape().len() > 1 {
        return Err(bad("array is in Fortran order; save it with np.ascontiguousarray".into()));
    }
    let item = match npy.dtype() {
        DType::Plain(t) => t.size_field(),
        _ => 1,
    };
    let bytes = npy.shape().iter().try_fold(item, |a, &d| a.checked_mul(d));
    if bytes.is_none_or(|b| b > data_len) {
        return Err(bad(format!(
            "header declares shape {:?} of {item}-byte values, more data than the file's {data_len} bytes after the header",
            npy.shape()
        )));
    }
    Ok(npy)
}

/// Some npyz messages span lines; errors here are one line.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Index of the first NaN or infinite value, if any.
pub fn first_nonfinite(data: &[f32]) -> Option<usize> {
    data.iter().position(|v| !v.is_finite())
}

/// Errors if `data` (of `shape`, read from `file`) holds a NaN or infinity, naming the first
/// one's index and `what` to do instead; `allow` turns the check off.
pub fn check_finite(file: &Path, shape: &[usize], data: &[f32], allow: bool) -> Result<()> {
    let Some(i) = first_nonfinite(data).filter(|_| !allow) else { return Ok(()) };
    let mut idx = vec![0; shape.len()];
    let mut rest = i;
    for (k, &d) in shape.iter().enumerate().rev() {
        idx[k] = rest % d.max(1);
        rest /= d.max(1);
    }
    Err(TrainError::NonFinite { file: file.to_path_buf(), index: format!("{idx:?}"), value: data[i] })
}

fn dtype_str(d: &DType) -> String {
    match d {
        DType::Plain(t) => t.to_string(),
        other => other.descr(),
    }
}

fn bad_data(path: &Path) -> impl Fn(std::io::Error) -> TrainError + '_ {
    move |e| TrainError::Npy { file: path.to_path_buf(), detail: e.to_string() }
}

/// Reads a float array (`<f4`, or `<f8` rounded to nearest f32).
pub fn read_f32(path: &Path) -> Result<Array> {
    let npy = open(path)?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let dt = npy.dtype();
    let found = dtype_str(&dt);
    let data = match &dt {
        DType::Plain(t) if t.type_char() == TypeChar::Float && t.size_field() == 4 => {
            npy.into_vec::<f32>().map_err(bad_data(path))?
        }
        DType::Plain(t) if t.type_char() == TypeChar::Float && t.size_field() == 8 => {
            npy.into_vec::<f64>().map_err(bad_data(path))?.into_iter().map(|v| v as f32).collect()
        }
        _ => {
            return Err(TrainError::DType {
                file: path.to_path_buf(),
                expected: "float32 (<f4) or float64 (<f8)".into(),
                found,
            })
        }
    };
    Ok(Array { shape, data })
}

/// Reads a float array and checks its shape against `expected` (before reading its data).
pub fn read_f32_shaped(path: &Path, expected: &[usize]) -> Result<Array> {
    let npy = open(path)?;
    let found: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    drop(npy);
    if found != expected {
        return Err(TrainError::Shape {
            file: path.to_path_buf(),
            expected: shape_str(expected),
            found: shape_str(&found),
        });
    }
    read_f32(path)
}

/// Reads model inputs: any float dtype, or unsigned bytes (kept as 0..=255 values). The
/// array (as f32) must fit `mem`.
pub fn read_inputs(path: &Path, mem: &HostMemory) -> Result<Array> {
    let npy = open(path)?;
    let elems = npy.shape().iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    mem.check(&format!("{} as float32", path.display()), elems.and_then(|n| n.checked_mul(4)))?;
    let dt = npy.dtype();
    if let DType::Plain(t) = &dt {
        if t.type_char() == TypeChar::Uint && t.size_field() == 1 {
            let shape = npy.shape().iter().map(|&d| d as usize).collect();
            let data = npy.into_vec::<u8>().map_err(bad_data(path))?.into_iter().map(f32::from).collect();
            return Ok(Array { shape, data });
        }
    }
    drop(npy);
    read_f32(path).map_err(|e| match e {
        TrainError::DType { file, found, .. } => {
            TrainError::DType { file, expected: "float32 (<f4), float64 (<f8) or uint8 (|u1)".into(), found }
        }
        e => e,
    })
}

/// Reads 1-D integer class labels (any signed or unsigned integer dtype, non-negative values).
pub fn read_labels(path: &Path) -> Result<Vec<u32>> {
    let npy = open(path)?;
    let shape = npy.shape().to_vec();
    let dt = npy.dtype();
    let found = dtype_str(&dt);
    let wrong = || TrainError::DType {
        file: path.to_path_buf(),
        expected: "an integer dtype (int64 <i8, int32 <i4, uint8 |u1, ...)".into(),
        found: found.clone(),
    };
    if shape.len() != 1 {
        return Err(TrainError::Shape {
            file: path.to_path_buf(),
            expected: "[N] (one class label per sample)".into(),
            found: format!("{shape:?}"),
        });
    }
    let DType::Plain(t) = &dt else { return Err(wrong()) };
    let vals: Vec<i64> = match (t.type_char(), t.size_field()) {
        (TypeChar::Int, 8) => npy.into_vec::<i64>().map_err(bad_data(path))?,
        (TypeChar::Int, 4) => npy.into_vec::<i32>().map_err(bad_data(path))?.into_iter().map(i64::from).collect(),
        (TypeChar::Int, 2) => npy.into_vec::<i16>().map_err(bad_data(path))?.into_iter().map(i64::from).collect(),
        (TypeChar::Int, 1) => npy.into_vec::<i8>().map_err(bad_data(path))?.into_iter().map(i64::from).collect(),
        (TypeChar::Uint, 8) => {
            npy.into_vec::<u64>().map_err(bad_data(path))?.into_iter().map(|v| v.min(i64::MAX as u64) as i64).collect()
        }
        (TypeChar::Uint, 4) => npy.into_vec::<u32>().map_err(bad_data(path))?.into_iter().map(i64::from).collect(),
        (TypeChar::Uint, 2) => npy.into_vec::<u16>().map_err(bad_data(path))?.into_iter().map(i64::from).collect(),
        (TypeChar::Uint, 1) => npy.into_vec::<u8>().map_err(bad_data(path))?.into_iter().map(i64::from).collect(),
        _ => return Err(wrong()),
    };
    vals.iter()
        .enumerate()
        .map(|(i, &v)| {
            u32::try_from(v).map_err(|_| {
                TrainError::Data(format!("{}: label {v} at index {i} is not a class index", path.display()))
            })
        })
        .collect()
}

/// Writes an f32 array as `<f4` in C order (exact: every bit is kept).
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    debug_assert_eq!(shape.iter().product::<usize>(), data.len());
    let f = std::fs::File::create(path).map_err(io_err(path))?;
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&shape)
        .writer(std::io::BufWriter::new(f))
        .begin_nd()
        .map_err(io_err(path))?;
    w.extend(data.iter().copied()).map_err(io_err(path))?;
    w.finish().map_err(io_err(path))
}

/// Writes integer labels as `<i8`.
pub fn write_labels(path: &Path, labels: &[u32]) -> Result<()> {
    let f = std::fs::File::create(path).map_err(io_err(path))?;
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&[labels.len() as u64])
        .writer(std::io::BufWriter::new(f))
        .begin_nd()
        .map_err(io_err(path))?;
    w.extend(labels.iter().map(|&l| l as i64)).map_err(io_err(path))?;
    w.finish().map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_any<T: npyz::Serialize + npyz::AutoSerialize + Copy>(path: &Path, shape: &[u64], data: &[T]) {
        let f = std::fs::File::create(path).unwrap();
        let mut w = npyz::WriteOptions::new().default_dtype().shape(shape).writer(f).begin_nd().unwrap();
        w.extend(data.iter().copied()).unwrap();
        w.finish().unwrap();
    }

    #[test]
    fn f32_round_trip_is_bit_exact() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.npy");
        let data = [1.5f32, -0.0, f32::MIN_POSITIVE / 4.0, 3.0e38, 7.0, 8.0];
        write_f32(&p, &[2, 3], &data).unwrap();
        let a = read_f32_shaped(&p, &[2, 3]).unwrap();
        assert_eq!(a.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), data.map(f32::to_bits));
    }

    #[test]
    fn errors_name_file_and_expected_vs_found() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.npy");
        write_any(&p, &[2, 2], &[1i32, 2, 3, 4]);
        let e = read_f32(&p).unwrap_err().to_string();
        assert!(e.contains("w.npy") && e.contains("<f4") && e.contains("<i4"), "{e}");
        write_f32(&p, &[2, 2], &[0.0; 4]).unwrap();
        let e = read_f32_shaped(&p, &[4, 1]).unwrap_err().to_string();
        assert!(e.contains("w.npy") && e.contains("expected [4, 1], found [2, 2]"), "{e}");
        let e = read_labels(&p).unwrap_err().to_string();
        assert!(e.contains("[N]") && e.contains("[2, 2]"), "{e}");
        // A header that claims more data than the file holds is refused before allocating.
        let mut head = b"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999,), }".to_vec();
        while !(10 + head.len() + 1).is_multiple_of(64) {
            head.push(b' ');
        }
        head.push(b'\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend((head.len() as u16).to_le_bytes());
        bytes.extend(head);
        bytes.extend([0u8; 8]);
        std::fs::write(&p, &bytes).unwrap();
        let e = read_f32(&p).unwrap_err().to_string();
        assert!(e.contains("more data than the file"), "{e}");
        // So is a header length past the end of the file (npyz would allocate it first).
        for version in [&b"\x01\x00\xff\xff"[..], b"\x02\x00\xf0\xff\xff\xff", b"\x03\x00\xf0\xff\xff\xff"] {
            std::fs::write(&p, [&b"\x93NUMPY"[..], version, b"{'descr'"].concat()).unwrap();
            let e = read_f32(&p).unwrap_err().to_string();
            assert!(e.contains("header bytes, more than the file's"), "{e}");
        }
        std::fs::write(&p, b"garbage").unwrap();
        assert!(read_f32(&p).unwrap_err().to_string().contains("not a valid .npy"));
        let e = read_f32(&dir.path().join("nope.npy")).unwrap_err().to_string();
        assert!(e.contains("nope.npy"), "{e}");
    }

    #[test]
    fn labels_of_any_int_dtype_and_f64_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("y.npy");
        write_any(&p, &[3], &[0u8, 2, 1]);
        assert_eq!(read_labels(&p).unwrap(), [0, 2, 1]);
        write_labels(&p, &[4, 5]).unwrap();
        assert_eq!(read_labels(&p).unwrap(), [4, 5]);
        write_any(&p, &[2], &[1i64, -1]);
        assert!(read_labels(&p).unwrap_err().to_string().contains("label -1"));
        write_any(&p, &[2], &[0.5f32, 1.0]);
        assert!(read_labels(&p).unwrap_err().to_string().contains("<f4"));
        let x = dir.path().join("x.npy");
        write_any(&x, &[1, 2], &[0.25f64, 2.0]);
        assert_eq!(
            read_inputs(&x, &HostMemory::default()).unwrap(),
            Array { shape: vec![1, 2], data: vec![0.25, 2.0] }
        );
        write_any(&x, &[2], &[255u8, 3]);
        assert_eq!(read_inputs(&x, &HostMemory::default()).unwrap().data, [255.0, 3.0]);
    }
}
