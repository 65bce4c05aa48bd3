//! `faultline scalesim`: a SCALE-Sim run config and topology as they are; each layer's GEMM
//! run on the register-level array; SCALE-Sim's three reports written with its column names,
//! plus Faultline's own columns.

use crate::gemm::random;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use faultline_hw::budget::{sum, HostMemory};
use faultline_hw::error::one_line;
use faultline_hw::fault::FaultSchedule;
use faultline_hw::interop::scalesim::{self, Layer, ScaleSimConfig, ScaleSimCounts};
use faultline_hw::mxu::{gemm, gemm_host_bytes, Schedule};
use faultline_hw::op::{self, OpKind};
use faultline_hw::{ExecMode, HwConfig};
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Whose conventions fill SCALE-Sim's columns.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Convention {
    /// SCALE-Sim's: folds padded to the array, never overlapping, weights loaded before each
    /// fold, no OS drain, the last cycle's index (its numbers, exactly).
    Scalesim,
    /// Faultline's: the register-level array's cycles (overlapped WS folds, OS drain, ragged
    /// tails), DMA stalls, and its own access counts.
    Faultline,
}

/// Execution mode of each layer's GEMM.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Step every PE register every clock.
    Cycle,
    /// The bit-exact functional twin (same cycle counts).
    Functional,
}

