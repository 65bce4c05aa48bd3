//! `faultline sites`: every fault-site class of a config with its bit count.

use anyhow::{bail, Context, Result};
use clap::Args;
use faultline_hw::fault::glob_match;
use faultline_hw::{HwConfig, SiteClass, SiteKind};
use faultline_train::{Executor, MxuFormat};
use serde::Serialize;
use std::path::PathBuf;

/// Arguments of `faultline sites`.
#[derive(Args)]
pub struct SitesArgs {
    /// Hardware config (RON), e.g. configs/tpu-32x32.ron.
    #[arg(long)]
    config: PathBuf,
    /// MXU input format of the run the sites are for: bf16 or fp32, as `train --precision` and
    /// a campaign's `precision` set it (fp32 registers and weight-buffer words are 32 bits wide)
    /// [default: the config as written, as `gemm` runs it].
    #[arg(long)]
    precision: Option<String>,
    /// Only classes whose pattern matches this glob (`*` = any text), e.g. 'mxu.pe[*][*].psum'
    /// or 'ub.*'.
    #[arg(long)]
    filter: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ClassRow {
    class: String,
    kind: &'static str,
    elements: u64,
    width: u32,
    bits: u64,
}

#[derive(Serialize)]
struct Totals {
    flip_flop_bits: u64,
    sram_bits: u64,
    bits: u64,
}

#[derive(Serialize)]
struct Report {
    config: String,
    /// MXU input format of the machine listed.
    precision: &'static str,
    filter: Option<String>,
    classes: Vec<ClassRow>,
    totals: Totals,
}

fn kind_name(k: SiteKind) -> &'static str {
    match k {
        SiteKind::FlipFlop => "flip-flop",
        SiteKind::Sram => "sram",
    }
}

/// Runs the command.
pub fn run(a: SitesArgs) -> Result<()> {
    let cfg = HwConfig::load(&a.config).with_context(|| "loading the hardware config")?;
    let given: Option<MxuFormat> = a.precision.as_deref().map(str::parse).transpose()?;
    // The machine a run at that precision executes on (the same one `train` builds).
    let cfg = match given {
        Some(p) => Executor::machine(&cfg, p),
        None => cfg,
    };
    let classes: Vec<ClassRow> = SiteClass::all(&cfg)
        .into_iter()
        .filter(|c| a.filter.as_deref().is_none_or(|f| glob_match(f, &c.pattern())))
        .map(|c| ClassRow {
            class: c.pattern(),
            kind: kind_name(c.kind()),
            elements: c.elements(&cfg),
            width: c.width(&cfg),
            bits: c.bit_count(&cfg),
        })
        .collect();
    if classes.is_empty() {
        let known: Vec<String> = SiteClass::all(&cfg).iter().map(|c| c.pattern()).collect();
        bail!("no site class matches `{}`; classes: {}", a.filter.unwrap_or_default(), known.join(", "));
    }
    let sum = |k: &str| classes.iter().filter(|c| c.kind == k).map(|c| c.bits).sum::<u64>();
    let (ff, sram) = (sum("flip-flop"), sum("sram"));
    let r = Report {
        config: cfg.name.clone(),
        precision: cfg.mxu.input_format.name(),
        filter: a.filter,
        classes,
        totals: Totals { flip_flop_bits: ff, sram_bits: sram, bits: ff + sram },
    };
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "fault sites of {} with {} MXU inputs{}",
        r.config,
        r.precision,
        r.filter.as_ref().map(|f| format!(" matching `{f}`")).unwrap_or_default()
    );
    println!("{:<28} {:<9} {:>12} {:>6} {:>14}", "class", "kind", "elements", "width", "bits");
    for c in &r.classes {
        println!("{:<28} {:<9} {:>12} {:>6} {:>14}", c.class, c.kind, c.elements, c.width, c.bits);
    }
    println!("{:<28} {:<9} {:>12} {:>6} {:>14}", "total flip-flop bits", "", "", "", ff);
    println!("{:<28} {:<9} {:>12} {:>6} {:>14}", "total SRAM bits", "", "", "", sram);
    println!("{:<28} {:<9} {:>12} {:>6} {:>14}", "total", "", "", "", ff + sram);
    Ok(())
}
