//! `faultline scalesim`: a SCALE-Sim run config and topology as they are; each layer's GEMM
//! run on the register-level array; SCALE-Sim's three reports written with its column names,
//! plus Faultline's own columns.

use crate::gemm::random;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use faultline_hw::budget::{sum, HostMemory};
use faultline_hw::error::one_line;
use faultline_hw::fault::FaultSchedule;
use faultline_hw::interop::scalesim::{self, Layer, ScaleSimConfig};
use faultline_hw::interop::scalesim_reports::{access, grown, write_reports, Convention, DmaCycles, LayerResult};
use faultline_hw::kernel::{self, KernelSpec};
use faultline_hw::mxu::{gemm, gemm_host_bytes, Schedule};
use faultline_hw::{ExecMode, HwConfig};
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

/// Whose conventions fill SCALE-Sim's columns.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConventionArg {
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
    convention: ConventionArg,
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

/// Runs the command.
pub fn run(args: ScaleSimArgs, mem: &HostMemory) -> Result<()> {
    let _lock = args.out.as_deref().map(|d| crate::args::lock_output("--out", d)).transpose()?;
    let cfg = ScaleSimConfig::load(&args.config)?;
    let text = scalesim::read_topology(&args.topology)?;
    // What the run holds for the whole topology, checked before it is built (a few bytes of
    // depth-wise row are 65,536 layers): the text, the layers (a growing Vec's spare capacity
    // counted), their names and a row of results each.
    let size = scalesim::topology_size(&text, &args.topology)?;
    let per_layer = (2 * size_of::<Layer>() + size_of::<LayerResult>()) as u64;
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
        let kind = KernelSpec::Matmul { m, k, n };
        // Timed on the .cfg's SRAMs when the operands fit them, else on SRAMs grown to hold
        // them (Faultline keeps a GEMM's operands resident).
        let (timed_on, fits) = match kernel::timing_host_bytes(&hw, &kind) {
            Ok(_) => (&hw, true),
            Err(_) => (&big, false),
        };
        let timing_bytes = kernel::timing_host_bytes(timed_on, &kind).with_context(|| what.clone())?;
        // The GEMM, then its timing, then its schedule: one at a time beside the rows.
        mem.check(&what, sum(&[held, gemm_host_bytes(&hw, m, k, n, mode, false), timing_bytes]))?;
        let (array_cycles, feed_cycles) = {
            let a = random(&mut rng, hw.mxu.input_format, m, k);
            let w = random(&mut rng, hw.mxu.input_format, k, n);
            let out = gemm(&hw, &a, &w, mode, &FaultSchedule::none()).with_context(|| what.clone())?;
            (out.stats.total_cycles, out.stats.compute_cycles)
        };
        let t = kernel::timing(timed_on, &kind).with_context(|| what.clone())?;
        let dma = DmaCycles { total: t.total_cycles, stall: t.stall_cycles, overlap: t.overlap_cycles };
        drop(t);
        let access = access(&Schedule::new(&hw.mxu, m, k, n)?);
        rows.push(LayerResult {
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
        let conv = match args.convention {
            ConventionArg::Scalesim => Convention::Scalesim,
            ConventionArg::Faultline => Convention::Faultline,
        };
        write_reports(dir, &cfg, conv, &rows)?;
        println!("reports: {}", dir.display());
    }
    Ok(())
}

fn pct(a: u64, b: u64) -> String {
    format!("{:+.1}%", 100.0 * (a as f64 / b.max(1) as f64 - 1.0))
}

fn print_table(args: &ScaleSimArgs, cfg: &ScaleSimConfig, hw: &HwConfig, rows: &[LayerResult], wall: f64) {
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
