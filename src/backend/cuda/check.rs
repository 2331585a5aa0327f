//! Driver results turned into this crate's errors, naming the call.

use crate::error::{Error, Result};
use cudarc::driver::{sys, DriverError};

pub(crate) fn cuda_err(what: &str, e: DriverError) -> Error {
    Error::Backend {
        backend: "cuda",
        msg: format!("{what}: {e}"),
    }
}

/// `CUresult` → `Result`, naming the call that failed.
pub(crate) trait Check {
    fn check(self, what: &str) -> Result<()>;
}

impl Check for sys::CUresult {
    fn check(self, what: &str) -> Result<()> {
        self.result().map_err(|e| cuda_err(what, e))
    }
}
