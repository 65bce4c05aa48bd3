//! `faultline gemm`: one GEMM on random inputs, optionally with one injected fault.

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use faultline_hw::budget::HostMemory;
use faultline_hw::fault::FaultSchedule;
use faultline_hw::mxu::{gemm, gemm_host_bytes};
use faultline_hw::{Dataflow, ExecMode, HwConfig, Matrix};
use faultline_num::NumFormat;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::PathBuf;
use std::time::Instant;

/// Dataflow choice on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum DataflowArg {
    /// Weight stationary.
    Ws,
    /// Output stationary.
    Os,
    /// Input stationary (weight stationary on the transposed problem).
    Is,
}

/// Execution mode on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// Step every register every clock.
    Cycle,
    /// Bit-exact functional twin (fast; no faults).
    Functional,
}

/// Arguments of `faultline gemm`.
#[derive(Args)]
pub struct GemmArgs {
    /// Hardware config (RON), e.g. configs/tpu-32x32.ron.
    #[arg(long)]
    pub(crate) config: PathBuf,
    /// Rows of A and of the output.
    #[arg(long)]
    pub(crate) m: usize,
    /// Columns of A = rows of W (the reduction length).
    #[arg(long)]
    pub(crate) k: usize,
    /// Columns of W and of the output.
    #[arg(long)]
    pub(crate) n: usize,
    /// Override the config's dataflow.
    #[arg(long, value_enum)]
    dataflow: Option<DataflowArg>,
    /// Execution mode.
    #[arg(long, value_enum, default_value = "cycle")]
    mode: ModeArg,
    /// Seed of the random inputs (ChaCha8; uniform in [-1, 1), or [-128, 127] for int8).
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,
    /// Inject one fault (cycle mode): KIND:SITE@TILE:CYCLE[+DURATION], e.g.
    /// flip:mxu.pe[3][5].psum[30]@0:40 or stuck1:mxu.pe[0][0].weight[14]@1:0+100.
    #[arg(long)]
    pub(crate) fault: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// ABFT with exact integer checksums (Li et al. 2021; needs an int8 config): W's row sums
    /// ride as base-256 digit columns in the same GEMM; prints plain and fused cycles, the
    /// overhead and the residual verdict (with --fault: whether C was corrupted and caught).
    #[arg(long)]
    pub(crate) abft: bool,
    /// With --abft (cycle mode): run N single-bit flips, uniform over every MXU site bit and
    /// every cycle of the fused GEMM, and count masked / false alarm / detected / silent.
    #[arg(long, requires = "abft", conflicts_with = "fault")]
    pub(crate) trials: Option<u64>,
    /// Worker threads for --trials [default: all cores].
    #[arg(long, requires = "trials")]
    pub(crate) threads: Option<u64>,
}

pub(crate) fn random(rng: &mut ChaCha8Rng, f: NumFormat, rows: usize, cols: usize) -> Matrix {
    Matrix::from_fn(rows, cols, |_, _| match f {
        NumFormat::Int8 => rng.gen_range(-128i32..=127) as u8 as u32,
        _ => f.f64_to_bits(rng.gen_range(-1.0..1.0)),
    })
}

