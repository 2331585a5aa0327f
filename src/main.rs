//! The `moeflux` command line. Nothing prints to stdout with `print!`:
//! commands write through a handle and pass a failed write up, so that a
//! reader that goes away (`| head`) ends the command quietly.
#![warn(clippy::print_stdout)]

mod cli;

use clap::{Parser, Subcommand};

/// Mixture-of-Experts inference that streams the routed experts from disk.
#[derive(Parser)]
#[command(name = "moeflux", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout, with a summary on stderr.
    Run(cli::run::RunArgs),
    /// Chat with a model in the terminal.
    Chat(cli::chat::ChatArgs),
    /// Convert a Hugging Face or MLX checkpoint into the packed streaming layout.
    Convert(cli::convert::ConvertArgs),
    /// Describe a source checkpoint or a packed model directory.
    Inspect(cli::inspect::InspectArgs),
    /// Evaluate tokens from position 0 and print logits (debugging / oracle).
    Logits(cli::logits::LogitsArgs),
    /// Write a random-weight packed model of a real model's shape.
    Synth(cli::synth::SynthArgs),
    /// Measure prefill and decode throughput and the expert traffic.
    Bench(cli::bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(cli::serve::ServeArgs),
}

fn main() {
    moeflux::heap::retain_freed_memory();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Run(a) => cli::run::run(a),
        Command::Chat(a) => cli::chat::run(a),
        Command::Convert(a) => cli::convert::run(a),
        Command::Inspect(a) => cli::inspect::run(a),
        Command::Logits(a) => cli::logits::run(a),
        Command::Synth(a) => cli::synth::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Serve(a) => cli::serve::run(a),
    };
    if let Err(e) = r {
        if cli::is_broken_pipe(&e) {
            return;
        }
        if matches!(e.downcast_ref::<moeflux::Error>(), Some(moeflux::Error::Cancelled)) {
            eprintln!("{e:#}");
            std::process::exit(130);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
