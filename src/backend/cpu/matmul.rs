//! Matrix products on the CPU: `y[n, rows] = x[n, cols] · Wᵀ` for MLX
//! affine 2/4/8-bit and bf16/f16/f32 weights. Rows are split across the
//! rayon pool in blocks of a few tens of KiB of weights; inside a block
//! each row (group) is decoded once and applied to all `n` inputs. The
//! kernels live in `qmatvec` (scalar), `simd` (AVX2 + FMA), `simd512`
//! (AVX-512, up to 16 tokens) and `vnni` (AVX-512 VNNI, 16-bit
//! integer activations: the fast path), chosen at run time by the CPU's
//! features.

use super::qmatvec::{self, Acts, Mat};
use crate::error::{Error, Result};
use crate::format::MatrixView;
use rayon::prelude::*;

/// A resident CPU matrix: a view of mapped (or owned) bytes.
#[derive(Debug, Clone)]
pub struct CpuMatrix {
    pub view: MatrixView,
}

impl CpuMatrix {
    /// Check the view's byte sizes against its shape and keep it.
    pub fn new(view: &MatrixView) -> Result<CpuMatrix> {
        Mat::new(view)?;
        Ok(CpuMatrix { view: view.clone() })
    }
}

/// Which kernels compute `linear`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Portable Rust; the reference for the others.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 AVX-512 F + BW + VL for quantized products of up to
    /// `AVX512_MAX_TOKENS` tokens (decode, batched decode); the AVX2
    /// kernels for everything else.
    Avx512,
    /// AVX-512 VNNI for quantized products (any number of tokens), the
    /// activations rounded to 16-bit integers per group (not exact: SPEC
    /// §6); the `Avx512` kernels for everything else.
    Avx512Vnni,
    /// `Avx512Vnni`, with AMX int8 tiles for quantized products of several
    /// tokens (the same arithmetic: SPEC §6).
    Amx,
}

impl Kernel {
    /// The fastest exact kernel this CPU runs (f32 activations).
    pub fn detect() -> Kernel {
        [Kernel::Avx512, Kernel::Avx2]
            .into_iter()
            .find(|k| k.available())
            .unwrap_or(Kernel::Scalar)
    }

    /// The fastest kernel this CPU runs, exact or not.
    pub fn detect_fast() -> Kernel {
        [Kernel::Amx, Kernel::Avx512Vnni]
            .into_iter()
            .find(|k| k.available())
            .unwrap_or_else(Kernel::detect)
    }

    /// The fastest kernel: `detect()` when `exact`, else `detect_fast()`.
    pub fn choose(exact: bool) -> Kernel {
        match exact {
            true => Kernel::detect(),
            false => Kernel::detect_fast(),
        }
    }

    /// Whether every product takes the activations as f32.
    pub fn is_exact(self) -> bool {
        !matches!(self, Kernel::Avx512Vnni | Kernel::Amx)
    }

    /// Whether this CPU runs `self`.
    pub fn available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => super::simd::available(),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => super::simd512::available(),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => super::vnni::available(),
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => super::amx::available(),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 | Kernel::Avx512 | Kernel::Avx512Vnni | Kernel::Amx => false,
        }
    }

    /// A short name for reports (`amx`, `vnni`, `avx512`, `avx2`, `scalar`).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Amx => "amx",
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
            Kernel::Avx512Vnni => "vnni",
        }
    }

    /// The kernel that computes `mat` over `n` tokens when `self` is asked
    /// for: AVX-512 covers the quantized products of whole 16-byte groups
    /// over at most `AVX512_MAX_TOKENS` tokens, and leaves the rest to the
    /// AVX2 kernels.
    fn for_product(self, mat: &Mat, n: usize) -> Kernel {
        match (self, mat) {
            #[cfg(target_arch = "x86_64")]
            (Kernel::Amx, Mat::Quant(q)) if n >= super::amx::MIN_TOKENS && super::amx::quant_supported(q) => {
                Kernel::Amx
            }
            (Kernel::Amx, _) => Kernel::Avx512Vnni.for_product(mat, n),
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512Vnni, Mat::Quant(q)) if super::vnni::quant_supported(q) => Kernel::Avx512Vnni,
            (Kernel::Avx512Vnni, _) => Kernel::Avx512.for_product(mat, n),
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Mat::Quant(q)) if n <= AVX512_MAX_TOKENS && super::simd512::quant_supported(q) => {
                Kernel::Avx512
            }
            (Kernel::Avx512, _) => Kernel::Avx2,
            (k, _) => k,
        }
    }
}

