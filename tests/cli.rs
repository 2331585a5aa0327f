//! The `moeflux` binary at its edges: closed pipes, terminals, signals,
//! shared flags, broken models.

#[path = "common/mod.rs"]
mod common;

#[path = "cli/flags.rs"]
mod flags;
#[path = "cli/hub.rs"]
mod hub;
#[path = "cli/inspect.rs"]
mod inspect;
#[path = "cli/integrity.rs"]
mod integrity;
#[path = "cli/interrupt.rs"]
mod interrupt;
#[path = "hub/mock.rs"]
mod mock;
#[path = "cli/pipe.rs"]
mod pipe;
#[path = "cli/run.rs"]
mod run;
#[path = "convert/synthetic.rs"]
mod synthetic;

use std::path::Path;

/// A small packed model (the qwen3_moe fixture at 4 bits) in `dir`.
pub fn packed_model(dir: &Path) {
    common::convert("qwen3_moe", dir, &[]);
}
