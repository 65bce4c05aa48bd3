//! Error-detecting and -correcting codes that protect SRAM words and registers.
//!
//! A `width`-bit data word (1..=64 bits) is stored with [`Code::check_bits`] extra check bits;
//! on every read the check logic recomputes the check bits, XORs them with the stored ones (the
//! *syndrome*) and decides what to pass on ([`Decoded`]). Bit positions in a codeword are
//! numbered data bits first (`0..width`), then check bits (`width..width + check_bits`), the
//! numbering [`Code::decode_error`] and [`Decoded::Corrected`] use.
//!
//! * [`Code::Parity`]: one even-parity bit. Detects every odd-weight error and misses every
//!   even-weight one (a double flip decodes [`Decoded::Clean`], silently wrong).
//! * [`Code::Secded`]: a Hsiao SEC-DED code (M. Y. Hsiao, "A Class of Optimal Minimum Odd-weight-
//!   column SEC-DED Codes", IBM J. R&D, 1970). Every column of the parity-check matrix has odd
//!   weight: data columns weight >= 3, check columns the unit vectors. A single error's syndrome
//!   is its column (odd weight, so it is corrected); a double error's syndrome is the XOR of two
//!   distinct odd-weight columns, nonzero and of even weight, so double-error detection is just
//!   the parity of the syndrome, with no overall parity bit as in extended Hamming codes. Errors
//!   of weight >= 3 may be detected, miscorrected or missed, as in the hardware.
//!
//! **Check-bit count.** SECDED uses the smallest `r >= 3` with at least `width` odd-weight
//! `r`-bit vectors of weight >= 3 (there are `2^(r-1) - r` of them): r = 3 for 1 bit, 4 for
//! 2..=4, 5 for 5..=11, 6 for 12..=26, 7 for 27..=57, 8 for 58..=64 bits. (No `r < 3` has any
//! such vector, so `r >= 2` is never the binding bound.)
//!
//! **Column choice.** Data bit `j` gets the `j`-th vector of: all weight-3 `r`-bit vectors in
//! ascending numeric order (lexicographic order of the `r`-bit string read from check bit
//! `r - 1` down to check bit 0), then all weight-5 ones likewise, then weight 7. This is Hsiao's
//! minimum-total-weight choice (fewest XOR inputs) without his explicit row balancing; ascending
//! numeric order happens to spread the weight-3 columns evenly over the rows anyway. Because the
//! sequence for a given `r` does not depend on `width`, a narrower word uses a prefix of it, and
//! the tables below are built at compile time once per `r`: encoding is `r` popcounts and decoding
//! adds one table lookup, with no allocation.

/// The check a word or register carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub enum Code {
    /// One even-parity bit over the data: detects odd-weight errors, misses even-weight ones.
    Parity,
    /// Hsiao single-error-correcting, double-error-detecting code.
    Secded,
}

/// The check logic's verdict on one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// Syndrome zero: the data is passed on as stored (it may still be wrong: an undetectable
    /// error).
    Clean,
    /// A single-bit error was corrected (SECDED): the corrected data, and which codeword bit was
    /// flipped (`0..width` are data bits, `width..` are check bits).
    Corrected {
        /// The data after correction (low `width` bits).
        data: u64,
        /// The codeword bit the decoder flipped back.
        bit: u32,
    },
    /// An uncorrectable error was detected (parity: odd weight; SECDED: even-weight syndrome, or
    /// odd syndrome matching no column).
    Detected,
}

/// Widest data word a code protects.
pub const MAX_WIDTH: u32 = 64;

/// Fewest SECDED check bits (a 1-bit word needs the single weight-3 column of 3 bits).
const MIN_R: u32 = 3;
/// Most SECDED check bits (64 data bits need 8).
const MAX_R: u32 = 8;
/// Number of distinct `r` values, the first index of the tables.
const NUM_R: usize = (MAX_R - MIN_R + 1) as usize;
/// Marks a syndrome that is no data column in [`SYNDROME_BIT`].
const NO_BIT: u8 = u8::MAX;

