//! The CUDA driver as the backend uses it: one context, a compute stream
//! and a copy stream, the compiled kernels, and raw device memory,
//! through cudarc's dynamically loaded driver API (nothing is linked at
//! build time; a machine without a driver never gets here, see `probe`).

pub(crate) use super::check::{cuda_err, Check};
use super::compile::{self, Module};
pub(crate) use super::event::Event;
use super::functions::{BaseKernels, FormatKernels, Kernels};
use super::graph::Segments;
use super::CudaOptions;
use crate::error::{Error, Result};
use crate::notify::Notifier;
use cudarc::driver::{sys, CudaContext};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The largest grid y (and z) dimension.
pub(crate) const MAX_GRID_Y: usize = 65535;

/// Why CUDA cannot be used here, or the number of devices.
pub fn probe() -> std::result::Result<usize, String> {
    // SAFETY: only tries to open the shared libraries.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda) found".into());
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("the CUDA driver is present but NVRTC (libnvrtc) is not; install the CUDA toolkit's NVRTC or add its directory to LD_LIBRARY_PATH".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err("the CUDA driver reports no device".into()),
        Err(e) => Err(format!("the CUDA driver failed to start: {e}")),
    }
}

/// Kernel arguments for [`Gpu::launch`]: pointers to each value, which
/// must have the exact type of the kernel's parameter (u64 for pointers,
/// i32 for `int`, i64 for `long long`, f32 for `float`, `#[repr(C)]`
/// structs as declared in the `.cu` sources).
#[macro_export]
#[doc(hidden)]
macro_rules! cuda_args {
    ($($a:expr),* $(,)?) => {
        &mut [$(&$a as *const _ as *mut ::std::ffi::c_void),*]
    };
}

/// Largest grid (in blocks) launched with programmatic stream serialization.
const PDL_MAX_BLOCKS: u64 = 1056;
/// Passes of at most this many tokens launch with programmatic stream
/// serialization: on the H100 it gained decode and cost prefill when every pass
/// used it (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Programmatic
/// dependent launch in decode only"). 16 covers a
/// batched decode step of up to 16 sequences.
pub(crate) const PDL_MAX_TOKENS: usize = 16;

/// One GPU: its context, streams and kernels.
pub(crate) struct Gpu {
    ctx: Arc<CudaContext>,
    /// Every kernel and every activation copy runs here, in order.
    pub stream: sys::CUstream,
    /// Host→device expert copies, ordered against `stream` with events.
    pub copy: sys::CUstream,
    modules: Vec<sys::CUmodule>,
    pub k: Kernels,
    /// Where this device's messages go (see `crate::notify`).
    pub notify: Notifier,
    /// The settings it was opened with.
    pub opts: CudaOptions,
    pub name: String,
    pub ordinal: usize,
    /// Stream-ordered allocation (`cuMemAllocAsync`) is available.
    async_alloc: bool,
    /// Freed blocks by size, reused without a driver call: every use is
    /// on the compute stream, so a block freed there may be handed out
    /// again at once (later work on the stream runs after earlier uses).
    free: Mutex<FreeList>,
    /// Launches captured into graphs (see `graph`); off with
    /// `CudaOptions::graphs`.
    graphs: AtomicBool,
    segments: Mutex<Segments>,
    readback: Mutex<super::readback::Readback>,
    published: Mutex<super::readback::Published>,
    upload: Mutex<super::upload::Upload>,
    /// Kernels are launched with programmatic stream serialization
    /// (compute capability 9.0 and later; off with `CudaOptions::pdl`): a
    /// kernel's launch and prologue overlap the end of the one before it,
    /// and every kernel waits (`griddepcontrol.wait`, `GRID_DEP` in
    /// kernels/common.cuh) for its predecessor before it touches memory.
    pdl: bool,
    /// The current forward pass is small enough for PDL (`PDL_MAX_TOKENS`).
    pub pdl_pass: AtomicBool,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    /// Streaming multiprocessors (queried).
    pub sms: usize,
    /// Most dynamic shared memory a block may be allowed (queried: the
    /// opt-in limit, 227 KiB on an H100).
    pub smem_optin: usize,
    /// Shared memory of one multiprocessor, and what the system keeps of
    /// it per block (queried: 228 KiB and 1 KiB on an H100).
    pub smem_sm: usize,
    pub smem_reserved: usize,
    /// Prefill products run on tensor cores (`CudaOptions::tensor_cores`
    /// and compute capability 8.0 or later; see `tensor.rs`).
    pub tensor_cores: bool,
}