/// Arguments of `faultline scalesim`.
#[derive(Args)]
pub struct ScaleSimArgs {
    /// SCALE-Sim run config (its INI `.cfg`): array size, dataflow, SRAM sizes, bandwidth mode.
    #[arg(long)]
    config: PathBuf,
    /// SCALE-Sim topology CSV: conv rows or GEMM rows (`Layer, M, N, K,`).
    #[arg(long)]
    topology: PathBuf,
    /// Write COMPUTE_REPORT.csv, BANDWIDTH_REPORT.csv and DETAILED_ACCESS_REPORT.csv here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Whose conventions fill SCALE-Sim's columns (Faultline's columns are always written).
    #[arg(long, value_enum, default_value = "scalesim")]
    convention: Convention,
    /// The Faultline machine the number formats, clock, DMA and DRAM come from; the array's
    /// size and dataflow, the SRAM sizes and a USER bandwidth come from --config.
    #[arg(long, default_value = "configs/tpu-32x32.ron")]
    base: PathBuf,
    /// How each layer's GEMM runs (random inputs; the cycle counts do not depend on them).
    #[arg(long, value_enum, default_value = "cycle")]
    mode: ModeArg,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// One layer's results.
struct Row {
    layer: Layer,
    gemm: [usize; 3],
    ss: ScaleSimCounts,
    /// The register-level array's cycles (a count, from first operand in to last accumulator
    /// write) and its operand-feeding cycles.
    array_cycles: u64,
    feed_cycles: u64,
    /// The op through DMA and SRAM on the machine, and whether it fits the .cfg's SRAMs (else
    /// it was timed with SRAMs grown to fit).
    dma: DmaCycles,
    fits: bool,
    access: Access,
}

/// What is kept of a layer's op timing (its tiles and transfers are not: a row per layer is
/// held for the whole topology).
struct DmaCycles {
    total: u64,
    stall: u64,
    overlap: u64,
}

/// Faultline's SRAM accesses for one GEMM, from its fold schedule.
#[derive(Default, Clone, Copy)]
struct Access {
    ifmap_reads: u64,
    filter_reads: u64,
    acc_writes: u64,
    acc_reads: u64,
}

/// Accesses of schedule `s`: each fold reads its `mr x kr` tile of the input and its `kr x nc`
/// tile of the weights once (whichever of them stays in the PEs and whichever streams), writes
/// its `mr x nc` outputs to the accumulators, and reads them back first when it adds to them.
fn access(s: &Schedule) -> Access {
    let mut a = Access::default();
    for f in &s.folds {
        let outs = (f.mr * f.nc) as u64;
        a.ifmap_reads += (f.mr * f.kr) as u64;
        a.filter_reads += (f.kr * f.nc) as u64;
        a.acc_writes += outs;
        if !f.overwrite {
            a.acc_reads += outs;
        }
    }
    a
}

/// `hw` with every SRAM at its largest (1 GiB), for timing a layer whose operands the .cfg's
/// SRAMs cannot hold whole (Faultline keeps a GEMM's operands resident).
fn grown(hw: &HwConfig) -> HwConfig {
    let mut g = hw.clone();
    for s in [&mut g.memory.unified_buffer, &mut g.memory.weight_buffer, &mut g.memory.accumulator] {
        s.bytes = 1 << 30;
    }
    g
}

/// Runs the command.
pub fn run(args: ScaleSimArgs, mem: &HostMemory) -> Result<()> {
    let _lock = args.out.as_deref().map(|d| crate::args::lock_output("--out", d)).transpose()?;
    let cfg = ScaleSimConfig::load(&args.config)?;
    let text = scalesim::read_topology(&args.topology)?;
    // What the run holds for the whole topology, checked before it is built (a few bytes of
    // depth-wise row are 65,536 layers): the text, the layers (a growing Vec's spare capacity
    // counted), their names and a row of results each.
    let size = scalesim::topology_size(&text, &args.topology)?;
    let per_layer = (2 * size_of::<Layer>() + size_of::<Row>()) as u64;
    let held = size
        .layers
        .checked_mul(per_layer)
        .and_then(|b| sum(&[Some(b), Some(size.name_bytes), Some(text.len() as u64)]));
    mem.check(&format!("the topology {} ({} layers)", args.topology.display(), size.layers), held)?;
    let layers = scalesim::parse_topology(&text, &args.topology)?;
    let base = HwConfig::load(&args.base)
        .context("--base (the Faultline machine the array is put in; run from the repository root or name one)")?;
    let (hw, notes) = cfg.machine(&base);
    // `machine` is valid by construction; checked all the same, so a mistake is an error here
    // rather than a wrong number later.
    hw.validate(&args.config).with_context(|| format!("the machine {} builds from it", args.config.display()))?;
    let big = grown(&hw);
    let mode = match args.mode {
        ModeArg::Cycle => ExecMode::CycleLevel,
        ModeArg::Functional => ExecMode::Functional,
    };
    let bar =
        if std::io::stderr().is_terminal() { ProgressBar::new(layers.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} layers, {elapsed} {msg}").expect("a valid template"),
    );
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let start = Instant::now();
    let mut rows = Vec::with_capacity(layers.len());
    for layer in layers {
        bar.set_message(one_line(&layer.name));
        let g @ [m, k, n] = layer.gemm();
        let what = format!("layer `{}` ({m}x{k}x{n})", one_line(&layer.name));
        let kind = OpKind::Matmul { m, k, n };
        // Timed on the .cfg's SRAMs when the operands fit them, else on SRAMs grown to hold
        // them (Faultline keeps a GEMM's operands resident).
        let (timed_on, fits) = match op::timing_host_bytes(&hw, &kind) {
            Ok(_) => (&hw, true),
            Err(_) => (&big, false),
        };
        let timing_bytes = op::timing_host_bytes(timed_on, &kind).with_context(|| what.clone())?;
        // The GEMM, then its timing, then its schedule: one at a time beside the rows.
        mem.check(&what, sum(&[held, gemm_host_bytes(&hw, m, k, n, mode, false), timing_bytes]))?;
        let (array_cycles, feed_cycles) = {
            let a = random(&mut rng, hw.mxu.input_format, m, k);
            let w = random(&mut rng, hw.mxu.input_format, k, n);
            let out = gemm(&hw, &a, &w, mode, &FaultSchedule::none()).with_context(|| what.clone())?;
            (out.stats.total_cycles, out.stats.compute_cycles)
        };
        let t = op::timing(timed_on, &kind).with_context(|| what.clone())?;
        let dma = DmaCycles { total: t.total_cycles, stall: t.stall_cycles, overlap: t.overlap_cycles };
        drop(t);
        let access = access(&Schedule::new(&hw.mxu, m, k, n)?);
        rows.push(Row {
            ss: scalesim::counts(cfg.rows, cfg.cols, cfg.dataflow, g),
            gemm: g,
            array_cycles,
            feed_cycles,
            dma,
            fits,
            access,
            layer,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    let wall = start.elapsed().as_secs_f64();
    print_table(&args, &cfg, &hw, &rows, wall);
    for n in &notes {
        println!("note: {n}");
    }
    if let Some(dir) = &args.out {
        write_reports(dir, &cfg, args.convention, &rows)?;
        println!("reports: {}", dir.display());
    }
    Ok(())
}

fn pct(a: u64, b: u64) -> String {
    format!("{:+.1}%", 100.0 * (a as f64 / b.max(1) as f64 - 1.0))
}

fn print_table(args: &ScaleSimArgs, cfg: &ScaleSimConfig, hw: &HwConfig, rows: &[Row], wall: f64) {
    let mode = match args.mode {
        ModeArg::Cycle => "cycle-level",
        ModeArg::Functional => "functional",
    };
    println!(
        "{} on {}x{} {} ({} layers, {} mode, {wall:.2} s)",
        args.topology.display(),
        cfg.rows,
        cfg.cols,
        cfg.dataflow.short(),
        rows.len(),
        mode
    );
    println!(
        "{:<20} {:>16} {:>6} {:>12} {:>12} {:>8} {:>12} {:>8}",
        "layer", "M x K x N", "folds", "SCALE-Sim", "array", "vs SS", "with DMA", "vs SS"
    );
    let (mut ss, mut arr, mut dma) = (0u64, 0u64, 0u64);
    for r in rows {
        let [m, k, n] = r.gemm;
        // SCALE-Sim's Total Cycles is the last cycle's index: compared as a count.
        let s = r.ss.total_cycles + 1;
        println!(
            "{:<20} {:>16} {:>6} {:>12} {:>12} {:>8} {:>12}{} {:>8}",
            one_line(&r.layer.name),
            format!("{m}x{k}x{n}"),
            r.ss.folds,
            s,
            r.array_cycles,
            pct(r.array_cycles, s),
            r.dma.total,
            if r.fits { " " } else { "*" },
            pct(r.dma.total, s),
        );
        ss += s;
        arr += r.array_cycles;
        dma += r.dma.total;
    }
    println!(
        "{:<20} {:>16} {:>6} {:>12} {:>12} {:>8} {:>12}  {:>8}",
        "total",
        "",
        "",
        ss,
        arr,
        pct(arr, ss),
        dma,
        pct(dma, ss)
    );
    if rows.iter().any(|r| !r.fits) {
        println!(
            "* timed with SRAMs grown to hold the layer's operands: {} keeps a GEMM's operands resident, and the \
             .cfg's SRAMs are too small for them",
            hw.name
        );
    }
}

/// A report in SCALE-Sim's style, `, `-separated with each row ending in a comma, written by
/// the csv crate so a field that needs quotes (a layer named `a,b`) gets them: each field after
/// the first starts with its space, and an empty field ends the row.
struct Report {
    path: PathBuf,
    w: csv::Writer<std::fs::File>,
}

impl Report {
    fn create(path: PathBuf) -> Result<Report> {
        let w = csv::Writer::from_path(&path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Report { path, w })
    }

    fn row(&mut self, cells: &[String]) -> Result<()> {
        let fields = cells
            .iter()
            .enumerate()
            .map(|(i, c)| if i == 0 { c.clone() } else { format!(" {c}") })
            .chain([String::new()]);
        self.w.write_record(fields).with_context(|| format!("cannot write {}", self.path.display()))
    }

    fn finish(mut self) -> Result<()> {
        self.w.flush().with_context(|| format!("cannot write {}", self.path.display()))
    }
}

fn write_reports(dir: &Path, cfg: &ScaleSimConfig, conv: Convention, rows: &[Row]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let pe = (cfg.rows * cfg.cols) as f64;
    let faultline_cols = [
        "Layer",
        "M",
        "K",
        "N",
        "Faultline Array Cycles",
        "Faultline Cycles (with DMA)",
        "Faultline DMA Stall Cycles",
        "Faultline DMA Overlap Cycles",
        "Faultline SRAMs Fit",
    ];
    let (mut compute, mut bandwidth, mut detail) = (
        Report::create(dir.join("COMPUTE_REPORT.csv"))?,
        Report::create(dir.join("BANDWIDTH_REPORT.csv"))?,
        Report::create(dir.join("DETAILED_ACCESS_REPORT.csv"))?,
    );
    let header = |scalesim: &[&str]| {
        let mut h: Vec<String> = vec!["LayerID".into()];
        h.extend(scalesim.iter().map(|s| s.to_string()));
        h.extend(faultline_cols.iter().map(|s| s.to_string()));
        h
    };
    compute.row(&header(&[
        "Total Cycles (incl. prefetch)",
        "Total Cycles",
        "Stall Cycles",
        "Overall Util %",
        "Mapping Efficiency %",
        "Compute Util %",
    ]))?;
    bandwidth.row(&header(&[
        "Avg IFMAP SRAM BW",
        "Avg FILTER SRAM BW",
        "Avg OFMAP SRAM BW",
        "Avg IFMAP DRAM BW",
        "Avg FILTER DRAM BW",
        "Avg OFMAP DRAM BW",
    ]))?;
    let mut dh = header(&[
        "SRAM IFMAP Start Cycle",
        "SRAM IFMAP Stop Cycle",
        "SRAM IFMAP Reads",
        "SRAM Filter Start Cycle",
        "SRAM Filter Stop Cycle",
        "SRAM Filter Reads",
        "SRAM OFMAP Start Cycle",
        "SRAM OFMAP Stop Cycle",
        "SRAM OFMAP Writes",
        "DRAM IFMAP Start Cycle",
        "DRAM IFMAP Stop Cycle",
        "DRAM IFMAP Reads",
        "DRAM Filter Start Cycle",
        "DRAM Filter Stop Cycle",
        "DRAM Filter Reads",
        "DRAM OFMAP Start Cycle",
        "DRAM OFMAP Stop Cycle",
        "DRAM OFMAP Writes",
    ]);
    dh.extend(["Faultline Accumulator Reads".to_string()]);
    detail.row(&dh)?;
    for (id, r) in rows.iter().enumerate() {
        let [m, k, n] = r.gemm;
        let macs = (m * k * n) as f64;
        let ours: Vec<String> = vec![
            r.layer.name.clone(),
            m.to_string(),
            k.to_string(),
            n.to_string(),
            r.array_cycles.to_string(),
            r.dma.total.to_string(),
            r.dma.stall.to_string(),
            r.dma.overlap.to_string(),
            if r.fits { "yes" } else { "no" }.to_string(),
        ];
        let blank = String::new;
        // What SCALE-Sim's columns hold under each convention. Columns Faultline does not
        // model in SCALE-Sim's terms (its DRAM trace, per-operand start and stop cycles) are
        // left empty rather than filled with numbers of another meaning.
        let (total, stall, prefetch, util, map, cu, reads) = match conv {
            Convention::Scalesim => (
                r.ss.total_cycles,
                0,
                blank(),
                r.ss.overall_util,
                r.ss.mapping_efficiency,
                r.ss.compute_util,
                [r.ss.ifmap_reads, r.ss.filter_reads, r.ss.ofmap_writes],
            ),
            Convention::Faultline => (
                r.array_cycles,
                r.dma.stall,
                r.dma.total.to_string(),
                100.0 * macs / (r.array_cycles as f64 * pe),
                r.ss.mapping_efficiency,
                100.0 * macs / (r.feed_cycles.max(1) as f64 * pe),
                [r.access.ifmap_reads, r.access.filter_reads, r.access.acc_writes],
            ),
        };
        let mut c = vec![id.to_string(), prefetch, total.to_string(), stall.to_string()];
        c.extend([util, map, cu].iter().map(|x| format!("{x}")));
        c.extend(ours.iter().cloned());
        compute.row(&c)?;
        let mut b = vec![id.to_string()];
        b.extend(reads.iter().map(|&x| format!("{}", x as f64 / total.max(1) as f64)));
        b.extend([blank(), blank(), blank()]);
        b.extend(ours.iter().cloned());
        bandwidth.row(&b)?;
        let mut d = vec![id.to_string()];
        for x in reads {
            d.extend([blank(), blank(), x.to_string()]);
        }
        d.extend((0..9).map(|_| blank()));
        d.extend(ours.iter().cloned());
        d.push(r.access.acc_reads.to_string());
        detail.row(&d)?;
    }
    compute.finish()?;
    bandwidth.finish()?;
    detail.finish()
}
