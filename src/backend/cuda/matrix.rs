//! Resident weight matrices on the device (MLX affine 2/4/8-bit or float,
//! in their packed layout), and the products and lookups that read them.

use super::buf::{CudaBuf, DevMem};
use super::driver::{Gpu, MAX_GRID_Y};
use super::format::{format_of, group_shift, Format, MatArg, MatSet, F16_SCALES, MQ_SET};
use crate::cuda_args;
use crate::error::{Error, Result};
use crate::format::{Dtype, MatrixData, MatrixView};
use std::sync::Arc;

/// The output tile of the `gemm` kernel: weight rows × tokens (`GM_BM`,
/// `GM_BN` in kernels/matvec.cu).
const GEMM_ROWS: usize = 128;
const GEMM_TOKENS: usize = 64;
/// The most tokens a product takes through `matvec_tok4/8` (a batched
/// decode step) instead of the tiled `gemm`.
const MATVEC_TOK_MAX: usize = 16;

/// Matrices of one (format code, group shift) for one tensor-core launch,
/// each with its output address.
type TcSet = ((i32, i32), Vec<(MatArg, u64)>);

/// Matrices of one (format code, group shift) for one staged launch, each
/// with its output address.
type StagedSet<'a> = ((i32, i32), Vec<(&'a CudaMatrix, u64)>);

/// Warps that share each row group's columns in `matvec_q`: 4 for a short
/// wide matrix (at most 4096 rows of at least 4096 columns: o_proj and
/// out_proj shapes, whose few rows would leave each warp a long serial
/// walk along its rows), else 1. A function of the matrix alone, so that
/// a row's sum is the same in every launch that holds the matrix.
fn split_of(m: &CudaMatrix) -> usize {
    if m.rows <= 4096 && m.cols >= 4096 {
        4
    } else {
        1
    }
}

/// Bytes of dynamic shared memory of a `matvec_q`/`matvec_qt` tile of `t`
/// tokens of `cols` (what `mq_stage` in kernels/matvec_q.cu fills): the
/// vectors, and each token's sums per 16-byte chunk (16 elements a chunk
/// at most).
const fn qt_smem(t: usize, cols: usize) -> usize {
    t * cols * 4 + t * (cols / 16) * 4
}

/// Shared memory `matvec_qt` keeps for its own (the split sums of 8
/// warps × QT_TILE tokens × 4 rows): what a tile's vectors may take is
/// the device's opt-in limit less this.
const QT_STATIC_SMEM: usize = 8 * QT_TILE * 4 * 4;

/// Tokens of a `matvec_qt` tile (`QT_TILE` in kernels/matvec_q.cu): the
/// tiles of a product run side by side in one grid. For 8 streams of a resident
/// decode on the H100, tiles of 2 and of 4 beat one tile of 8, and 4 streams
/// ran alike with tiles of 2 or 4
/// (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Batched decode:
/// `matvec_q` for tiles of tokens").
const QT_TILE: usize = 2;

/// Whether `matvec_q`'s arithmetic takes rows of weight format code
/// `fmt` (log2 group size `gs_shift`, rows 16-byte aligned: `vec`):
/// quantized, each 16-byte chunk inside one group.
fn chunks_in_groups(fmt: i32, gs_shift: i32, vec: bool) -> bool {
    let bits = match fmt & 7 {
        f if f == Format::Q2 as i32 => 2,
        f if f == Format::Q4 as i32 => 4,
        f if f == Format::Q8 as i32 => 8,
        _ => return false,
    };
    // Elements per 16-byte chunk: 128 / bits.
    vec && (1usize << gs_shift) >= 128 / bits
}

/// Bytes of shared memory of one staged vector of `cols` (`matvec_q`).
const fn one_smem(cols: usize) -> usize {
    qt_smem(1, cols)
}

/// Whether one staged vector of `cols` fits in the 48 KiB of shared
/// memory any block has, less the kernel's 1 KiB of its own.
const fn one_fits(cols: usize) -> bool {
    one_smem(cols) <= 47 * 1024
}

/// Most tokens a product takes through `matvec_qt` (a batched decode
/// step of up to 8 sequences); more take the tensor cores or
/// `matvec_tok8`.
pub(crate) const QT_TOKENS: usize = 8;

