//! Resident weight matrices on the device (MLX affine 2/4/8-bit or float,
//! in their packed layout), and the products and lookups that read them.

use super::buf::{CudaBuf, DevMem};
use super::driver::Gpu;
use crate::cuda_args;
use crate::error::{Error, Result};
use crate::format::{Dtype, MatrixData, MatrixView};
use std::sync::Arc;

/// Weight formats; kept in step with `FMT_*` in kernels/common.cuh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    F32 = 0,
    Bf16 = 1,
    F16 = 2,
    Q2 = 3,
    Q4 = 4,
    Q8 = 5,
}

/// Added to a quantized format code whose scales are f16.
pub(crate) const F16_SCALES: i32 = 8;

impl Format {
    pub fn float(d: Dtype) -> Result<Format> {
        match d {
            Dtype::F32 => Ok(Format::F32),
            Dtype::Bf16 => Ok(Format::Bf16),
            Dtype::F16 => Ok(Format::F16),
            Dtype::U32 => Err(Error::Invalid("U32 data without quantization parameters".into())),
        }
    }
    pub fn quant(bits: u32) -> Result<Format> {
        match bits {
            2 => Ok(Format::Q2),
            4 => Ok(Format::Q4),
            8 => Ok(Format::Q8),
            b => Err(Error::Invalid(format!("{b}-bit weights are not supported (2, 4 or 8)"))),
        }
    }
    /// Bytes of one row of `cols` weights (without scales).
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            Format::F32 => cols * 4,
            Format::Bf16 | Format::F16 => cols * 2,
            Format::Q2 => cols / 4,
            Format::Q4 => cols / 2,
            Format::Q8 => cols,
        }
    }
}

/// log2 of a quantization group size the kernels take: a power of two, at
/// least 8, dividing `cols`.
pub(crate) fn group_shift(gs: usize, cols: usize, bits: u32) -> Result<i32> {
    if !gs.is_power_of_two() || gs < 8 || cols % gs != 0 || (gs * bits as usize) % 32 != 0 {
        return Err(Error::Invalid(format!(
            "group size {gs} with {bits}-bit weights over {cols} columns: the CUDA kernels need a power of two ≥ 8 that divides the columns into whole words"
        )));
    }
    Ok(gs.trailing_zeros() as i32)
}

/// The `Mat` kernel argument (kernels/common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatArg {
    pub w: u64,
    pub s: u64,
    pub b: u64,
    pub rows: i32,
    pub cols: i32,
    pub fmt: i32,
    pub gs_shift: i32,
    pub vec: i32,
    pub pad: i32,
}

/// A weight matrix resident on the device.
pub struct CudaMatrix {
    pub(crate) arg: MatArg,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    _mem: DevMem,
}

/// The largest grid y (and z) dimension.
pub(crate) const MAX_GRID_Y: usize = 65535;

fn align256(x: usize) -> usize {
    x.div_ceil(256) * 256
}

impl CudaMatrix {
    /// Check `m`'s byte sizes against its shape and copy it to the device
    /// (weights, scales and biases in one allocation).
    pub(crate) fn upload(gpu: &Arc<Gpu>, m: &MatrixView) -> Result<CudaMatrix> {
        let (rows, cols) = (m.rows, m.cols);
        let bad = |what: String| Error::Invalid(format!("matrix [{rows}, {cols}]: {what}"));
        if rows > i32::MAX as usize || cols > i32::MAX as usize {
            return Err(bad("too large for the CUDA kernels".into()));
        }
        let (fmt, gs_shift, parts): (i32, i32, Vec<&[u8]>) = match &m.data {
            MatrixData::Quant {
                bits,
                group_size,
                weight,
                scales,
                biases,
                scale_dtype,
            } => {
                let f = Format::quant(*bits).map_err(|e| bad(e.to_string()))?;
                let shift = group_shift(*group_size, cols, *bits).map_err(|e| bad(e.to_string()))?;
                let sf16 = match scale_dtype {
                    Dtype::Bf16 => 0,
                    Dtype::F16 => F16_SCALES,
                    d => return Err(bad(format!("scales of dtype {} (BF16 or F16 expected)", d.name()))),
                };
                let wbytes = f.row_bytes(cols) * rows;
                let sbytes = rows * (cols / group_size) * 2;
                for (name, len, want) in [
                    ("weight", weight.len(), wbytes),
                    ("scales", scales.len(), sbytes),
                    ("biases", biases.len(), sbytes),
                ] {
                    if len != want {
                        return Err(bad(format!("{name} has {len} bytes, the shape needs {want}")));
                    }
                }
                (
                    f as i32 + sf16,
                    shift,
                    vec![weight.bytes(), scales.bytes(), biases.bytes()],
                )
            }
            MatrixData::Float { dtype, data } => {
                let f = Format::float(*dtype).map_err(|e| bad(e.to_string()))?;
                let want = f.row_bytes(cols) * rows;
                if data.len() != want {
                    return Err(bad(format!("data has {} bytes, the shape needs {want}", data.len())));
                }
                (f as i32, 0, vec![data.bytes()])
            }
        };
        let offs: Vec<usize> = parts
            .iter()
            .scan(0usize, |at, p| {
                let o = *at;
                *at += align256(p.len());
                Some(o)
            })
            .collect();
        let total: usize = parts.iter().map(|p| align256(p.len())).sum();
        let mem = DevMem::new(gpu, total)?;
        for (p, o) in parts.iter().zip(&offs) {
            gpu.htod(mem.ptr() + *o as u64, p)?;
        }
        let base = mem.ptr();
        let at = |i: usize| offs.get(i).map(|o| base + *o as u64).unwrap_or(0);
        let row_bytes = Format::row_bytes(format_of(fmt), cols);
        let arg = MatArg {
            w: at(0),
            s: at(1),
            b: at(2),
            rows: rows as i32,
            cols: cols as i32,
            fmt,
            gs_shift,
            vec: (row_bytes % 16 == 0) as i32,
            pad: 0,
        };
        Ok(CudaMatrix {
            arg,
            rows,
            cols,
            _mem: mem,
        })
    }