/// `COLUMNS[r - MIN_R][j]`: the Hsiao column of data bit `j` in the `r`-check-bit code (0 past
/// the last odd-weight vector, which only happens for `j` beyond any width using that `r`).
const COLUMNS: [[u8; MAX_WIDTH as usize]; NUM_R] = build_columns();
/// `ROWS[r - MIN_R][i]`: the data bits check bit `i` covers (bit `j` set iff column `j` has bit
/// `i`); a narrower word masks it to its width.
const ROWS: [[u64; MAX_R as usize]; NUM_R] = build_rows();
/// `SYNDROME_BIT[r - MIN_R][s]`: the data bit whose column is `s`, or [`NO_BIT`].
const SYNDROME_BIT: [[u8; 1 << MAX_R]; NUM_R] = build_syndrome_bits();

/// Hsiao columns for every `r`: weight 3, 5, 7 in turn, each in ascending numeric order.
const fn build_columns() -> [[u8; MAX_WIDTH as usize]; NUM_R] {
    let mut t = [[0u8; MAX_WIDTH as usize]; NUM_R];
    let mut ri = 0;
    while ri < NUM_R {
        let r = MIN_R + ri as u32;
        let mut n = 0;
        let mut w = 3;
        while w <= r && n < MAX_WIDTH as usize {
            // Gosper's hack: the next larger integer with the same popcount.
            let mut v: u32 = (1 << w) - 1;
            while v < (1 << r) && n < MAX_WIDTH as usize {
                t[ri][n] = v as u8;
                n += 1;
                let c = v & v.wrapping_neg();
                let s = v + c;
                v = (((s ^ v) >> 2) / c) | s;
            }
            w += 2;
        }
        ri += 1;
    }
    t
}

/// Transposes [`COLUMNS`] into per-check-bit data masks.
const fn build_rows() -> [[u64; MAX_R as usize]; NUM_R] {
    let cols = COLUMNS;
    let mut t = [[0u64; MAX_R as usize]; NUM_R];
    let mut ri = 0;
    while ri < NUM_R {
        let mut j = 0;
        while j < MAX_WIDTH as usize {
            let mut i = 0;
            while i < MAX_R as usize {
                if cols[ri][j] >> i & 1 == 1 {
                    t[ri][i] |= 1 << j;
                }
                i += 1;
            }
            j += 1;
        }
        ri += 1;
    }
    t
}

/// Inverts [`COLUMNS`]: syndrome to data bit.
const fn build_syndrome_bits() -> [[u8; 1 << MAX_R]; NUM_R] {
    let cols = COLUMNS;
    let mut t = [[NO_BIT; 1 << MAX_R]; NUM_R];
    let mut ri = 0;
    while ri < NUM_R {
        let mut j = 0;
        // Column 0 is the "no more columns" filler, never a real (weight >= 3) column.
        while j < MAX_WIDTH as usize && cols[ri][j] != 0 {
            t[ri][cols[ri][j] as usize] = j as u8;
            j += 1;
        }
        ri += 1;
    }
    t
}

/// The low `width` bits set; panics outside `1..=64` (a caller bug, not a data condition).
#[inline]
fn data_mask(width: u32) -> u64 {
    assert!((1..=MAX_WIDTH).contains(&width), "ECC word width {width} outside 1..={MAX_WIDTH}");
    u64::MAX >> (MAX_WIDTH - width)
}

/// SECDED check bits for a `width`-bit word (`width` already validated).
#[inline]
fn secded_r(width: u32) -> u32 {
    let mut r = MIN_R;
    // 2^(r-1) - r odd-weight r-bit vectors have weight >= 3 (all odd ones minus the r units).
    while (1u32 << (r - 1)) - r < width {
        r += 1;
    }
    r
}

