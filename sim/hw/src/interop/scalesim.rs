//! SCALE-Sim interoperability: its run config (an INI `.cfg`) and topology CSVs read as they
//! are, each layer's GEMM as SCALE-Sim maps it, and SCALE-Sim's own counts for that mapping.
//!
//! # SCALE-Sim's mapping
//!
//! A conv layer (`Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels,
//! Num Filter, Strides,`) is the GEMM of its im2col matrix: `M` output pixels
//! (`ceil((H - Fh + S) / S) * ceil((W - Fw + S) / S)`), `K = Fh * Fw * C` (the window), `N`
//! filters. A GEMM topology (`Layer, M, N, K,`) is that directly. Rows end with a comma, so the
//! last field is empty; a depth-wise row (`DP` in its name) is one layer per channel.
//! (`scalesim/topology_utils.py`.)
//!
//! Each dataflow lays the GEMM on the `R x C` array as `(Sr, Sc, T)`, the rows and columns a
//! fold maps and the cycles it streams (`topology_utils.calc_spatio_temporal_params`):
//!
//! ```text
//! OS: Sr = M, Sc = N, T = K      WS: Sr = K, Sc = N, T = M      IS: Sr = K, Sc = M, T = N
//! ```
//!
//! # SCALE-Sim's counts (its `CALC` bandwidth mode: no stalls)
//!
//! With `F = ceil(Sr/R) * ceil(Sc/C)` folds, each padded to the full array and none overlapping
//! (`scalesim/compute/systolic_compute_{os,ws,is}.py`):
//!
//! ```text
//! Total Cycles        OS: F * (T + R + C - 2) - 1      WS, IS: F * (T + 2R + C - 2) - 1
//! Overall Util %      100 * M*K*N / (Total Cycles * R*C)
//! Mapping Efficiency  100 * Sr*Sc / (F * R*C)                 (the folds' mean used share)
//! Compute Util %      Mapping Efficiency * T / L,  L = OS: T + R + C - 2;  WS, IS: T + 2R + 2C - 3
//! IFMAP SRAM Reads    OS, WS: M*K*ceil(N/C)    IS: M*K
//! Filter SRAM Reads   OS: K*N*ceil(M/R)        WS: K*N       IS: K*N*ceil(M/C)
//! OFMAP SRAM Writes   OS: M*N + F*(R + C)      WS: M*N*ceil(K/R)   IS: M*N*ceil(K/R)
//! ```
//!
//! "Total Cycles" is the index of the last cycle, not a count (hence the `- 1`). The OS
//! `F * (R + C)` term is what SCALE-Sim adds: `systolic_compute_os.py` counts each fold's
//! flipped output block by `shape[0] + shape[1]` on top of its `shape[0] * shape[1]` writes
//! (line 403). It is reproduced because these are SCALE-Sim's numbers; Faultline's own access
//! counts are the ones its memories record.

use crate::config::{Dataflow, DRAM_BANDWIDTH, NAME_MAX_CHARS};
use crate::error::{one_line, ConfigError};
use crate::files::{read_text_capped, TEXT_FILE_LIMIT};
use crate::HwConfig;
use std::path::{Path, PathBuf};

/// A SCALE-Sim run config, the fields Faultline uses.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleSimConfig {
    /// `general.run_name`.
    pub run_name: String,
    /// `architecture_presets.ArrayHeight`: PE rows.
    pub rows: usize,
    /// `architecture_presets.ArrayWidth`: PE columns.
    pub cols: usize,
    /// `architecture_presets.IfmapSramSzkB`.
    pub ifmap_kb: u64,
    /// `architecture_presets.FilterSramSzkB`.
    pub filter_kb: u64,
    /// `architecture_presets.OfmapSramSzkB`.
    pub ofmap_kb: u64,
    /// `architecture_presets.Dataflow`: `ws`, `os` or `is`.
    pub dataflow: Dataflow,
    /// `run_presets.InterfaceBandwidth = USER`: `architecture_presets.Bandwidth`, words per
    /// cycle; `None` for `CALC` (SCALE-Sim sizes the interface so nothing stalls).
    pub user_bandwidth: Option<Vec<f64>>,
}

/// Largest array side accepted (Faultline's MXU limit).
const MAX_SIDE: usize = 1024;