#[derive(Default)]
struct FreeList {
    by_size: HashMap<usize, Vec<u64>>,
    bytes: usize,
}

/// Most bytes kept in the free list; larger frees go to the driver.
const FREE_LIST_BYTES: usize = 4 << 30;

// SAFETY: the driver API is thread-safe; every entry point binds the
// context to the calling thread first, and the raw handles are only
// passed to the driver.
unsafe impl Send for Gpu {}
// SAFETY: as above.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Open device `ordinal`, compile (or load from the disk cache) the
    /// kernels for the weight format codes `codes`.
    pub fn open(ordinal: usize, codes: &[i32], opts: &CudaOptions, notify: &Notifier) -> Result<Arc<Gpu>> {
        if let Err(why) = probe() {
            return Err(Error::Backend {
                backend: "cuda",
                msg: why,
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda_err(&format!("opening CUDA device {ordinal}"), e))?;
        let name = ctx.name().map_err(|e| cuda_err("device name", e))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| cuda_err("compute capability", e))?;
        let images = compile::module_images(cc, codes, opts.kernel_cache.as_deref(), notify)?;
        let async_alloc = ctx.has_async_alloc();
        let attr = |a: sys::CUdevice_attribute, what: &str| -> Result<usize> {
            Ok(ctx.attribute(a).map_err(|e| cuda_err(what, e))?.max(0) as usize)
        };
        use sys::CUdevice_attribute as A;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count")?.max(1);
        let smem_optin = attr(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "shared memory per block",
        )?;
        let smem_sm = attr(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            "shared memory per multiprocessor",
        )?;
        let smem_reserved = attr(
            A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
            "shared memory reserved per block",
        )?;
        let mut modules = Vec::with_capacity(images.len());
        for (_, image) in &images {
            let mut module = std::ptr::null_mut();
            // SAFETY: `image` is a complete CUBIN made by NVRTC for this device.
            unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) }
                .check("loading the kernels")?;
            modules.push(module);
        }
        let of = |pick: &dyn Fn(Module) -> bool| -> Vec<sys::CUmodule> {
            images
                .iter()
                .zip(&modules)
                .filter(|((m, _), _)| pick(*m))
                .map(|(_, &module)| module)
                .collect()
        };
        let base = BaseKernels::load(&of(&|m| matches!(m, Module::Base | Module::Attention | Module::Delta)))?;
        let formats = codes
            .iter()
            .map(|&c| {
                let mods = of(&|m| matches!(m, Module::Format { code, .. } if code == c));
                FormatKernels::load(&mods).map(|k| (c, k))
            })
            .collect::<Result<Vec<_>>>()?;
        let k = Kernels { base, formats };
        let tensor_cores = cc.0 >= 8 && opts.tensor_cores;
        let mut stream = std::ptr::null_mut();
        let mut copy = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: plain stream creation in the bound context.
        unsafe { sys::cuStreamCreate(&mut stream, flags) }.check("creating a stream")?;
        // SAFETY: as above.
        unsafe { sys::cuStreamCreate(&mut copy, flags) }.check("creating a stream")?;
        if async_alloc {
            // Keep freed memory in the pool: activations are allocated and
            // freed many times per token.
            let mut pool = std::ptr::null_mut();
            // SAFETY: the device is valid; `keep` outlives the call.
            unsafe {
                sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).check("memory pool")?;
                let mut keep = u64::MAX;
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut keep as *mut u64 as *mut c_void,
                )
                .check("memory pool threshold")?;
            }
        }
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            copy,
            modules,
            k,
            notify: notify.clone(),
            name,
            ordinal,
            async_alloc,
            free: Mutex::new(FreeList::default()),
            graphs: AtomicBool::new(opts.graphs),
            segments: Mutex::new(Segments::default()),
            readback: Mutex::new(Default::default()),
            published: Mutex::new(Default::default()),
            upload: Mutex::new(Default::default()),
            pdl: cc.0 >= 9 && opts.pdl,
            pdl_pass: AtomicBool::new(true),
            tensor_cores,
            cc,
            sms,
            smem_optin,
            smem_sm,
            smem_reserved,
            opts: opts.clone(),
        }))
    }

    /// Make this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("binding the context", e))
    }

    /// (free, total) bytes of device memory.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        self.ctx.mem_get_info().map_err(|e| cuda_err("memory info", e))
    }

    /// Let kernel `f` take up to `bytes` of dynamic shared memory (more
    /// than the 48 KiB a block gets without asking).
    pub fn allow_shared_memory(&self, f: sys::CUfunction, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: a function of a loaded module; a plain attribute.
        unsafe {
            sys::cuFuncSetAttribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .check("a kernel's shared memory")
    }

    /// Launch `f` on the compute stream; `block` threads in x.
    pub fn launch(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let mut seg = match self.graphs.load(Ordering::Relaxed) {
            true => Some(self.segments()?),
            false => None,
        };
        if let Some(s) = seg.as_mut() {
            s.begin(self.stream)?;
        }
        // Programmatic serialization pays where launch latency shows: a
        // grid of about one wave or less. Larger grids launch plainly, so
        // that their blocks, waiting early, take no slots from the kernel
        // still running before them.
        let r = if self.pdl
            && self.pdl_pass.load(Ordering::Relaxed)
            && (grid.0 as u64) * (grid.1 as u64) * (grid.2 as u64) <= PDL_MAX_BLOCKS
        {
            // SAFETY: an all-zero attribute value is valid; the one field
            // read for this attribute is set below.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as for cuLaunchKernel below; `cfg` and `attr` live
            // until the call returns.
            unsafe { sys::cuLaunchKernelEx(&cfg, f, args.as_mut_ptr(), std::ptr::null_mut()) }.check("kernel launch")
        } else {
            // SAFETY: the caller passes arguments of the kernel's exact
            // types (see `cuda_args!`), which live until this call returns.
            unsafe {
                sys::cuLaunchKernel(
                    f,
                    grid.0,
                    grid.1,
                    grid.2,
                    block,
                    1,
                    1,
                    smem,
                    self.stream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .check("kernel launch")
        };
        match seg.as_mut() {
            Some(s) if r.is_ok() => s.launched(self.stream),
            Some(s) => {
                let _ = s.flush(self.stream);
                r
            }
            None => r,
        }
    }

    fn segments(&self) -> Result<MutexGuard<'_, Segments>> {
        self.segments.lock().map_err(|_| Error::Backend {
            backend: "cuda",
            msg: "graph capture state poisoned".into(),
        })
    }

    /// Launch the kernels captured so far: called before anything else
    /// is put on the compute stream.
    pub fn flush(&self) -> Result<()> {
        if !self.graphs.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.segments()?.flush(self.stream)
    }

    /// Whether launches are captured into graphs.
    pub fn graphs(&self) -> bool {
        self.graphs.load(Ordering::Relaxed)
    }

    /// Turn graph capture on or off (what was captured is launched first).
    pub fn set_graphs(&self, on: bool) -> Result<()> {
        self.flush()?;
        self.graphs.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Blocks are handed out in multiples of this.
    pub const GRAIN: usize = 256;

    /// `bytes` of device memory, rounded up to [`Gpu::GRAIN`] (0 bytes: a
    /// null pointer), from the free list when a block of that size is there.
    pub fn alloc(&self, bytes: usize) -> Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        let bytes = bytes.div_ceil(Self::GRAIN) * Self::GRAIN;
        if let Ok(mut fl) = self.free.lock() {
            if let Some(p) = fl.by_size.get_mut(&bytes).and_then(|v| v.pop()) {
                fl.bytes -= bytes;
                return Ok(p);
            }
        }
        self.flush()?;
        let mut p = 0;
        let what = || format!("allocating {bytes} bytes of device memory");
        // SAFETY: plain allocation in the bound context.
        if self.async_alloc {
            unsafe { sys::cuMemAllocAsync(&mut p, bytes, self.stream) }.check(&what())?;
        } else {
            unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }.check(&what())?;
        }
        Ok(p)
    }

    /// Give back `bytes` at `p` from [`Gpu::alloc`]: to the free list, or
    /// to the driver once the compute stream is past its uses.
    pub fn free(&self, p: u64, bytes: usize) {
        if p == 0 {
            return;
        }
        let bytes = bytes.div_ceil(Self::GRAIN) * Self::GRAIN;
        if let Ok(mut fl) = self.free.lock() {
            if fl.bytes + bytes <= FREE_LIST_BYTES {
                fl.bytes += bytes;
                fl.by_size.entry(bytes).or_default().push(p);
                return;
            }
        }
        self.release(p);
    }

    fn release(&self, p: u64) {
        if self.bind().is_err() || self.flush().is_err() {
            return;
        }
        // SAFETY: `p` came from `alloc` and is freed once. Errors here
        // can only be reported by later calls.
        unsafe {
            if self.async_alloc {
                let _ = sys::cuMemFreeAsync(p, self.stream);
            } else {
                let _ = sys::cuMemFree_v2(p);
            }
        }
    }

    pub fn memset_zero(&self, p: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.flush()?;
        // SAFETY: the caller owns `bytes` bytes at `p` (a multiple of 4).
        unsafe { sys::cuMemsetD32Async(p, 0, bytes / 4, self.stream) }.check("memset")
    }

    /// Copy host bytes to the device (ordered on the compute stream; the
    /// host slice may be dropped on return).
    pub fn htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.flush()?;
        if src.len() <= super::upload::SLOT_BYTES {
            if let Ok(mut up) = self.upload.lock() {
                return up.copy(self.stream, dst, src);
            }
        }
        // SAFETY: the caller owns `src.len()` bytes at `dst`; pageable
        // sources are staged by the driver before this returns.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), self.stream) }
            .check("copy to the device")
    }

    /// Copy device bytes to the host, waiting for the compute stream.
    pub fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.flush()?;
        // SAFETY: `src` holds at least `dst.len()` bytes; the stream is
        // synchronized before `dst` is used.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), self.stream) }
            .check("copy to the host")?;
        self.sync()
    }

    /// Several device ranges to the host with one wait for the stream
    /// (through pinned memory when they fit in `READBACK_BYTES`).
    pub fn dtoh_many(&self, parts: &mut [(&mut [u8], u64)]) -> Result<()> {
        self.flush()?;
        if super::readback::Readback::fits(parts) {
            if let Ok(mut rb) = self.readback.lock() {
                return rb.read(self.stream, parts, || self.sync());
            }
        }
        for (dst, src) in parts.iter_mut() {
            if dst.is_empty() {
                continue;
            }
            // SAFETY: as in `dtoh`; every `dst` outlives the sync below.
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, *src, dst.len(), self.stream) }
                .check("copy to the host")?;
        }
        self.sync()
    }

    /// As [`Gpu::dtoh_many`], for at most three parts of whole words: a
    /// kernel writes them into mapped page-locked memory, then a flag the
    /// host spins on (no copy, no stream sync; `readback::Published`).
    pub fn publish_many(&self, parts: &mut [(&mut [u8], u64)]) -> Result<()> {
        if !super::readback::Published::fits(parts) {
            return self.dtoh_many(parts);
        }
        let Ok(mut p) = self.published.lock() else {
            return self.dtoh_many(parts);
        };
        let launch = |dst: u64, s: &[(u64, i32, i32); 3], seq: u32| {
            let ((s0, o0, n0), (s1, o1, n1), (s2, o2, n2)) = (s[0], s[1], s[2]);
            self.launch(
                self.k.publish,
                (1, 1, 1),
                256,
                0,
                crate::cuda_args![dst, s0, o0, n0, s1, o1, n1, s2, o2, n2, seq],
            )
        };
        // SAFETY: the stream is valid while `self` lives.
        let query = || unsafe { sys::cuStreamQuery(self.stream) };
        p.read(parts, launch, || self.flush(), query)
    }

    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.flush()?;
        // SAFETY: both ranges are owned device memory of `bytes` bytes.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream) }.check("device copy")
    }

    /// Wait for everything on the compute stream.
    pub fn sync(&self) -> Result<()> {
        self.flush()?;
        // SAFETY: the stream is valid for the life of `self`.
        unsafe { sys::cuStreamSynchronize(self.stream) }.check("waiting for the GPU")?;
        if self.graphs.load(Ordering::Relaxed) {
            self.segments()?.restart();
        }
        Ok(())
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let _ = self.flush();
        let cached: Vec<u64> = match self.free.lock() {
            Ok(mut fl) => fl.by_size.drain().flat_map(|(_, v)| v).collect(),
            Err(_) => Vec::new(),
        };
        for p in cached {
            self.release(p);
        }
        // SAFETY: the handles were created by `open` and are destroyed once;
        // every buffer holds an `Arc<Gpu>`, so none outlives them.
        unsafe {
            let _ = sys::cuStreamSynchronize(self.stream);
            let _ = sys::cuStreamSynchronize(self.copy);
            if let Ok(mut seg) = self.segments.lock() {
                seg.destroy();
            }
            if let Ok(mut rb) = self.readback.lock() {
                rb.free();
            }
            if let Ok(mut p) = self.published.lock() {
                p.free();
            }
            if let Ok(mut up) = self.upload.lock() {
                up.free();
            }
            let _ = sys::cuStreamDestroy_v2(self.stream);
            let _ = sys::cuStreamDestroy_v2(self.copy);
            for &m in &self.modules {
                let _ = sys::cuModuleUnload(m);
            }
        }
    }
}
