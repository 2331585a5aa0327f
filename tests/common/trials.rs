//! Tests as `libtest-mimic` trials, for the test files that run on CUDA
//! (`harness = false` in Cargo.toml): a CUDA test runs where a CUDA device
//! is, and where none is it is counted as *ignored*, with the reason, in the
//! runner's own summary — never as passed.
#![allow(dead_code)] // each test file uses the trials it needs

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use moeflux::backend::cuda::probe;
use std::sync::OnceLock;

/// Why CUDA tests cannot run on this machine, or None when they can.
pub fn no_cuda() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| probe().err().map(|e| format!("no CUDA device: {e}")))
        .as_deref()
}

/// A test that needs a CUDA device.
pub fn cuda(name: impl Into<String>, f: impl FnOnce() + Send + 'static) -> Trial {
    Trial::ignorable_test(name, move || match no_cuda() {
        Some(why) => Ok(Completion::ignored_with(why)),
        None => {
            f();
            Ok(Completion::Completed)
        }
    })
}

/// A test that runs everywhere.
pub fn plain(name: impl Into<String>, f: impl FnOnce() + Send + 'static) -> Trial {
    Trial::test(name, move || {
        f();
        Ok::<(), Failed>(())
    })
}

/// Run the trials with the command line's filters and flags; exits.
pub fn run(trials: Vec<Trial>) -> ! {
    libtest_mimic::run(&Arguments::from_args(), trials).exit()
}
