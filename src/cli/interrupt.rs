//! Ctrl-C while generating stops the generation, not the program: the
//! SIGINT handler sets a flag that the generation loop polls. Ctrl-C when
//! nothing is being generated (at chat's prompt, while loading), or a
//! second one before the first was seen, exits at once.
//!
//! `convert` and `synth` poll the same flag while they write, for SIGINT
//! and SIGTERM alike: they remove their temporary directory and exit with
//! 130. A second signal exits at once; the next run to the same
//! destination removes what was left.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
/// A loop polls `STOP` (a generation, or a model being written).
static POLLED: AtomicBool = AtomicBool::new(false);
/// Reset the terminal's text attributes on exit (stdout is a terminal).
static RESET_ON_EXIT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    if POLLED.load(Ordering::SeqCst) && !STOP.swap(true, Ordering::SeqCst) {
        return;
    }
    // Only async-signal-safe calls from here on.
    let bye: &[u8] = if RESET_ON_EXIT.load(Ordering::SeqCst) {
        b"\x1b[0m\n"
    } else {
        b"\n"
    };
    // SAFETY: write(2) and _exit(2) are async-signal-safe.
    unsafe {
        libc::write(1, bye.as_ptr().cast(), bye.len());
        libc::_exit(130);
    }
}

fn handle(signal: libc::c_int) -> anyhow::Result<()> {
    let handler = on_signal as extern "C" fn(libc::c_int);
    // SAFETY: the handler only touches atomics and async-signal-safe calls.
    let old = unsafe { libc::signal(signal, handler as libc::sighandler_t) };
    if old == libc::SIG_ERR {
        anyhow::bail!("cannot install a signal handler: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Install the SIGINT handler of `run` and `chat` (once per process).
pub fn install() -> anyhow::Result<()> {
    RESET_ON_EXIT.store(std::io::stdout().is_terminal(), Ordering::SeqCst);
    handle(libc::SIGINT)
}

/// `convert` and `synth`: SIGINT and SIGTERM set the returned flag, which
/// the writer polls for the rest of the process.
pub fn install_cancel() -> anyhow::Result<&'static AtomicBool> {
    POLLED.store(true, Ordering::SeqCst);
    handle(libc::SIGINT)?;
    handle(libc::SIGTERM)?;
    Ok(&STOP)
}

/// The flag generation polls.
pub fn stop_flag() -> &'static AtomicBool {
    &STOP
}

/// Mark the start (`true`) or end of a generation; clears the stop flag.
pub fn set_generating(on: bool) {
    STOP.store(false, Ordering::SeqCst);
    POLLED.store(on, Ordering::SeqCst);
}
