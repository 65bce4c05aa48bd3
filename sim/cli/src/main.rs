//! `faultline`: command-line front end. Thin: parses arguments, calls library code, prints.

use clap::{Parser, Subcommand};

mod gemm;

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Gemm(a) => gemm::run(a),
    }
}
