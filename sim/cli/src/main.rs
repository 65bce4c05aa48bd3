//! `faultline`: command-line front end. Thin: parses arguments, calls library code, prints.

// Doc comments here are clap's `--help` text, full of site syntax like `mxu.pe[3][5]` that
// rustdoc would read as links; they are written for the terminal, not for rustdoc.
#![allow(rustdoc::broken_intra_doc_links)]

use clap::{Parser, Subcommand};

mod args;
mod gemm;
mod op;
mod sites;
mod train;

/// Fault-injection simulator of a TPU-like training accelerator.
#[derive(Parser)]
#[command(name = "faultline", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one GEMM on random inputs and report cycles, utilization and an output checksum.
    Gemm(gemm::GemmArgs),
    /// List every fault-site class of a config with its bit count (flip-flops and SRAM cells).
    Sites(sites::SitesArgs),
    /// Run one op (matmul, conv2d, relu, softmax, adam) through DMA, SRAM and the MXU/VPU and
    /// print its timing breakdown.
    Op(op::OpArgs),
    /// Train a model on the simulated machine; report loss, accuracy and cycles per step.
    Train(train::TrainArgs),
}

/// Prints an error as one line with its causes (`error: a: b`) and exits with status 2, instead
/// of anyhow's debug dump: users read these, and a backtrace is noise for a bad flag or file.
fn main() {
    // Rust ignores SIGPIPE, so `faultline ... | head` would panic in println!; restore the
    // default action so a closed pipe ends the process quietly, as for any Unix tool.
    #[cfg(unix)]
    // SAFETY: called before any other thread exists; SIG_DFL is a valid handler for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Gemm(a) => gemm::run(a),
        Command::Sites(a) => sites::run(a),
        Command::Op(a) => op::run(a),
        Command::Train(a) => train::run(a),
    }
}
