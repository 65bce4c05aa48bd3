//! Fault sites: every injectable bit of the machine ([`FaultSite`]) and the classes they are
//! counted and sampled in ([`SiteClass`]).

use crate::config::HwConfig;
use crate::error::{one_line, HwError};
use faultline_num::NumFormat;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Hardware unit a site belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Unit {
    /// The systolic matrix unit.
    Mxu,
    /// The vector unit (`vpu.lane[l].a[bit]`).
    Vpu,
    /// Unified buffer SRAM (`ub.word[0x1f40][7]`).
    Ub,
    /// Accumulator SRAM (`acc.word[0xc][31]`).
    Acc,
    /// Weight buffer / FIFO SRAM (`wbuf.word[0x10][3]`).
    Wbuf,
    /// Off-chip DRAM (`dram.word[0x100][0]`); sites only when `dram.fault_sites` is set.
    Dram,
    /// The core sequencer's control registers (`seq.acc_addr[3]`, `seq.tile[0]`).
    Seq,
    /// The DMA engine's address registers (`dma.src_addr[5]`).
    Dma,
}

impl Unit {
    /// Text name, first segment of a site.
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Mxu => "mxu",
            Unit::Vpu => "vpu",
            Unit::Ub => "ub",
            Unit::Acc => "acc",
            Unit::Wbuf => "wbuf",
            Unit::Dram => "dram",
            Unit::Seq => "seq",
            Unit::Dma => "dma",
        }
    }

    /// Whether the unit is a memory whose sites are `unit.word[addr][bit]`.
    pub const fn is_memory(self) -> bool {
        matches!(self, Unit::Ub | Unit::Acc | Unit::Wbuf | Unit::Dram)
    }
}

/// A register (or memory word) kind within a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Register {
    /// PE activation register (input format; passed right). In IS it carries weight values
    /// (the streaming operand).
    Act,
    /// PE activation-valid bit (gates the MAC).
    Valid,
    /// WS and IS only: weight-swap strobe riding with the first activation of a tile.
    Swap,
    /// PE weight register (stationary in WS, passed down in OS). In IS it holds an input
    /// (activation) value `A[m][k]`, the stationary operand, and [`Register::Act`] holds the
    /// weight values streaming through.
    Weight,
    /// WS and IS only: shadow weight register, loaded while the current tile computes (in IS
    /// with the next tile's input values).
    WeightShadow,
    /// OS only: weight-valid bit travelling down with the weight.
    WeightValid,
    /// PE partial sum (accumulator format; passed down in WS, held then drained in OS).
    Psum,
    /// VPU lane operand register 0 (fp32): first input of the instruction.
    OpA,
    /// VPU lane operand register 1 (fp32).
    OpB,
    /// VPU lane operand register 2 (fp32).
    OpC,
    /// VPU lane operand register 3 (fp32).
    OpD,
    /// VPU lane reduction accumulator (fp32).
    LaneAcc,
    /// VPU lane result register (fp32), read by the write-back.
    LaneOut,
    /// One SRAM/DRAM word (the element itself holds the bits).
    Word,
    /// Sequencer: accumulator-SRAM write address (word address, `ceil(log2(words))` bits).
    AccAddr,
    /// Sequencer: tile (fold) counter selecting the tile the MXU executes next (16 bits).
    TileCounter,
    /// DMA: source word address of the current transfer (32 bits).
    SrcAddr,
    /// DMA: destination word address of the current transfer (32 bits).
    DstAddr,
}

/// Whether a site is a flip-flop (logic) or an SRAM cell; FIT rates differ per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SiteKind {
    /// A flip-flop in logic.
    FlipFlop,
    /// A bit cell of an SRAM array.
    Sram,
}

/// A group of sites sharing a unit and register: e.g. all `mxu.pe[*][*].psum` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SiteClass {
    /// Unit of the class.
    pub unit: Unit,
    /// Register of the class.
    pub register: Register,
}

/// Static description of a class: how it prints and where it exists.
struct ClassInfo {
    class: SiteClass,
    /// Element segment name (`pe`, `word`, `lane`) or "" for unit-level registers.
    element: &'static str,
    /// Register segment name, or "" when the element itself holds the bits (memory words).
    reg: &'static str,
    /// Number of element indices (0, 1 or 2).
    arity: usize,
    kind: SiteKind,
    /// Print indices in hex (addresses).
    hex: bool,
}