    /// Whether `matvec_q` takes this matrix: quantized, rows of whole
    /// 16-byte chunks each inside one group, x small enough for 48 KiB of
    /// shared memory.
    fn staged_matvec(&self) -> bool {
        let a = &self.arg;
        let bits = match a.fmt & 7 {
            f if f == Format::Q2 as i32 => 2,
            f if f == Format::Q4 as i32 => 4,
            f if f == Format::Q8 as i32 => 8,
            _ => return false,
        };
        // Elements per 16-byte chunk: 128 / bits.
        a.vec == 1 && (1usize << a.gs_shift) >= 128 / bits && self.cols * 4 <= 48 * 1024
    }

    /// `y[n, rows] = x[n, cols] · Wᵀ`.
    pub(crate) fn linear(&self, gpu: &Gpu, x: &CudaBuf, n: usize, y: &mut CudaBuf) -> Result<()> {
        let (rows, cols) = (self.rows, self.cols);
        x.want(&format!("linear [{rows}, {cols}] input"), n * cols)?;
        y.want(&format!("linear [{rows}, {cols}] output"), n * rows)?;
        if n == 0 || rows == 0 {
            return Ok(());
        }
        if cols == 0 {
            let yp = y.read(gpu)?;
            return gpu.memset_zero(yp, n * rows * 4);
        }
        let (arg, xp, yp) = (self.arg, x.read(gpu)?, y.write(gpu, n * rows)?);
        if n == 1 && self.staged_matvec() {
            // 4 rows a warp. A matrix of ≥ 32 rows per SM of an H100: 8
            // warps a block and at most 264 blocks (2 per SM) striding over
            // the rows, so x is staged into few blocks; a smaller one: 2
            // warps a block, to spread it over the SMs.
            let (warps, grid) = match rows >= 32 * 132 {
                true => (8, rows.div_ceil(32).min(264)),
                false => (2, rows.div_ceil(8)),
            };
            let smem = (cols * 4) as u32;
            gpu.launch(
                gpu.k.matvec_q,
                (grid as u32, 1, 1),
                32 * warps,
                smem,
                cuda_args![arg, xp, yp],
            )
        } else if n == 1 {
            // 2 warps of 4 rows per block: small blocks spread a matrix of
            // few rows over every SM.
            let grid = rows.div_ceil(8) as u32;
            gpu.launch(gpu.k.matvec, (grid, 1, 1), 64, 0, cuda_args![arg, xp, yp])
        } else {
            let (gx, gy) = (rows.div_ceil(64) as u32, n.div_ceil(64) as u32);
            let n = n as i32;
            gpu.launch(gpu.k.gemm, (gx, gy, 1), 256, 0, cuda_args![arg, xp, yp, n])
        }
    }

    /// `y[t] = row tokens[t]`, dequantized.
    pub(crate) fn embed(&self, gpu: &Arc<Gpu>, tokens: &[u32], y: &mut CudaBuf) -> Result<()> {
        y.want("embed output", tokens.len() * self.cols)?;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.rows) {
            return Err(Error::TokenOutOfRange {
                token: t,
                vocab: self.rows,
            });
        }
        if tokens.is_empty() || self.cols == 0 {
            return Ok(());
        }
        let ids = DevMem::from_host(gpu, bytemuck::cast_slice(tokens))?;
        let y0 = y.write(gpu, tokens.len() * self.cols)?;
        // Grid y is at most 65535: chunks of tokens.
        for t0 in (0..tokens.len()).step_by(MAX_GRID_Y) {
            let nt = (tokens.len() - t0).min(MAX_GRID_Y);
            let arg = self.arg;
            let tp = ids.ptr() + 4 * t0 as u64;
            let yp = y0 + 4 * (t0 * self.cols) as u64;
            let grid = (self.cols.div_ceil(256) as u32, nt as u32, 1);
            gpu.launch(gpu.k.embed, grid, 256, 0, cuda_args![arg, tp, yp])?;
        }
        Ok(())
    }
}

/// The format of a kernel format code (without the scale flag).
pub(crate) fn format_of(code: i32) -> Format {
    match code & 7 {
        0 => Format::F32,
        1 => Format::Bf16,
        2 => Format::F16,
        3 => Format::Q2,
        4 => Format::Q4,
        _ => Format::Q8,
    }
}
