//! The kernels: `.cu` sources embedded in the binary, compiled by NVRTC for
//! the GPU present, and kept on disk keyed by a hash of the source, the
//! options, the NVRTC version and the architecture, so that the second
//! start loads CUBINs instead of compiling.
//!
//! The kernels that depend on the weight format (`FOR_FMT` in
//! `kernels/matvec.cu`) are instantiated for nine formats; compiled as one
//! module they took 88–96 s on an H100 host. They are compiled instead as
//! one module per (format, kernel group) ([`Module::Format`],
//! `-DMOEFLUX_FMT=code -DMOEFLUX_GROUP=g`; the groups are `FG_*` in
//! `kernels/common.cuh`), for the formats the model uses, plus the
//! tensor-core attention ([`Module::Attention`]), the chunked
//! GatedDeltaNet ([`Module::Delta`]) and one module of everything else
//! ([`Module::Base`]), all at once on as many threads, so that a first
//! start waits for the slowest module alone.

use crate::error::{Error, Result};
use crate::notify::Notifier;
use cudarc::nvrtc::sys as nv;
use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;

/// The sources of the base module, in the order they are concatenated.
const SOURCES: [&str; 14] = [
    include_str!("kernels/common.cuh"),
    include_str!("kernels/kv.cuh"),
    include_str!("kernels/matvec.cu"),
    include_str!("kernels/matvec_q.cu"),
    include_str!("kernels/elementwise.cu"),
    include_str!("kernels/attention.cu"),
    include_str!("kernels/delta.cu"),
    include_str!("kernels/moe.cu"),
    include_str!("kernels/moe_routed.cu"),
    include_str!("kernels/mma.cuh"),
    include_str!("kernels/tensor.cu"),
    include_str!("kernels/matvec_tc.cu"),
    include_str!("kernels/moe_mt.cu"),
    include_str!("kernels/prep.cu"),
];

/// The sources of the attention module: the tensor-core attention of
/// prefill chunks. Compiled beside the base module, not
/// in it: it took the base module's compile from about 5.6 to 7.9 s (nvcc
/// on the H100 host), the first start's longest wait.
const ATTENTION_SOURCES: [&str; 4] = [
    include_str!("kernels/common.cuh"),
    include_str!("kernels/kv.cuh"),
    include_str!("kernels/mma.cuh"),
    include_str!("kernels/flash.cu"),
];

/// The sources of the chunked GatedDeltaNet's module: compiled beside the
/// base module for the same reason (its unrolled triangular solve).
const DELTA_SOURCES: [&str; 2] = [
    include_str!("kernels/common.cuh"),
    include_str!("kernels/delta_chunk.cu"),
];

/// The sources of a format module: the files that hold `FOR_FMT` kernels.
/// (`elementwise.cu`, `attention.cu`, `delta.cu`, `flash.cu` and `prep.cu`
/// hold none.)
const FORMAT_SOURCES: [&str; 9] = [
    include_str!("kernels/common.cuh"),
    include_str!("kernels/matvec.cu"),
    include_str!("kernels/matvec_q.cu"),
    include_str!("kernels/moe.cu"),
    include_str!("kernels/moe_routed.cu"),
    include_str!("kernels/mma.cuh"),
    include_str!("kernels/tensor.cu"),
    include_str!("kernels/matvec_tc.cu"),
    include_str!("kernels/moe_mt.cu"),
];

/// Every weight format code (`FMT_*` in `kernels/common.cuh`, `+ 8` for f16
/// scales).
pub const FORMAT_CODES: [i32; 9] = [0, 1, 2, 3, 4, 5, 3 + 8, 4 + 8, 5 + 8];

/// The format-dependent kernel groups (`FG_MATVEC` … `FG_MATVEC_Q` in
/// `kernels/common.cuh`), each compiled as one module per format.
const FORMAT_GROUPS: std::ops::Range<i32> = 0..7;

/// The group of the attention module (`FG_ATTENTION` in
/// `kernels/common.cuh`).
const FG_ATTENTION: i32 = 8;

/// The group of the chunked GatedDeltaNet's module (`FG_DELTA`).
const FG_DELTA: i32 = 9;

