//! `faultline plan`: how many trials a campaign needs for a stated margin, and how long they
//! take, from a small pilot of its own trials ([`faultline_fault::plan`]).

use anyhow::{Context, Result};
use clap::Args;
use faultline_fault::plan::{plan, CampaignPlan, Margin};
use faultline_fault::spec::Sampling;
use faultline_fault::{Campaign, CampaignSpec, RunOptions, Shard, TrialMode};
use faultline_hw::budget::HostMemory;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `faultline plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Campaign file (RON), e.g. configs/campaign-mlp-all.ron.
    pub spec: PathBuf,
    /// Interval half-width to aim at on the combined failure rate, as a fraction in (0, 0.5]
    /// (0.005: half a percentage point).
    #[arg(long, default_value_t = 0.005, value_parser = fraction(0.5), conflicts_with = "relative")]
    pub margin: f64,
    /// Aim instead at this fraction of the pilot's combined failure rate, in (0, 1] (0.5: the
    /// rate to within half of itself).
    #[arg(long, value_parser = fraction(1.0))]
    pub relative: Option<f64>,
    /// Two-sided confidence of the interval, in (0, 1).
    #[arg(long, default_value_t = 0.95, value_parser = fraction(0.999999))]
    pub confidence: f64,
    /// Pilot trials per class: the spec's classes sampled as `Stratified(per_class: N)`, timed.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(2..=100_000))]
    pub pilot: u64,
    /// Keep the pilot's records here, resuming any there [default: a temporary directory,
    /// removed afterwards].
    #[arg(long)]
    pub pilot_dir: Option<PathBuf>,
    /// Worker threads of the pilot, and of the campaign the wall times are for [default: all
    /// cores].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
}

/// A parser of numbers in `(0, hi]`.
fn fraction(hi: f64) -> impl Fn(&str) -> std::result::Result<f64, String> + Clone {
    move |s: &str| {
        let x: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
        if x > 0.0 && x <= hi {
            Ok(x)
        } else {
            Err(format!("`{s}`: must be in (0, {hi}]"))
        }
    }
}

/// Runs `faultline plan`.
pub fn run(a: PlanArgs, mem: &HostMemory) -> Result<()> {
    let spec = CampaignSpec::load(&a.spec)?;
    let threads = a.threads.map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |t| t as usize);
    let pilot = CampaignSpec { sampling: Sampling::Stratified { per_class: a.pilot }, ..spec.clone() };
    let start = Instant::now();
    let c = Campaign::prepare(pilot, &a.spec, mem).with_context(|| format!("campaign {}", a.spec.display()))?;
    let golden = start.elapsed().as_secs_f64();
    mem.check(&format!("campaign `{}` on {threads} threads", spec.name), c.host_bytes(threads))?;
    let (dir, temporary) = match &a.pilot_dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("faultline-plan-{}", std::process::id())), true),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    let opts = RunOptions { threads, shard: Shard::ALL, resume: true, mode: TrialMode::Hybrid };
    let summary = c.run(&dir, opts, |_| {});
    let planned = summary.map_err(anyhow::Error::from).and_then(|s| {
        let margin = a.relative.map_or(Margin::Absolute(a.margin), Margin::Relative);
        Ok(plan(&c.info, &s, &dir, golden, margin, a.confidence, threads)?)
    });
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    print(&spec, &c, &planned?);
    Ok(())
}

/// Seconds as a reader wants them: `42 s`, `12 min`, `3.4 h`.
fn duration(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 90.0 {
        format!("{s:.0} s")
    } else if s < 5400.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// Prints the plan: the pilot, each class, then the designs side by side.
fn print(spec: &CampaignSpec, c: &Campaign, p: &CampaignPlan) {
    let pct = |x: f64| format!("{:.2}", 100.0 * x);
    let points = if 100.0 * p.margin >= 0.01 { pct(p.margin) } else { format!("{:.2e}", 100.0 * p.margin) };
    println!(
        "plan for campaign {} ({} on {}): the failure rate to within {points} points at {}% confidence",
        spec.name,
        c.model(),
        c.info.hw,
        100.0 * p.confidence
    );
    let n: u64 = p.classes.len() as u64 * p.pilot_trials;
    println!(
        "pilot: {} trials per class ({} in all); combined failure {}% [{}, {}]",
        p.pilot_trials,
        n,
        pct(p.pilot.p),
        pct(p.pilot.lo),
        pct(p.pilot.hi)
    );
    // Measured times last and left-aligned: the columns before them never move.
    println!(
        "{:<30} {:>10} {:>7} {:>22} {:>11} {:>9} {:>8}  ms/trial",
        "class", "bits", "live %", "pilot failure % [CI]", "worst case", "at pilot", "Neyman"
    );
    for k in &p.classes {
        println!(
            "{:<30} {:>10} {:>7.1} {:>22} {:>11} {:>9} {:>8}  {:.2}",
            k.class,
            k.bits,
            100.0 * k.live_share,
            format!("{} [{}, {}]", pct(k.pilot.p), pct(k.pilot.lo), pct(k.pilot.hi)),
            k.worst_case,
            k.at_pilot,
            k.neyman,
            1e3 * k.trial_seconds
        );
    }
    println!("{:<44} {:>10}  wall on {} threads", "design (combined rate)", "trials", p.threads);
    let rows = [
        ("Uniform, worst case (p = 0.5)", p.uniform_worst_case, p.uniform_seconds(p.uniform_worst_case)),
        ("Uniform at the pilot's rate", p.uniform, p.uniform_seconds(p.uniform)),
        ("Stratified, equal per class, at the pilot's", p.equal_per_class, p.equal_seconds(p.equal_per_class)),
        ("Neyman allocation at the pilot's rates", p.neyman, p.neyman_seconds()),
        ("Neyman over live faults only (Adaptive)", p.live_neyman, p.live_neyman_seconds()),
    ];
    for (name, trials, secs) in rows {
        println!("{name:<44} {trials:>10}  {}", duration(secs));
    }
}