/// SECDED check bits of `data` (already masked to its width) in the `r`-check-bit code.
#[inline]
fn secded_encode(r: u32, data: u64) -> u64 {
    let rows = &ROWS[(r - MIN_R) as usize];
    let mut check = 0;
    // Masking `data` suffices: row bits beyond `width` then meet only zero data bits.
    for (i, row) in rows.iter().enumerate().take(r as usize) {
        check |= u64::from((data & row).count_ones() & 1) << i;
    }
    check
}

impl Code {
    /// Check bits this code adds to a `width`-bit word.
    ///
    /// # Panics
    /// If `width` is outside `1..=64`.
    pub fn check_bits(self, width: u32) -> u32 {
        data_mask(width);
        match self {
            Code::Parity => 1,
            Code::Secded => secded_r(width),
        }
    }

    /// Bits of a stored `width`-bit codeword: data plus check bits.
    ///
    /// # Panics
    /// If `width` is outside `1..=64`.
    pub fn codeword_bits(self, width: u32) -> u32 {
        width + self.check_bits(width)
    }

    /// The check bits of `data` (low `width` bits used).
    ///
    /// # Panics
    /// If `width` is outside `1..=64`.
    pub fn encode(self, width: u32, data: u64) -> u64 {
        let data = data & data_mask(width);
        match self {
            // Even parity: data plus parity bit has even weight.
            Code::Parity => u64::from(data.count_ones() & 1),
            Code::Secded => secded_encode(secded_r(width), data),
        }
    }

    /// What the check logic does when a word is read: `data` and `check` as stored (possibly
    /// with errors). Bits above `width` in `data` and above [`Code::check_bits`] in `check`
    /// are ignored.
    ///
    /// # Panics
    /// If `width` is outside `1..=64`.
    pub fn decode(self, width: u32, data: u64, check: u64) -> Decoded {
        let data = data & data_mask(width);
        match self {
            Code::Parity => {
                if (data.count_ones() as u64 ^ check) & 1 == 0 {
                    Decoded::Clean
                } else {
                    Decoded::Detected
                }
            }
            Code::Secded => {
                let r = secded_r(width);
                let syndrome = secded_encode(r, data) ^ (check & ((1 << r) - 1));
                if syndrome == 0 {
                    Decoded::Clean
                } else if syndrome.count_ones() & 1 == 0 {
                    // Every column has odd weight, so any double error lands here.
                    Decoded::Detected
                } else if syndrome.is_power_of_two() {
                    // A unit-vector syndrome: a flipped check bit, the data is intact.
                    Decoded::Corrected { data, bit: width + syndrome.trailing_zeros() }
                } else {
                    let j = SYNDROME_BIT[(r - MIN_R) as usize][syndrome as usize];
                    // Columns past `width` belong to wider words: no single error here gives them.
                    if u32::from(j) < width {
                        Decoded::Corrected { data: data ^ (1 << j), bit: u32::from(j) }
                    } else {
                        Decoded::Detected
                    }
                }
            }
        }
    }

    /// What the check logic does with codeword error pattern `error` on a correctly stored
    /// `data` word: bits `0..width` of `error` flip data bits, bits `width..width + check_bits`
    /// flip check bits, higher bits are ignored. `Clean` with a nonzero `error` is a silent
    /// (undetected) error.
    ///
    /// # Panics
    /// If `width` is outside `1..=64`.
    pub fn decode_error(self, width: u32, data: u64, error: u128) -> Decoded {
        let mask = data_mask(width);
        let check = self.encode(width, data);
        let check_error = (error >> width) as u64 & ((1 << self.check_bits(width)) - 1);
        self.decode(width, (data ^ error as u64) & mask, check ^ check_error)
    }

