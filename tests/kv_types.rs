//! The KV cache types (SPEC §6): on every golden fixture, with exact
//! products, logits over f16, bf16 and q8_0 caches against transformers'
//! (f32 throughout), at every position of the golden sequence, as one
//! chunk and token by token. An f16 cache holds the fast-path tolerance at
//! every position, with transformers' argmax (so its greedy tokens); bf16
//! (8 significant bits) and q8_0 (a step of max/127 per block of 32) are
//! held to a median over the positions, since a tiny random model's
//! near-ties turn their rounding into a large error at a position or two.
//! Each type's median and worst are printed.

mod common;

use common::kv::check_kv_types;
use moeflux::Device;

fn check(name: &str, flags: &[&str]) {
    check_kv_types(name, flags, Device::Cpu);
}

golden_fixture_tests!(check);