const fn pe(register: Register, reg: &'static str) -> ClassInfo {
    ClassInfo {
        class: SiteClass { unit: Unit::Mxu, register },
        element: "pe",
        reg,
        arity: 2,
        kind: SiteKind::FlipFlop,
        hex: false,
    }
}

const fn lane(register: Register, reg: &'static str) -> ClassInfo {
    ClassInfo {
        class: SiteClass { unit: Unit::Vpu, register },
        element: "lane",
        reg,
        arity: 1,
        kind: SiteKind::FlipFlop,
        hex: false,
    }
}

const fn word(unit: Unit) -> ClassInfo {
    ClassInfo {
        class: SiteClass { unit, register: Register::Word },
        element: "word",
        reg: "",
        arity: 1,
        kind: SiteKind::Sram,
        hex: true,
    }
}

const fn ctrl(unit: Unit, register: Register, reg: &'static str) -> ClassInfo {
    ClassInfo { class: SiteClass { unit, register }, element: "", reg, arity: 0, kind: SiteKind::FlipFlop, hex: false }
}

/// The one table of site classes: printing, parsing and enumeration all read it.
const CLASSES: &[ClassInfo] = &[
    pe(Register::Act, "act"),
    pe(Register::Valid, "valid"),
    pe(Register::Swap, "swap"),
    pe(Register::Weight, "weight"),
    pe(Register::WeightShadow, "weight_shadow"),
    pe(Register::WeightValid, "wvalid"),
    pe(Register::Psum, "psum"),
    lane(Register::OpA, "a"),
    lane(Register::OpB, "b"),
    lane(Register::OpC, "c"),
    lane(Register::OpD, "d"),
    lane(Register::LaneAcc, "acc"),
    lane(Register::LaneOut, "out"),
    word(Unit::Ub),
    word(Unit::Acc),
    word(Unit::Wbuf),
    word(Unit::Dram),
    ctrl(Unit::Seq, Register::AccAddr, "acc_addr"),
    ctrl(Unit::Seq, Register::TileCounter, "tile"),
    ctrl(Unit::Dma, Register::SrcAddr, "src_addr"),
    ctrl(Unit::Dma, Register::DstAddr, "dst_addr"),
];

/// Bits needed to address `n` words (at least 1).
pub fn addr_bits(n: u64) -> u32 {
    (64 - n.saturating_sub(1).leading_zeros()).max(1)
}

/// Width of the sequencer's tile counter, bits.
pub const TILE_COUNTER_BITS: u32 = 16;
/// Width of the DMA address registers, bits (word addresses).
pub const DMA_ADDR_BITS: u32 = 32;

fn info(class: SiteClass) -> &'static ClassInfo {
    CLASSES.iter().find(|c| c.class == class).expect("every SiteClass has a CLASSES row")
}

impl SiteClass {
    /// Every class that exists on `cfg` (some registers exist only in one dataflow).
    pub fn all(cfg: &HwConfig) -> Vec<SiteClass> {
        CLASSES.iter().map(|c| c.class).filter(|c| c.exists(cfg)).collect()
    }

    /// Whether this class is physically present on `cfg`.
    pub fn exists(self, cfg: &HwConfig) -> bool {
        // IS is WS on the transposed problem: the same registers.
        let ws = cfg.mxu.dataflow.stationary_operand();
        match (self.unit, self.register) {
            (Unit::Mxu, Register::Swap | Register::WeightShadow) => ws,
            (Unit::Mxu, Register::WeightValid) => !ws,
            (Unit::Dram, _) => cfg.dram.fault_sites,
            _ => true,
        }
    }

    /// Why the class is absent on `cfg` (for error messages).
    fn absent_reason(self, cfg: &HwConfig) -> String {
        match self.unit {
            Unit::Dram => "DRAM words are fault sites only with `dram.fault_sites: true`".into(),
            _ => format!("{} is not present with dataflow {:?}", self, cfg.mxu.dataflow),
        }
    }

    /// Flip-flop or SRAM.
    pub fn kind(self) -> SiteKind {
        info(self).kind
    }

    /// Extent of each element index (unused trailing entries are 1).
    pub fn dims(self, cfg: &HwConfig) -> [u32; 2] {
        let m = &cfg.memory;
        match self.unit {
            Unit::Mxu => [cfg.mxu.rows as u32, cfg.mxu.cols as u32],
            Unit::Vpu => [cfg.vpu.lanes as u32, 1],
            Unit::Ub => [m.unified_buffer.words() as u32, 1],
            Unit::Acc => [m.accumulator.words() as u32, 1],
            Unit::Wbuf => [m.weight_buffer.words() as u32, 1],
            Unit::Dram => [(cfg.dram.bytes / 4) as u32, 1],
            Unit::Seq | Unit::Dma => [1, 1],
        }
    }

