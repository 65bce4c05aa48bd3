//! Hardware configuration, loaded from RON (`configs/tpu-*.ron`).
//!
//! Every field is typed and documented with its unit and its allowed range, which
//! [`HwConfig::validate`] enforces (naming file, field, value and range), so that every cycle and
//! byte count the machine derives from a valid config fits 64 bits. Unknown fields are rejected
//! so that a typo never silently falls back to a default. Files are read with a size cap
//! ([`crate::files::TEXT_FILE_LIMIT`]).

use crate::error::{one_line, ConfigError};
use crate::files::{parse_ron, read_ron};
use faultline_num::{NumFormat, Precision};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Dataflow of the systolic array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Dataflow {
    /// Weights held in PEs (double-buffered via shadow registers); activations flow right,
    /// partial sums flow down into the accumulators.
    WeightStationary,
    /// Partial sums held in PEs; activations flow right, weights flow down; results drain
    /// down the columns after each tile.
    OutputStationary,
    /// Inputs (activations) held in PEs: weight-stationary on the transposed problem
    /// (`out^T = W^T * A^T`). A tile of `A` sits in the weight and shadow registers, the
    /// columns of `W` flow right, partial sums flow down into the accumulators.
    InputStationary,
}

impl Dataflow {
    /// Short name used on the command line (`ws`, `os`, `is`).
    pub const fn short(self) -> &'static str {
        match self {
            Dataflow::WeightStationary => "ws",
            Dataflow::OutputStationary => "os",
            Dataflow::InputStationary => "is",
        }
    }

    /// Whether the array holds an operand in its (double-buffered) weight registers and passes
    /// partial sums down into the accumulators: WS, and IS (which is WS on the transposed
    /// problem). These dataflows have the `swap` and `weight_shadow` registers.
    pub const fn stationary_operand(self) -> bool {
        matches!(self, Dataflow::WeightStationary | Dataflow::InputStationary)
    }
}

/// The matrix unit (systolic array).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MxuConfig {
    /// PE rows (the reduction/K dimension in WS and IS). Count, 1..=1024.
    pub rows: usize,
    /// PE columns (the output/N dimension; in IS the output rows, M). Count, 1..=1024.
    pub cols: usize,
    /// Dataflow the array implements: `WeightStationary`, `OutputStationary` or
    /// `InputStationary`.
    pub dataflow: Dataflow,
    /// Format of activation and weight registers: Bf16, Fp32 or Int8.
    pub input_format: NumFormat,
    /// Format of partial sums and accumulators: Fp32 (with Bf16/Fp32 inputs) or Int32 (with Int8);
    /// no other pair.
    pub acc_format: NumFormat,
}

impl MxuConfig {
    /// The validated (input, accumulator) pair. Panics only if `validate` was skipped.
    pub fn precision(&self) -> Precision {
        Precision::from_formats(self.input_format, self.acc_format)
            .expect("MxuConfig::precision on an unvalidated config")
    }
}

/// The vector unit (elementwise ops, reductions, optimizer updates in fp32).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VpuConfig {
    /// Number of lanes (elements processed per vector instruction). Count, 1..=4096.
    pub lanes: usize,
    /// Cycles from the ALU reading the operand registers to the result register latching
    /// (the ALU's internal pipeline; those internal stages are not fault sites). Cycles, 1..=64.
    pub pipeline_depth: u64,
}

/// One on-chip SRAM array. Each word holds one element (low bits used), so an element and its
/// word are the same thing for fault injection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SramConfig {
    /// Capacity. Bytes; must be a whole number of words, 1 KiB..=1 GiB.
    pub bytes: u64,
    /// Word width. Bits: 8, 16 or 32 (at least the width of the elements stored in it).
    pub word_bits: u32,
    /// Independently addressable banks. Count, 1..=1024.
    pub banks: u32,
    /// Read ports per bank (one word per port per cycle). Count, 1..=4.
    pub read_ports: u32,
    /// Write ports per bank (one word per port per cycle). Count, 1..=4.
    pub write_ports: u32,
}

