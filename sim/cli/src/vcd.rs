//! `faultline vcd`: one trial of a campaign replayed at cycle level, written as a waveform.

use anyhow::Result;
use clap::Args;
use faultline_hw::budget::HostMemory;
use faultline_report::vcd::{self, VcdRequest};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `faultline vcd`.
#[derive(Args, Debug)]
pub struct VcdArgs {
    /// Campaign directory (campaign.json, records.jsonl), e.g. traces/mlp-mxu.
    #[arg(long)]
    pub campaign: PathBuf,
    /// The trial to replay: its `trial` in records.jsonl.
    #[arg(long)]
    pub trial: u64,
    /// The VCD file to write, e.g. traces/trial17.vcd.
    #[arg(long)]
    pub out: PathBuf,
    /// More registers to show (repeatable): globs over register names as `faultline sites`
    /// writes sites, without the bit, e.g. 'mxu.pe[0][*].psum' or 'vpu.lane[*].out'. A PE
    /// fault shows its PE's row and column, a lane fault its lane, by default.
    #[arg(long = "sites", value_name = "GLOB")]
    pub sites: Vec<String>,
    /// The campaign's spec file, if it moved since the campaign ran [default: the spec_file
    /// campaign.json records].
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// Most cycles to write: a longer instruction is cut to this many around the fault.
    #[arg(long, default_value_t = vcd::DEFAULT_WINDOW, value_parser = clap::value_parser!(u64).range(1..))]
    pub window: u64,
}

/// Runs `faultline vcd`: re-runs the campaign's golden run, replays the trial and prints what
/// the waveform shows.
pub fn run(a: VcdArgs, mem: &HostMemory) -> Result<()> {
    let req =
        VcdRequest { campaign: a.campaign, trial: a.trial, out: a.out, sites: a.sites, spec: a.spec, window: a.window };
    // The golden run is the replay's slow part on a large campaign: a bar when someone watches.
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new_spinner();
        b.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] golden run: step {pos}")
                .expect("static template"),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    // The library's errors name the trial and the file concerned already.
    let replay = vcd::replay(&req, mem, |s| bar.set_position(s))?;
    bar.finish_and_clear();
    println!("{replay}");
    Ok(())
}