    /// Width in bits of one element's register.
    pub fn width(self, cfg: &HwConfig) -> u32 {
        let p = cfg.mxu.precision();
        let m = &cfg.memory;
        match self.register {
            Register::Act | Register::Weight | Register::WeightShadow => p.input().bits(),
            Register::Psum => p.acc().bits(),
            Register::Valid | Register::Swap | Register::WeightValid => 1,
            Register::OpA | Register::OpB | Register::OpC | Register::OpD | Register::LaneAcc | Register::LaneOut => 32,
            Register::Word => m.sram(self.unit).map_or(32, |s| s.word_bits),
            Register::AccAddr => addr_bits(m.accumulator.words()),
            Register::TileCounter => TILE_COUNTER_BITS,
            Register::SrcAddr | Register::DstAddr => DMA_ADDR_BITS,
        }
    }

    /// The number format of the class's values on `cfg`, for reading a bit position as sign,
    /// exponent or mantissa: `None` for 1-bit strobes, counters and addresses.
    pub fn format(self, cfg: &HwConfig) -> Option<NumFormat> {
        let p = cfg.mxu.precision();
        match self.register {
            Register::Act | Register::Weight | Register::WeightShadow => Some(p.input()),
            Register::Psum => Some(p.acc()),
            Register::OpA | Register::OpB | Register::OpC | Register::OpD | Register::LaneAcc | Register::LaneOut => {
                Some(NumFormat::Fp32)
            }
            // The executor's buffers hold fp32 words; a narrower SRAM (the weight buffer) holds
            // the MXU's input format.
            Register::Word => match self.width(cfg) {
                32 => Some(NumFormat::Fp32),
                w if w == p.input().bits() => Some(p.input()),
                _ => None,
            },
            _ => None,
        }
    }

    /// Number of elements (PEs, words, lanes) in the class.
    pub fn elements(self, cfg: &HwConfig) -> u64 {
        let d = self.dims(cfg);
        d[..info(self).arity].iter().map(|&x| x as u64).product()
    }

    /// Total bits in the class on `cfg` (0 if the class does not exist there).
    pub fn bit_count(self, cfg: &HwConfig) -> u64 {
        if !self.exists(cfg) {
            return 0;
        }
        self.elements(cfg) * self.width(cfg) as u64
    }

    /// The `idx`-th bit of the class (row-major over elements, then bit): uniform sampling over
    /// `0..bit_count` gives uniform sampling over the class's bits.
    pub fn site_at(self, cfg: &HwConfig, idx: u64) -> Option<FaultSite> {
        if idx >= self.bit_count(cfg) {
            return None;
        }
        let w = self.width(cfg) as u64;
        let (elem, bit) = (idx / w, (idx % w) as u32);
        let d = self.dims(cfg);
        let instance = match info(self).arity {
            0 => [0, 0],
            1 => [elem as u32, 0],
            _ => [(elem / d[1] as u64) as u32, (elem % d[1] as u64) as u32],
        };
        Some(FaultSite { unit: self.unit, instance, register: self.register, bit })
    }

    /// The element index of `site` in this class (row-major, as [`SiteClass::site_at`] numbers
    /// elements): a PE's `row * cols + col`, a lane, a word address, 0 for a control register.
    pub fn element_of(self, cfg: &HwConfig, site: &FaultSite) -> u64 {
        match info(self).arity {
            0 => 0,
            1 => site.instance[0] as u64,
            _ => site.instance[0] as u64 * self.dims(cfg)[1] as u64 + site.instance[1] as u64,
        }
    }

    /// The register's name as sites print it (`psum`, `a`, `acc_addr`); a memory's element
    /// name (`word`), whose words hold the bits themselves.
    pub fn register_name(self) -> &'static str {
        let i = info(self);
        if i.reg.is_empty() {
            i.element
        } else {
            i.reg
        }
    }

    /// Glob-style pattern of the class, e.g. `mxu.pe[*][*].psum`.
    pub fn pattern(self) -> String {
        let i = info(self);
        let mut s = String::from(self.unit.name());
        if !i.element.is_empty() {
            s.push('.');
            s.push_str(i.element);
            for _ in 0..i.arity {
                s.push_str("[*]");
            }
        }
        if !i.reg.is_empty() {
            s.push('.');
            s.push_str(i.reg);
        }
        s
    }
}

