//! One file per subcommand.

pub mod bench;
mod bench_cuda;
mod bench_rows;
pub mod chat;
pub mod convert;
pub mod inspect;
mod interrupt;
pub mod llama;
pub mod logits;
pub mod model_args;
pub mod pull;
pub mod run;
pub mod serve;
pub mod synth;

/// Whether `e` comes from writing to a reader that went away (`| head`):
/// the command ends quietly then, not with an error.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
