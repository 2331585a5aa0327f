//! One file per subcommand.

pub mod bench;
pub mod chat;
pub mod convert;
pub mod inspect;
mod interrupt;
pub mod logits;
pub mod run;
pub mod synth;