impl fmt::Display for SiteClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.pattern())
    }
}

/// One injectable bit: `unit.element[instance].register[bit]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FaultSite {
    /// Unit holding the bit.
    pub unit: Unit,
    /// Element indices (PE row/col, word address, lane); unused entries are 0.
    pub instance: [u32; 2],
    /// Register within the element.
    pub register: Register,
    /// Bit position, 0 = least significant.
    pub bit: u32,
}

impl FaultSite {
    /// A bit of an MXU PE register.
    pub fn pe(row: usize, col: usize, register: Register, bit: u32) -> FaultSite {
        FaultSite { unit: Unit::Mxu, instance: [row as u32, col as u32], register, bit }
    }

    /// A bit of a VPU lane register.
    pub fn lane(lane: usize, register: Register, bit: u32) -> FaultSite {
        FaultSite { unit: Unit::Vpu, instance: [lane as u32, 0], register, bit }
    }

    /// A bit of a memory word (`unit` is `Ub`, `Acc`, `Wbuf` or `Dram`).
    pub fn word(unit: Unit, addr: u64, bit: u32) -> FaultSite {
        FaultSite { unit, instance: [addr as u32, 0], register: Register::Word, bit }
    }

    /// A bit of a unit-level control register (`seq.acc_addr`, `dma.src_addr`, ...).
    pub fn control(unit: Unit, register: Register, bit: u32) -> FaultSite {
        FaultSite { unit, instance: [0, 0], register, bit }
    }

    /// The class this site belongs to.
    pub fn class(&self) -> SiteClass {
        SiteClass { unit: self.unit, register: self.register }
    }

    /// Checks that the site exists on `cfg` (class present, indices and bit in range).
    pub fn validate(&self, cfg: &HwConfig) -> Result<(), HwError> {
        let c = self.class();
        let err = |why: String| HwError::BadSite { site: self.to_string(), why };
        if !CLASSES.iter().any(|i| i.class == c) {
            return Err(err(format!("unit {} has no register {:?}", self.unit.name(), self.register)));
        }
        if !c.exists(cfg) {
            return Err(err(c.absent_reason(cfg)));
        }
        let d = c.dims(cfg);
        for (k, (&i, &n)) in self.instance.iter().zip(d.iter()).take(info(c).arity).enumerate() {
            if i >= n {
                return Err(err(format!("index {k} is {i}, allowed 0..{n}")));
            }
        }
        let w = c.width(cfg);
        if self.bit >= w {
            return Err(err(format!("bit {} out of range, register is {w} bits", self.bit)));
        }
        Ok(())
    }
}

impl fmt::Display for FaultSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(i) = CLASSES.iter().find(|c| c.class == self.class()) else {
            // Only reachable for a hand-built site whose register the unit lacks.
            return write!(f, "{}.<{:?}>[{}]", self.unit.name(), self.register, self.bit);
        };
        write!(f, "{}", self.unit.name())?;
        if !i.element.is_empty() {
            write!(f, ".{}", i.element)?;
            for &x in &self.instance[..i.arity] {
                if i.hex {
                    write!(f, "[{x:#x}]")?;
                } else {
                    write!(f, "[{x}]")?;
                }
            }
        }
        if !i.reg.is_empty() {
            write!(f, ".{}", i.reg)?;
        }
        write!(f, "[{}]", self.bit)
    }
}

/// Splits `name[a][b]` into the name and its bracketed indices (decimal or 0x-hex).
fn segment(seg: &str) -> Result<(&str, Vec<u32>), String> {
    let (name, mut rest) = match seg.find('[') {
        Some(p) => (&seg[..p], &seg[p..]),
        None => (seg, ""),
    };
    let mut idx = Vec::new();
    while !rest.is_empty() {
        let close = rest.find(']').ok_or_else(|| format!("unclosed `[` in `{}`", one_line(seg)))?;
        if !rest.starts_with('[') {
            return Err(format!("unexpected text in `{}`", one_line(seg)));
        }
        let num = &rest[1..close];
        let v = if let Some(h) = num.strip_prefix("0x") { u32::from_str_radix(h, 16) } else { num.parse() }
            .map_err(|_| format!("`{}` is not an index", one_line(num)))?;
        idx.push(v);
        rest = &rest[close + 1..];
    }
    Ok((name, idx))
}