/// One compiled module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Module {
    /// Every kernel that does not depend on the weight format.
    Base,
    /// The tensor-core attention kernels (`kernels/flash.cu`), which
    /// need no format either.
    Attention,
    /// The chunked GatedDeltaNet recurrence (`kernels/delta_chunk.cu`).
    Delta,
    /// The kernels of one group for one format code.
    Format { code: i32, group: i32 },
}

impl Module {
    fn source(self) -> String {
        match self {
            Module::Base => SOURCES.concat(),
            Module::Attention => ATTENTION_SOURCES.concat(),
            Module::Delta => DELTA_SOURCES.concat(),
            Module::Format { .. } => FORMAT_SOURCES.concat(),
        }
    }

    fn defines(self) -> Vec<String> {
        match self {
            Module::Base => vec!["-DMOEFLUX_FMT=-1".to_string()],
            Module::Attention => vec![
                "-DMOEFLUX_FMT=-1".to_string(),
                format!("-DMOEFLUX_GROUP={FG_ATTENTION}"),
            ],
            Module::Delta => vec!["-DMOEFLUX_FMT=-1".to_string(), format!("-DMOEFLUX_GROUP={FG_DELTA}")],
            Module::Format { code, group } => vec![format!("-DMOEFLUX_FMT={code}"), format!("-DMOEFLUX_GROUP={group}")],
        }
    }

    fn label(self) -> String {
        match self {
            Module::Base => "base".to_string(),
            Module::Attention => "attention".to_string(),
            Module::Delta => "delta".to_string(),
            Module::Format { code, group } => format!("fmt{code}-g{group}"),
        }
    }
}

fn nvrtc_err(what: &str, r: nv::nvrtcResult) -> Error {
    // SAFETY: nvrtcGetErrorString returns a static C string.
    let s = unsafe { CStr::from_ptr(nv::nvrtcGetErrorString(r)) }
        .to_string_lossy()
        .into_owned();
    Error::Backend {
        backend: "cuda",
        msg: format!("NVRTC {what}: {s}"),
    }
}

fn ok(what: &str, r: nv::nvrtcResult) -> Result<()> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(nvrtc_err(what, r))
    }
}

