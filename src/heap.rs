//! The process heap between forward passes.
//!
//! A forward pass allocates its activations afresh (a 512-token prefill
//! chunk: buffers of 4–16 MiB a layer). glibc serves blocks that large
//! with `mmap` and gives them back to the kernel when they are freed, so
//! every layer faulted its buffers in again, 4 KiB at a time, zeroed by
//! the kernel (docs/cpu.md, "Memory the heap keeps";
//! docs/notes/2026-11-22-to-12-02-benchmark-log.md, "AMX groups unpacked into
//! L1, and no page faults between layers"). [`retain_freed_memory`] keeps such
//! blocks in
//! the heap for the next layer instead.

/// Keep freed blocks of up to 32 MiB (more than any buffer of a
/// 512-token chunk) in the process's heap rather than returning them to
/// the kernel (glibc's `M_MMAP_THRESHOLD` at 32 MiB, which also stops it
/// from moving with the sizes freed, and no trimming of the heap's top).
/// The resident memory then stays at its peak between passes, which is
/// what an inference process holds anyway. The `moeflux` binary calls it at
/// start; a program that embeds the library may too. Returns whether the
/// allocator took the settings (false where the C library is not glibc).
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes the allocator's parameters; it is
        // called before this process has threads that allocate (or, from
        // an embedding program, at any time: glibc takes its own lock).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    /// glibc takes both settings, and a block freed after them is
    /// served again from the heap. Other tests allocate on other threads
    /// meanwhile and may take a freed block first (CI saw it once), so the
    /// reuse must show in one of a few tries.
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_settings() {
        assert!(super::retain_freed_memory());
        let reused = (0..8).any(|_| {
            let a = std::hint::black_box(vec![1u8; 16 << 20]);
            let p = a.as_ptr() as usize;
            drop(a);
            let b = std::hint::black_box(vec![2u8; 16 << 20]);
            b.as_ptr() as usize == p
        });
        assert!(reused, "a freed 16 MiB block was not reused in 8 tries");
    }
}