    /// Name as written in configs: "Parity" / "Secded".
    pub fn name(self) -> &'static str {
        match self {
            Code::Parity => "Parity",
            Code::Secded => "Secded",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Widths the tests cover exhaustively: tiny registers, byte/half/word, odd sizes, 64.
    const WIDTHS: [u32; 9] = [1, 2, 3, 8, 12, 16, 24, 32, 64];

    /// splitmix64, so test words are reproducible without a crate.
    fn splitmix64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 0, all-ones and eight pseudo-random words, masked to `width`.
    fn words(width: u32) -> Vec<u64> {
        let mask = u64::MAX >> (64 - width);
        let mut state = 0x5eed_0000 + u64::from(width);
        let mut w = vec![0, mask];
        w.extend((0..8).map(|_| splitmix64(&mut state) & mask));
        w
    }

    /// Independent reference: Hsiao columns by brute force over all r-bit values.
    fn reference_columns(r: u32) -> Vec<u64> {
        let mut cols = Vec::new();
        for weight in (3..=r).step_by(2) {
            cols.extend((0..1u64 << r).filter(|v| v.count_ones() == weight));
        }
        cols
    }

    /// Independent reference: smallest r >= 2 with `width` odd-weight columns of weight >= 3.
    fn reference_r(width: u32) -> u32 {
        (2..).find(|&r| reference_columns(r).len() >= width as usize).unwrap()
    }

    /// Independent reference: check bits as the XOR of the columns of the set data bits.
    fn reference_encode(width: u32, data: u64) -> u64 {
        let cols = reference_columns(reference_r(width));
        (0..width).filter(|&j| data >> j & 1 == 1).fold(0, |acc, j| acc ^ cols[j as usize])
    }

    #[test]
    fn check_bits_values() {
        for w in 1..=MAX_WIDTH {
            assert_eq!(Code::Parity.check_bits(w), 1);
            assert_eq!(Code::Secded.check_bits(w), reference_r(w), "width {w}");
            assert_eq!(Code::Secded.codeword_bits(w), w + reference_r(w));
        }
        let secded: Vec<u32> = [1, 2, 3, 8, 12, 16, 24, 32, 64].iter().map(|&w| Code::Secded.check_bits(w)).collect();
        assert_eq!(secded, [3, 4, 4, 5, 6, 6, 6, 7, 8]);
        // The boundaries of each r.
        for (w, r) in [(4, 4), (5, 5), (11, 5), (12, 6), (26, 6), (27, 7), (57, 7), (58, 8)] {
            assert_eq!(Code::Secded.check_bits(w), r, "width {w}");
        }
    }

    #[test]
    #[should_panic(expected = "outside 1..=64")]
    fn width_zero_panics() {
        Code::Secded.encode(0, 0);
    }

    #[test]
    #[should_panic(expected = "outside 1..=64")]
    fn width_65_panics() {
        Code::Parity.check_bits(65);
    }

    #[test]
    fn hsiao_columns_distinct_odd_weight_at_least_3() {
        for r in MIN_R..=MAX_R {
            let table = &COLUMNS[(r - MIN_R) as usize];
            let reference = reference_columns(r);
            let n = reference.len().min(MAX_WIDTH as usize);
            let cols: Vec<u64> = table[..n].iter().map(|&c| u64::from(c)).collect();
            // Weight-3 first, ascending, then weight 5, ...: the documented order.
            assert_eq!(cols, reference[..n], "r {r}");
            assert!(table[n..].iter().all(|&c| c == 0), "r {r}: filler");
            for (j, &c) in cols.iter().enumerate() {
                assert!(c < 1 << r, "r {r} col {j}");
                assert!(c.count_ones() >= 3 && c.count_ones() % 2 == 1, "r {r} col {j}");
                assert!(!cols[..j].contains(&c), "r {r}: column {j} repeated");
                assert_eq!(SYNDROME_BIT[(r - MIN_R) as usize][c as usize], j as u8);
            }
            let real = SYNDROME_BIT[(r - MIN_R) as usize].iter().filter(|&&b| b != NO_BIT).count();
            assert_eq!(real, n, "r {r}: syndrome table entries");
        }
        // Every width gets enough columns.
        for w in 1..=MAX_WIDTH {
            let r = Code::Secded.check_bits(w);
            assert_ne!(COLUMNS[(r - MIN_R) as usize][w as usize - 1], 0, "width {w}");
        }
    }

    #[test]
    fn encode_matches_column_xor() {
        for w in 1..=MAX_WIDTH {
            for d in words(w) {
                assert_eq!(Code::Secded.encode(w, d), reference_encode(w, d), "w {w} d {d:#x}");
                assert_eq!(Code::Parity.encode(w, d), u64::from(d.count_ones() % 2));
            }
            // Single data bits: the check bits are exactly the column.
            for j in 0..w {
                assert_eq!(Code::Secded.encode(w, 1 << j), reference_encode(w, 1 << j));
            }
        }
    }

    #[test]
    fn bits_above_width_are_ignored() {
        for &w in WIDTHS.iter().filter(|&&w| w < 64) {
            for code in [Code::Parity, Code::Secded] {
                for d in words(w) {
                    let junk = d | (u64::MAX << w);
                    assert_eq!(code.encode(w, junk), code.encode(w, d));
                    let c = code.encode(w, d);
                    let junk_check = c | (u64::MAX << code.check_bits(w));
                    assert_eq!(code.decode(w, junk, junk_check), Decoded::Clean);
                }
            }
        }
    }

    #[test]
    fn error_free_words_decode_clean() {
        for w in 1..=MAX_WIDTH {
            for code in [Code::Parity, Code::Secded] {
                for d in words(w) {
                    assert_eq!(code.decode(w, d, code.encode(w, d)), Decoded::Clean);
                    assert_eq!(code.decode_error(w, d, 0), Decoded::Clean);
                }
            }
        }
    }

    /// Every single-bit error of the codeword is corrected to the original data and the right
    /// bit reported, for each word of each width in `widths`.
    fn check_singles(widths: impl Iterator<Item = u32>) {
        for w in widths {
            let n = Code::Secded.codeword_bits(w);
            for d in words(w) {
                for bit in 0..n {
                    let got = Code::Secded.decode_error(w, d, 1 << bit);
                    assert_eq!(got, Decoded::Corrected { data: d, bit }, "w {w} d {d:#x}");
                }
            }
        }
    }

    /// Every double-bit error of the codeword is detected.
    fn check_doubles(widths: impl Iterator<Item = u32>) {
        for w in widths {
            let n = Code::Secded.codeword_bits(w);
            for d in words(w) {
                for a in 0..n {
                    for b in a + 1..n {
                        let got = Code::Secded.decode_error(w, d, 1 << a | 1 << b);
                        assert_eq!(got, Decoded::Detected, "w {w} d {d:#x} bits {a},{b}");
                    }
                }
            }
        }
    }

    #[test]
    fn secded_corrects_every_single_bit_error() {
        check_singles(WIDTHS.into_iter());
    }

    #[test]
    fn secded_detects_every_double_bit_error() {
        check_doubles(WIDTHS.into_iter());
    }

    #[test]
    fn secded_single_and_double_errors_every_width() {
        check_singles(1..=MAX_WIDTH);
        check_doubles(1..=MAX_WIDTH);
    }

    #[test]
    fn secded_decode_takes_stored_bits() {
        // decode() on hand-corrupted stored bits agrees with decode_error().
        for &w in &WIDTHS {
            let r = Code::Secded.check_bits(w);
            for d in words(w) {
                let c = Code::Secded.encode(w, d);
                for j in 0..w {
                    let got = Code::Secded.decode(w, d ^ 1 << j, c);
                    assert_eq!(got, Decoded::Corrected { data: d, bit: j });
                }
                for i in 0..r {
                    let got = Code::Secded.decode(w, d, c ^ 1 << i);
                    assert_eq!(got, Decoded::Corrected { data: d, bit: w + i });
                }
            }
        }
    }

    #[test]
    fn secded_unused_odd_syndromes_are_detected() {
        // Width 8 uses 8 of the 11 weight-3/5 columns of r = 5: the other 3 (and any odd syndrome
        // not a column) must be reported, not "corrected" into a bit the word does not have.
        let w = 8;
        let r = Code::Secded.check_bits(w);
        let used: Vec<u64> = (0..w).map(|j| Code::Secded.encode(w, 1 << j)).collect();
        let mut unused = 0;
        for s in 0..1u64 << r {
            if s.count_ones() % 2 == 1 && s.count_ones() >= 3 && !used.contains(&s) {
                assert_eq!(Code::Secded.decode(w, 0, s), Decoded::Detected, "syndrome {s:#b}");
                unused += 1;
            }
        }
        assert_eq!(unused, 3);
    }

    #[test]
    fn secded_triple_errors_never_decode_clean() {
        // A triple error may be miscorrected (SEC-DED promises nothing at weight 3), but its
        // syndrome is the XOR of three odd-weight columns: odd, hence nonzero, never Clean.
        for &w in &[8, 16] {
            let n = Code::Secded.codeword_bits(w);
            for a in 0..n {
                for b in a + 1..n {
                    for c in b + 1..n {
                        let error = 1 << a | 1 << b | 1 << c;
                        let got = Code::Secded.decode_error(w, 0x5a, error);
                        assert_ne!(got, Decoded::Clean, "w {w} bits {a},{b},{c}");
                    }
                }
            }
        }
    }

    #[test]
    fn parity_detects_odd_weight_errors() {
        // Exhaustive over positions of weight 1 and 3 for every tested width (C(65, 3) = 43680
        // triples at 64 bits: cheap enough not to sample).
        for &w in &WIDTHS {
            let n = Code::Parity.codeword_bits(w);
            assert_eq!(n, w + 1);
            for d in words(w) {
                for a in 0..n {
                    assert_eq!(Code::Parity.decode_error(w, d, 1 << a), Decoded::Detected);
                    for b in a + 1..n {
                        for c in b + 1..n {
                            let got = Code::Parity.decode_error(w, d, 1 << a | 1 << b | 1 << c);
                            assert_eq!(got, Decoded::Detected, "w {w} bits {a},{b},{c}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn parity_misses_even_weight_errors() {
        // Parity's known blind spot: a double flip leaves the parity unchanged.
        for &w in &WIDTHS {
            let n = Code::Parity.codeword_bits(w);
            for d in words(w) {
                for a in 0..n {
                    for b in a + 1..n {
                        let got = Code::Parity.decode_error(w, d, 1 << a | 1 << b);
                        assert_eq!(got, Decoded::Clean, "w {w} bits {a},{b}");
                    }
                }
            }
        }
    }

    #[test]
    fn decode_error_ignores_bits_past_the_codeword() {
        for &w in &WIDTHS {
            for code in [Code::Parity, Code::Secded] {
                let n = code.codeword_bits(w);
                let beyond = u128::MAX << n;
                assert_eq!(code.decode_error(w, 0, beyond), Decoded::Clean);
            }
        }
    }

    #[test]
    fn names_match_serde() {
        for code in [Code::Parity, Code::Secded] {
            assert_eq!(ron::to_string(&code).unwrap(), code.name());
            assert_eq!(ron::from_str::<Code>(code.name()).unwrap(), code);
        }
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn secded_single_corrected_double_detected(
                width in 1..=MAX_WIDTH,
                data: u64,
                a in 0u32..72,
                b in 0u32..72,
            ) {
                let data = data & (u64::MAX >> (64 - width));
                let n = Code::Secded.codeword_bits(width);
                let (a, b) = (a % n, b % n);
                prop_assert_eq!(
                    Code::Secded.decode_error(width, data, 1 << a),
                    Decoded::Corrected { data, bit: a }
                );
                if a != b {
                    prop_assert_eq!(
                        Code::Secded.decode_error(width, data, 1 << a | 1 << b),
                        Decoded::Detected
                    );
                }
            }
        }
    }
}