/// The blocks of each matrix of a `matvec_q`/`matvec_qt` launch and the
/// warps of a block. 4 rows a warp. At least 32 rows per SM in all: 8
/// warps a block and for each matrix at most as many blocks as fit on
/// the SMs at once (`per_sm` a SM; the blocks stride over its rows), so x
/// is staged into few blocks; fewer: 2 warps a block, to spread the rows
/// over the SMs. A short wide matrix (`split_of`) has 4 warps share each
/// row group's columns, in blocks of 8 warps.
fn mq_blocks(gpu: &Gpu, set: &[(&CudaMatrix, u64)], per_sm: usize) -> (Vec<(MatArg, u64, usize)>, u32) {
    let big = set.iter().map(|(m, _)| m.rows).sum::<usize>() >= 32 * gpu.sms;
    let split = set.iter().any(|(m, _)| split_of(m) > 1);
    let warps = if big || split { 8 } else { 2 };
    let parts = set
        .iter()
        .map(|&(m, y)| {
            let ks = split_of(m);
            // Rows per block: 4 per row group of `ks` warps.
            let per_block = 4 * warps / ks;
            let blocks = match big {
                true => m.rows.div_ceil(per_block).min(per_sm * gpu.sms),
                false => m.rows.div_ceil(per_block),
            };
            let arg = MatArg {
                split: ks as i32,
                ..m.arg
            };
            (arg, y, blocks)
        })
        .collect();
    (parts, 32 * warps as u32)
}

/// One `matvec_q` launch: `y = W·v` for each (matrix, output address) of
/// `set` (1 to MQ_SET matrices that `staged` takes for one token, all of
/// the same cols), with v = x, or silu(x) ⊙ u when `u` is not 0 (x, u
/// `[cols]`).
fn launch_matvec_q(gpu: &Gpu, set: &[(&CudaMatrix, u64)], x: u64, u: u64) -> Result<()> {
    let Some((first, _)) = set.first() else {
        return Ok(());
    };
    let (parts, threads) = mq_blocks(gpu, set, 2);
    let (arg, blocks) = MatSet::new("matvec_q", &parts)?;
    let smem = one_smem(first.cols) as u32;
    gpu.launch(
        gpu.k.matvec_q,
        (blocks as u32, 1, 1),
        threads,
        smem,
        cuda_args![arg, x, u],
    )
}

/// Whether `matvec_qt` takes products of `cols` columns: a tile's
/// vectors fit in a block's shared memory.
fn qt_fits(gpu: &Gpu, cols: usize) -> bool {
    qt_smem(QT_TILE, cols) <= qt_smem_max(gpu)
}

/// One `matvec_qt` launch for `n` tokens (2 to QT_TOKENS) in tiles of
/// QT_TILE: `y[n, rows] = v[n, cols]·Wᵀ` for each (matrix, output
/// address) of `set` (1 to MQ_SET matrices of one format code that
/// `staged` takes, all of the same cols), v = x or silu(x) ⊙ u. Each
/// token's row sums are the ones `matvec_q` gives it alone.
fn launch_matvec_qt(gpu: &Gpu, set: &[(&CudaMatrix, u64)], x: u64, u: u64, n: usize) -> Result<()> {
    let Some((first, _)) = set.first() else {
        return Ok(());
    };
    let smem = qt_smem(QT_TILE, first.cols);
    let (parts, threads) = mq_blocks(gpu, set, (qt_smem_max(gpu) / smem).max(1));
    let (arg, blocks) = MatSet::new("matvec_qt", &parts)?;
    let f = gpu.k.fmt(first.arg.fmt)?.matvec_qt;
    let grid = (blocks as u32, n.div_ceil(QT_TILE) as u32, 1);
    let nn = n as i32;
    gpu.launch(f, grid, threads, smem as u32, cuda_args![arg, x, u, nn])
}

/// The most dynamic shared memory a `matvec_qt` block is given.
fn qt_smem_max(gpu: &Gpu) -> usize {
    gpu.smem_optin.max(48 * 1024) - QT_STATIC_SMEM
}

/// Let `matvec_qt` take all the shared memory a block may have (once,
/// after the kernels are loaded).
pub(crate) fn allow_shared_memory(gpu: &Gpu) -> Result<()> {
    for (_, k) in &gpu.k.formats {
        gpu.allow_shared_memory(k.matvec_qt, qt_smem_max(gpu))?;
    }
    Ok(())
}