impl SramConfig {
    /// Bytes per word.
    pub fn word_bytes(&self) -> u64 {
        (self.word_bits / 8) as u64
    }
    /// Number of words.
    pub fn words(&self) -> u64 {
        self.bytes / self.word_bytes()
    }
    /// Peak write bandwidth of the array, bytes per cycle (`banks * write_ports * word_bytes`).
    pub fn write_bytes_per_cycle(&self) -> f64 {
        (self.banks as u64 * self.write_ports as u64 * self.word_bytes()) as f64
    }
    /// Peak read bandwidth of the array, bytes per cycle (`banks * read_ports * word_bytes`).
    pub fn read_bytes_per_cycle(&self) -> f64 {
        (self.banks as u64 * self.read_ports as u64 * self.word_bytes()) as f64
    }
}

/// The on-chip memories.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Unified buffer: activations and VPU operands (fp32 VPU data needs 32-bit words).
    /// `word_bits` at least `mxu.input_format`'s width; `banks * read_ports >= mxu.rows` (one
    /// activation per array row per cycle).
    pub unified_buffer: SramConfig,
    /// Accumulator SRAM: MXU outputs in the accumulator format. `word_bits` 32;
    /// `banks * write_ports >= mxu.cols` (one output per array column per cycle).
    pub accumulator: SramConfig,
    /// Weight buffer / FIFO feeding the MXU shadow registers; holds whole weight tiles
    /// (`rows * cols` words each), two of them for double buffering. At least one tile's bytes;
    /// `word_bits` at least `mxu.input_format`'s width; `banks * read_ports >= mxu.cols` (one
    /// weight per array column per cycle).
    pub weight_buffer: SramConfig,
}

impl MemoryConfig {
    /// The SRAM of memory unit `unit` (`Ub`, `Acc` or `Wbuf`); `None` for any other unit.
    pub fn sram(&self, unit: crate::Unit) -> Option<&SramConfig> {
        match unit {
            crate::Unit::Ub => Some(&self.unified_buffer),
            crate::Unit::Acc => Some(&self.accumulator),
            crate::Unit::Wbuf => Some(&self.weight_buffer),
            _ => None,
        }
    }
}

/// Off-chip DRAM / HBM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DramConfig {
    /// Capacity. Bytes, 1 MiB..=8 GiB, a multiple of 4 (32-bit words; word addresses fit a
    /// 32-bit register).
    pub bytes: u64,
    /// Sustained bandwidth. Bytes per core cycle, 0.01..=2^20 (1048576), or `inf` (no
    /// bandwidth limit). The floor keeps `ceil(bytes / bw)` of the largest transfer far below
    /// 2^64 cycles; the ceiling is far above any SRAM's ports (at most 16 KiB per cycle).
    pub bandwidth_bytes_per_cycle: f64,
    /// Latency from a DMA transfer's start to its first word arriving. Cycles, 0..=1000000.
    pub latency_cycles: u64,
    /// Whether DRAM words are fault sites (`dram.word[addr][bit]`); off in the shipped configs
    /// because DRAM is usually ECC-protected.
    pub fault_sites: bool,
}

/// The DMA engine moving tiles between DRAM and the SRAMs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DmaConfig {
    /// Fixed cost of starting one transfer (descriptor fetch, address setup), added to the
    /// DRAM latency. Cycles, 0..=1000000.
    pub setup_cycles: u64,
    /// Tile buffers per SRAM for prefetching: 1 = no overlap, 2 = double buffering. Count, 1..=2.
    pub buffers: usize,
}

