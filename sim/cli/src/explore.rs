//! `faultline explore`: protection plans against campaigns, paired, with a Pareto report.

use anyhow::{Context, Result};
use clap::Args;
use faultline_fault::explore::{self, ExploreProgress, ExploreResult, ExploreSpec};
use faultline_fault::Progress;
use faultline_hw::budget::HostMemory;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `faultline explore`.
#[derive(Args, Debug)]
pub struct ExploreArgs {
    /// Exploration file (RON), e.g. configs/explore-mlp.ron.
    pub spec: PathBuf,
    /// Output directory: explore.json, the Pareto report (index.html, pareto.md, pareto.csv,
    /// figures/), and each campaign's records under `<campaign>/<plan>/`, later rounds' under
    /// `<campaign>/<plan>/round-<r>/` (a rerun resumes them).
    #[arg(long)]
    pub out: PathBuf,
    /// Worker threads [default: all cores].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
}

/// Runs the command.
pub fn run(a: ExploreArgs, mem: &HostMemory) -> Result<()> {
    let spec = ExploreSpec::load(&a.spec)?;
    // Held through the report: the campaigns under it lock their own directories too.
    let _lock = crate::args::lock_output("--out", &a.out)?;
    let threads = a.threads.map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |t| t as usize);
    let bar = if std::io::stderr().is_terminal() { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} trials {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let result = explore::run(&spec, &a.spec, &a.out, threads, mem, |p| match p {
        ExploreProgress::Plan { campaign, plan, round } => {
            let round = if round > 1 { format!(", round {round}") } else { String::new() };
            bar.set_message(format!("{campaign} under {plan}{round}"));
            bar.set_position(0);
        }
        ExploreProgress::Campaign(Progress::Start { recorded, trials }) => {
            bar.set_length(trials);
            bar.set_position(recorded);
        }
        ExploreProgress::Campaign(Progress::Trial(_)) => bar.inc(1),
    })
    .with_context(|| format!("exploration {}", a.spec.display()))?;
    bar.finish_and_clear();
    let w = faultline_report::pareto::write_pareto(&result, &a.out)?;
    print(&result);
    println!("results: {}; report: {} ({} figures)", a.out.join("explore.json").display(), w.html.display(), w.figures);
    Ok(())
}

/// Prints each campaign's plans: cost, residual failure rate, what they caught.
fn print(r: &ExploreResult) {
    let pct = |p: f64| format!("{:.1}", 100.0 * p);
    for c in &r.campaigns {
        println!(
            "{} ({} on {}, {} trials per plan, {} cycles/step unprotected)",
            c.campaign, c.model, c.hw, c.trials, c.base_cycles
        );
        println!(
            "  {:<30} {:>9} {:>11} {:<26} {:<20} {:>22} {:>7} {:>9}",
            "plan",
            "cycles",
            "check bits",
            "failure FIT [95% CI]",
            "detected %",
            "failures -/+ of paired",
            "pareto",
            "at 95%"
        );
        for p in &c.plans {
            println!(
                "  {:<30} {:>9} {:>11} {:<26} {:<20} {:>22} {:>7} {:>9}",
                p.plan,
                format!("+{}%", pct(p.cycle_overhead)),
                p.area_bits,
                format!("{:.3} [{:.3}, {:.3}]", p.failure_fit.p, p.failure_fit.lo, p.failure_fit.hi),
                format!("{} [{}, {}]", pct(p.detected.p), pct(p.detected.lo), pct(p.detected.hi)),
                format!("{}/{} of {}", p.failures_removed, p.failures_added, p.paired_trials),
                if p.pareto { "yes" } else { "" },
                if p.front_at_confidence { "yes" } else { "" }
            );
        }
        if let Some(r) = faultline_report::pareto::compare::rounds(c) {
            println!("  {r}");
        }
        // The decision, then every pair of point-estimate Pareto plans.
        if !c.comparisons.is_empty() {
            let front: Vec<&str> = c.plans.iter().filter(|p| p.front_at_confidence).map(|p| p.plan.as_str()).collect();
            println!("  front at 95% (each plan fails demonstrably less than every cheaper one): {}", front.join(", "));
            let pareto = |n: &str| c.plans.iter().any(|p| p.plan == n && p.pareto);
            for x in c.comparisons.iter().filter(|x| pareto(&x.first) && pareto(&x.second)) {
                let pair = format!("{} vs {}", x.first, x.second);
                println!("    {pair:<58} {}", faultline_report::pareto::compare::verdict(x));
            }
        }
    }
}