/// Least USER bandwidth accepted, words per cycle: a word is at least a byte, so the DRAM's
/// bandwidth stays at or above Faultline's floor ([`DRAM_BANDWIDTH`]).
const MIN_BANDWIDTH: f64 = *DRAM_BANDWIDTH.start();

/// `path` as text, read with the cap every text input has; errors name it as `what`.
fn read_text(path: &Path, what: &'static str) -> Result<String, ConfigError> {
    read_text_capped(path, TEXT_FILE_LIMIT).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        what,
        source,
    })
}

impl ScaleSimConfig {
    /// Reads (at most [`TEXT_FILE_LIMIT`] bytes) and parses a SCALE-Sim config; errors name the
    /// file, the `section.Key` and what is allowed.
    pub fn load(path: &Path) -> Result<ScaleSimConfig, ConfigError> {
        Self::parse(&read_text(path, "SCALE-Sim config")?, path)
    }

    /// Parses config text; `file` names it in errors.
    pub fn parse(text: &str, file: &Path) -> Result<ScaleSimConfig, ConfigError> {
        let mut ini = configparser::ini::Ini::new();
        ini.read(text.to_string()).map_err(|message| ConfigError::Parse {
            file: file.to_path_buf(),
            line: 0,
            col: 0,
            message,
        })?;
        let bad = |field: &str, value: &str, allowed: &str| ConfigError::Invalid {
            file: file.to_path_buf(),
            field: field.into(),
            value: one_line(value),
            allowed: allowed.into(),
        };
        let get = |section: &str, key: &str| -> Result<String, ConfigError> {
            ini.get(section, key)
                .map(|v| v.trim().to_string())
                .ok_or_else(|| bad(&format!("{section}.{key}"), "(missing)", "a value: SCALE-Sim requires this key"))
        };
        let opt = |section: &str, key: &str| ini.get(section, key).map(|v| v.trim().to_string());
        let count = |section: &str, key: &str, max: u64| -> Result<u64, ConfigError> {
            let v = get(section, key)?;
            v.parse::<u64>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| bad(&format!("{section}.{key}"), &v, &format!("an integer in 1..={max}")))
        };
        let arch = "architecture_presets";
        let rows = count(arch, "ArrayHeight", MAX_SIDE as u64)? as usize;
        let cols = count(arch, "ArrayWidth", MAX_SIDE as u64)? as usize;
        let kb = 1 << 20;
        let (ifmap_kb, filter_kb, ofmap_kb) =
            (count(arch, "IfmapSramSzkB", kb)?, count(arch, "FilterSramSzkB", kb)?, count(arch, "OfmapSramSzkB", kb)?);
        let df = get(arch, "Dataflow")?;
        let dataflow = match df.as_str() {
            "ws" => Dataflow::WeightStationary,
            "os" => Dataflow::OutputStationary,
            "is" => Dataflow::InputStationary,
            _ => return Err(bad("architecture_presets.Dataflow", &df, "ws, os or is")),
        };
        let bw_mode = get("run_presets", "InterfaceBandwidth")?;
        let user_bandwidth = match bw_mode.as_str() {
            "CALC" => None,
            "USER" => {
                let v = get(arch, "Bandwidth")?;
                // At least MIN_BANDWIDTH: then the DRAM's bytes per cycle are within Faultline's
                // range whatever the word size (SCALE-Sim itself takes whole words).
                let list: Option<Vec<f64>> = v
                    .split(',')
                    .map(|x| x.trim().parse::<f64>().ok().filter(|b| b.is_finite() && *b >= MIN_BANDWIDTH))
                    .collect();
                Some(list.ok_or_else(|| {
                    bad(
                        "architecture_presets.Bandwidth",
                        &v,
                        &format!("words per cycle, at least {MIN_BANDWIDTH}, comma-separated"),
                    )
                })?)
            }
            _ => return Err(bad("run_presets.InterfaceBandwidth", &bw_mode, "CALC or USER")),
        };
        // Features SCALE-Sim has and Faultline does not model: refused by name, not ignored.
        let off = |section: &str, key: &str, what: &str| -> Result<(), ConfigError> {
            match opt(section, key) {
                Some(v) if !v.eq_ignore_ascii_case("false") => {
                    Err(bad(&format!("{section}.{key}"), &v, &format!("False: {what}")))
                }
                _ => Ok(()),
            }
        };
        off("sparsity", "SparsitySupport", "Faultline's array computes dense GEMMs")?;
        off("run_presets", "UseRamulatorTrace", "Faultline models its own DRAM and DMA")?;
        off("layout", "IfmapCustomLayout", "Faultline's SRAMs are not banked by a custom layout")?;
        off("layout", "FilterCustomLayout", "Faultline's SRAMs are not banked by a custom layout")?;
        Ok(ScaleSimConfig {
            run_name: opt("general", "run_name").unwrap_or_else(|| "scale_run".into()),
            rows,
            cols,
            ifmap_kb,
            filter_kb,
            ofmap_kb,
            dataflow,
            user_bandwidth,
        })
    }
}

