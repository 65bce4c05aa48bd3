//! `faultline op`: one op through DMA, SRAM and the MXU/VPU, with its timing breakdown.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use faultline_graph::OptimizerSpec;
use faultline_hw::budget::HostMemory;
use faultline_hw::fault::FaultSchedule;
use faultline_hw::op::{self, ConvShape, OpKind};
use faultline_hw::{ExecMode, HwConfig};
use faultline_num::NumFormat;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Which op to run.
#[derive(Clone, Copy, ValueEnum)]
pub enum OpArg {
    /// `out[M][N] = A[M][K] * W[K][N]` (--m --k --n).
    Matmul,
    /// NHWC convolution via im2col (--batch --h --w --c-in --c-out --kernel --stride --pad).
    Conv2d,
    /// Elementwise ReLU (--n).
    Relu,
    /// Row-wise softmax (--rows --cols).
    Softmax,
    /// One Adam step (--n).
    Adam,
}

/// Execution mode on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Move every value through the memories; step the VPU lanes, and the MXU where a fault
    /// can matter (faults possible).
    Cycle,
    /// Bit-exact functional twin (fast; no faults).
    Functional,
    /// Memory path simulated; only the VPU chunk a fault lands in is stepped (same bits as cycle).
    Hybrid,
}

/// Arguments of `faultline op`.
#[derive(Args)]
pub struct OpArgs {
    /// Hardware config (RON), e.g. configs/tpu-32x32.ron.
    #[arg(long)]
    config: PathBuf,
    /// The op.
    #[arg(long, value_enum)]
    op: OpArg,
    /// Matmul: rows of A.
    #[arg(long)]
    m: Option<usize>,
    /// Matmul: reduction length.
    #[arg(long)]
    k: Option<usize>,
    /// Matmul: columns of W; relu/adam: elements.
    #[arg(long)]
    n: Option<usize>,
    /// Conv2d: batch.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Conv2d: input height.
    #[arg(long)]
    h: Option<usize>,
    /// Conv2d: input width.
    #[arg(long)]
    w: Option<usize>,
    /// Conv2d: input channels.
    #[arg(long)]
    c_in: Option<usize>,
    /// Conv2d: output channels.
    #[arg(long)]
    c_out: Option<usize>,
    /// Conv2d: kernel size (square).
    #[arg(long, default_value_t = 3)]
    kernel: usize,
    /// Conv2d: stride.
    #[arg(long, default_value_t = 1)]
    stride: usize,
    /// Conv2d: zero padding per side (default: kernel / 2, "same").
    #[arg(long)]
    pad: Option<usize>,
    /// Softmax: rows.
    #[arg(long)]
    rows: Option<usize>,
    /// Softmax: columns.
    #[arg(long)]
    cols: Option<usize>,
    /// Override the config's DRAM bandwidth, bytes per cycle (`inf` allowed).
    #[arg(long)]
    dram_bw: Option<f64>,
    /// Execution mode.
    #[arg(long, value_enum, default_value_t = ModeArg::Functional)]
    mode: ModeArg,
    /// Inject one fault (cycle mode): KIND:SITE@TILE:CYCLE[+DURATION] (the `gemm` syntax), e.g.
    /// flip:ub.word[0x40][7]@0:500 or flip:seq.acc_addr[3]@2:40. TILE is the fold (matmul,
    /// conv2d) or chunk (VPU ops); CYCLE counts from the tile's first load (MXU sites: from the
    /// fold's compute start; VPU sites: from the chunk's first issue).
    #[arg(long)]
    fault: Option<String>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the per-tile timeline (one row per tile, cycles) as CSV to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Writes the per-tile timeline as CSV to `path` (SCALE-Sim style: open it anywhere). All
/// columns in cycles.
fn write_tiles_csv(t: &faultline_hw::timing::OpTiming, path: &Path) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(["tile", "origin", "loaded", "compute_start", "ready", "stored"])?;
    for (i, x) in t.tiles.iter().enumerate() {
        w.write_record([i as u64, x.origin, x.loaded, x.compute_start, x.ready, x.stored].map(|c| c.to_string()))?;
    }
    Ok(w.flush()?)
}

fn need(v: Option<usize>, flag: &str, op: &str) -> Result<usize> {
    match v {
        Some(0) => bail!("--{flag} must be at least 1"),
        Some(x) => Ok(x),
        None => bail!("--op {op} needs --{flag}"),
    }
}

