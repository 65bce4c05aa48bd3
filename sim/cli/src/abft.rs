//! `faultline gemm --abft [--trials N]`: an int8 GEMM with exact integer checksum columns
//! (`faultline_hw::protect::abft`, after Li et al. 2021), its cycle overhead, and optionally one fault or
//! a campaign of random single-bit flips classified by what the check saw.

use crate::gemm::{random, GemmArgs};
use anyhow::{bail, Context, Result};
use faultline_fault::abft_trials::{self, FusedGemm};
use faultline_hw::budget::HostMemory;
use faultline_hw::fault::FaultSchedule;
use faultline_hw::mxu::{gemm, gemm_host_bytes, GemmStats};
use faultline_hw::protect::abft::{self, AbftOutcome};
use faultline_hw::{ExecMode, HwConfig, Matrix};
use faultline_num::NumFormat;
use indicatif::{ProgressBar, ProgressStyle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::io::IsTerminal;
use std::time::Instant;

/// Cycle counts of the plain and the fused GEMM.
struct Overhead {
    plain: GemmStats,
    fused: GemmStats,
}

impl Overhead {
    /// Extra cycles of the fused GEMM, in percent of the plain one.
    fn percent(&self) -> f64 {
        100.0 * (self.fused.total_cycles as f64 / self.plain.total_cycles as f64 - 1.0)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "plain_cycles": self.plain.total_cycles,
            "fused_cycles": self.fused.total_cycles,
            "plain_folds": self.plain.folds,
            "fused_folds": self.fused.folds,
            "overhead_percent": self.percent(),
        })
    }

    fn print(&self) {
        println!("  plain cycles     {:>12}  ({} folds)", self.plain.total_cycles, self.plain.folds);
        println!("  fused cycles     {:>12}  ({} folds)", self.fused.total_cycles, self.fused.folds);
        println!("  cycle overhead   {:>11.2}%", self.percent());
    }
}

/// Runs `gemm --abft` (with `--fault` or `--trials` if given) on `cfg` in `mode`.
pub(crate) fn run(
    args: &GemmArgs,
    cfg: &HwConfig,
    mode: ExecMode,
    faults: &FaultSchedule,
    mem: &HostMemory,
) -> Result<()> {
    let input = cfg.mxu.input_format;
    if input != NumFormat::Int8 {
        bail!(
            "--abft needs an int8 config (mxu.input_format: Int8, exact int32 checksums); {} has input format {}",
            args.config.display(),
            input.name()
        );
    }
    if args.trials.is_some() && mode != ExecMode::CycleLevel {
        bail!("--trials needs --mode cycle (faults live in registers)");
    }
    if args.trials == Some(0) {
        bail!("--trials must be at least 1");
    }
    let threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(t) => t as usize,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let (m, k, n) = (args.m, args.k, args.n);
    // Before generating the inputs: the plain GEMM, the fused one (at most 4 more columns) and,
    // per worker, a faulty fused run beside its golden twin.
    let workers = if args.trials.is_some() { threads as u64 } else { 1 };
    let faulty = gemm_host_bytes(cfg, m, k, n + abft::MAX_DIGITS, mode, true);
    let need = [
        gemm_host_bytes(cfg, m, k, n, mode, false),
        gemm_host_bytes(cfg, m, k, n + abft::MAX_DIGITS, ExecMode::Functional, false),
        faulty.and_then(|f| f.checked_mul(workers)),
    ]
    .into_iter()
    .try_fold(0u64, |acc, b| b.and_then(|b| acc.checked_add(b)));
    mem.check(&format!("gemm --abft {m}x{k}x{n}"), need)?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let a = random(&mut rng, input, m, k);
    let w = random(&mut rng, input, k, n);
    let (wf, d) = abft::augment(&w);
    let start = Instant::now();
    let plain = gemm(cfg, &a, &w, mode, &FaultSchedule::none())?;
    let golden = gemm(cfg, &a, &wf, mode, &FaultSchedule::none())?;
    if abft::data_part(&golden.out, n) != plain.out {
        bail!("internal error: the fused GEMM's first {n} columns differ from the plain GEMM");
    }
    let cost = Overhead { plain: plain.stats, fused: golden.stats };
    let clean = abft::residuals(&golden.out, n, d).iter().all(|&r| r == 0);
    let header = format!(
        "gemm {m}x{k}x{n} on {} ({}x{}, {}, int8 x int8 -> int32), {} mode, ABFT: {d} checksum digit column{}",
        cfg.name,
        cfg.mxu.rows,
        cfg.mxu.cols,
        cfg.mxu.dataflow.short(),
        if mode == ExecMode::CycleLevel { "cycle-level" } else { "functional" },
        if d == 1 { "" } else { "s" },
    );
    if let Some(trials) = args.trials {
        return campaign(args, cfg, &a, &wf, (n, d), &golden.out, &cost, trials, threads, rng, &header);
    }
    let fault = if faults.is_empty() {
        None
    } else {
        let out = gemm(cfg, &a, &wf, mode, faults)?.out;
        let outcome = abft::classify(&golden.out, &out, n, d);
        let flagged = abft::residuals(&out, n, d).iter().filter(|&&r| r != 0).count();
        let diff = golden.out.diff(&out);
        Some((outcome, flagged, diff))
    };
    let wall = start.elapsed().as_secs_f64();
    if args.json {
        let mut j = serde_json::json!({
            "config": cfg.name,
            "dataflow": cfg.mxu.dataflow.short(),
            "m": m, "k": k, "n": n,
            "digits": d,
            "fault_free_residuals_zero": clean,
            "wall_seconds": wall,
        });
        merge(&mut j, cost.json());
        if let Some((outcome, flagged, diff)) = &fault {
            let in_c = diff.iter().filter(|&&(_, c)| c < n).count();
            merge(
                &mut j,
                serde_json::json!({
                    "fault": args.fault,
                    "outcome": outcome.name(),
                    "c_corrupted": outcome.corrupted(),
                    "detected": *flagged > 0,
                    "corrupted_outputs": in_c,
                    "changed_checksum_outputs": diff.len() - in_c,
                    "flagged_rows": flagged,
                }),
            );
        }
        println!("{j}");
        return Ok(());
    }
    println!("{header}");
    cost.print();
    println!("  fault-free check {:>12}", if clean { "all 0" } else { "NONZERO" });
    if let Some((outcome, flagged, diff)) = &fault {
        let in_c: Vec<_> = diff.iter().filter(|&&(_, c)| c < n).collect();
        println!("  fault            {}", args.fault.as_deref().unwrap_or(""));
        println!("{}", crate::gemm::corrupted_line(in_c.len(), in_c.iter().map(|(r, c)| format!("({r},{c})"))));
        println!("  checksum changed {:>12}", diff.len() - in_c.len());
        println!("  flagged rows     {flagged:>12}");
        println!("  verdict          {:>12}  ({})", outcome.name(), verdict(*outcome));
    }
    println!("  wall time        {wall:>11.3}s");
    Ok(())
}