impl ScaleSimConfig {
    /// The Faultline machine this config describes: `base` (number formats, clock, DMA, DRAM)
    /// with the config's array, dataflow, SRAM sizes and USER bandwidth, and whatever else the
    /// array's size requires of the memories ([`HwConfig::fit_memories_to_array`]: banks that
    /// feed it at full rate, a weight buffer of at least one tile). Valid for every config
    /// [`ScaleSimConfig::parse`] accepts and every valid `base`. Also returns one line per
    /// value that is not the config's or the base's, saying why.
    pub fn machine(&self, base: &HwConfig) -> (HwConfig, Vec<String>) {
        let mut hw = base.clone();
        let name =
            format!("{} ({}x{} {}, from {})", self.run_name, self.rows, self.cols, self.dataflow.short(), base.name);
        // Within the name's limits whatever run_name is (one line, at most NAME_MAX_CHARS).
        hw.name = one_line(&name).chars().take(NAME_MAX_CHARS).collect();
        hw.mxu.rows = self.rows;
        hw.mxu.cols = self.cols;
        hw.mxu.dataflow = self.dataflow;
        let size = |kb: u64, word_bytes: u64| (kb * 1024).div_ceil(word_bytes) * word_bytes;
        let m = &mut hw.memory;
        m.unified_buffer.bytes = size(self.ifmap_kb, m.unified_buffer.word_bytes());
        m.weight_buffer.bytes = size(self.filter_kb, m.weight_buffer.word_bytes());
        m.accumulator.bytes = size(self.ofmap_kb, m.accumulator.word_bytes());
        let mut notes = hw.fit_memories_to_array();
        if let Some(bw) = &self.user_bandwidth {
            // SCALE-Sim's USER bandwidth is words per cycle (its first entry).
            let bytes = bw[0] * hw.mxu.input_format.bits() as f64 / 8.0;
            hw.dram.bandwidth_bytes_per_cycle = if bytes > *DRAM_BANDWIDTH.end() {
                notes.push(format!(
                    "dram.bandwidth_bytes_per_cycle inf: architecture_presets.Bandwidth, {} words per cycle, is {bytes} \
                     bytes, above Faultline's {} (unlimited)",
                    bw[0],
                    DRAM_BANDWIDTH.end()
                ));
                f64::INFINITY
            } else {
                bytes
            };
        }
        (hw, notes)
    }
}

/// One layer of a topology, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerShape {
    /// A convolution (SCALE-Sim's conv topology row).
    Conv {
        /// IFMAP height.
        ifmap_h: usize,
        /// IFMAP width.
        ifmap_w: usize,
        /// Filter height.
        filt_h: usize,
        /// Filter width.
        filt_w: usize,
        /// Input channels.
        channels: usize,
        /// Filters (output channels).
        filters: usize,
        /// Stride, both directions.
        stride: usize,
    },
    /// A GEMM `M x K` by `K x N` (SCALE-Sim's GEMM topology row `M, N, K`).
    Gemm {
        /// Rows of the output.
        m: usize,
        /// Columns of the output.
        n: usize,
        /// Reduction length.
        k: usize,
    },
}

/// A named layer of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Its name (first column).
    pub name: String,
    /// Its shape.
    pub shape: LayerShape,
}