/// The most tokens the AVX-512 quantized kernels take (a batched decode
/// step); longer products decode rows to f32 for the AVX2 tiled product.
pub const AVX512_MAX_TOKENS: usize = 16;

/// `y[n, rows] = x[n, cols] · Wᵀ` with the fastest kernel of this CPU.
pub fn linear(w: &MatrixView, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
    linear_with(Kernel::detect(), w, x, n, y)
}

/// Weight bytes a rayon task should get: enough to hide the cost of a task.
const TASK_BYTES: usize = 32 << 10;

/// The fewest rows of an AMX task.
const AMX_TASK_ROWS: usize = 64;

/// Weight bytes of a task of the repacked VNNI kernel at most: it repacks
/// its rows into a scratch that must stay in L2 while its token tiles
/// pass over it. Tasks sized only by the set's total (a 248320-row lm
/// head over 4–8 tokens: 17 MB of repacked rows a task) sent that
/// scratch through memory, 7–9× the time of two tokens.
const REPACK_TASK_BYTES: usize = 256 << 10;

/// `y[n, rows] = x[n, cols] · Wᵀ` with the given kernel (tests and
/// benchmarks compare kernels with this).
pub fn linear_with(kernel: Kernel, w: &MatrixView, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
    linear_set_with(kernel, &mut [Product { w, x, n, y }])
}

/// One product of a set computed together: `y[n, rows] = x[n, cols] · Wᵀ`.
pub struct Product<'a> {
    pub w: &'a MatrixView,
    /// `[n, cols]`.
    pub x: &'a [f32],
    pub n: usize,
    /// `[n, rows]`.
    pub y: &'a mut [f32],
}

/// Every product of `ps` with the fastest kernel of this CPU, in one
/// parallel loop: the rows of all the matrices are split into tasks
/// together, so that a set of small matrices (a layer's projections, the
/// experts of a token) keeps every thread busy for the price of one
/// dispatch. Each output row is computed by one task, so the result does
/// not depend on the split.
pub fn linear_set(ps: &mut [Product]) -> Result<()> {
    linear_set_with(Kernel::detect(), ps)
}