/// Largest allowed [`MxuConfig::rows`] and [`MxuConfig::cols`].
pub const MAX_ARRAY_DIM: usize = 1024;
/// Longest allowed [`HwConfig::name`], characters.
pub const NAME_MAX_CHARS: usize = 64;
/// Allowed [`HwConfig::clock_mhz`], MHz.
pub const CLOCK_MHZ: std::ops::RangeInclusive<f64> = 1.0..=100_000.0;
/// Allowed finite [`DramConfig::bandwidth_bytes_per_cycle`], bytes per cycle (`inf` is allowed
/// too).
pub const DRAM_BANDWIDTH: std::ops::RangeInclusive<f64> = 0.01..=1_048_576.0;
/// Largest allowed [`DramConfig::latency_cycles`] and [`DmaConfig::setup_cycles`]: a million
/// cycles (a millisecond at 1 GHz), far above any real memory system.
pub const MAX_FIXED_CYCLES: u64 = 1_000_000;

/// One of the SRAMs that feed the array.
#[derive(Debug, Clone, Copy)]
enum Feeding {
    UnifiedBuffer,
    Accumulator,
    WeightBuffer,
}

impl Feeding {
    fn of(self, m: &MemoryConfig) -> &SramConfig {
        match self {
            Feeding::UnifiedBuffer => &m.unified_buffer,
            Feeding::Accumulator => &m.accumulator,
            Feeding::WeightBuffer => &m.weight_buffer,
        }
    }
    fn of_mut(self, m: &mut MemoryConfig) -> &mut SramConfig {
        match self {
            Feeding::UnifiedBuffer => &mut m.unified_buffer,
            Feeding::Accumulator => &mut m.accumulator,
            Feeding::WeightBuffer => &mut m.weight_buffer,
        }
    }
    fn field(self) -> &'static str {
        match self {
            Feeding::UnifiedBuffer => "memory.unified_buffer",
            Feeding::Accumulator => "memory.accumulator",
            Feeding::WeightBuffer => "memory.weight_buffer",
        }
    }
}

/// The ports of an SRAM that a feed uses.
#[derive(Debug, Clone, Copy)]
enum Ports {
    Read,
    Write,
}

impl Ports {
    fn of(self, s: &SramConfig) -> u32 {
        match self {
            Ports::Read => s.read_ports,
            Ports::Write => s.write_ports,
        }
    }
}

/// Words per cycle the array takes from (or gives to) one SRAM at full rate.
struct Feed {
    sram: Feeding,
    ports: Ports,
    words: usize,
    why: &'static str,
}

/// The whole machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HwConfig {
    /// Human-readable name, e.g. `tpu-32x32`: 1..=64 characters, no control characters (it is
    /// printed in reports and one-line messages).
    pub name: String,
    /// Core clock in MHz (used to turn cycles into seconds), 1..=100000 (1 MHz to 100 GHz).
    pub clock_mhz: f64,
    /// The matrix unit.
    pub mxu: MxuConfig,
    /// The vector unit.
    pub vpu: VpuConfig,
    /// On-chip SRAMs.
    pub memory: MemoryConfig,
    /// Off-chip memory.
    pub dram: DramConfig,
    /// The DMA engine.
    pub dma: DmaConfig,
    /// How the compiler places a training step's buffers in the SRAMs (optional; omitted:
    /// first-fit words, stored values loaded back).
    #[serde(default, skip_serializing_if = "PlacementConfig::is_default")]
    pub placement: PlacementConfig,
}

/// How the step's buffers get SRAM words: what a real compiler for the machine would do. It
/// changes the step's cycles and which words hold what when, so the SRAM classes'
/// vulnerability, never a value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// Read a value the step keeps in DRAM (the logits, the next optimizer state) from the
    /// on-chip copy it was written in and stored from, instead of loading it back. The copy
    /// then lives until its last reader. `false` (the default): every later reader loads it.
    #[serde(default)]
    pub forward_stored: bool,
    /// Which free words a buffer takes: `FirstFit` (the default: the lowest that fit) or
    /// `LeastRecentlyUsed` (those last used the earliest, so a buffer need not wait for a store
    /// still reading its words out; kept only where the step gets faster than first fit).
    #[serde(default)]
    pub words: WordChoice,
}

/// Which free SRAM words a buffer takes ([`PlacementConfig::words`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum WordChoice {
    /// The lowest free words that fit.
    #[default]
    FirstFit,
    /// The free words last used the earliest, where that makes the step faster.
    LeastRecentlyUsed,
}

