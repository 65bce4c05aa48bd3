//! `faultline campaign` and `faultline merge`: fault-injection campaigns during training.

use anyhow::{bail, Context, Result};
use clap::Args;
use faultline_fault::campaign::Next;
use faultline_fault::record::Summary;
use faultline_fault::spec::Sampling;
use faultline_fault::store::merge_rounds;
use faultline_fault::{Campaign, CampaignSpec, Outcome, Progress, RunOptions, Shard, TrialMode};
use faultline_hw::budget::HostMemory;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Arguments of `faultline campaign`.
#[derive(Args, Debug)]
pub struct CampaignArgs {
    /// Campaign file (RON), e.g. configs/campaign-mlp-mxu.ron.
    pub spec: PathBuf,
    /// Output directory: campaign.json, records.jsonl (one line per trial), summary.json,
    /// timing.jsonl.
    #[arg(long)]
    pub out: PathBuf,
    /// Worker threads [default: all cores].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Run the deterministic slice I of N (0-based), e.g. 0/4; `faultline merge` combines the
    /// slices' directories into what one run writes.
    #[arg(long, value_parser = Shard::parse, default_value = "0/1")]
    pub shard: Shard,
    /// Continue the records in --out (after a kill or crash) instead of refusing it.
    #[arg(long)]
    pub resume: bool,
    /// For a shard of an Adaptive campaign: run its slice of the round after those merged in
    /// DIR (`faultline merge` of the shards' earlier rounds), appending to --out, which holds
    /// its slices of them; without it a shard runs the first round. The last line says which
    /// round ran, or that the campaign is finished and nothing ran.
    #[arg(long, value_name = "DIR")]
    pub after: Option<PathBuf>,
    /// How trials run: hybrid (the faulted instruction at register level, the rest
    /// functionally; provably dead faults not run) or cycle (every instruction of every step at
    /// register level, dead faults included). Records are identical; cycle is the reference
    /// hybrid is checked and timed against.
    #[arg(long, value_enum, default_value_t = Mode::Hybrid)]
    pub mode: Mode,
    /// Run with this protection plan (configs/protect-*.ron) instead of the spec's
    /// `protection` (if any): its checks join the step, its codes guard their classes.
    #[arg(long, value_name = "PLAN")]
    pub protect: Option<PathBuf>,
    /// Print the summary as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// How trials run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The faulted instruction at register level, the rest functionally.
    Hybrid,
    /// Everything at register level.
    #[value(alias = "cycle-level")]
    Cycle,
}

/// Arguments of `faultline merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// Output directory (empty or new).
    #[arg(long)]
    pub out: PathBuf,
    /// The shard directories, one per slice, e.g. traces/c/shard-0 traces/c/shard-1.
    #[arg(required = true)]
    pub shards: Vec<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `faultline campaign`.
pub fn run(a: CampaignArgs, mem: &HostMemory) -> Result<()> {
    let mut spec = CampaignSpec::load(&a.spec)?;
    if let Some(plan) = &a.protect {
        // Absolute, so that the spec's directory does not re-anchor it.
        spec.protection = Some(std::path::absolute(plan).with_context(|| format!("--protect {}", plan.display()))?);
        spec.validate(&a.spec)?;
    }
    if let (Some(dir), false) = (&a.after, matches!(spec.sampling, Sampling::Adaptive { .. })) {
        bail!(
            "--after {}: only a shard of an Adaptive campaign runs after a merge, and {} samples {:?}",
            dir.display(),
            a.spec.display(),
            spec.sampling
        );
    }
    let threads = a.threads.map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |t| t as usize);
    let show = !a.json && std::io::stderr().is_terminal();
    let golden = if show {
        let (model, hw) = (spec.resolve(&a.spec, &spec.model), spec.resolve(&a.spec, &spec.hw));
        eprintln!("golden run: {} steps of {} on {}", spec.golden_steps, model.display(), hw.display());
        let b = ProgressBar::new(spec.golden_steps);
        b.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} golden steps ETA {eta}")
                .expect("static template")
                .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let c = Campaign::prepare_with(spec, &a.spec, mem, |s| golden.set_position(s))?;
    golden.finish_and_clear();
    mem.check(&format!("campaign `{}` on {threads} threads", c.info.spec.name), c.host_bytes(threads))?;
    let bar = if show {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} trials {per_sec} ETA {eta}  {msg}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let counts: Vec<AtomicU64> = Outcome::ALL.iter().map(|_| AtomicU64::new(0)).collect();
    let mode = match a.mode {
        Mode::Hybrid => TrialMode::Hybrid,
        Mode::Cycle => TrialMode::CycleLevel,
    };
    let opts = RunOptions { threads, shard: a.shard, resume: a.resume, mode };
    let adaptive = matches!(c.info.spec.sampling, Sampling::Adaptive { .. });
    let progress = |p: Progress| match p {
        Progress::Start { recorded, trials } => {
            // The bar counts this run's trials, so its rate and ETA are this run's.
            bar.set_length(trials - recorded);
            if recorded > 0 {
                bar.println(format!("resuming: {recorded} of {trials} trials recorded already"));
            }
        }
        Progress::Trial(r) => {
            let i = Outcome::ALL.iter().position(|&o| o == r.outcome).expect("outcome listed");
            counts[i].fetch_add(1, Ordering::Relaxed);
            let msg: Vec<String> = Outcome::ALL
                .iter()
                .zip(&counts)
                .map(|(o, n)| (o, n.load(Ordering::Relaxed)))
                .filter(|(_, n)| *n > 0)
                .map(|(o, n)| format!("{o} {n}"))
                .collect();
            bar.set_message(msg.join(", "));
            bar.inc(1);
        }
    };
    let ran = if adaptive {
        c.run_rounds(&a.out, opts, a.after.as_deref(), progress).map(|(s, n)| (s, Some(n)))
    } else {
        c.run(&a.out, opts, progress).map(|s| (s, None))
    };
    let (summary, next) = ran.with_context(|| format!("campaign {}", a.spec.display()))?;
    bar.finish_and_clear();
    print_summary(&summary, a.json, &a.out)?;
    if let Some(n) = next {
        // One round of a shard says what ran; the rest say whether the campaign is finished.
        let line = match (&n, a.shard == Shard::ALL && a.after.is_none()) {
            (Next::Round { .. }, _) => format!(
                "adaptive: ran {n} on shard {}/{}; merge the shards, then run the next round with --after MERGED_DIR",
                a.shard.index, a.shard.count
            ),
            (Next::Finished { .. }, true) => format!("adaptive: {n}"),
            (Next::Finished { .. }, false) => format!("adaptive: {n}; nothing to run"),
        };
        print_status(&line, a.json);
    }
    if let (Some(p), false) = (&c.info.protection, a.json) {
        print_protection(p);
    }
    Ok(())
}