fn kind_of(a: &OpArgs) -> Result<OpKind> {
    Ok(match a.op {
        OpArg::Matmul => {
            OpKind::Matmul { m: need(a.m, "m", "matmul")?, k: need(a.k, "k", "matmul")?, n: need(a.n, "n", "matmul")? }
        }
        OpArg::Conv2d => {
            if a.kernel == 0 || a.stride == 0 || a.batch == 0 {
                bail!("--kernel, --stride and --batch must be at least 1");
            }
            OpKind::Conv2d(ConvShape {
                batch: a.batch,
                h: need(a.h, "h", "conv2d")?,
                w: need(a.w, "w", "conv2d")?,
                c_in: need(a.c_in, "c-in", "conv2d")?,
                c_out: need(a.c_out, "c-out", "conv2d")?,
                kh: a.kernel,
                kw: a.kernel,
                stride: a.stride,
                pad: a.pad.unwrap_or(a.kernel / 2),
            })
        }
        OpArg::Relu => OpKind::Relu { n: need(a.n, "n", "relu")? },
        OpArg::Softmax => {
            OpKind::Softmax { rows: need(a.rows, "rows", "softmax")?, cols: need(a.cols, "cols", "softmax")? }
        }
        OpArg::Adam => OpKind::Adam {
            n: need(a.n, "n", "adam")?,
            lr: 1e-3,
            // The training optimizer's, in the VPU's fp32 (each the nearest f32 of its decimal).
            b1: OptimizerSpec::ADAM_BETA1 as f32,
            b2: OptimizerSpec::ADAM_BETA2 as f32,
            eps: OptimizerSpec::ADAM_EPS as f32,
            t: 1,
        },
    })
}

fn inputs(cfg: &HwConfig, kind: &OpKind, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let gemm = matches!(kind, OpKind::Matmul { .. } | OpKind::Conv2d(_));
    let fmt = if gemm { cfg.mxu.input_format } else { NumFormat::Fp32 };
    kind.input_lens()
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            (0..l)
                .map(|_| {
                    let x: f64 =
                        if fmt == NumFormat::Int8 { rng.gen_range(-128.0..128.0) } else { rng.gen_range(-1.0..1.0) };
                    // Adam's second moments are non-negative.
                    let x = if matches!(kind, OpKind::Adam { .. }) && i == 3 { x.abs() } else { x };
                    fmt.f64_to_bits(x)
                })
                .collect()
        })
        .collect()
}

