//! The kernels: `.cu` sources embedded in the binary, compiled by NVRTC for
//! the GPU present, and kept on disk keyed by a hash of the source, the
//! options, the NVRTC version and the architecture, so that the second
//! start loads a CUBIN instead of compiling.

use crate::error::{Error, Result};
use cudarc::nvrtc::sys as nv;
use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;

/// The sources, in the order they are concatenated into one module.
const SOURCES: [&str; 6] = [
    include_str!("kernels/common.cuh"),
    include_str!("kernels/matvec.cu"),
    include_str!("kernels/elementwise.cu"),
    include_str!("kernels/attention.cu"),
    include_str!("kernels/delta.cu"),
    include_str!("kernels/moe.cu"),
];

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

/// `$MOEFLUX_CACHE_DIR`, else `$XDG_CACHE_HOME/moeflux/kernels`, else
/// `~/.cache/moeflux/kernels`.
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MOEFLUX_CACHE_DIR") {
        return Some(PathBuf::from(d));
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

/// The CUBIN of all kernels for compute capability `cc`, from the disk
/// cache or freshly compiled.
pub fn module_image(cc: (i32, i32)) -> Result<Vec<u8>> {
    let source = SOURCES.concat();
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let opts = [format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
    let (vmaj, vmin) = nvrtc_version()?;
    let version = format!("nvrtc {vmaj}.{vmin}");
    let key = fnv1a(&[source.as_bytes(), opts.join(" ").as_bytes(), version.as_bytes()]);
    let path = cache_dir().map(|d| d.join(format!("{key:016x}-{arch}.cubin")));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let t0 = std::time::Instant::now();
    eprintln!("compiling the CUDA kernels for {arch} ({version}); they are cached for the next start");
    let cubin = compile(&source, &opts)?;
    eprintln!("compiled the CUDA kernels in {:.1} s", t0.elapsed().as_secs_f64());
    if let Some(p) = &path {
        if let Err(e) = store(p, &cubin) {
            eprintln!("warning: could not cache the compiled kernels at {}: {e}", p.display());
        }
    }
    Ok(cubin)
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