/// [`linear_set`] with the given kernel.
pub fn linear_set_with(kernel: Kernel, ps: &mut [Product]) -> Result<()> {
    if !kernel.available() {
        return Err(Error::Invalid(format!(
            "the {kernel:?} kernel does not run on this CPU"
        )));
    }
    let mut mats = Vec::with_capacity(ps.len());
    for p in ps.iter() {
        let (rows, cols, n) = (p.w.rows, p.w.cols, p.n);
        if p.x.len() < n * cols || p.y.len() < n * rows {
            return Err(Error::Invalid(format!(
                "linear [{rows}, {cols}] over {n} tokens: x has {} elements (need {}), y has {} (need {})",
                p.x.len(),
                n * cols,
                p.y.len(),
                n * rows
            )));
        }
        mats.push(Mat::new(p.w)?);
    }
    // The kernel of each product, and the activations, prepared once per
    // distinct input and kernel.
    let kernels: Vec<Kernel> = ps.iter().zip(&mats).map(|(p, m)| kernel.for_product(m, p.n)).collect();
    // (the experts of a MoE layer have one input each: prepared in
    // parallel).
    let mut keys: Vec<(ActsKey, usize)> = Vec::new();
    let mut act_of = Vec::with_capacity(ps.len());
    for (j, ((p, mat), &k)) in ps.iter().zip(&mats).zip(&kernels).enumerate() {
        let key = ActsKey::new(k, mat, p.x, p.n, p.w.cols);
        let i = match keys.iter().position(|(key2, _)| *key2 == key) {
            Some(i) => i,
            None => {
                keys.push((key, j));
                keys.len() - 1
            }
        };
        act_of.push(i);
    }
    let mut acts: Vec<Option<Prepared>> = keys.iter().map(|_| None).collect();
    crate::parallel::for_each_chunk(&mut acts, 1, |i, a| {
        let j = keys[i].1;
        let p = &ps[j];
        a[0] = Some(prepare(kernels[j], &mats[j], p.x, p.n, p.w.cols));
    });
    let acts: Vec<Prepared> = acts.into_iter().flatten().collect();
    // Tasks: at least TASK_BYTES of weights each, about eight per thread
    // over the whole set.
    let cost = |p: &Product, m: &Mat| p.w.rows * m.row_bytes() * p.n.div_ceil(4);
    let total: usize = ps.iter().zip(&mats).map(|(p, m)| cost(p, m)).sum();
    let task_bytes = (total / (8 * rayon::current_num_threads())).max(TASK_BYTES);
    // Several tokens go through [rows, n] and a transpose, except on the
    // tile unit, which writes y's rows itself.
    let direct = |i: usize| ps[i].n == 1 || kernels[i] == Kernel::Amx;
    let mut scratch: Vec<Vec<f32>> = (0..ps.len())
        .map(|i| crate::parallel::zeros(if direct(i) { 0 } else { ps[i].w.rows * ps[i].n }))
        .collect();
    let mut tasks: Vec<Task> = Vec::new();
    for (i, (p, s)) in ps.iter_mut().zip(scratch.iter_mut()).enumerate() {
        let (rows, cols, n) = (p.w.rows, p.w.cols, p.n);
        if n == 0 || rows == 0 {
            continue;
        }
        if cols == 0 {
            p.y[..n * rows].fill(0.0);
            continue;
        }
        let row_cost = mats[i].row_bytes() * n.div_ceil(4);
        let mut block = (task_bytes / row_cost.max(1)).clamp(1, rows);
        if acts[act_of[i]].repacks() {
            block = block.min((REPACK_TASK_BYTES / mats[i].row_bytes().max(1)).max(1));
        }
        if kernels[i] == Kernel::Amx {
            // Whole pairs of 16-row tiles (the kernel's unit), and at
            // least two of them: within a task the next pair's rows are
            // read ahead while a pair is multiplied.
            block = block.max(AMX_TASK_ROWS).next_multiple_of(32).min(rows);
            #[cfg(target_arch = "x86_64")]
            {
                let y = super::amx::TokenRows {
                    p: p.y.as_mut_ptr(),
                    ld: rows,
                };
                tasks.extend((0..rows).step_by(block).map(|r0| Task {
                    i,
                    r0,
                    out: Out::Tokens(y, block.min(rows - r0)),
                }));
                continue;
            }
        }
        let out: &mut [f32] = if n == 1 { &mut p.y[..rows] } else { s };
        tasks.extend(out.chunks_mut(block * n).enumerate().map(|(bi, o)| Task {
            i,
            r0: bi * block,
            out: Out::Rows(o),
        }));
    }
    crate::parallel::for_each_mut(&mut tasks, |t| {
        rows_into(kernels[t.i], &mats[t.i], &acts[act_of[t.i]], t.r0, &mut t.out)
    });
    // [rows, n] → y [n, rows], the tokens in parallel (serial, this
    // took a large share of a 16-thread prefill product), for the
    // products that had a scratch (several tokens, off the tile unit).
    for (p, s) in ps.iter_mut().zip(&scratch) {
        if p.w.cols > 0 && !s.is_empty() {
            let (rows, n) = (p.w.rows, p.n);
            crate::parallel::for_each_chunk(&mut p.y[..n * rows], rows, |t, yt| {
                for (r, y) in yt.iter_mut().enumerate() {
                    *y = s[r * n + t];
                }
            });
        }
    }
    Ok(())
}

