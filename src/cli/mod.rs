//! One file per subcommand.

pub mod bench;
pub mod convert;
pub mod inspect;
pub mod logits;
pub mod synth;