/// One line on what an outcome means.
fn verdict(o: AbftOutcome) -> &'static str {
    match o {
        AbftOutcome::Masked => "C and checksum columns unchanged",
        AbftOutcome::ChecksumOnly => "C correct; a checksum column changed by a multiple of 2^32 / 256^t, unseen",
        AbftOutcome::FalseAlarm => "C correct, residual nonzero",
        AbftOutcome::Detected => "C corrupted, residual nonzero",
        AbftOutcome::Silent => "C corrupted, every residual 0",
    }
}

fn merge(j: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(o), serde_json::Value::Object(more)) = (j.as_object_mut(), more) {
        o.extend(more);
    }
}

/// `trials` single-bit flips of the fused GEMM ([`abft_trials::run`] on `threads` workers),
/// printed as a table or JSON.
#[allow(clippy::too_many_arguments)]
fn campaign(
    args: &GemmArgs,
    cfg: &HwConfig,
    a: &Matrix,
    wf: &Matrix,
    (n, d): (usize, usize),
    golden: &Matrix,
    cost: &Overhead,
    trials: u64,
    threads: usize,
    mut rng: ChaCha8Rng,
    header: &str,
) -> Result<()> {
    let cycles = cost.fused.total_cycles;
    let bar = if !args.json && std::io::stderr().is_terminal() {
        let b = ProgressBar::new(trials);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} trials {per_sec} ETA {eta}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("starting worker threads")?;
    let start = Instant::now();
    let g = FusedGemm { a, wf, n, d, golden, cycles };
    let run = pool.install(|| abft_trials::run(cfg, g, trials, &mut rng, || bar.inc(1)))?;
    bar.finish_and_clear();
    let wall = start.elapsed().as_secs_f64();
    let (totals, corrupted, detection, per_class) = (run.totals(), run.corrupted(), run.detection(), run.by_class());
    let site_bits = run.site_bits;
    if args.json {
        let outcome_map = |v: &[u64]| -> serde_json::Map<String, serde_json::Value> {
            AbftOutcome::ALL.iter().zip(v).map(|(o, &c)| (o.name().to_string(), c.into())).collect()
        };
        let mut j = serde_json::json!({
            "config": cfg.name,
            "dataflow": cfg.mxu.dataflow.short(),
            "m": args.m, "k": args.k, "n": n,
            "digits": d,
            "seed": args.seed,
            "trials": trials,
            "site_bits": site_bits,
            "cycles": cycles,
            "outcomes": outcome_map(&totals),
            "c_corrupted": corrupted,
            "detection": detection,
            "by_class": per_class.iter().map(|(p, v)| (p.clone(), serde_json::Value::Object(outcome_map(v)))).collect::<serde_json::Map<_, _>>(),
            "threads": threads,
            "wall_seconds": wall,
        });
        merge(&mut j, cost.json());
        println!("{j}");
        return Ok(());
    }
    println!("{header}");
    cost.print();
    println!(
        "  {trials} single-bit flips, uniform over {site_bits} MXU site bits x {cycles} cycles (seed {}), {threads} threads, {wall:.2} s",
        args.seed
    );
    let pct = |c: u64| 100.0 * c as f64 / trials as f64;
    for (o, &c) in AbftOutcome::ALL.iter().zip(&totals) {
        println!("  {:<16} {c:>8}  {:>6.2}%  {}", o.name(), pct(c), verdict(*o));
    }
    println!(
        "  detection rate   {:>8}  {:>6.2}%  of {} that corrupted C; 95% CI {:.2}-{:.2}%",
        detection.k,
        100.0 * detection.p,
        detection.n,
        100.0 * detection.lo,
        100.0 * detection.hi
    );
    println!("  {:<26}{}", "by site class", AbftOutcome::ALL.map(|o| format!("{:>14}", o.name())).join(""));
    for (p, v) in &per_class {
        println!("  {p:<26}{}", v.iter().map(|c| format!("{c:>14}")).collect::<String>());
    }
    Ok(())
}
