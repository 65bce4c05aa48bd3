//! `faultline report` and `faultline diff`: campaign records folded back onto the hardware.

use anyhow::Result;
use clap::Args;
use faultline_hw::budget::HostMemory;
use faultline_report::aggregate::{aggregate, ties, Report};
use faultline_report::diff::{Change, DiffRow};
use faultline_report::document::{pct, rank_intervals, rank_list};
use faultline_report::load::{load, Trace};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Arguments of `faultline report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A campaign's output directory (campaign.json, records.jsonl), e.g. traces/mlp-mxu.
    pub trace: PathBuf,
    /// Report directory: index.html, report.md, summary.csv, trials.csv, figures/.
    #[arg(long)]
    pub out: PathBuf,
}

/// Arguments of `faultline diff`.
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// Campaign A's output directory (e.g. before a protection plan).
    pub a: PathBuf,
    /// Campaign B's output directory (e.g. after).
    pub b: PathBuf,
    /// Output directory: index.html, report.md, diff.csv.
    #[arg(long)]
    pub out: PathBuf,
}

/// Loads and aggregates a trace directory, with a progress bar over its bytes on a terminal.
fn read(dir: &Path, mem: &HostMemory) -> Result<(Trace, Report)> {
    let bar = if std::io::stderr().is_terminal() { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("reading {}", dir.display()));
    let trace = load(dir, mem, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let report = aggregate(&trace);
    Ok((trace, report))
}

/// Runs `faultline report`.
pub fn run(a: ReportArgs, mem: &HostMemory) -> Result<()> {
    let _lock = crate::args::lock_output("--out", &a.out)?;
    let (trace, report) = read(&a.trace, mem)?;
    let w = faultline_report::write_report(&trace, &report, &a.out)?;
    let s = &report.summary;
    println!(
        "report of campaign {}: {} trials ({} simulated, {} provably dead), {} figures",
        trace.info.spec.name, s.trials, s.simulated, s.skipped_dead, w.figures
    );
    println!(
        "{:<18} {:>10} {:>8}  {:<24} {:<24}",
        "unit", "bits", "trials", "vulnerability % [95% CI]", "failure % [95% CI]"
    );
    for u in &report.units {
        println!("{:<18} {:>10} {:>8}  {:<24} {:<24}", u.unit, u.bits, u.trials, pct(u.unmasked), pct(u.failure));
    }
    let top: Vec<String> = report
        .ranking
        .iter()
        .filter(|r| r.failure_per_bit > 0.0)
        .take(3)
        .map(|r| {
            let [lo, hi] = r.failure_ci;
            format!(
                "{} ({:.2}% [{:.2}, {:.2}] per faulty bit)",
                r.class,
                100.0 * r.failure_per_bit,
                100.0 * lo,
                100.0 * hi
            )
        })
        .collect();
    if !top.is_empty() {
        println!("protect first: {}", top.join(", "));
        if let Some(tied) = ties(&rank_intervals(&report)).first().filter(|t| !t.is_empty()) {
            println!("  not separated: #1's 95% interval overlaps those of {} (the report's ranking)", rank_list(tied));
        }
    }
    println!("wrote {}, {}, {}, {}", w.html.display(), w.markdown.display(), w.csv[0].display(), w.csv[1].display());
    Ok(())
}

/// Runs `faultline diff`.
pub fn run_diff(a: DiffArgs, mem: &HostMemory) -> Result<()> {
    let _lock = crate::args::lock_output("--out", &a.out)?;
    // Both campaigns are held at once: each may take half the limit.
    let half = HostMemory::new(mem.limit / 2, mem.raise_with);
    let (ta, ra) = read(&a.a, &half)?;
    let (tb, rb) = read(&a.b, &half)?;
    let files = faultline_report::diff::write_diff(&ta, &ra, &tb, &rb, &a.out)?;
    let rows = faultline_report::diff::compare(&ra, &rb);
    // A campaign run with `--protect` keeps its spec's name: the plan tells the sides apart.
    let name = |t: &Trace| match &t.info.protection {
        Some(p) => format!("{} under {}", t.info.spec.name, p.plan.name),
        None => t.info.spec.name.clone(),
    };
    println!("A = {} ({} trials), B = {} ({} trials)", name(&ta), ra.summary.trials, name(&tb), rb.summary.trials);
    let side = |e: Option<[f64; 3]>| e.map_or("-".to_string(), pct);
    for (what, pick) in [
        ("vulnerability %", (|r: &DiffRow| r.unmasked) as fn(&DiffRow) -> Change),
        ("failure %", |r: &DiffRow| r.failure),
    ] {
        println!("{what:<28} {:<20} {:<20} {:>7}  intervals", "A", "B", "B-A pp");
        for r in &rows {
            let c = pick(r);
            println!("{:<28} {:<20} {:<20} {:>7}  {}", r.name, side(c.a), side(c.b), c.points(), c.verdict());
        }
    }
    println!("wrote {}, {}, {}", files[0].display(), files[1].display(), files[2].display());
    Ok(())
}