impl LayerShape {
    /// `[M, K, N]` of the layer's GEMM as SCALE-Sim maps it (see the module docs). Saturating,
    /// so a shape built by hand never panics; [`parse_topology`]'s shapes are far from it.
    pub fn gemm(&self) -> [usize; 3] {
        match *self {
            LayerShape::Gemm { m, n, k } => [m, k, n],
            LayerShape::Conv { ifmap_h, ifmap_w, filt_h, filt_w, channels, filters, stride } => {
                let out = |i: usize, f: usize| i.saturating_sub(f).saturating_add(stride).div_ceil(stride.max(1));
                let window = filt_h.saturating_mul(filt_w).saturating_mul(channels);
                [out(ifmap_h, filt_h).saturating_mul(out(ifmap_w, filt_w)), window, filters]
            }
        }
    }
}

impl Layer {
    /// `[M, K, N]` of the layer's GEMM ([`LayerShape::gemm`]).
    pub fn gemm(&self) -> [usize; 3] {
        self.shape.gemm()
    }
}

/// Most channels of a depth-wise row, which becomes one layer per channel.
const MAX_DP_CHANNELS: usize = 1 << 16;

/// What a depth-wise row's per-channel layer adds to its name: `Channel_` and at most five
/// digits (below [`MAX_DP_CHANNELS`]).
const DP_SUFFIX_MAX: u64 = 8 + 5;

/// Largest layer dimension accepted (keeps `M*K*N` and the cycle counts far inside `u64`).
const MAX_DIM: usize = 1 << 24;

/// Reads a SCALE-Sim topology CSV ([`read_topology`]) and parses it ([`parse_topology`]).
pub fn load_topology(path: &Path) -> Result<Vec<Layer>, ConfigError> {
    parse_topology(&read_topology(path)?, path)
}

/// A topology file's text, read with the cap every text input has ([`TEXT_FILE_LIMIT`]).
pub fn read_topology(path: &Path) -> Result<String, ConfigError> {
    read_text(path, "SCALE-Sim topology")
}

/// What a topology expands to, counted by [`topology_size`] without building its layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopologySize {
    /// Layers ([`parse_topology`]'s length: a depth-wise row is one layer per channel).
    pub layers: u64,
    /// Bytes of the layers' names, at most.
    pub name_bytes: u64,
}

/// The size of what [`parse_topology`] would build from `text` (the same checks, the same
/// errors), for a host-memory estimate before building it: a few bytes of depth-wise row
/// become 65,536 layers.
pub fn topology_size(text: &str, file: &Path) -> Result<TopologySize, ConfigError> {
    let mut size = TopologySize::default();
    for_each_row(text, file, |row| {
        let layers = row.channels.unwrap_or(1) as u64;
        let name = row.name.len() as u64 + if row.channels.is_some() { DP_SUFFIX_MAX } else { 0 };
        size.layers = size.layers.saturating_add(layers);
        size.name_bytes = size.name_bytes.saturating_add(layers.saturating_mul(name));
    })?;
    Ok(size)
}

/// Parses a SCALE-Sim topology: conv rows (8 fields) or GEMM rows (`Layer, M, N, K`), told
/// apart by the header's field count; each row's trailing comma is optional here, and an `N:M`
/// sparsity column is refused. Errors name the file, the line and the column. A depth-wise row
/// becomes one layer per channel: check [`topology_size`] first where memory is bounded.
pub fn parse_topology(text: &str, file: &Path) -> Result<Vec<Layer>, ConfigError> {
    let mut layers = Vec::new();
    for_each_row(text, file, |row| match row.channels {
        // Depth-wise: SCALE-Sim runs one single-channel layer per channel.
        Some(channels) => layers.extend(
            (0..channels).map(|c| Layer { name: format!("{}Channel_{c}", row.name), shape: row.shape.clone() }),
        ),
        None => layers.push(Layer { name: row.name, shape: row.shape }),
    })?;
    Ok(layers)
}

/// One row of a topology, checked: its name, the shape of each of its layers, and for a
/// depth-wise row the channels it becomes one layer each.
struct TopologyRow {
    name: String,
    shape: LayerShape,
    channels: Option<usize>,
}