/// Prints what a protection plan cost, how its checks fared on the golden run and the bounds
/// its clamps learned there.
fn print_protection(p: &faultline_fault::protect::Applied) {
    println!(
        "protection {}: step {} -> {} cycles (+{:.1}%), {} check bits",
        p.plan.name,
        p.base_cycles,
        p.cycles,
        100.0 * p.cycle_overhead(),
        p.area_bits
    );
    for c in &p.checks {
        let margin = if c.golden_max > 0.0 { format!("{:.3e}x", c.threshold / c.golden_max) } else { "-".into() };
        println!(
            "  {:<32} threshold {:<10.3e} golden max {:<10.3e} margin {:<11} false positives {}",
            c.name, c.threshold, c.golden_max, margin, c.false_positives
        );
    }
    for c in &p.clamps {
        println!(
            "  {:<32} bound     {:<10.3e} golden max {:<10.3e} margin {}x",
            c.name, c.bound, c.golden_max, c.margin
        );
    }
}

/// Runs `faultline merge`.
pub fn run_merge(a: MergeArgs) -> Result<()> {
    let (summary, next) = merge_rounds(&a.out, &a.shards)?;
    print_summary(&summary, a.json, &a.out)?;
    match next {
        Some(n @ Next::Round { .. }) => {
            print_status(&format!("adaptive: next {n}; run each shard with --after {}", a.out.display()), a.json)
        }
        Some(n) => print_status(&format!("adaptive: {n}"), a.json),
        None => {}
    }
    Ok(())
}

/// Prints an adaptive campaign's last line, `adaptive: ...` (scripts test its start): on
/// standard output after the table, or on standard error beside `--json`'s one object.
fn print_status(line: &str, json: bool) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// Prints a summary: a table of outcome shares per class, or JSON.
fn print_summary(s: &Summary, json: bool, out: &std::path::Path) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(s)?);
        return Ok(());
    }
    println!(
        "campaign {}: {} trials ({} simulated, {} skipped as provably dead, {} dead ones verified masked)",
        s.campaign, s.trials, s.simulated, s.skipped_dead, s.verified_dead
    );
    let pct = |p: f64| format!("{:.1}", 100.0 * p);
    // The report's terms: vulnerability is the share not masked, failure the share that failed.
    println!(
        "{:<28} {:>7}  {:<24} {:<22}  outcomes",
        "class", "trials", "vulnerability % [95% CI]", "failure % [95% CI]"
    );
    for c in &s.classes {
        let outcomes: Vec<String> =
            c.outcomes.iter().filter(|o| o.share.k > 0).map(|o| format!("{} {}", o.outcome, o.share.k)).collect();
        println!(
            "{:<28} {:>7}  {:<24} {:<22}  {}",
            c.class,
            c.trials,
            format!("{} [{}, {}]", pct(c.unmasked.p), pct(c.unmasked.lo), pct(c.unmasked.hi)),
            format!("{} [{}, {}]", pct(c.failure.p), pct(c.failure.lo), pct(c.failure.hi)),
            outcomes.join(", ")
        );
    }
    println!(
        "all selected ({}): vulnerability {}% [{}, {}], failure {}% [{}, {}]",
        s.unmasked.method,
        pct(s.unmasked.p),
        pct(s.unmasked.lo),
        pct(s.unmasked.hi),
        pct(s.failure.p),
        pct(s.failure.lo),
        pct(s.failure.hi)
    );
    println!("records: {}", out.join("records.jsonl").display());
    Ok(())
}