/// Rows `r0..` of product `i`, and where they go.
struct Task<'a> {
    i: usize,
    r0: usize,
    out: Out<'a>,
}

/// A task's output: `[rows, n]` (y itself for one token), or (on the tile
/// unit) this many rows of y `[n, rows]` in place.
enum Out<'a> {
    Rows(&'a mut [f32]),
    #[cfg(target_arch = "x86_64")]
    Tokens(super::amx::TokenRows, usize),
}

/// What makes two products' prepared activations the same.
#[derive(PartialEq, Eq)]
struct ActsKey {
    kernel: Kernel,
    x: (usize, usize),
    n: usize,
    cols: usize,
    /// Group size and bits of quantized weights.
    quant: Option<(usize, usize)>,
}

impl ActsKey {
    fn new(kernel: Kernel, mat: &Mat, x: &[f32], n: usize, cols: usize) -> ActsKey {
        ActsKey {
            kernel,
            x: (x.as_ptr() as usize, x.len()),
            n,
            cols,
            quant: match mat {
                Mat::Quant(q) => Some((q.group_size, q.bits)),
                Mat::Float(_) => None,
            },
        }
    }
}

/// The activations of a product as its kernel wants them: `Acts`, and for
/// the fast path over several tokens, x laid out for the repacked VNNI
/// kernel or as AMX tiles.
struct Prepared<'a> {
    acts: Acts<'a>,
    #[cfg(target_arch = "x86_64")]
    tiles: Tiles,
}

#[cfg(target_arch = "x86_64")]
enum Tiles {
    None,
    Vnni(super::vnni_gemm::Tiled),
    Amx(super::amx::Tiled),
}

impl Prepared<'_> {
    /// Whether the kernel repacks each task's rows (`vnni_gemm`).
    fn repacks(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if matches!(self.tiles, Tiles::Vnni(_)) {
            return true;
        }
        false
    }
}

/// The activations as `kernel` wants them for `mat`.
fn prepare<'a>(kernel: Kernel, mat: &Mat, x: &'a [f32], n: usize, cols: usize) -> Prepared<'a> {
    #[cfg(target_arch = "x86_64")]
    let mut tiles = Tiles::None;
    let acts = match mat {
        Mat::Float(_) => Acts::new(x, n, cols, None),
        Mat::Quant(q) => {
            let mut acts = Acts::new(x, n, cols, Some(q.group_size));
            match kernel {
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx512Vnni | Kernel::Amx => {
                    // The tiled kernels read x by 32-byte blocks, the
                    // one-token and small-tile one by 64-byte chunks.
                    use super::qmatvec::Order;
                    use super::vnni_gemm::{Plan, MIN_TOKENS};
                    let plan = (kernel != Kernel::Amx && n >= MIN_TOKENS)
                        .then(|| Plan::new(q))
                        .flatten();
                    let order = match (kernel, &plan) {
                        (Kernel::Amx, _) => Order::Natural,
                        (_, Some(_)) => Order::Blocks,
                        _ => Order::Words,
                    };
                    acts.xq = super::vnni::quantize_x(acts.x, &acts.xsum, cols, q.group_size, q.bits, order);
                    if kernel == Kernel::Amx {
                        tiles = Tiles::Amx(super::amx::tile_x(q, &acts.xq, &acts.xsum, n));
                    } else if let Some(plan) = plan {
                        tiles = Tiles::Vnni(super::vnni_gemm::tile_x(plan, &acts.xq, &acts.xsum, n));
                    }
                }
                _ => acts.xp = permuted(kernel, q, acts.x),
            }
            acts
        }
    };
    Prepared {
        acts,
        #[cfg(target_arch = "x86_64")]
        tiles,
    }
}