impl FromStr for FaultSite {
    type Err = HwError;
    fn from_str(text: &str) -> Result<FaultSite, HwError> {
        let err = |why: String| HwError::SiteParse { text: text.to_string(), why };
        let segs: Vec<&str> = text.split('.').collect();
        let parsed: Vec<(&str, Vec<u32>)> = segs.iter().map(|s| segment(s)).collect::<Result<_, _>>().map_err(err)?;
        let unit_name = parsed[0].0;
        for ci in CLASSES {
            if ci.class.unit.name() != unit_name {
                continue;
            }
            // Expected segment layout for this class.
            let mut layout: Vec<(&str, usize)> = vec![(unit_name, 0)];
            if !ci.element.is_empty() {
                layout.push((ci.element, ci.arity + usize::from(ci.reg.is_empty())));
            }
            if !ci.reg.is_empty() {
                layout.push((ci.reg, 1));
            }
            let fits = layout.len() == parsed.len()
                && layout.iter().zip(&parsed).all(|((n, a), (pn, pi))| n == pn && *a == pi.len());
            if !fits {
                continue;
            }
            let mut instance = [0u32; 2];
            if !ci.element.is_empty() {
                let ix = &parsed[1].1;
                instance[..ci.arity].copy_from_slice(&ix[..ci.arity]);
            }
            let bit = *parsed.last().unwrap().1.last().unwrap();
            return Ok(FaultSite { unit: ci.class.unit, instance, register: ci.class.register, bit });
        }
        let known: Vec<String> = CLASSES.iter().map(|c| format!("{}[bit]", c.class.pattern())).collect();
        Err(err(format!("no site class has this form; known forms: {}", known.join(", "))))
    }
}

