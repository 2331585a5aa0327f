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
    /// Download a model from the Hugging Face Hub (and convert a checkpoint).
    Pull(cli::pull::PullArgs),
    /// List the models in the local Hub cache, or remove one.
    List(cli::pull::ListArgs),
}

/// How `--model ORG/NAME` is made ready: converted, the download removed.
const PREPARE: cli::pull::Prepare = cli::pull::Prepare {
    convert: true,
    keep_source: false,
    bits: None,
};

fn main() {
    moeflux::heap::retain_freed_memory();
    cli::llama::copy_env();
    let cli = Cli::parse_from(cli::llama::rewrite(std::env::args_os()));
    let r = match cli.command {
        Command::Run(mut a) => a.model.resolve(PREPARE).and_then(|()| cli::run::run(a)),
        Command::Chat(mut a) => a.model.resolve(PREPARE).and_then(|()| cli::chat::run(a)),
        Command::Convert(a) => cli::convert::run(a),
        Command::Inspect(mut a) => {
            let source = cli::pull::Prepare {
                convert: false,
                ..PREPARE
            };
            cli::pull::resolve_model(&a.dir, source).and_then(|dir| {
                a.dir = dir;
                cli::inspect::run(a)
            })
        }
        Command::Logits(mut a) => a.model.resolve(PREPARE).and_then(|()| cli::logits::run(a)),
        Command::Synth(a) => cli::synth::run(a),
        Command::Bench(mut a) => a.model.resolve(PREPARE).and_then(|()| cli::bench::run(a)),
        Command::Serve(mut a) => {
            let named = a.model.model.to_string_lossy().into_owned();
            a.model.resolve(PREPARE).and_then(|()| {
                if a.alias.is_none() && a.model.model.as_os_str() != named.as_str() {
                    a.alias = Some(named);
                }
                cli::serve::run(a)
            })
        }
        Command::Pull(a) => cli::pull::run(a),
        Command::List(a) => cli::pull::list(a),
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