/// x in the column order in which `kernel` unpacks `q` (empty when the
/// kernel reads x as it is).
fn permuted(kernel: Kernel, q: &qmatvec::QuantMat, x: &[f32]) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    match kernel {
        Kernel::Avx512 => return super::simd512::permute_x(x, q.bits),
        Kernel::Avx2 if super::simd::quant_supported(q) => return super::simd::permute_x(x, q.bits),
        _ => {}
    }
    let _ = (kernel, q, x);
    Vec::new()
}

/// Rows `r0..` into `out` with `kernel`, as chosen by
/// `Kernel::for_product`: `[rows, n]` (`Out::Rows`, `out.len()/n` rows),
/// or in place in y (`Out::Tokens`, the tile unit's products).
fn rows_into(kernel: Kernel, mat: &Mat, p: &Prepared, r0: usize, out: &mut Out) {
    let a = &p.acts;
    let out: &mut [f32] = match out {
        Out::Rows(o) => o,
        #[cfg(target_arch = "x86_64")]
        Out::Tokens(y, rows) => {
            match (mat, &p.tiles) {
                // SAFETY: `for_product` chose the tile unit for a layout
                // it takes, `prepare` laid x out as its tiles, and this
                // task's rows of y are its alone.
                (Mat::Quant(q), Tiles::Amx(xa)) => unsafe { super::amx::quant_rows(q, xa, r0, *rows, *y) },
                // Tasks write y in place only for the tile unit's products.
                _ => unreachable!("an in-place output for a product off the tile unit"),
            }
            return;
        }
    };
    match (kernel, mat) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as below; `for_product` chose this kernel for a layout
        // it takes, and `prepare` quantized x for it (and laid it out as
        // the tiles it made).
        (Kernel::Amx | Kernel::Avx512Vnni, Mat::Quant(q)) => unsafe {
            match &p.tiles {
                Tiles::Vnni(xt) => super::vnni_gemm::quant_rows(q, xt, a.n, r0, out),
                Tiles::None => super::vnni::quant_rows(q, a, r0, out),
                // The tile unit writes y in place (`Out::Tokens`).
                Tiles::Amx(_) => unreachable!("tile products have no [rows, n] output"),
            }
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `linear_set_with` checked that the CPU has the features,
        // `Mat::new` checked every byte size, `for_product` checked the
        // layout and the token count, and `a` was prepared for `mat`.
        (Kernel::Avx512, Mat::Quant(q)) => unsafe { super::simd512::quant_rows(q, a, r0, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (Kernel::Avx2, Mat::Quant(q)) if super::simd::quant_supported(q) => unsafe {
            super::simd::quant_rows(q, a, r0, out)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (Kernel::Avx2, Mat::Float(f)) => unsafe { super::simd::float_rows(f, a, r0, out) },
        (_, Mat::Quant(q)) => qmatvec::quant_rows(q, a, r0, out),
        (_, Mat::Float(f)) => qmatvec::float_rows(f, a, r0, out),
    }
}

/// `y[t] = row tokens[t] of the table` (quantized rows dequantized).
pub fn embed(table: &MatrixView, tokens: &[u32], y: &mut [f32]) -> Result<()> {
    let cols = table.cols;
    if y.len() < tokens.len() * cols {
        return Err(Error::Invalid(format!(
            "embed of {} tokens into {} elements (need {})",
            tokens.len(),
            y.len(),
            tokens.len() * cols
        )));
    }
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.rows) {
        return Err(Error::TokenOutOfRange {
            token: t,
            vocab: table.rows,
        });
    }
    let mat = Mat::new(table)?;
    y[..tokens.len() * cols]
        .par_chunks_mut(cols.max(1))
        .zip(tokens.par_iter())
        .for_each(|(o, &t)| mat.decode_row(t as usize, o));
    Ok(())
}