/// Runs the command.
pub fn run(args: GemmArgs, mem: &HostMemory) -> Result<()> {
    let mut cfg = HwConfig::load(&args.config)?;
    if let Some(d) = args.dataflow {
        cfg.mxu.dataflow = match d {
            DataflowArg::Ws => Dataflow::WeightStationary,
            DataflowArg::Os => Dataflow::OutputStationary,
            DataflowArg::Is => Dataflow::InputStationary,
        };
    }
    for (name, v) in [("--m", args.m), ("--k", args.k), ("--n", args.n)] {
        if v == 0 {
            bail!("{name} must be at least 1");
        }
    }
    let mode = match args.mode {
        ModeArg::Cycle => ExecMode::CycleLevel,
        ModeArg::Functional => ExecMode::Functional,
    };
    let faults = match &args.fault {
        Some(f) => {
            if mode != ExecMode::CycleLevel {
                bail!("--fault needs --mode cycle (faults live in registers)");
            }
            FaultSchedule::one(crate::args::parse_fault(f)?)
        }
        None => FaultSchedule::none(),
    };
    if args.abft {
        return crate::abft::run(&args, &cfg, mode, &faults, mem);
    }
    // Before generating the inputs: a faulted run also keeps a golden run and the diff.
    let need = gemm_host_bytes(&cfg, args.m, args.k, args.n, mode, !faults.is_empty());
    mem.check(&format!("gemm {}x{}x{}", args.m, args.k, args.n), need)?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let input = cfg.mxu.input_format;
    let a = random(&mut rng, input, args.m, args.k);
    let w = random(&mut rng, input, args.k, args.n);
    let start = Instant::now();
    let res = gemm(&cfg, &a, &w, mode, &faults)?;
    let wall = start.elapsed().as_secs_f64();
    let corrupted = if faults.is_empty() {
        None
    } else {
        let golden = gemm(&cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none())?;
        Some(golden.out.diff(&res.out))
    };
    let s = res.stats;
    let checksum = format!("{:016x}", res.out.checksum());
    let sim_us = s.total_cycles as f64 / cfg.clock_mhz;
    if args.json {
        let mut j = serde_json::json!({
            "config": cfg.name,
            "dataflow": cfg.mxu.dataflow.short(),
            "mode": match mode { ExecMode::CycleLevel => "cycle", ExecMode::Functional => "functional" },
            "m": args.m, "k": args.k, "n": args.n,
            "total_cycles": s.total_cycles,
            "compute_cycles": s.compute_cycles,
            "folds": s.folds,
            "utilization": s.utilization,
            "macs": s.macs,
            "output_checksum": checksum,
            "simulated_us": sim_us,
            "wall_seconds": wall,
        });
        if let Some(c) = &corrupted {
            j["fault"] = serde_json::json!(args.fault);
            j["corrupted_outputs"] = serde_json::json!(c.len());
            j["corrupted_positions"] = serde_json::json!(c.iter().take(64).collect::<Vec<_>>());
        }
        println!("{j}");
    } else {
        println!(
            "gemm {}x{}x{} on {} ({}x{}, {}, {} x {} -> {}), {} mode",
            args.m,
            args.k,
            args.n,
            cfg.name,
            cfg.mxu.rows,
            cfg.mxu.cols,
            cfg.mxu.dataflow.short(),
            input.name(),
            input.name(),
            cfg.mxu.acc_format.name(),
            if mode == ExecMode::CycleLevel { "cycle-level" } else { "functional" }
        );
        println!("  total cycles     {:>12}  ({sim_us:.2} us at {} MHz)", s.total_cycles, cfg.clock_mhz);
        println!("  compute cycles   {:>12}", s.compute_cycles);
        println!("  folds            {:>12}", s.folds);
        println!("  PE utilization   {:>11.2}%", 100.0 * s.utilization);
        println!("  MACs             {:>12}", s.macs);
        println!("  output checksum  {checksum:>12}");
        println!("  wall time        {:>11.3}s", wall);
        if let Some(c) = &corrupted {
            println!("  fault            {}", args.fault.as_deref().unwrap_or(""));
            println!("{}", corrupted_line(c.len(), c.iter().map(|(r, c)| format!("({r},{c})"))));
        }
    }
    Ok(())
}

/// The `corrupted outputs` line of a faulted run (`gemm`, `op`): the count and the first 16
/// positions.
pub(crate) fn corrupted_line(count: usize, positions: impl Iterator<Item = String>) -> String {
    let shown: Vec<String> = positions.take(16).collect();
    let more = if count > 16 { format!(" ... +{}", count - 16) } else { String::new() };
    format!("  corrupted outputs{count:>12}  {}{more}", shown.join(" "))
}