/// A weight matrix resident on the device.
pub struct CudaMatrix {
    pub(crate) arg: MatArg,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    _mem: DevMem,
}

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
            vec: row_bytes.is_multiple_of(16) as i32,
            split: 1,
        };
        Ok(CudaMatrix {
            arg,
            rows,
            cols,
            _mem: mem,
        })
    }

    /// Whether `matvec_q` and `matvec_qt` take this matrix.
    fn quant_chunks(&self) -> bool {
        let a = &self.arg;
        chunks_in_groups(a.fmt, a.gs_shift, a.vec == 1) && self.rows > 0 && self.cols > 0
    }

    /// Whether `n` tokens through this matrix go to `matvec_q` (one
    /// token, x in the 48 KiB of shared memory any block has, less the
    /// kernel's 1 KiB of its own) or `matvec_qt` (2 to QT_TOKENS tokens in
    /// one tile): each token's row sums then are the ones it gets alone.
    /// Where the tensor cores are on, 2 to QT_TOKENS tokens take
    /// `matvec_tc` instead of `matvec_qt` (within SPEC §6's batched
    /// tolerance of a token's sums alone, not bit for bit).
    fn staged(&self, gpu: &Gpu, n: usize) -> bool {
        let fits = match n {
            1 => one_fits(self.cols),
            2..=QT_TOKENS => (n <= super::matvec_tc::MAX_TOKENS && self.step_tc(gpu)) || qt_fits(gpu, self.cols),
            _ => false,
        };
        fits && self.quant_chunks()
    }

    /// Whether `matvec_tc` takes this matrix.
    fn step_tc(&self, gpu: &Gpu) -> bool {
        super::matvec_tc::takes(gpu, &self.arg)
    }

    /// The `matvec_q` (one token), `matvec_tc` or `matvec_qt` launch of
    /// `set` (matrices of one format code and group size for more than
    /// one token).
    fn launch_staged(gpu: &Gpu, set: &[(&CudaMatrix, u64)], x: u64, u: u64, n: usize) -> Result<()> {
        match n {
            1 => launch_matvec_q(gpu, set, x, u),
            _ if n <= super::matvec_tc::MAX_TOKENS && set.iter().all(|(m, _)| m.step_tc(gpu)) => {
                let args: Vec<(MatArg, u64)> = set.iter().map(|&(m, y)| (m.arg, y)).collect();
                super::matvec_tc::launch(gpu, &args, x, u, n)
            }
            _ => launch_matvec_qt(gpu, set, x, u, n),
        }
    }

    /// `y[n, rows] = x[n, cols] · Wᵀ`.
    pub(crate) fn linear(&self, gpu: &Arc<Gpu>, x: &CudaBuf, n: usize, y: &mut CudaBuf) -> Result<()> {
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
        if self.staged(gpu, n) {
            CudaMatrix::launch_staged(gpu, &[(self, yp)], xp, 0, n)
        } else if n == 1 {
            // 2 warps of 4 rows per block: small blocks spread a matrix of
            // few rows over every SM.
            let grid = rows.div_ceil(8) as u32;
            gpu.launch(gpu.k.fmt(arg.fmt)?.matvec, (grid, 1, 1), 64, 0, cuda_args![arg, xp, yp])
        } else if self.tensor_cores(gpu, n) {
            super::tensor::gemm(gpu, &[(arg, yp)], xp, n)
        } else if n <= MATVEC_TOK_MAX {
            // matvec's warps over tiles of 4 or 8 tokens.
            let (f, t) = match n {
                ..=4 => (gpu.k.fmt(arg.fmt)?.matvec_tok4, 4),
                _ => (gpu.k.fmt(arg.fmt)?.matvec_tok8, 8),
            };
            // 2 warps of 4 rows per block, as matvec.
            let grid = (rows.div_ceil(8) as u32, n.div_ceil(t) as u32, 1);
            let n = n as i32;
            gpu.launch(f, grid, 64, 0, cuda_args![arg, xp, yp, n])
        } else {
            // Tiles of GEMM_ROWS × GEMM_TOKENS outputs.
            let (gx, gy) = (rows.div_ceil(GEMM_ROWS) as u32, n.div_ceil(GEMM_TOKENS) as u32);
            let n = n as i32;
            gpu.launch(
                gpu.k.fmt(arg.fmt)?.gemm,
                (gx, gy, 1),
                256,
                0,
                cuda_args![arg, xp, yp, n],
            )
        }
    }

    /// Whether a product of `n` tokens through this matrix runs on tensor
    /// cores (`tensor.rs`).
    fn tensor_cores(&self, gpu: &Gpu, n: usize) -> bool {
        let a = &self.arg;
        let step = n >= super::tensor::STEP_MIN_TOKENS && self.rows >= super::tensor::STEP_MIN_ROWS;
        let tokens = n >= super::tensor::MIN_TOKENS || step;
        tokens && self.rows > 0 && super::tensor::takes(gpu, a.fmt, a.gs_shift, self.cols, a.vec == 1)
    }

    /// `ys[i][n, rows_i] = x[n, cols] · W_iᵀ`. For 1 to QT_TOKENS tokens,
    /// the matrices of `ws` that `matvec_q`/`matvec_qt` take and that have
    /// the first one's cols run MQ_SET to a launch (`matvec_qt`: of one
    /// format code; each row's arithmetic is the one `linear` does); for
    /// more tokens, those on tensor cores of one format and group size run
    /// MQ_SET to a launch from one split of x; the others run one `linear`
    /// each.
    pub(crate) fn linear_many(
        gpu: &Arc<Gpu>,
        ws: &[&CudaMatrix],
        x: &CudaBuf,
        n: usize,
        ys: &mut [&mut CudaBuf],
    ) -> Result<()> {
        if ws.len() != ys.len() {
            return Err(Error::Invalid(format!(
                "linear_many: {} matrices and {} outputs",
                ws.len(),
                ys.len()
            )));
        }
        let cols = ws.first().map_or(0, |w| w.cols);
        if n > QT_TOKENS {
            // Sets of matrices the tensor cores take, by (format, group).
            let mut sets: Vec<TcSet> = Vec::new();
            for (w, y) in ws.iter().zip(ys.iter_mut()) {
                if !(w.tensor_cores(gpu, n) && w.cols == cols) {
                    w.linear(gpu, x, n, y)?;
                    continue;
                }
                x.want(&format!("linear [{}, {cols}] input", w.rows), n * cols)?;
                y.want(&format!("linear [{}, {cols}] output", w.rows), n * w.rows)?;
                let key = (w.arg.fmt, w.arg.gs_shift);
                let yp = y.write(gpu, n * w.rows)?;
                match sets.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, s)) => s.push((w.arg, yp)),
                    None => sets.push((key, vec![(w.arg, yp)])),
                }
            }
            for (_, set) in &sets {
                for chunk in set.chunks(MQ_SET) {
                    super::tensor::gemm(gpu, chunk, x.read(gpu)?, n)?;
                }
            }
            return Ok(());
        }
        // 1 to QT_TOKENS tokens: the matrices matvec_q/matvec_qt/matvec_tc
        // take, MQ_SET to a launch (more than one token: of one format code
        // and group size).
        let mut sets: Vec<StagedSet> = Vec::new();
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            if !(w.staged(gpu, n) && w.cols == cols) {
                w.linear(gpu, x, n, y)?;
                continue;
            }
            x.want(&format!("linear [{}, {cols}] input", w.rows), n * cols)?;
            y.want(&format!("linear [{}, {cols}] output", w.rows), n * w.rows)?;
            let key = if n == 1 { (0, 0) } else { (w.arg.fmt, w.arg.gs_shift) };
            let yp = y.write(gpu, n * w.rows)?;
            match sets.iter_mut().find(|(k, _)| *k == key) {
                Some((_, s)) => s.push((w, yp)),
                None => sets.push((key, vec![(w, yp)])),
            }
        }
        if sets.is_empty() {
            return Ok(());
        }
        let xp = x.read(gpu)?;
        for (_, set) in &sets {
            for chunk in set.chunks(MQ_SET) {
                CudaMatrix::launch_staged(gpu, chunk, xp, 0, n)?;
            }
        }
        Ok(())
    }

    /// `y[n, rows] = (silu(gate) ⊙ up) · Wᵀ` with gate, up `[n, cols]`: for
    /// 1 to QT_TOKENS tokens through a matrix `matvec_q`/`matvec_qt` take,
    /// one launch that stages silu(gate) ⊙ up (the `swiglu` kernel's
    /// values) as its vectors; otherwise `swiglu`, then `linear`.
    pub(crate) fn swiglu_linear(
        &self,
        gpu: &Arc<Gpu>,
        gate: &CudaBuf,
        up: &CudaBuf,
        n: usize,
        y: &mut CudaBuf,
    ) -> Result<()> {
        let (rows, cols) = (self.rows, self.cols);
        gate.want(&format!("swiglu_linear [{rows}, {cols}] gate"), n * cols)?;
        up.want(&format!("swiglu_linear [{rows}, {cols}] up"), n * cols)?;
        y.want(&format!("swiglu_linear [{rows}, {cols}] output"), n * rows)?;
        if !self.staged(gpu, n) {
            let mut h = CudaBuf::zeroed(gpu, n * cols)?; // [n, cols]
            super::ops::swiglu(gpu, gate, up, n * cols, &mut h)?;
            return self.linear(gpu, &h, n, y);
        }
        let (gp, upp, yp) = (gate.read(gpu)?, up.read(gpu)?, y.write(gpu, n * rows)?);
        CudaMatrix::launch_staged(gpu, &[(self, yp)], gp, upp, n)
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
            gpu.launch(gpu.k.fmt(arg.fmt)?.embed, grid, 256, 0, cuda_args![arg, tp, yp])?;
        }
        Ok(())
    }
}