/// FNV-1a, 64 bits: a stable hash for the cache key.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `dir` if given, else `$XDG_CACHE_HOME/moeflux/kernels`, else
/// `~/.cache/moeflux/kernels`.
fn cache_dir(dir: Option<&std::path::Path>) -> Option<PathBuf> {
    if let Some(d) = dir {
        return Some(d.to_path_buf());
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(base.join("moeflux").join("kernels"))
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters.
    ok("version", unsafe { nv::nvrtcVersion(&mut major, &mut minor) })?;
    Ok((major, minor))
}

/// A module and its CUBIN.
pub type Image = (Module, Vec<u8>);

/// The CUBIN of each module for compute capability `cc` and the weight
/// format codes `codes`, from the disk cache or freshly compiled (the
/// missing ones in parallel).
/// What was done is said through `notify`: the modules to compile before
/// the wait, the time it took after; nothing when all came from the cache.
pub fn module_images(
    cc: (i32, i32),
    codes: &[i32],
    kernel_cache: Option<&std::path::Path>,
    notify: &Notifier,
) -> Result<Vec<Image>> {
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let (vmaj, vmin) = nvrtc_version()?;
    let version = format!("nvrtc {vmaj}.{vmin}");
    let dir = cache_dir(kernel_cache);
    let modules: Vec<Module> = [Module::Base, Module::Attention, Module::Delta]
        .into_iter()
        .chain(
            codes
                .iter()
                .flat_map(|&code| FORMAT_GROUPS.map(move |group| Module::Format { code, group })),
        )
        .collect();
    let mut jobs = Vec::new();
    let mut images: Vec<Option<Vec<u8>>> = Vec::with_capacity(modules.len());
    for &m in &modules {
        let source = m.source();
        let mut opts = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
        opts.extend(m.defines());
        let key = fnv1a(&[source.as_bytes(), opts.join(" ").as_bytes(), version.as_bytes()]);
        let path = dir
            .as_ref()
            .map(|d| d.join(format!("{key:016x}-{}-{arch}.cubin", m.label())));
        let cached = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .filter(|b| !b.is_empty());
        if cached.is_none() {
            jobs.push((images.len(), source, opts, path));
        }
        images.push(cached);
    }
    let t0 = std::time::Instant::now();
    let compiled = jobs.len();
    if !jobs.is_empty() {
        notify.say(&format!(
            "compiling {} CUDA kernel modules for {arch} ({version}) in parallel; they are cached for the next start",
            jobs.len()
        ));
        let built: Vec<(usize, Result<Vec<u8>>, Option<PathBuf>)> = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|(i, source, opts, path)| s.spawn(move || (i, compile(&source, &opts), path)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        (
                            usize::MAX,
                            Err(Error::Backend {
                                backend: "cuda",
                                msg: "a kernel compilation thread panicked".into(),
                            }),
                            None,
                        )
                    })
                })
                .collect()
        });
        for (i, cubin, path) in built {
            let cubin = cubin?;
            if let Some(p) = &path {
                if let Err(e) = store(p, &cubin) {
                    notify.say(&format!(
                        "warning: could not cache the compiled kernels at {}: {e}",
                        p.display()
                    ));
                }
            }
            if let Some(slot) = images.get_mut(i) {
                *slot = Some(cubin);
            }
        }
    }
    if compiled > 0 {
        notify.say(&format!(
            "compiled {compiled} CUDA kernel modules in {:.1} s",
            t0.elapsed().as_secs_f64()
        ));
    }
    let out = modules
        .into_iter()
        .zip(images)
        .map(|(m, img)| {
            img.map(|b| (m, b)).ok_or_else(|| Error::Backend {
                backend: "cuda",
                msg: format!("kernel module {} was not compiled", m.label()),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(out)
}

/// Write to a temporary name in the same directory, then rename.
fn store(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn compile(source: &str, opts: &[String]) -> Result<Vec<u8>> {
    let src = CString::new(source).map_err(|_| Error::Invalid("kernel source holds a NUL byte".into()))?;
    let name = CString::new("moeflux.cu").map_err(|_| Error::Invalid("kernel name".into()))?;
    let copts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()).map_err(|_| Error::Invalid(format!("NVRTC option {o}"))))
        .collect::<Result<_>>()?;
    let ptrs: Vec<*const c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    let mut prog = std::ptr::null_mut();
    // SAFETY: the strings outlive the program, which is destroyed below.
    unsafe {
        ok(
            "create",
            nv::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ),
        )?;
        let r = nv::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        let out = if r == nv::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            ok("cubin size", nv::nvrtcGetCUBINSize(prog, &mut size)).and_then(|_| {
                let mut buf = vec![0u8; size];
                ok("cubin", nv::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char)).map(|_| buf)
            })
        } else {
            let mut size = 0usize;
            let mut log = String::new();
            if nv::nvrtcGetProgramLogSize(prog, &mut size) == nv::nvrtcResult::NVRTC_SUCCESS && size > 0 {
                let mut buf = vec![0u8; size];
                if nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) == nv::nvrtcResult::NVRTC_SUCCESS {
                    log = String::from_utf8_lossy(&buf).trim_end_matches('\0').to_string();
                }
            }
            Err(Error::Backend {
                backend: "cuda",
                msg: format!("NVRTC could not compile the kernels ({opts:?}):\n{log}"),
            })
        };
        nv::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// The value of `#define NAME` in a kernel source (the tests that check a
/// launch's constants against its kernel's).
#[cfg(test)]
pub(crate) fn define(src: &str, name: &str) -> Option<usize> {
    src.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("#define ")?.strip_prefix(name)?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_changes_with_any_part() {
        let a = fnv1a(&[b"abc", b"sm_90"]);
        assert_ne!(a, fnv1a(&[b"abc", b"sm_89"]));
        assert_ne!(a, fnv1a(&[b"ab", b"csm_90"]));
        assert_eq!(a, fnv1a(&[b"abc", b"sm_90"]));
    }
}
