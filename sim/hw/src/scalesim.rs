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

use crate::config::Dataflow;
use crate::error::{one_line, ConfigError};
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

impl ScaleSimConfig {
    /// Reads and parses a SCALE-Sim config; errors name the file, the `section.Key` and what
    /// is allowed.
    pub fn load(path: &Path) -> Result<ScaleSimConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            what: "SCALE-Sim config",
            source,
        })?;
        Self::parse(&text, path)
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
                let list: Option<Vec<f64>> =
                    v.split(',').map(|x| x.trim().parse::<f64>().ok().filter(|b| b.is_finite() && *b > 0.0)).collect();
                Some(list.ok_or_else(|| {
                    bad("architecture_presets.Bandwidth", &v, "positive words per cycle, comma-separated")
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

impl Layer {
    /// `[M, K, N]` of the layer's GEMM as SCALE-Sim maps it (see the module docs).
    pub fn gemm(&self) -> [usize; 3] {
        match self.shape {
            LayerShape::Gemm { m, n, k } => [m, k, n],
            LayerShape::Conv { ifmap_h, ifmap_w, filt_h, filt_w, channels, filters, stride } => {
                let out = |i: usize, f: usize| (i - f + stride).div_ceil(stride);
                [out(ifmap_h, filt_h) * out(ifmap_w, filt_w), filt_h * filt_w * channels, filters]
            }
        }
    }
}

/// Most channels of a depth-wise row, which becomes one layer per channel.
const MAX_DP_CHANNELS: usize = 1 << 16;

/// Largest layer dimension accepted (keeps `M*K*N` and the cycle counts far inside `u64`).
const MAX_DIM: usize = 1 << 24;

/// Reads a SCALE-Sim topology CSV: conv rows (8 fields) or GEMM rows (`Layer, M, N, K`),
/// told apart by the header's field count; each row's trailing comma is optional here, and an
/// `N:M` sparsity column is refused. Errors name the file, the line and the column.
pub fn load_topology(path: &Path) -> Result<Vec<Layer>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        what: "SCALE-Sim topology",
        source,
    })?;
    parse_topology(&text, path)
}

/// Parses topology text; `file` names it in errors.
pub fn parse_topology(text: &str, file: &Path) -> Result<Vec<Layer>, ConfigError> {
    let mut rd =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(text.as_bytes());
    let bad = |line: u64, field: &str, value: &str, allowed: &str| ConfigError::Invalid {
        file: file.to_path_buf(),
        field: format!("line {line}: {field}"),
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
    let mut layers = Vec::new();
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
        let name = v[0].clone();
        let shapes: Vec<(String, LayerShape)> = if gemm {
            vec![(name, LayerShape::Gemm { m: num(1)?, n: num(2)?, k: num(3)? })]
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
            if name.contains("DP") {
                // Depth-wise: SCALE-Sim runs one single-channel layer per channel.
                if channels > MAX_DP_CHANNELS {
                    return Err(bad(
                        line,
                        "column `Channels`",
                        &channels.to_string(),
                        &format!("at most {MAX_DP_CHANNELS} for a depth-wise (`DP`) row: one layer per channel"),
                    ));
                }
                (0..channels).map(|c| (format!("{name}Channel_{c}"), conv(1))).collect()
            } else {
                vec![(name, conv(channels))]
            }
        };
        for (name, shape) in shapes {
            let l = Layer { name, shape };
            let [m, k, n] = l.gemm();
            if m.checked_mul(k).and_then(|x| x.checked_mul(n)).is_none_or(|x| x > 1 << 50) {
                return Err(bad(line, "row", &v.join(", "), "a layer of at most 2^50 MACs"));
            }
            layers.push(l);
        }
    }
    if layers.is_empty() {
        return Err(bad(1, "rows", "(none)", "at least one layer row after the header"));
    }
    Ok(layers)
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
}
