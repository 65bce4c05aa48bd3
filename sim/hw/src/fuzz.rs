//! Mutations of valid inputs for the fuzz-style parser tests of every crate (compiled with the
//! `fuzzing` feature, which only the crates' dev-dependencies enable): byte flips, deletions,
//! insertions, truncation, and numbers replaced by the values a fuzzer would try.

use proptest::prelude::*;

/// Values a fuzzer would try in place of a number.
pub const NUMBERS: &[&str] = &[
    "0",
    "0.0",
    "-0.0",
    "-1",
    "1",
    "-1e300",
    "1e308",
    "1e-17",
    "NaN",
    "inf",
    "-inf",
    "4294967296",
    "65536",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "0x7fffffff",
    "3.5",
    "1024",
];

/// One edit of a text.
#[derive(Debug, Clone)]
pub enum Edit {
    /// XOR one byte with a mask.
    Flip(usize, u8),
    /// Delete up to `len` bytes.
    Delete(usize, usize),
    /// Insert bytes.
    Insert(usize, Vec<u8>),
    /// Cut the text there.
    Truncate(usize),
    /// Replace the `i`-th number in the text with `NUMBERS[j]`.
    Number(usize, usize),
}

/// A random edit.
pub fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, m)| Edit::Flip(i, m)),
        (any::<usize>(), 1usize..40).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<usize>(), Just(b"(),:[]@+\"\n".to_vec()))
            .prop_flat_map(|(i, cs)| (Just(i), proptest::sample::select(cs)))
            .prop_map(|(i, c)| Edit::Insert(i, vec![c])),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), 0..NUMBERS.len()).prop_map(|(i, j)| Edit::Number(i, j)),
        (any::<usize>(), 0..NUMBERS.len()).prop_map(|(i, j)| Edit::Number(i, j)),
    ]
}

/// Byte ranges of the numbers (runs of digits, with a leading `-` and inner `.`/`e`) in `t`.
pub fn numbers(t: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i].is_ascii_digit() && (i == 0 || !t[i - 1].is_ascii_alphanumeric() && t[i - 1] != b'_') {
            let start = if i > 0 && t[i - 1] == b'-' { i - 1 } else { i };
            let mut j = i;
            while j < t.len() && (t[j].is_ascii_alphanumeric() || t[j] == b'.') {
                j += 1;
            }
            out.push((start, j));
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// `edits` applied to `text`, as text (invalid UTF-8 replaced).
pub fn apply(text: &str, edits: &[Edit]) -> String {
    String::from_utf8_lossy(&mutate(text.as_bytes(), edits)).into_owned()
}

/// `edits` applied to bytes.
pub fn mutate(bytes: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut t = bytes.to_vec();
    for e in edits {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
        match e {
            Edit::Flip(i, m) if !t.is_empty() => {
                let i = i % t.len();
                t[i] ^= m;
            }
            Edit::Flip(..) => {}
            Edit::Delete(i, n) => {
                let i = at(*i, t.len());
                let end = (i + n).min(t.len());
                t.drain(i..end);
            }
            Edit::Insert(i, b) => {
                let i = at(*i, t.len());
                t.splice(i..i, b.iter().copied());
            }
            Edit::Truncate(i) => t.truncate(at(*i, t.len())),
            Edit::Number(i, j) => {
                let nums = numbers(&t);
                if !nums.is_empty() {
                    let (s, e) = nums[i % nums.len()];
                    t.splice(s..e, NUMBERS[*j].bytes());
                }
            }
        }
    }
    t
}