impl PlacementConfig {
    /// Whether this is the default placement (not written out).
    pub fn is_default(&self) -> bool {
        *self == PlacementConfig::default()
    }
}

impl HwConfig {
    /// Reads, parses and validates a config file.
    pub fn load(path: impl AsRef<Path>) -> Result<HwConfig, ConfigError> {
        let path = path.as_ref();
        let cfg: HwConfig = read_ron(path, |source| ConfigError::Io { file: path.to_path_buf(), source })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Parses and validates RON text; `file` is only used in error messages.
    pub fn from_ron(text: &str, file: impl AsRef<Path>) -> Result<HwConfig, ConfigError> {
        let file = file.as_ref();
        let cfg: HwConfig = parse_ron(text, file)?;
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// Checks value ranges that the type system cannot express.
    pub fn validate(&self, file: &Path) -> Result<(), ConfigError> {
        let bad = |field: &str, value: String, allowed: &str| ConfigError::Invalid {
            file: file.to_path_buf(),
            field: field.into(),
            value,
            allowed: allowed.into(),
        };
        let chars = self.name.chars().count();
        if !(1..=NAME_MAX_CHARS).contains(&chars) || self.name.chars().any(char::is_control) {
            return Err(bad(
                "name",
                format!("\"{}\" ({chars} characters)", one_line(&self.name)),
                &format!("allowed: 1 to {NAME_MAX_CHARS} characters, no control characters"),
            ));
        }
        if !CLOCK_MHZ.contains(&self.clock_mhz) {
            return Err(bad(
                "clock_mhz",
                format!("{:?}", self.clock_mhz),
                &format!("allowed: {:?} to {:?} MHz", CLOCK_MHZ.start(), CLOCK_MHZ.end()),
            ));
        }
        if !(1..=MAX_ARRAY_DIM).contains(&self.mxu.rows) {
            return Err(bad("mxu.rows", self.mxu.rows.to_string(), &format!("allowed: 1 to {MAX_ARRAY_DIM}")));
        }
        if !(1..=MAX_ARRAY_DIM).contains(&self.mxu.cols) {
            return Err(bad("mxu.cols", self.mxu.cols.to_string(), &format!("allowed: 1 to {MAX_ARRAY_DIM}")));
        }
        if Precision::from_formats(self.mxu.input_format, self.mxu.acc_format).is_none() {
            return Err(bad(
                "mxu.acc_format",
                format!("{:?} with input_format {:?}", self.mxu.acc_format, self.mxu.input_format),
                "allowed pairs (input_format, acc_format): (Bf16, Fp32), (Fp32, Fp32), (Int8, Int32)",
            ));
        }
        if !(1..=4096).contains(&self.vpu.lanes) {
            return Err(bad("vpu.lanes", self.vpu.lanes.to_string(), "allowed: 1 to 4096"));
        }
        if !(1..=64).contains(&self.vpu.pipeline_depth) {
            return Err(bad("vpu.pipeline_depth", self.vpu.pipeline_depth.to_string(), "allowed: 1 to 64 cycles"));
        }
        let m = &self.memory;
        let elem_in = self.mxu.input_format.bits();
        for (name, s, min_bits) in [
            ("memory.unified_buffer", &m.unified_buffer, elem_in),
            ("memory.accumulator", &m.accumulator, 32),
            ("memory.weight_buffer", &m.weight_buffer, elem_in),
        ] {
            if ![8, 16, 32].contains(&s.word_bits) || s.word_bits < min_bits {
                return Err(bad(
                    &format!("{name}.word_bits"),
                    s.word_bits.to_string(),
                    &format!("allowed: 8, 16 or 32, and at least {min_bits} (the elements it stores)"),
                ));
            }
            if !(1024..=1 << 30).contains(&s.bytes) || s.bytes % s.word_bytes() != 0 {
                return Err(bad(
                    &format!("{name}.bytes"),
                    s.bytes.to_string(),
                    "allowed: 1024 to 2^30 bytes, a whole number of words",
                ));
            }
            if !(1..=1024).contains(&s.banks) {
                return Err(bad(&format!("{name}.banks"), s.banks.to_string(), "allowed: 1 to 1024"));
            }
            if !(1..=4).contains(&s.read_ports) {
                return Err(bad(&format!("{name}.read_ports"), s.read_ports.to_string(), "allowed: 1 to 4"));
            }
            if !(1..=4).contains(&s.write_ports) {
                return Err(bad(&format!("{name}.write_ports"), s.write_ports.to_string(), "allowed: 1 to 4"));
            }
        }
        for f in self.feeds() {
            let s = f.sram.of(m);
            let ports = f.ports.of(s);
            let words = s.banks as usize * ports as usize;
            if words < f.words {
                return Err(bad(
                    &format!("{}.banks", f.sram.field()),
                    format!("{} (x {ports} ports = {words} words per cycle)", s.banks),
                    &format!("allowed: banks * ports >= {} = {}", f.words, f.why),
                ));
            }
        }
        let tile = (self.mxu.rows * self.mxu.cols) as u64;
        if m.weight_buffer.words() < tile {
            return Err(bad(
                "memory.weight_buffer.bytes",
                m.weight_buffer.bytes.to_string(),
                &format!(
                    "allowed: at least one {}x{} weight tile = {} bytes",
                    self.mxu.rows,
                    self.mxu.cols,
                    tile * m.weight_buffer.word_bytes()
                ),
            ));
        }
        if !(1 << 20..=1 << 33).contains(&self.dram.bytes) || !self.dram.bytes.is_multiple_of(4) {
            return Err(bad("dram.bytes", self.dram.bytes.to_string(), "allowed: 2^20 to 2^33 bytes, a multiple of 4"));
        }
        let bw = self.dram.bandwidth_bytes_per_cycle;
        if !(DRAM_BANDWIDTH.contains(&bw) || bw == f64::INFINITY) {
            return Err(bad(
                "dram.bandwidth_bytes_per_cycle",
                format!("{bw:?}"),
                &format!("allowed: {:?} to {:?} bytes per cycle, or inf", DRAM_BANDWIDTH.start(), DRAM_BANDWIDTH.end()),
            ));
        }
        for (field, v) in
            [("dram.latency_cycles", self.dram.latency_cycles), ("dma.setup_cycles", self.dma.setup_cycles)]
        {
            if v > MAX_FIXED_CYCLES {
                return Err(bad(field, v.to_string(), &format!("allowed: 0 to {MAX_FIXED_CYCLES} cycles")));
            }
        }
        if !(1..=2).contains(&self.dma.buffers) {
            return Err(bad(
                "dma.buffers",
                self.dma.buffers.to_string(),
                "allowed: 1 (no overlap) or 2 (double buffering)",
            ));
        }
        Ok(())
    }

    /// What the array asks of the SRAMs each cycle: one activation per row, one accumulator
    /// word per column and one weight per column (the MXU schedule assumes full rate).
    fn feeds(&self) -> [Feed; 3] {
        [
            Feed {
                sram: Feeding::UnifiedBuffer,
                ports: Ports::Read,
                words: self.mxu.rows,
                why: "mxu.rows: one activation per array row per cycle",
            },
            Feed {
                sram: Feeding::Accumulator,
                ports: Ports::Write,
                words: self.mxu.cols,
                why: "mxu.cols: one output per array column per cycle",
            },
            Feed {
                sram: Feeding::WeightBuffer,
                ports: Ports::Read,
                words: self.mxu.cols,
                why: "mxu.cols: one weight per array column per cycle",
            },
        ]
    }

    /// Raises what the array's size requires of the memories to the least [`HwConfig::validate`]
    /// accepts: each feeding SRAM's banks, so its ports keep up with the array, and the weight
    /// buffer's size, to one whole `rows x cols` tile. For a machine whose array is given from
    /// elsewhere (a SCALE-Sim config) on a base machine's memories. Returns one line per change
    /// (field, old and new value, why); valid memories are left as they are.
    pub fn fit_memories_to_array(&mut self) -> Vec<String> {
        let mut changes = Vec::new();
        for f in self.feeds() {
            let s = f.sram.of_mut(&mut self.memory);
            let ports = f.ports.of(s).max(1);
            let need = f.words.div_ceil(ports as usize) as u32;
            if s.banks < need {
                changes.push(format!(
                    "{}.banks {} -> {need}, so that banks * ports >= {} ({})",
                    f.sram.field(),
                    s.banks,
                    f.words,
                    f.why
                ));
                s.banks = need;
            }
        }
        let wb = &mut self.memory.weight_buffer;
        let tile = (self.mxu.rows * self.mxu.cols) as u64 * wb.word_bytes();
        if wb.bytes < tile {
            changes.push(format!(
                "memory.weight_buffer.bytes {} -> {tile}, one {}x{} weight tile",
                wb.bytes, self.mxu.rows, self.mxu.cols
            ));
            wb.bytes = tile;
        }
        changes
    }

    /// A small in-memory config for tests and examples.
    pub fn test_config(rows: usize, cols: usize, dataflow: Dataflow, precision: Precision) -> HwConfig {
        // One bank per array row/column (at least 8), so the array is fed at full rate.
        let banks = rows.max(cols).clamp(8, 1024) as u32;
        HwConfig {
            name: format!("test-{rows}x{cols}"),
            clock_mhz: 1000.0,
            mxu: MxuConfig { rows, cols, dataflow, input_format: precision.input(), acc_format: precision.acc() },
            vpu: VpuConfig { lanes: cols.max(1), pipeline_depth: 1 },
            memory: MemoryConfig {
                unified_buffer: SramConfig { bytes: 1 << 20, word_bits: 32, banks, read_ports: 1, write_ports: 1 },
                accumulator: SramConfig { bytes: 1 << 20, word_bits: 32, banks, read_ports: 1, write_ports: 1 },
                weight_buffer: SramConfig { bytes: 1 << 20, word_bits: 32, banks, read_ports: 1, write_ports: 1 },
            },
            // Unlimited bandwidth and zero latency: op time equals compute time by default.
            dram: DramConfig {
                bytes: 1 << 30,
                bandwidth_bytes_per_cycle: f64::INFINITY,
                latency_cycles: 0,
                fault_sites: false,
            },
            dma: DmaConfig { setup_cycles: 0, buffers: 2 },
            placement: PlacementConfig::default(),
        }
    }
}

/// Placeholder path used in errors for configs not read from a file.
pub fn inline_path() -> PathBuf {
    PathBuf::from("<inline>")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::TEXT_FILE_LIMIT;

    const GOOD: &str = r#"(
        name: "t",
        clock_mhz: 940.0,
        mxu: (rows: 4, cols: 8, dataflow: WeightStationary, input_format: Bf16, acc_format: Fp32),
        vpu: (lanes: 8, pipeline_depth: 2),
        memory: (
            unified_buffer: (bytes: 65536, word_bits: 32, banks: 4, read_ports: 1, write_ports: 1),
            accumulator: (bytes: 16384, word_bits: 32, banks: 8, read_ports: 1, write_ports: 1),
            weight_buffer: (bytes: 4096, word_bits: 16, banks: 2, read_ports: 4, write_ports: 1),
        ),
        dram: (bytes: 1048576, bandwidth_bytes_per_cycle: 16.0, latency_cycles: 100, fault_sites: false),
        dma: (setup_cycles: 4, buffers: 2),
    )"#;

    #[test]
    fn parses_a_good_config() {
        let c = HwConfig::from_ron(GOOD, "good.ron").unwrap();
        assert_eq!((c.mxu.rows, c.mxu.cols), (4, 8));
        assert_eq!(c.mxu.precision(), Precision::Bf16Fp32);
    }

    #[test]
    fn unknown_field_names_file_line_and_field() {
        let text = GOOD.replace("rows: 4,", "rows: 4, rowz: 3,");
        let e = HwConfig::from_ron(&text, "cfg/bad.ron").unwrap_err().to_string();
        assert!(e.starts_with("cfg/bad.ron:4:"), "{e}");
        assert!(e.contains("rowz"), "{e}");
    }

    #[test]
    fn bad_enum_value_lists_allowed_values() {
        let text = GOOD.replace("WeightStationary", "RowStationary");
        let e = HwConfig::from_ron(&text, "x.ron").unwrap_err().to_string();
        assert!(e.contains("RowStationary") && e.contains("WeightStationary"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_field() {
        let e = HwConfig::from_ron(&GOOD.replace("rows: 4", "rows: 0"), "x.ron").unwrap_err().to_string();
        assert!(e.contains("mxu.rows") && e.contains("1 to 1024"), "{e}");
        let e = HwConfig::from_ron(&GOOD.replace("Fp32)", "Int32)"), "x.ron").unwrap_err().to_string();
        assert!(e.contains("mxu.acc_format") && e.contains("(Int8, Int32)"), "{e}");
        let e = HwConfig::from_ron(&GOOD.replace("word_bits: 16", "word_bits: 8"), "x.ron").unwrap_err().to_string();
        assert!(
            e.contains("x.ron") && e.contains("memory.weight_buffer.word_bits") && e.contains("at least 16"),
            "{e}"
        );
        let e = HwConfig::from_ron(&GOOD.replace("buffers: 2", "buffers: 3"), "x.ron").unwrap_err().to_string();
        assert!(e.contains("dma.buffers") && e.contains("double buffering"), "{e}");
        let e = HwConfig::from_ron(&GOOD.replace("16.0", "0.0"), "x.ron").unwrap_err().to_string();
        assert!(e.contains("dram.bandwidth_bytes_per_cycle"), "{e}");
        let e = HwConfig::from_ron(&GOOD.replace("banks: 2, read_ports: 4", "banks: 1, read_ports: 4"), "x.ron")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("memory.weight_buffer.banks") && e.contains(">= 8") && e.contains("4 words per cycle"),
            "{e}"
        );
        let e = HwConfig::from_ron(&GOOD.replace("lanes: 8", "lanes: 0"), "x.ron").unwrap_err().to_string();
        assert!(e.contains("vpu.lanes") && e.contains("1 to 4096"), "{e}");
    }

    /// Every field without a range before (name, clock, DRAM bandwidth and latency, DMA setup)
    /// now has one, enforced with an error naming file, field, value and range.
    #[test]
    fn every_field_has_a_range() {
        let long = format!("name: \"{}\"", "x".repeat(65));
        for (from, to, field, allowed) in [
            ("name: \"t\"", "name: \"\"", "name", "1 to 64 characters"),
            ("name: \"t\"", long.as_str(), "name", "1 to 64 characters"),
            ("name: \"t\"", "name: \"a\\nb\"", "name", "no control characters"),
            ("clock_mhz: 940.0", "clock_mhz: 0.0", "clock_mhz", "1.0 to 100000.0 MHz"),
            ("clock_mhz: 940.0", "clock_mhz: 1e300", "clock_mhz", "1.0 to 100000.0 MHz"),
            ("clock_mhz: 940.0", "clock_mhz: NaN", "clock_mhz", "1.0 to 100000.0 MHz"),
            ("clock_mhz: 940.0", "clock_mhz: inf", "clock_mhz", "1.0 to 100000.0 MHz"),
            ("16.0", "1e-17", "dram.bandwidth_bytes_per_cycle", "0.01 to 1048576.0 bytes per cycle, or inf"),
            ("16.0", "2e6", "dram.bandwidth_bytes_per_cycle", "or inf"),
            ("16.0", "-inf", "dram.bandwidth_bytes_per_cycle", "or inf"),
            ("16.0", "NaN", "dram.bandwidth_bytes_per_cycle", "or inf"),
            (
                "latency_cycles: 100",
                "latency_cycles: 18446744073709551615",
                "dram.latency_cycles",
                "0 to 1000000 cycles",
            ),
            ("latency_cycles: 100", "latency_cycles: 1000001", "dram.latency_cycles", "0 to 1000000 cycles"),
            ("setup_cycles: 4", "setup_cycles: 18446744073709551615", "dma.setup_cycles", "0 to 1000000 cycles"),
        ] {
            assert!(GOOD.contains(from), "{from}");
            let e = HwConfig::from_ron(&GOOD.replacen(from, to, 1), "cfg/x.ron").unwrap_err().to_string();
            assert!(e.starts_with("cfg/x.ron: field `") && e.contains(field) && e.contains(allowed), "{to}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        // The ends of each range are allowed.
        for (from, to) in [
            ("clock_mhz: 940.0", "clock_mhz: 1.0"),
            ("clock_mhz: 940.0", "clock_mhz: 100000.0"),
            ("16.0", "0.01"),
            ("16.0", "1048576.0"),
            ("latency_cycles: 100", "latency_cycles: 1000000"),
            ("latency_cycles: 100", "latency_cycles: 0"),
            ("setup_cycles: 4", "setup_cycles: 1000000"),
        ] {
            HwConfig::from_ron(&GOOD.replacen(from, to, 1), "x.ron").unwrap_or_else(|e| panic!("{to}: {e}"));
        }
        let e = HwConfig::from_ron(&GOOD.replacen("name: \"t\"", &format!("name: \"{}\"", "é".repeat(64)), 1), "x")
            .map(|c| c.name.chars().count());
        assert_eq!(e.unwrap(), 64, "the limit counts characters, not bytes");
    }

    #[test]
    fn loading_is_capped_and_names_the_file() {
        let e = HwConfig::load("/dev/zero").unwrap_err();
        let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(
            text.starts_with("/dev/zero: cannot read hardware config: a character device, not a regular file"),
            "{text}"
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.ron");
        let mut big = GOOD.to_string();
        big.push_str(&" ".repeat(TEXT_FILE_LIMIT as usize));
        std::fs::write(&p, big).unwrap();
        assert!(HwConfig::load(&p).is_err(), "a config past the cap is refused even if it would parse");
    }

    #[test]
    fn infinite_bandwidth_parses() {
        let c = HwConfig::from_ron(&GOOD.replace("16.0", "inf"), "x.ron").unwrap();
        assert!(c.dram.bandwidth_bytes_per_cycle.is_infinite());
    }

    #[test]
    fn shipped_configs_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        for name in ["tpu-8x8.ron", "tpu-32x32.ron", "tpu-128x128.ron"] {
            HwConfig::load(dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn memories_fit_to_any_array_validate() {
        let good = HwConfig::from_ron(GOOD, "x.ron").unwrap();
        assert!(good.clone().fit_memories_to_array().is_empty(), "a valid machine is left as it is");
        for (rows, cols) in [(1, 1), (4, 8), (64, 64), (128, 128), (1024, 3), (1024, 1024)] {
            let mut c = good.clone();
            (c.mxu.rows, c.mxu.cols) = (rows, cols);
            let changes = c.fit_memories_to_array();
            c.validate(Path::new("x.ron")).unwrap_or_else(|e| panic!("{rows}x{cols}: {e}"));
            assert!(c.fit_memories_to_array().is_empty(), "{rows}x{cols}: one fit is enough");
            // The least that validates: one bank fewer would not (weight buffer: 4 read ports).
            assert_eq!(c.memory.unified_buffer.banks as usize, rows.max(4), "{rows}x{cols}");
            assert_eq!(c.memory.weight_buffer.banks as usize, cols.div_ceil(4).max(2), "{rows}x{cols}");
            assert_eq!(c.memory.weight_buffer.bytes, (rows * cols * 2).max(4096) as u64, "{rows}x{cols}");
            if rows == 128 {
                assert!(changes.contains(
                    &"memory.unified_buffer.banks 4 -> 128, so that banks * ports >= 128 \
                         (mxu.rows: one activation per array row per cycle)"
                        .to_string()
                ));
            }
        }
    }
}