/// Matches a site or class pattern against a glob where `*` matches any run of characters,
/// e.g. `mxu.pe[*][*].psum` or `mxu.pe[0][*].*`.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Dataflow;
    use faultline_num::Precision;
    use proptest::prelude::*;

    fn cfg(df: Dataflow) -> HwConfig {
        HwConfig::test_config(4, 6, df, Precision::Bf16Fp32)
    }

    #[test]
    fn text_forms_are_stable() {
        assert_eq!(FaultSite::pe(3, 5, Register::Psum, 30).to_string(), "mxu.pe[3][5].psum[30]");
        assert_eq!(FaultSite::pe(0, 7, Register::WeightShadow, 14).to_string(), "mxu.pe[0][7].weight_shadow[14]");
        assert_eq!(FaultSite::pe(2, 2, Register::Valid, 0).to_string(), "mxu.pe[2][2].valid[0]");
        assert_eq!("mxu.pe[2][2].valid[0]".parse::<FaultSite>().unwrap(), FaultSite::pe(2, 2, Register::Valid, 0));
    }

    #[test]
    fn register_names_are_the_patterns_last_segment() {
        let names: Vec<(String, &str)> = CLASSES.iter().map(|c| (c.class.pattern(), c.class.register_name())).collect();
        assert!(names.contains(&("mxu.pe[*][*].psum".into(), "psum")));
        assert!(names.contains(&("ub.word[*]".into(), "word")));
        assert!(names.contains(&("seq.acc_addr".into(), "acc_addr")));
        for (pattern, name) in names {
            let last = pattern.rsplit('.').next().unwrap();
            assert_eq!(last.split('[').next().unwrap(), name, "{pattern}");
        }
    }

    #[test]
    fn bad_text_is_a_clear_error() {
        for bad in
            ["mxu.pe[1].psum[3]", "mxu.pe[1][2].psm[3]", "gpu.x[1]", "mxu.pe[1][2].psum[", "mxu.pe[a][2].psum[1]"]
        {
            let e = bad.parse::<FaultSite>().unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn bit_counts_per_class() {
        let ws = cfg(Dataflow::WeightStationary);
        let n = 24;
        let count = |r| SiteClass { unit: Unit::Mxu, register: r }.bit_count(&ws);
        assert_eq!(count(Register::Psum), n * 32);
        assert_eq!(count(Register::Act), n * 16);
        assert_eq!(count(Register::WeightShadow), n * 16);
        assert_eq!(count(Register::Valid), n);
        assert_eq!(count(Register::WeightValid), 0, "wvalid exists only in OS");
        let os = cfg(Dataflow::OutputStationary);
        assert!(!SiteClass::all(&os).iter().any(|c| c.register == Register::WeightShadow));
        // IS is WS on the transposed problem: the same register classes.
        assert_eq!(SiteClass::all(&cfg(Dataflow::InputStationary)), SiteClass::all(&ws));
        let total: u64 = SiteClass::all(&ws).iter().filter(|c| c.unit == Unit::Mxu).map(|c| c.bit_count(&ws)).sum();
        assert_eq!(total, n * (16 + 1 + 1 + 16 + 16 + 32));
    }

    #[test]
    fn memory_and_control_sites() {
        let c = cfg(Dataflow::WeightStationary);
        assert_eq!(FaultSite::word(Unit::Ub, 0x1f40, 7).to_string(), "ub.word[0x1f40][7]");
        assert_eq!(FaultSite::word(Unit::Acc, 12, 31).to_string(), "acc.word[0xc][31]");
        assert_eq!("acc.word[12][31]".parse::<FaultSite>().unwrap(), FaultSite::word(Unit::Acc, 12, 31));
        assert_eq!(FaultSite::lane(3, Register::OpB, 7).to_string(), "vpu.lane[3].b[7]");
        assert_eq!(FaultSite::control(Unit::Seq, Register::AccAddr, 2).to_string(), "seq.acc_addr[2]");
        assert_eq!(
            "dma.src_addr[31]".parse::<FaultSite>().unwrap(),
            FaultSite::control(Unit::Dma, Register::SrcAddr, 31)
        );
        let ub = SiteClass { unit: Unit::Ub, register: Register::Word };
        assert_eq!(ub.kind(), SiteKind::Sram);
        assert_eq!(ub.bit_count(&c), (1 << 20) * 8);
        assert_eq!(ub.pattern(), "ub.word[*]");
        // 1 MiB of 32-bit words = 2^18 words -> 18 address bits.
        assert_eq!(SiteClass { unit: Unit::Seq, register: Register::AccAddr }.width(&c), 18);
        assert!(FaultSite::word(Unit::Ub, 1 << 18, 0).validate(&c).is_err());
        let e = FaultSite::word(Unit::Dram, 0, 0).validate(&c).unwrap_err().to_string();
        assert!(e.contains("fault_sites"), "{e}");
        assert!(FaultSite { unit: Unit::Ub, instance: [0, 0], register: Register::Psum, bit: 0 }.validate(&c).is_err());
        let mut d = c.clone();
        d.dram.fault_sites = true;
        let dram = SiteClass { unit: Unit::Dram, register: Register::Word };
        assert_eq!(dram.bit_count(&c), 0);
        assert_eq!(dram.bit_count(&d), d.dram.bytes * 8);
        assert!(SiteClass::all(&d).contains(&dram) && !SiteClass::all(&c).contains(&dram));
        assert_eq!(addr_bits(1), 1);
        assert_eq!(addr_bits(4096), 12);
        assert_eq!(addr_bits(4097), 13);
    }

    #[test]
    fn validate_rejects_out_of_range() {
        let c = cfg(Dataflow::WeightStationary);
        assert!(FaultSite::pe(3, 5, Register::Psum, 31).validate(&c).is_ok());
        assert!(FaultSite::pe(4, 0, Register::Psum, 0).validate(&c).is_err());
        assert!(FaultSite::pe(0, 0, Register::Act, 16).validate(&c).is_err());
        assert!(FaultSite::pe(0, 0, Register::WeightValid, 0).validate(&c).is_err());
    }

    #[test]
    fn globbing() {
        assert!(glob_match("mxu.pe[*][*].psum", "mxu.pe[*][*].psum"));
        assert!(glob_match("mxu.pe[0][*].*", "mxu.pe[0][3].psum[2]"));
        assert!(!glob_match("mxu.pe[*][*].psum", "mxu.pe[*][*].act"));
        assert!(glob_match("*shadow*", "mxu.pe[*][*].weight_shadow"));
    }

    proptest! {
        #[test]
        fn every_site_roundtrips_through_text(idx in any::<u64>()) {
            for df in [Dataflow::WeightStationary, Dataflow::OutputStationary, Dataflow::InputStationary] {
                let mut c = cfg(df);
                c.dram.fault_sites = df == Dataflow::OutputStationary;
                for class in SiteClass::all(&c) {
                    let s = class.site_at(&c, idx % class.bit_count(&c)).unwrap();
                    prop_assert!(s.validate(&c).is_ok());
                    prop_assert_eq!(s.to_string().parse::<FaultSite>().unwrap(), s);
                    prop_assert_eq!(s.class(), class);
                }
            }
        }
    }
}