fn checksum(out: &[Vec<u32>]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in out {
        for &x in v {
            for b in x.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    h
}

#[derive(Serialize)]
struct Report<'a> {
    config: &'a str,
    op: String,
    mode: &'static str,
    fault: Option<String>,
    timing: &'a faultline_hw::timing::OpTiming,
    microseconds: f64,
    checksum: String,
    wall_seconds: f64,
    /// With a fault: output elements that differ from the fault-free run, and the first 64.
    #[serde(skip_serializing_if = "Option::is_none")]
    corrupted_outputs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    corrupted_positions: Option<Vec<String>>,
}

/// Runs the command.
pub fn run(a: OpArgs, mem: &HostMemory) -> Result<()> {
    let mut cfg = HwConfig::load(&a.config).with_context(|| "loading the hardware config")?;
    if let Some(bw) = a.dram_bw {
        cfg.dram.bandwidth_bytes_per_cycle = bw;
        cfg.validate(&a.config).context("--dram-bw")?;
    }
    let kind = kind_of(&a)?;
    let mode = match a.mode {
        ModeArg::Cycle | ModeArg::Hybrid => ExecMode::CycleLevel,
        ModeArg::Functional => ExecMode::Functional,
    };
    let faults = match &a.fault {
        None => FaultSchedule::none(),
        Some(s) => {
            if matches!(mode, ExecMode::Functional) {
                bail!("--fault needs --mode cycle or hybrid");
            }
            FaultSchedule::one(crate::args::parse_fault(s)?)
        }
    };
    // Before generating the inputs: the op must fit the machine (shape, DRAM, SRAMs) and the host
    // (a faulted run keeps a fault-free one to compare with).
    let golden_bytes = if faults.is_empty() { Some(0) } else { op::host_bytes(&cfg, &kind, ExecMode::Functional)? };
    let need = op::host_bytes(&cfg, &kind, mode)?.zip(golden_bytes).and_then(|(a, b)| a.checked_add(b));
    mem.check(&format!("op {}", kind.describe()), need)?;
    let ins = inputs(&cfg, &kind, a.seed);
    let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
    let t0 = Instant::now();
    let hybrid = matches!(a.mode, ModeArg::Hybrid);
    let out =
        if hybrid { op::run_hybrid(&cfg, &kind, &refs, &faults)? } else { op::run(&cfg, &kind, &refs, mode, &faults)? };
    let wall = t0.elapsed().as_secs_f64();
    let corrupted = if faults.is_empty() {
        None
    } else {
        let golden = op::run(&cfg, &kind, &refs, ExecMode::Functional, &FaultSchedule::none())?;
        Some(diff(&kind, &golden.out, &out.out))
    };
    let t = &out.timing;
    let r = Report {
        config: &cfg.name,
        op: kind.describe(),
        mode: match a.mode {
            ModeArg::Cycle => "cycle",
            ModeArg::Functional => "functional",
            ModeArg::Hybrid => "hybrid",
        },
        fault: a.fault.clone(),
        timing: t,
        microseconds: t.total_cycles as f64 / cfg.clock_mhz,
        checksum: format!("{:016x}", checksum(&out.out)),
        wall_seconds: wall,
        corrupted_outputs: corrupted.as_ref().map(Vec::len),
        corrupted_positions: corrupted.as_ref().map(|c| c.iter().take(64).cloned().collect()),
    };
    if let Some(p) = &a.csv {
        write_tiles_csv(t, p).with_context(|| format!("writing {}", p.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let pct = |x: u64| if t.total_cycles == 0 { 0.0 } else { 100.0 * x as f64 / t.total_cycles as f64 };
    println!("{} on {} ({} mode)", r.op, cfg.name, r.mode);
    println!(
        "  total cycles     {:>12}   ({:.2} us at {} MHz, {}-bound)",
        t.total_cycles, r.microseconds, cfg.clock_mhz, t.bound
    );
    println!("  compute cycles   {:>12}   ({:.1}% of total)", t.compute_cycles, pct(t.compute_cycles));
    println!("  DMA busy cycles  {:>12}   ({:.1}%)", t.dma_cycles, pct(t.dma_cycles));
    println!("  stall cycles     {:>12}   ({:.1}%, compute waiting for data)", t.stall_cycles, pct(t.stall_cycles));
    println!(
        "  overlap cycles   {:>12}   ({:.1}%, DMA and compute both busy)",
        t.overlap_cycles,
        pct(t.overlap_cycles)
    );
    println!(
        "  DRAM traffic     {:>12} B loaded, {} B stored, {} transfers",
        t.load_bytes,
        t.store_bytes,
        t.transfers.len()
    );
    println!("  tiles            {:>12}", t.tiles.len());
    println!("  utilization      {:>11.1}%", 100.0 * t.utilization);
    if let Some(f) = &r.fault {
        println!("  fault            {f}");
    }
    println!("  output checksum  {}", r.checksum);
    println!("  wall time        {:.3} s", wall);
    if let Some(c) = &corrupted {
        println!("{}", crate::gemm::corrupted_line(c.len(), c.iter().cloned()));
    }
    Ok(())
}

/// The output elements that differ between `golden` and `got`: `(row,col)` of a matmul or
/// conv2d result (rows are output pixels for conv2d), `[i]` of a VPU op's output (`[k][i]`
/// for its output `k` when it has several).
fn diff(kind: &OpKind, golden: &[Vec<u32>], got: &[Vec<u32>]) -> Vec<String> {
    let n = kind.gemm_dims().map(|(_, _, n)| n);
    let mut v = Vec::new();
    for (k, (g, f)) in golden.iter().zip(got).enumerate() {
        for (i, _) in g.iter().zip(f).enumerate().filter(|(_, (a, b))| a != b) {
            v.push(match (n, golden.len()) {
                (Some(n), _) => format!("({},{})", i / n, i % n),
                (None, 1) => format!("[{i}]"),
                (None, _) => format!("[{k}][{i}]"),
            });
        }
    }
    v
}
