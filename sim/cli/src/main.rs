//! `faultline`: command-line front end. Thin: parses arguments, calls library code, prints.

// Doc comments here are clap's `--help` text, full of site syntax like `mxu.pe[3][5]` that
// rustdoc would read as links; they are written for the terminal, not for rustdoc.
#![allow(rustdoc::broken_intra_doc_links)]

use clap::{Parser, Subcommand};
use faultline_hw::budget::HostMemory;

mod abft;
mod args;
mod campaign;
mod explore;
mod gemm;
mod op;
mod plan;
mod program;
mod report;
mod scalesim;
mod sites;
mod train;
mod vcd;

/// Fault-injection simulator of a TPU-like training accelerator.
#[derive(Parser)]
#[command(name = "faultline", version, about)]
struct Cli {
    /// Host-memory limit: a command that would need more (estimated before allocating) is
    /// refused. Bytes, or with a suffix K, M, G, T (powers of 1024), e.g. 16G.
    #[arg(long, global = true, default_value = "4G", value_parser = parse_size)]
    max_memory: u64,
    #[command(subcommand)]
    command: Command,
}

/// `4096`, `512K`, `16M`, `4G`, `1T` (powers of 1024) as bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("`{s}`: unknown size suffix `{c}` (use K, M, G or T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num.parse().map_err(|_| format!("`{s}` is not a size (e.g. 4096, 512M, 16G)"))?;
    n.checked_mul(1 << shift).filter(|&b| b > 0).ok_or_else(|| format!("`{s}`: must be between 1 byte and 2^64"))
}

#[derive(Subcommand)]
enum Command {
    /// Run one GEMM on random inputs and report cycles, utilization and an output checksum.
    Gemm(gemm::GemmArgs),
    /// List every fault-site class of a config with its bit count (flip-flops and SRAM cells).
    Sites(sites::SitesArgs),
    /// Run one op (matmul, conv2d, relu, softmax, adam) as a training step runs it, through DMA,
    /// SRAM and the MXU/VPU, and print its instructions and their schedule.
    Op(op::OpArgs),
    /// Train a model on the simulated machine; report loss, accuracy and cycles per step.
    Train(train::TrainArgs),
    /// List the instructions one training step lowers to, their schedule, and the step's
    /// injection space (without running it).
    Program(program::ProgramArgs),
    /// Run a fault-injection campaign during training: one fault per trial, each classified by
    /// what it did to training (resumable, shardable).
    Campaign(campaign::CampaignArgs),
    /// Combine the shard directories of a campaign into what one run writes (of an adaptive
    /// campaign, the rounds run so far; its last line says whether another round is due).
    Merge(campaign::MergeArgs),
    /// Plan a campaign before running it: the trials a stated margin on its failure rate needs
    /// (per class, uniform, equal per class, Neyman-allocated) and their wall time, from a timed
    /// pilot of its own trials.
    Plan(plan::PlanArgs),
    /// Write a campaign's report (HTML, Markdown, CSV, figures): its records folded back onto
    /// the hardware, per unit, class, PE, bit, phase, layer and step.
    Report(report::ReportArgs),
    /// Compare two campaigns class by class (e.g. before and after a protection plan).
    Diff(report::DiffArgs),
    /// Run protection plans against campaigns on the same trials and write a Pareto report:
    /// residual failure FIT against check bits and cycle overhead, with intervals.
    Explore(explore::ExploreArgs),
    /// Replay one trial of a campaign at cycle level and write a VCD waveform (GTKWave, Surfer)
    /// of the faulted instruction: golden and faulty registers side by side, the fault marked.
    Vcd(vcd::VcdArgs),
    /// Run a SCALE-Sim config and topology (its .cfg and CSV, as they are) on the array, and
    /// write its COMPUTE, BANDWIDTH and DETAILED_ACCESS reports, counted as SCALE-Sim counts or
    /// as Faultline does, with Faultline's own columns beside them.
    Scalesim(scalesim::ScaleSimArgs),
}

/// Prints an error as one line with its causes (`error: a: b`) and exits with status 2, instead
/// of anyhow's debug dump: users read these, and a backtrace is noise for a bad flag or file.
/// Keeps memory the program frees on glibc's heap for the next allocation, instead of
/// unmapping it: a training step allocates and frees the same large buffers every step, and
/// fresh pages from the kernel (a fault and a zeroing each) cost about a quarter of a
/// functional step. Heap memory is bounded by the peak in use, as before.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread exists.
    unsafe {
        // Blocks up to glibc's largest mmap threshold (32 MiB on 64-bit) come from the heap,
        // and the heap's top is never given back.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

fn main() {
    // Rust ignores SIGPIPE, so `faultline ... | head` would panic in println!; restore the
    // default action so a closed pipe ends the process quietly, as for any Unix tool.
    #[cfg(unix)]
    // SAFETY: called before any other thread exists; SIG_DFL is a valid handler for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    keep_freed_memory();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => usage_error(e),
    };
    if let Err(e) = run(cli) {
        // `{:#}` joins the causes with ": "; a cause that itself spans lines is folded too.
        eprintln!("error: {}", one_line(&format!("{e:#}")));
        std::process::exit(2);
    }
}

/// Prints a command-line parsing error as one line (clap's own rendering spans 3-7: the error,
/// a tip, a usage block and a pointer to --help) and exits 2; `--help` and `--version` print
/// normally and exit 0.
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    if matches!(e.kind(), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand) {
        // `faultline` alone (clap would print the whole help to stderr) or with global flags
        // only: one line, naming the commands.
        let cmd = <Cli as clap::CommandFactory>::command();
        let names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).filter(|n| *n != "help").collect();
        eprintln!("error: no command given (one of: {}); see `faultline --help`", names.join(", "));
        std::process::exit(2);
    }
    let text = e.render().to_string();
    let mut parts: Vec<String> = Vec::new();
    let mut list = false;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            list = false;
            continue;
        }
        let line = line.trim_start_matches("error: ");
        match parts.last_mut() {
            // "the following required arguments were not provided:" then one argument a line.
            Some(last) if list || last.ends_with(':') => {
                last.push_str(if list { ", " } else { " " });
                last.push_str(line);
                list = true;
            }
            _ => parts.push(line.to_string()),
        }
    }
    // Point to the help of the subcommand the user typed, if any.
    let cmd = <Cli as clap::CommandFactory>::command();
    let sub = std::env::args()
        .skip(1)
        .find(|a| cmd.get_subcommands().any(|s| s.get_name() == a))
        .map(|s| format!(" {s}"))
        .unwrap_or_default();
    eprintln!("error: {}; see `faultline{sub} --help`", parts.join("; "));
    std::process::exit(2);
}

/// Folds a multi-line message into one line.
fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mem = HostMemory::new(cli.max_memory, "--max-memory");
    match cli.command {
        Command::Gemm(a) => gemm::run(a, &mem),
        Command::Sites(a) => sites::run(a),
        Command::Op(a) => op::run(a, &mem),
        Command::Train(a) => train::run(a, &mem),
        Command::Program(a) => program::run(a, &mem),
        Command::Campaign(a) => campaign::run(a, &mem),
        Command::Merge(a) => campaign::run_merge(a),
        Command::Plan(a) => plan::run(a, &mem),
        Command::Report(a) => report::run(a, &mem),
        Command::Diff(a) => report::run_diff(a, &mem),
        Command::Explore(a) => explore::run(a, &mem),
        Command::Vcd(a) => vcd::run(a, &mem),
        Command::Scalesim(a) => scalesim::run(a, &mem),
    }
}