/// Calls `f` with each layer row of `text` in order, after checking it; errors as
/// [`parse_topology`] documents them.
fn for_each_row(text: &str, file: &Path, mut f: impl FnMut(TopologyRow)) -> Result<(), ConfigError> {
    let mut rd =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(text.as_bytes());
    let bad = |line: u64, field: &str, value: &str, allowed: &str| ConfigError::Invalid {
        file: file.to_path_buf(),
        field: format!("line {line}: {}", one_line(field)),
        value: one_line(value),
        allowed: allowed.into(),
    };
    let fields = |r: &csv::StringRecord| -> Vec<String> {
        let mut v: Vec<String> = r.iter().map(str::to_string).collect();
        // SCALE-Sim's rows end with a comma: drop the empty last field.
        if v.last().is_some_and(|s| s.is_empty()) {
            v.pop();
        }
        v
    };
    let mut records = rd.records();
    let header = match records.next() {
        Some(r) => fields(&r.map_err(|e| csv_error(file, e))?),
        None => return Err(bad(1, "header", "(empty file)", "a header row: `Layer, M, N, K,` or the conv columns")),
    };
    let (gemm, width) = match header.len() {
        4 => (true, 4),
        8 => (false, 8),
        n => {
            return Err(bad(
                1,
                "header",
                &header.join(", "),
                &format!(
                    "4 columns (GEMM: Layer, M, N, K) or 8 (conv: Layer name, IFMAP Height, IFMAP Width, Filter \
                     Height, Filter Width, Channels, Num Filter, Strides); this header has {n}"
                ),
            ))
        }
    };
    let mut rows = 0u64;
    for r in records {
        let r = r.map_err(|e| csv_error(file, e))?;
        let line = r.position().map_or(0, |p| p.line());
        let v = fields(&r);
        if v.iter().all(|s| s.is_empty()) {
            continue;
        }
        if v.len() != width {
            let why = if v.len() == width + 1 {
                "no N:M sparsity column: Faultline's array computes dense GEMMs".to_string()
            } else {
                format!("{width} fields, as the header has")
            };
            return Err(bad(line, "row", &v.join(", "), &why));
        }
        let num = |i: usize| -> Result<usize, ConfigError> {
            v[i].parse::<usize>().ok().filter(|n| (1..=MAX_DIM).contains(n)).ok_or_else(|| {
                bad(line, &format!("column `{}`", header[i]), &v[i], &format!("an integer in 1..={MAX_DIM}"))
            })
        };
        let (shape, channels) = if gemm {
            (LayerShape::Gemm { m: num(1)?, n: num(2)?, k: num(3)? }, None)
        } else {
            let (ifmap_h, ifmap_w, filt_h, filt_w) = (num(1)?, num(2)?, num(3)?, num(4)?);
            let (channels, filters, stride) = (num(5)?, num(6)?, num(7)?);
            if filt_h > ifmap_h || filt_w > ifmap_w {
                return Err(bad(
                    line,
                    "filter",
                    &format!("{filt_h}x{filt_w} on a {ifmap_h}x{ifmap_w} IFMAP"),
                    "a filter no larger than the IFMAP (SCALE-Sim asserts the same)",
                ));
            }
            let conv = |channels| LayerShape::Conv { ifmap_h, ifmap_w, filt_h, filt_w, channels, filters, stride };
            if v[0].contains("DP") {
                if channels > MAX_DP_CHANNELS {
                    return Err(bad(
                        line,
                        "column `Channels`",
                        &channels.to_string(),
                        &format!("at most {MAX_DP_CHANNELS} for a depth-wise (`DP`) row: one layer per channel"),
                    ));
                }
                (conv(1), Some(channels))
            } else {
                (conv(channels), None)
            }
        };
        let [m, k, n] = shape.gemm();
        if m.checked_mul(k).and_then(|x| x.checked_mul(n)).is_none_or(|x| x > 1 << 50) {
            return Err(bad(line, "row", &v.join(", "), "a layer of at most 2^50 MACs"));
        }
        rows += 1;
        f(TopologyRow { name: v[0].clone(), shape, channels });
    }
    if rows == 0 {
        return Err(bad(1, "rows", "(none)", "at least one layer row after the header"));
    }
    Ok(())
}

fn csv_error(file: &Path, e: csv::Error) -> ConfigError {
    let line = e.position().map_or(0, |p| p.line() as usize);
    ConfigError::Parse { file: PathBuf::from(file), line, col: 0, message: e.to_string() }
}

