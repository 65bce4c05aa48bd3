//! `faultline op`: one op lowered, placed and run as a training step runs it (DMA, SRAM, the
//! MXU and the VPU), with its instruction schedule, and one fault on the training fault path.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use faultline_graph::OptimizerSpec;
use faultline_hw::budget::HostMemory;
use faultline_hw::isa::Instr;
use faultline_hw::kernel::{ConvShape, KernelSpec};
use faultline_hw::memory::dma::Direction;
use faultline_hw::{ExecMode, HwConfig};
use faultline_train::kernel::Kernel;
use faultline_train::{MxuFormat, StepFault};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::path::PathBuf;
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
    /// The bit-exact functional twins; the instructions a fault reaches run at cycle level.
    Functional,
    /// Every instruction at cycle level (the same bits, slower).
    Cycle,
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
    /// MXU input format: bf16 (fp32 accumulate) or fp32, as `train --precision` takes it
    /// [default: the config's input_format].
    #[arg(long)]
    precision: Option<String>,
    /// Override the config's DRAM bandwidth, bytes per cycle (`inf` allowed).
    #[arg(long)]
    dram_bw: Option<f64>,
    /// Execution mode.
    #[arg(long, value_enum, default_value_t = ModeArg::Functional)]
    mode: ModeArg,
    /// Inject one fault: KIND:SITE@cycle=C[,for=N], C a cycle of the op's run as the
    /// instruction table shows it (`train --inject` without the step), e.g.
    /// flip:ub.word[0x40][7]@cycle=150 or flip:seq.acc_addr[3]@cycle=300.
    #[arg(long)]
    fault: Option<String>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the instruction table (one row per instruction, cycles) as CSV to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

fn need(v: Option<usize>, flag: &str, op: &str) -> Result<usize> {
    match v {
        Some(0) => bail!("--{flag} must be at least 1"),
        Some(x) => Ok(x),
        None => bail!("--op {op} needs --{flag}"),
    }
}

