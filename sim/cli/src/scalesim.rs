//! `faultline scalesim`: a SCALE-Sim run config and topology as they are; each layer's GEMM
//! run on the register-level array; SCALE-Sim's three reports written with its column names,
//! plus Faultline's own columns.

use crate::gemm::random;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use faultline_hw::budget::HostMemory;
use faultline_hw::fault::FaultSchedule;
use faultline_hw::mxu::{gemm, gemm_host_bytes, Schedule};
use faultline_hw::op::{self, OpKind};
use faultline_hw::scalesim::{self, Layer, ScaleSimConfig, ScaleSimCounts};
use faultline_hw::timing::OpTiming;
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
    dma: OpTiming,
    fits: bool,
    access: Access,
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

/// The Faultline machine: `base` with the .cfg's array, dataflow, SRAM sizes and USER bandwidth.
fn machine(base: &HwConfig, c: &ScaleSimConfig) -> HwConfig {
    let mut hw = base.clone();
    hw.name = format!("{} ({}x{} {}, from {})", c.run_name, c.rows, c.cols, c.dataflow.short(), base.name);
    hw.mxu.rows = c.rows;
    hw.mxu.cols = c.cols;
    hw.mxu.dataflow = c.dataflow;
    let size = |kb: u64, word_bytes: u64| (kb * 1024).div_ceil(word_bytes) * word_bytes;
    let m = &mut hw.memory;
    m.unified_buffer.bytes = size(c.ifmap_kb, m.unified_buffer.word_bytes());
    m.weight_buffer.bytes = size(c.filter_kb, m.weight_buffer.word_bytes());
    m.accumulator.bytes = size(c.ofmap_kb, m.accumulator.word_bytes());
    if let Some(bw) = &c.user_bandwidth {
        // SCALE-Sim's USER bandwidth is words per cycle (its first entry).
        hw.dram.bandwidth_bytes_per_cycle = bw[0] * hw.mxu.input_format.bits() as f64 / 8.0;
    }
    hw
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
    let layers = scalesim::load_topology(&args.topology)?;
    let base = HwConfig::load(&args.base)
        .context("--base (the Faultline machine the array is put in; run from the repository root or name one)")?;
    let hw = machine(&base, &cfg);
    hw.validate(&args.config).with_context(|| format!("the machine {} builds from it", args.config.display()))?;
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
        bar.set_message(layer.name.clone());
        let g @ [m, k, n] = layer.gemm();
        let what = format!("layer `{}` ({m}x{k}x{n})", layer.name);
        mem.check(&what, gemm_host_bytes(&hw, m, k, n, mode, false))?;
        let a = random(&mut rng, hw.mxu.input_format, m, k);
        let w = random(&mut rng, hw.mxu.input_format, k, n);
        let out = gemm(&hw, &a, &w, mode, &FaultSchedule::none()).with_context(|| what.clone())?;
        let kind = OpKind::Matmul { m, k, n };
        let (dma, fits) = match op::timing(&hw, &kind) {
            Ok(t) => (t, true),
            Err(_) => (op::timing(&grown(&hw), &kind).with_context(|| what.clone())?, false),
        };
        let sched = Schedule::new(&hw.mxu, m, k, n)?;
        rows.push(Row {
            ss: scalesim::counts(cfg.rows, cfg.cols, cfg.dataflow, g),
            gemm: g,
            array_cycles: out.stats.total_cycles,
            feed_cycles: out.stats.compute_cycles,
            dma,
            fits,
            access: access(&sched),
            layer,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    let wall = start.elapsed().as_secs_f64();
    print_table(&args, &cfg, &hw, &rows, wall);
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
            r.layer.name,
            format!("{m}x{k}x{n}"),
            r.ss.folds,
            s,
            r.array_cycles,
            pct(r.array_cycles, s),
            r.dma.total_cycles,
            if r.fits { " " } else { "*" },
            pct(r.dma.total_cycles, s),
        );
        ss += s;
        arr += r.array_cycles;
        dma += r.dma.total_cycles;
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

/// A CSV in SCALE-Sim's style: `, `-separated, each row ending in a comma.
fn csv_row(cells: &[String]) -> String {
    let mut s = cells.join(", ");
    s.push_str(",\n");
    s
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
    let (mut compute, mut bandwidth, mut detail) = (String::new(), String::new(), String::new());
    let header = |scalesim: &[&str]| {
        let mut h: Vec<String> = vec!["LayerID".into()];
        h.extend(scalesim.iter().map(|s| s.to_string()));
        h.extend(faultline_cols.iter().map(|s| s.to_string()));
        h
    };
    compute.push_str(&csv_row(&header(&[
        "Total Cycles (incl. prefetch)",
        "Total Cycles",
        "Stall Cycles",
        "Overall Util %",
        "Mapping Efficiency %",
        "Compute Util %",
    ])));
    bandwidth.push_str(&csv_row(&header(&[
        "Avg IFMAP SRAM BW",
        "Avg FILTER SRAM BW",
        "Avg OFMAP SRAM BW",
        "Avg IFMAP DRAM BW",
        "Avg FILTER DRAM BW",
        "Avg OFMAP DRAM BW",
    ])));
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
    detail.push_str(&csv_row(&dh));
    for (id, r) in rows.iter().enumerate() {
        let [m, k, n] = r.gemm;
        let macs = (m * k * n) as f64;
        let ours: Vec<String> = vec![
            r.layer.name.clone(),
            m.to_string(),
            k.to_string(),
            n.to_string(),
            r.array_cycles.to_string(),
            r.dma.total_cycles.to_string(),
            r.dma.stall_cycles.to_string(),
            r.dma.overlap_cycles.to_string(),
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
                r.dma.stall_cycles,
                r.dma.total_cycles.to_string(),
                100.0 * macs / (r.array_cycles as f64 * pe),
                r.ss.mapping_efficiency,
                100.0 * macs / (r.feed_cycles.max(1) as f64 * pe),
                [r.access.ifmap_reads, r.access.filter_reads, r.access.acc_writes],
            ),
        };
        let mut c = vec![id.to_string(), prefetch, total.to_string(), stall.to_string()];
        c.extend([util, map, cu].iter().map(|x| format!("{x}")));
        c.extend(ours.iter().cloned());
        compute.push_str(&csv_row(&c));
        let mut b = vec![id.to_string()];
        b.extend(reads.iter().map(|&x| format!("{}", x as f64 / total.max(1) as f64)));
        b.extend([blank(), blank(), blank()]);
        b.extend(ours.iter().cloned());
        bandwidth.push_str(&csv_row(&b));
        let mut d = vec![id.to_string()];
        for x in reads {
            d.extend([blank(), blank(), x.to_string()]);
        }
        d.extend((0..9).map(|_| blank()));
        d.extend(ours.iter().cloned());
        d.push(r.access.acc_reads.to_string());
        detail.push_str(&csv_row(&d));
    }
    for (name, text) in
        [("COMPUTE_REPORT.csv", compute), ("BANDWIDTH_REPORT.csv", bandwidth), ("DETAILED_ACCESS_REPORT.csv", detail)]
    {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}
