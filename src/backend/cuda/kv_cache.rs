//! The device's KV cache: rows of one [`KvType`] in the row encoding of
//! `backend/kv.rs` (kernels/kv.cuh reads and writes it), and the launches
//! that store rows into it and read them back.

use super::buf::{CudaBuf, DevMem};
use super::driver::Gpu;
use super::ops::grid_for;
use crate::backend::KvType;
use crate::cuda_args;
use crate::error::{Error, Result};
use std::sync::Arc;

/// The backend's `Cache`: `rows` rows of `width` values of type `t`.
pub struct CudaCache {
    mem: DevMem,
    t: KvType,
    rows: usize,
    width: usize,
}

impl CudaCache {
    pub(crate) fn new(gpu: &Arc<Gpu>, t: KvType, rows: usize, width: usize) -> Result<CudaCache> {
        t.check_width(width, width, "this cache")?;
        let bytes = rows
            .checked_mul(t.row_bytes(width))
            .ok_or_else(|| Error::Invalid(format!("a KV cache of {rows} rows of {width} overflows")))?;
        Ok(CudaCache {
            mem: DevMem::new(gpu, bytes.max(1))?,
            t,
            rows,
            width,
        })
    }

    pub fn kind(&self) -> KvType {
        self.t
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// The type's code for the kernels (`KV_*` of kernels/kv.cuh).
    pub(crate) fn code(&self) -> i32 {
        self.t.code() as i32
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.mem.ptr()
    }

    /// An error unless the cache holds rows `[0, rows)`.
    pub(crate) fn want(&self, what: &str, rows: usize) -> Result<()> {
        if rows > self.rows {
            return Err(Error::Invalid(format!(
                "{what}: {rows} positions in a cache of {}",
                self.rows
            )));
        }
        Ok(())
    }
}

/// Rows `[row0, row0 + n)` of `c` = rows `[src_row, src_row + n)` of src.
pub(crate) fn store(gpu: &Gpu, src: &CudaBuf, src_row: usize, n: usize, c: &mut CudaCache, row0: usize) -> Result<()> {
    let w = c.width;
    src.want("KV cache store input", (src_row + n) * w)?;
    c.want("KV cache store", row0 + n)?;
    if n == 0 {
        return Ok(());
    }
    let sp = src.read(gpu)? + 4 * (src_row * w) as u64;
    let warps = n * w.div_ceil(32);
    let (dp, nn, ww, t, r0) = (c.ptr(), n as i32, w as i32, c.code(), row0 as i32);
    gpu.launch(
        gpu.k.kv_store,
        grid_for(warps * 32),
        256,
        0,
        cuda_args![sp, dp, nn, ww, t, r0],
    )
}

/// Rows `[row0, row0 + n)` of `c`, decoded, into a new buffer `[n, width]`.
pub(crate) fn load(gpu: &Arc<Gpu>, c: &CudaCache, row0: usize, n: usize) -> Result<CudaBuf> {
    c.want("KV cache read", row0 + n)?;
    let out = CudaBuf::zeroed(gpu, n * c.width)?;
    if n > 0 {
        let op = out.write(gpu, n * c.width)?;
        let (sp, nn, ww, t, r0) = (c.ptr(), n as i32, c.width as i32, c.code(), row0 as i32);
        gpu.launch(
            gpu.k.kv_load,
            grid_for(n * c.width),
            256,
            0,
            cuda_args![sp, op, nn, ww, t, r0],
        )?;
    }
    Ok(out)
}
