//! `moeflux serve` end to end: the built binary serving the demo model on
//! 127.0.0.1 (a free port), driven by a small HTTP client.

#[path = "common/mod.rs"]
mod common;

#[path = "server/access.rs"]
mod access;
#[path = "server/client.rs"]
mod client;
#[path = "server/endpoints.rs"]
mod endpoints;
#[path = "server/errors.rs"]
mod errors;
#[path = "server/failures.rs"]
mod failures;
#[path = "server/lifecycle.rs"]
mod lifecycle;
#[path = "server/limits.rs"]
mod limits;
#[path = "server/load.rs"]
mod load;
#[path = "server/logprobs.rs"]
mod logprobs;
#[path = "server/streams.rs"]
mod streams;
#[path = "server/structured.rs"]
mod structured;
#[path = "server/template.rs"]
mod template;