fn kind_of(a: &OpArgs) -> Result<KernelSpec> {
    Ok(match a.op {
        OpArg::Matmul => KernelSpec::Matmul {
            m: need(a.m, "m", "matmul")?,
            k: need(a.k, "k", "matmul")?,
            n: need(a.n, "n", "matmul")?,
        },
        OpArg::Conv2d => {
            if a.kernel == 0 || a.stride == 0 || a.batch == 0 {
                bail!("--kernel, --stride and --batch must be at least 1");
            }
            KernelSpec::Conv2d(ConvShape {
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
        OpArg::Relu => KernelSpec::Relu { n: need(a.n, "n", "relu")? },
        OpArg::Softmax => {
            KernelSpec::Softmax { rows: need(a.rows, "rows", "softmax")?, cols: need(a.cols, "cols", "softmax")? }
        }
        OpArg::Adam => KernelSpec::Adam {
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

/// Random inputs in `[-1, 1)` as fp32 bits (Adam's second moments non-negative): the MXU
/// rounds GEMM operands to its input format as it reads them, as in training.
fn inputs(kind: &KernelSpec, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    kind.input_lens()
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            (0..l)
                .map(|_| {
                    let x: f32 = rng.gen_range(-1.0..1.0);
                    let x = if matches!(kind, KernelSpec::Adam { .. }) && i == 3 { x.abs() } else { x };
                    x.to_bits()
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
    /// MXU input format of the run.
    precision: MxuFormat,
    fault: Option<String>,
    cycles: u64,
    microseconds: f64,
    mxu_busy_cycles: u64,
    vpu_busy_cycles: u64,
    /// Cycles DMA transfers take, issue to last word.
    dma_cycles: u64,
    /// Cycles the MXU and VPU sat waiting for an instruction's inputs.
    stall_cycles: u64,
    /// Words moved from DRAM to SRAM and back.
    words_loaded: usize,
    words_stored: usize,
    /// MACs over cycles x array PEs (0 for VPU ops).
    utilization: f64,
    instructions: Vec<crate::program::Row>,
    checksum: String,
    wall_seconds: f64,
    /// With a fault: where it landed and what it did to the instruction it hit.
    #[serde(skip_serializing_if = "Option::is_none")]
    injection: Option<faultline_train::InjectionReport>,
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
    let precision = crate::args::precision(a.precision.as_deref(), &cfg)?;
    let (mode, mode_name) = match a.mode {
        ModeArg::Functional => (ExecMode::Functional, "functional"),
        ModeArg::Cycle => (ExecMode::CycleLevel, "cycle"),
    };
    let fault = a.fault.as_deref().map(StepFault::parse_on_op).transpose()?;
    // Before generating the inputs: the op must fit the host (a faulted run keeps a fault-free
    // one to compare with) and the machine.
    let runs = if fault.is_some() { 2 } else { 1 };
    mem.check(&format!("op {}", kind.describe()), Kernel::host_bytes(&kind, &cfg)?.and_then(|b| b.checked_mul(runs)))?;
    let kernel = Kernel::new(&kind, &cfg, mode, precision)?;
    let ins = inputs(&kind, a.seed);
    let t0 = Instant::now();
    let out = kernel.run(&ins, fault.as_slice())?;
    let wall = t0.elapsed().as_secs_f64();
    let corrupted = match fault {
        None => None,
        Some(_) => Some(diff(&kind, &kernel.run(&ins, &[])?.outputs, &out.outputs)),
    };
    let sched = kernel.schedule();
    let p = kernel.program();
    let words = |d: Direction| {
        p.instrs.iter().map(move |i| match i {
            Instr::Dma { dir, len, .. } if *dir == d => *len,
            _ => 0,
        })
    };
    let pes = (kernel.hw.mxu.rows * kernel.hw.mxu.cols) as f64;
    let macs = kind.gemm_dims().map_or(0.0, |(m, k, n)| m as f64 * k as f64 * n as f64);
    let stall = |u: &str| sched.per_phase_unit.values().filter_map(|x| x.get(u)).map(|c| c.stall).sum::<u64>();
    let mut injection = out.injection;
    if let (Some(r), Some(text)) = (injection.as_mut(), &a.fault) {
        // The op's clock has no steps: the report names the fault as it was given.
        r.fault = text.clone();
    }
    let r = Report {
        config: &cfg.name,
        op: kind.describe(),
        mode: mode_name,
        precision,
        fault: a.fault.clone(),
        cycles: out.cycles,
        microseconds: out.cycles as f64 / cfg.clock_mhz,
        mxu_busy_cycles: sched.mxu_cycles,
        vpu_busy_cycles: sched.vpu_cycles,
        dma_cycles: sched.dma_cycles,
        stall_cycles: stall("mxu") + stall("vpu"),
        words_loaded: words(Direction::Load).sum(),
        words_stored: words(Direction::Store).sum(),
        utilization: if out.cycles == 0 { 0.0 } else { macs / (out.cycles as f64 * pes) },
        instructions: crate::program::rows(p, sched, &kernel.graph.graph),
        checksum: format!("{:016x}", checksum(&out.outputs)),
        wall_seconds: wall,
        injection,
        corrupted_outputs: corrupted.as_ref().map(Vec::len),
        corrupted_positions: corrupted.as_ref().map(|c| c.iter().take(64).cloned().collect()),
    };
    if let Some(path) = &a.csv {
        let mut w = csv::Writer::from_path(path).with_context(|| format!("writing {}", path.display()))?;
        for row in &r.instructions {
            w.serialize(row)?;
        }
        w.flush().with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let pct = |x: u64| if r.cycles == 0 { 0.0 } else { 100.0 * x as f64 / r.cycles as f64 };
    println!(
        "{} on {} ({} MXU inputs, {} mode): {} instructions, {} cycles ({:.2} us at {} MHz)",
        r.op,
        cfg.name,
        precision,
        r.mode,
        r.instructions.len(),
        r.cycles,
        r.microseconds,
        cfg.clock_mhz
    );
    crate::program::print_rows(&r.instructions);
    println!(
        "busy: MXU {} cycles ({:.1}%), VPU {} cycles ({:.1}%), DMA {} cycles ({:.1}%); stalled waiting for data: {} cycles",
        r.mxu_busy_cycles,
        pct(r.mxu_busy_cycles),
        r.vpu_busy_cycles,
        pct(r.vpu_busy_cycles),
        r.dma_cycles,
        pct(r.dma_cycles),
        r.stall_cycles
    );
    println!("DRAM traffic: {} words loaded, {} stored", r.words_loaded, r.words_stored);
    if macs > 0.0 {
        println!("MXU utilization: {:.1}% (MACs over cycles x {} PEs)", 100.0 * r.utilization, pes);
    }
    if let Some(inj) = &r.injection {
        println!("fault: {inj}");
    }
    println!("output checksum: {}", r.checksum);
    println!("wall time: {:.3} s", wall);
    if let Some(c) = &corrupted {
        println!("{}", crate::gemm::corrupted_line(c.len(), c.iter().cloned()));
    }
    Ok(())
}

/// The output elements that differ between `golden` and `got`: `(row,col)` of a matmul or
/// conv2d result (rows are output pixels for conv2d), `[i]` of a VPU op's output (`[k][i]`
/// for its output `k` when it has several).
fn diff(kind: &KernelSpec, golden: &[Vec<u32>], got: &[Vec<u32>]) -> Vec<String> {
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