/// SCALE-Sim's numbers for one layer (the columns of its compute and access reports).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleSimCounts {
    /// `(Sr, Sc, T)` of the mapping.
    pub mapping: [usize; 3],
    /// Folds.
    pub folds: u64,
    /// "Total Cycles": the index of the last cycle.
    pub total_cycles: u64,
    /// "Overall Util %".
    pub overall_util: f64,
    /// "Mapping Efficiency %".
    pub mapping_efficiency: f64,
    /// "Compute Util %".
    pub compute_util: f64,
    /// "SRAM IFMAP Reads".
    pub ifmap_reads: u64,
    /// "SRAM Filter Reads".
    pub filter_reads: u64,
    /// "SRAM OFMAP Writes".
    pub ofmap_writes: u64,
}

/// SCALE-Sim's counts for the `[M, K, N]` GEMM on an `R x C` array with `dataflow` (module docs).
pub fn counts(rows: usize, cols: usize, dataflow: Dataflow, [m, k, n]: [usize; 3]) -> ScaleSimCounts {
    let (r, c) = (rows as u64, cols as u64);
    let (m, k, n) = (m as u64, k as u64, n as u64);
    let [sr, sc, t] = match dataflow {
        Dataflow::OutputStationary => [m, n, k],
        Dataflow::WeightStationary => [k, n, m],
        Dataflow::InputStationary => [k, m, n],
    };
    let folds = sr.div_ceil(r) * sc.div_ceil(c);
    let os = dataflow == Dataflow::OutputStationary;
    let per_fold = if os { t + r + c - 2 } else { t + 2 * r + c - 2 };
    let total_cycles = folds * per_fold - 1;
    let macs = (m * k * n) as f64;
    let mapping_efficiency = 100.0 * (sr * sc) as f64 / (folds * r * c) as f64;
    let fold_len = if os { t + r + c - 2 } else { t + 2 * r + 2 * c - 3 };
    let (ifmap_reads, filter_reads, ofmap_writes) = match dataflow {
        Dataflow::OutputStationary => (m * k * n.div_ceil(c), k * n * m.div_ceil(r), m * n + folds * (r + c)),
        Dataflow::WeightStationary => (m * k * n.div_ceil(c), k * n, m * n * k.div_ceil(r)),
        Dataflow::InputStationary => (m * k, k * n * m.div_ceil(c), m * n * k.div_ceil(r)),
    };
    ScaleSimCounts {
        mapping: [sr as usize, sc as usize, t as usize],
        folds,
        total_cycles,
        overall_util: 100.0 * macs / (total_cycles as f64 * (r * c) as f64),
        mapping_efficiency,
        compute_util: mapping_efficiency * t as f64 / fold_len as f64,
        ifmap_reads,
        filter_reads,
        ofmap_writes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers SCALE-Sim 3.0.0 (PyPI) printed for these layers, CALC bandwidth.
    #[test]
    fn counts_are_scalesims() {
        // 64x64x64 on 32x32, WS: COMPUTE_REPORT 631 cycles, 100% mapping; 8192/4096/8192 accesses.
        let ws = counts(32, 32, Dataflow::WeightStationary, [64, 64, 64]);
        assert_eq!((ws.total_cycles, ws.ifmap_reads, ws.filter_reads, ws.ofmap_writes), (631, 8192, 4096, 8192));
        assert!((ws.mapping_efficiency - 100.0).abs() < 1e-9);
        assert!((ws.compute_util - 33.86243386243386).abs() < 1e-9);
        // M=100, N=30, K=70 on 32x32, WS: 581 cycles, 68.359375% mapping, 7000/2100/9000.
        let g = counts(32, 32, Dataflow::WeightStationary, [100, 70, 30]);
        assert_eq!((g.total_cycles, g.ifmap_reads, g.filter_reads, g.ofmap_writes), (581, 7000, 2100, 9000));
        assert!((g.mapping_efficiency - 68.359375).abs() < 1e-9);
        assert!((g.overall_util - 35.297439759036145).abs() < 1e-9);
        // M=35, N=146, K=17 on 8x8: OS 2944 cycles, ofmap 6630 writes; IS 2519, ifmap 595.
        let os = counts(8, 8, Dataflow::OutputStationary, [35, 17, 146]);
        assert_eq!((os.total_cycles, os.ifmap_reads, os.filter_reads, os.ofmap_writes), (2944, 11305, 12410, 6630));
        assert!((os.compute_util - 46.0897707979626).abs() < 1e-9);
        let is = counts(8, 8, Dataflow::InputStationary, [35, 17, 146]);
        assert_eq!((is.total_cycles, is.ifmap_reads, is.filter_reads, is.ofmap_writes), (2519, 595, 12410, 15330));
        assert!((is.compute_util - 51.708333333333336).abs() < 1e-9);
    }

    #[test]
    fn configs_parse_and_name_bad_fields() {
        let cfg = "[general]\nrun_name = t\n[architecture_presets]\nArrayHeight: 8\nArrayWidth: 4\n\
                   IfmapSramSzkB: 64\nFilterSramSzkB: 64\nOfmapSramSzkB: 32\nDataflow : is\nBandwidth : 10\n\
                   [sparsity]\nSparsitySupport : false\n[run_presets]\nInterfaceBandwidth: CALC\n\
                   UseRamulatorTrace: False\n";
        let c = ScaleSimConfig::parse(cfg, Path::new("a.cfg")).unwrap();
        assert_eq!((c.rows, c.cols, c.dataflow, c.user_bandwidth.clone()), (8, 4, Dataflow::InputStationary, None));
        let e = ScaleSimConfig::parse(&cfg.replace("is\n", "rs\n"), Path::new("a.cfg")).unwrap_err().to_string();
        assert_eq!(e, "a.cfg: field `architecture_presets.Dataflow` = rs: ws, os or is");
        let e = ScaleSimConfig::parse(
            &cfg.replace("SparsitySupport : false", "SparsitySupport : true"),
            Path::new("a.cfg"),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "a.cfg: field `sparsity.SparsitySupport` = true: False: Faultline's array computes dense GEMMs");
        let e = ScaleSimConfig::parse(&cfg.replace("ArrayWidth: 4", "ArrayWidth: 0"), Path::new("a.cfg"))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "a.cfg: field `architecture_presets.ArrayWidth` = 0: an integer in 1..=1024");
    }

    #[test]
    fn topologies_parse_as_scalesim_maps_them() {
        let conv =
            "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n\
                    Conv1, 224, 224, 7, 7, 3, 64, 2,\nDP2, 8, 8, 3, 3, 4, 4, 1,\n";
        let l = parse_topology(conv, Path::new("n.csv")).unwrap();
        // 224 - 7 + 2 = 219, / 2 rounded up = 110 per side (SCALE-Sim pads nothing).
        assert_eq!(l[0].gemm(), [110 * 110, 147, 64]);
        assert_eq!(l.len(), 1 + 4);
        assert_eq!((l[1].name.as_str(), l[1].gemm()), ("DP2Channel_0", [36, 9, 4]));
        let gemm = "Layer, M, N, K,\nqkv, 128, 2304, 768,\n";
        assert_eq!(parse_topology(gemm, Path::new("g.csv")).unwrap()[0].gemm(), [128, 768, 2304]);
        let e = parse_topology("Layer, M, N, K,\nx, 4, 0, 2,\n", Path::new("g.csv")).unwrap_err().to_string();
        assert_eq!(e, "g.csv: field `line 2: column `N`` = 0: an integer in 1..=16777216");
        let e = parse_topology("Layer, M, N, K,\nx, 4, 4, 2, 1:4,\n", Path::new("g.csv")).unwrap_err().to_string();
        assert!(e.contains("no N:M sparsity column"), "{e}");
    }

    const CFG: &str = "[general]\nrun_name = t\n[architecture_presets]\nArrayHeight: 128\nArrayWidth: 128\n\
                       IfmapSramSzkB: 64\nFilterSramSzkB: 64\nOfmapSramSzkB: 64\nDataflow : ws\nBandwidth : 10\n\
                       [run_presets]\nInterfaceBandwidth: CALC\n";

    fn base() -> HwConfig {
        HwConfig::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/tpu-32x32.ron")).unwrap()
    }

    #[test]
    fn the_machine_of_a_large_array_satisfies_its_own_constraints() {
        let c = ScaleSimConfig::parse(CFG, Path::new("a.cfg")).unwrap();
        let (hw, notes) = c.machine(&base());
        hw.validate(Path::new("a.cfg")).unwrap();
        assert_eq!((hw.mxu.rows, hw.mxu.cols, hw.memory.unified_buffer.bytes), (128, 128, 64 << 10));
        // tpu-32x32 has 32 banks of one port each: a 128-wide array needs 128.
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].starts_with("memory.unified_buffer.banks 32 -> 128"), "{notes:?}");
        // A 16 KiB filter SRAM holds no 128x128 bf16 tile (32 KiB): the weight buffer is one tile.
        let small = ScaleSimConfig::parse(&CFG.replace("FilterSramSzkB: 64", "FilterSramSzkB: 16"), Path::new("a.cfg"));
        let (hw, notes) = small.unwrap().machine(&base());
        hw.validate(Path::new("a.cfg")).unwrap();
        assert_eq!(hw.memory.weight_buffer.bytes, 32 << 10);
        assert!(notes.iter().any(|n| n.starts_with("memory.weight_buffer.bytes 16384 -> 32768")), "{notes:?}");
        // The .cfg's arrays that already fit the base keep its memories as they are.
        let (hw, notes) =
            ScaleSimConfig::parse(&CFG.replace(": 128", ": 8"), Path::new("a.cfg")).unwrap().machine(&base());
        assert!(notes.is_empty() && hw.memory.unified_buffer.banks == 32, "{notes:?}");
    }

    #[test]
    fn any_run_name_and_user_bandwidth_give_a_valid_machine() {
        let long = CFG.replace("run_name = t", &format!("run_name = {}\u{1}", "x".repeat(100)));
        let user = |bw: &str| {
            long.replace("InterfaceBandwidth: CALC", "InterfaceBandwidth: USER").replace("Bandwidth : 10", bw)
        };
        let c = ScaleSimConfig::parse(&user("Bandwidth : 1000000000"), Path::new("a.cfg")).unwrap();
        let (hw, notes) = c.machine(&base());
        hw.validate(Path::new("a.cfg")).unwrap();
        assert_eq!(hw.name.chars().count(), NAME_MAX_CHARS);
        assert!(hw.dram.bandwidth_bytes_per_cycle.is_infinite());
        assert!(notes.last().unwrap().starts_with("dram.bandwidth_bytes_per_cycle inf"), "{notes:?}");
        let c = ScaleSimConfig::parse(&user("Bandwidth : 0.01"), Path::new("a.cfg")).unwrap();
        c.machine(&base()).0.validate(Path::new("a.cfg")).unwrap();
        let e = ScaleSimConfig::parse(&user("Bandwidth : 0.001"), Path::new("a.cfg")).unwrap_err().to_string();
        assert!(e.contains("`architecture_presets.Bandwidth` = 0.001: words per cycle, at least 0.01"), "{e}");
    }

    #[test]
    fn topology_size_counts_what_parse_builds() {
        let conv = "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, \
                    Strides,\nConv1, 8, 8, 3, 3, 3, 4, 1,\nDP2, 8, 8, 3, 3, 12, 4, 1,\n\"a,DP\", 4, 4, 1, 1, 2, 2, 1,\n";
        let layers = parse_topology(conv, Path::new("n.csv")).unwrap();
        let size = topology_size(conv, Path::new("n.csv")).unwrap();
        assert_eq!((layers.len(), size.layers), (1 + 12 + 2, 15));
        assert_eq!(layers[14].name, "a,DPChannel_1");
        let names: usize = layers.iter().map(|l| l.name.len()).sum();
        assert!(size.name_bytes >= names as u64 && size.name_bytes <= names as u64 + 15 * 5);
        // The same errors as parse_topology.
        let e = topology_size("Layer, M, N, K,\n", Path::new("g.csv")).unwrap_err().to_string();
        assert!(e.contains("at least one layer row after the header"), "{e}");
    }

    #[test]
    fn reads_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        // Valid text past the cap: refused for its size, not parsed.
        std::fs::write(&big, format!("{CFG}{}", "#\n".repeat(TEXT_FILE_LIMIT as usize / 2 + 1))).unwrap();
        for e in [ScaleSimConfig::load(&big).unwrap_err(), load_topology(&big).unwrap_err()] {
            let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
            assert!(text.contains("big: cannot read SCALE-Sim ") && text.contains("larger than 16.0 MiB"), "{text}");
        }
        for e in [
            ScaleSimConfig::load(Path::new("/dev/zero")).unwrap_err(),
            load_topology(Path::new("/dev/zero")).unwrap_err(),
        ] {
            // A device is refused before any read, whatever it would yield.
            let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
            assert!(text.contains("a character device, not a regular file"), "{text}");
        }
    }
}
