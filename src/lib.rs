//! moeflux: Mixture-of-Experts inference that streams the routed experts.
//!
//! The map of the code is `DESIGN.md`; the formats and numerics it keeps
//! are in `SPEC.md`.

pub mod arch;
pub mod chatsave;
pub mod check;
pub mod checksum;
pub mod config;
pub mod error;
pub mod format;
pub mod generate;
pub mod heap;
pub mod hub;

pub use config::{Arch, ModelConfig};
pub use error::{Error, Result};
pub mod backend;
pub mod engine;
pub mod experts;
pub mod model;
pub mod notify;
pub mod options;
pub(crate) mod parallel;
pub mod server;
pub mod session;
pub mod text;

pub use engine::Model;
pub use options::{Device, Options};
pub use session::{BatchItem, Session};
pub mod synth;
