//! The pieces of `linear` shared by its kernels: borrowed, size-checked
//! views of a weight matrix, the activations prepared once per call, and
//! the portable scalar kernels (the reference the SIMD kernels are tested
//! against, and the path on CPUs without AVX2).
//!
//! Quantized rows use the per-group identity
//! `Σ_i (q_i·s + b)·x_i = s·Σ_i q_i·x_i + b·Σ_i x_i`, so a group costs one
//! multiply-add per weight plus two per group; the group sums of x are
//! computed once per call.

use super::vector::dot;
use crate::error::{Error, Result};
use crate::format::{Dtype, MatrixData, MatrixView};

/// bf16 bits to f32: the high half of an f32.
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// A quantized matrix's bytes, checked against its shape.
pub(crate) struct QuantMat<'a> {
    pub bits: usize,
    pub group_size: usize,
    pub cols: usize,
    /// `[rows, cols·bits/8]` packed little-endian words, lowest bits first.
    pub weight: &'a [u8],
    /// `[rows, cols/group_size]` bf16 (or f16 when `f16_scales`).
    pub scales: &'a [u8],
    /// `[rows, cols/group_size]`, same dtype as `scales`.
    pub biases: &'a [u8],
    pub f16_scales: bool,
}

impl QuantMat<'_> {
    pub fn groups(&self) -> usize {
        self.cols / self.group_size
    }
    pub fn row_bytes(&self) -> usize {
        self.cols * self.bits / 8
    }
    #[inline(always)]
    fn half(&self, bytes: &[u8], i: usize) -> f32 {
        let h = u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]);
        if self.f16_scales {
            half::f16::from_bits(h).to_f32()
        } else {
            bf16_bits_to_f32(h)
        }
    }
    /// Scale of group `g` of row `r`.
    #[inline(always)]
    pub fn scale(&self, r: usize, g: usize) -> f32 {
        self.half(self.scales, r * self.groups() + g)
    }
    /// Bias of group `g` of row `r`.
    #[inline(always)]
    pub fn bias(&self, r: usize, g: usize) -> f32 {
        self.half(self.biases, r * self.groups() + g)
    }
    /// The integer levels of group `g` of row `r`, as f32, into `q[..group_size]`.
    fn levels(&self, r: usize, g: usize, q: &mut [f32]) {
        let per_byte = 8 / self.bits;
        let mask = ((1u32 << self.bits) - 1) as u8;
        let gb = self.group_size * self.bits / 8;
        let bytes = &self.weight[r * self.row_bytes() + g * gb..][..gb];
        for (qs, &byte) in q.chunks_exact_mut(per_byte).zip(bytes) {
            for (k, v) in qs.iter_mut().enumerate() {
                *v = ((byte >> (self.bits * k)) & mask) as f32;
            }
        }
    }
}

/// A float matrix's bytes, checked against its shape.
pub(crate) struct FloatMat<'a> {
    pub dtype: Dtype,
    pub cols: usize,
    /// `[rows, cols]` little-endian f32, bf16 or f16.
    pub data: &'a [u8],
}

impl FloatMat<'_> {
    pub fn row_bytes(&self) -> usize {
        self.cols * self.dtype.size()
    }
    /// Row `r` as f32.
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        self.dtype
            .decode_into(&self.data[r * self.row_bytes()..][..self.row_bytes()], out);
    }
}

/// A weight matrix, borrowed and checked.
pub(crate) enum Mat<'a> {
    Quant(QuantMat<'a>),
    Float(FloatMat<'a>),
}

impl<'a> Mat<'a> {
    /// Borrow `w`'s bytes, checking every region's size against the shape
    /// (the kernels read without bounds checks).
    pub fn new(w: &'a MatrixView) -> Result<Mat<'a>> {
        let (rows, cols) = (w.rows, w.cols);
        let bad = |what: String| Error::Invalid(format!("matrix [{rows}, {cols}]: {what}"));
        match &w.data {
            MatrixData::Quant {
                bits,
                group_size,
                weight,
                scales,
                biases,
                scale_dtype,
            } => {
                let (bits, gs) = (*bits as usize, *group_size);
                if !matches!(bits, 2 | 4 | 8) {
                    return Err(bad(format!("{bits}-bit weights are not supported (2, 4 or 8)")));
                }
                if gs == 0 || cols % gs != 0 || (gs * bits) % 32 != 0 {
                    return Err(bad(format!(
                        "group size {gs} does not divide the columns into whole words"
                    )));
                }
                if !matches!(scale_dtype, Dtype::Bf16 | Dtype::F16) {
                    return Err(bad(format!(
                        "scales of dtype {} (BF16 or F16 expected)",
                        scale_dtype.name()
                    )));
                }
                let wbytes = rows * cols * bits / 8;
                let sbytes = rows * (cols / gs) * 2;
                for (name, len, want) in [
                    ("weight", weight.len(), wbytes),
                    ("scales", scales.len(), sbytes),
                    ("biases", biases.len(), sbytes),
                ] {
                    if len != want {
                        return Err(bad(format!("{name} has {len} bytes, the shape needs {want}")));
                    }
                }
                Ok(Mat::Quant(QuantMat {
                    bits,
                    group_size: gs,
                    cols,
                    weight: weight.bytes(),
                    scales: scales.bytes(),
                    biases: biases.bytes(),
                    f16_scales: *scale_dtype == Dtype::F16,
                }))
            }
            MatrixData::Float { dtype, data } => {
                if *dtype == Dtype::U32 {
                    return Err(bad("U32 data without quantization parameters".into()));
                }
                let want = rows * cols * dtype.size();
                if data.len() != want {
                    return Err(bad(format!("data has {} bytes, the shape needs {want}", data.len())));
                }
                Ok(Mat::Float(FloatMat {
                    dtype: *dtype,
                    cols,
                    data: data.bytes(),
                }))
            }
        }
    }

    /// Bytes of one row (weights, scales and biases).
    pub fn row_bytes(&self) -> usize {
        match self {
            Mat::Quant(q) => q.row_bytes() + 4 * q.groups(),
            Mat::Float(f) => f.row_bytes(),
        }
    }

    /// Row `r` as f32 (embeddings): `w = q·scale + bias` for quantized rows.
    pub fn decode_row(&self, r: usize, out: &mut [f32]) {
        match self {
            Mat::Quant(q) => {
                for (g, o) in out.chunks_exact_mut(q.group_size).enumerate() {
                    q.levels(r, g, o);
                    let (s, b) = (q.scale(r, g), q.bias(r, g));
                    for v in o.iter_mut() {
                        *v = *v * s + b;
                    }
                }
            }
            Mat::Float(f) => f.decode_row(r, out),
        }
    }
}

/// The activations of one call: x `[n, cols]`, the per-group sums of x
/// (quantized weights), and x with its columns in the order a SIMD kernel
/// unpacks them (when it asks for one).
pub(crate) struct Acts<'a> {
    pub n: usize,
    pub cols: usize,
    /// `[n, cols]`.
    pub x: &'a [f32],
    /// `[n, cols / group_size]`; empty for float weights.
    pub xsum: Vec<f32>,
    /// `[n, cols]` permuted, or empty.
    pub xp: Vec<f32>,
    /// x rounded to integers per group (the fast path), or empty.
    pub xq: QuantX,
}

impl<'a> Acts<'a> {
    pub fn new(x: &'a [f32], n: usize, cols: usize, group_size: Option<usize>) -> Acts<'a> {
        let x = &x[..n * cols];
        // Several tokens (prefill) in parallel: serial, this is a large
        // share of a 16-thread product.
        let xsum = match group_size {
            Some(gs) if n > 1 => {
                let mut sums = vec![0.0f32; x.len() / gs];
                crate::parallel::for_each_chunk(&mut sums, 64, |i, c| {
                    for (j, o) in c.iter_mut().enumerate() {
                        *o = group_sum(&x[(64 * i + j) * gs..][..gs]);
                    }
                });
                sums
            }
            Some(gs) => x.chunks_exact(gs).map(group_sum).collect(),
            None => Vec::new(),
        };
        Acts {
            n,
            cols,
            x,
            xsum,
            xp: Vec::new(),
            xq: QuantX::default(),
        }
    }

    /// Token `t` of x.
    pub fn token(&self, t: usize) -> &[f32] {
        &self.x[t * self.cols..(t + 1) * self.cols]
    }
}

/// The activations quantized per group: `x[t, c] ≈ scale[t, c / gs] · q[t, c']`,
/// each level at the slot `c'` where the kernel that reads it unpacks
/// column `c` of the weights (`Order`).
#[derive(Default)]
pub(crate) struct QuantX {
    /// `[n, cols]`, in `order`.
    pub q: Vec<i16>,
    /// `[n, cols / gs]`.
    pub scale: Vec<f32>,
    /// `[n, cols / gs]`: what the rounding lost, `Σ x − scale·Σ q` per group.
    pub resid: Vec<f32>,
    pub order: Order,
}

/// Where a token's levels lie in `QuantX::q`, for `bits`-bit weights with
/// `P = 8 / bits` levels per byte.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) enum Order {
    /// By 32-byte blocks of weights (`32·P` columns): column `P·i + k` of a
    /// block at `32·k + i` (byte `i` widened to 16 bits, level `k` taken
    /// out by a shift). The tiled kernels (`vnni_gemm`, `amx`) read this.
    #[default]
    Blocks,
    /// By 64-byte chunks of weights read as 32 words of 16 bits (`32·2P`
    /// columns): column `2P·i + k` at `W·k + i`, where `W` is the chunk's
    /// words (32, fewer in a shorter last chunk). The one-token and small
    /// tile kernel (`vnni`) reads this: a chunk's level `k` is one shift and
    /// one mask of the words, with no widening.
    Words,
    /// Columns as they are, the order in which the AMX kernel unpacks its
    /// weights (`amx::tile_x`).
    Natural,
}

impl Order {
    /// Every token of `q` (`[n, cols]`, columns in natural order) put in
    /// this order for `bits`-bit weights.
    pub(crate) fn arrange(self, q: &mut [i16], cols: usize, bits: usize) {
        let per = 8 / bits; // levels per byte
        let (span, unit) = match self {
            Order::Blocks => (32 * per, per),
            Order::Words => (64 * per, 2 * per),
            Order::Natural => return,
        };
        if unit == 1 {
            return;
        }
        let mut tmp = [0i16; 256]; // span: at most 64 · 4 (2-bit words)
        for row in q.chunks_exact_mut(cols) {
            for c in row.chunks_mut(span) {
                let w = c.len() / unit; // bytes or words of this block
                tmp[..c.len()].copy_from_slice(c);
                for i in 0..w {
                    for k in 0..unit {
                        c[w * k + i] = tmp[unit * i + k];
                    }
                }
            }
        }
    }
}

/// `x` `[n, cols]` quantized for `bits`-bit weights in groups of `gs`
/// (`gs` a multiple of `256 / bits`), rounding half away from zero, in
/// `order`; the portable form of `vnni::quantize_x` (which rounds half to
/// even), for the layouts it leaves to this one.
pub(crate) fn quantize_x(x: &[f32], cols: usize, gs: usize, bits: usize, order: Order) -> QuantX {
    let mut q = vec![0i16; x.len()];
    let mut scale = Vec::with_capacity(x.len() / gs);
    let mut resid = Vec::with_capacity(x.len() / gs);
    for (xg, qg) in x.chunks_exact(gs).zip(q.chunks_exact_mut(gs)) {
        let amax = xg.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let s = amax / 32767.0;
        scale.push(s);
        if amax == 0.0 || !amax.is_finite() {
            // Zeros stay zero; a non-finite group gives a non-finite scale,
            // so the output is non-finite as the exact product's would be.
            resid.push(0.0);
            continue;
        }
        let inv = 32767.0 / amax;
        for (v, q) in xg.iter().zip(qg.iter_mut()) {
            let v = v * inv;
            *q = (v + 0.5f32.copysign(v)) as i16;
        }
        let sx: f64 = xg.iter().map(|&v| v as f64).sum();
        let sq: i64 = qg.iter().map(|&v| v as i64).sum();
        resid.push((sx - s as f64 * sq as f64) as f32);
    }
    order.arrange(&mut q, cols, bits);
    QuantX { q, scale, resid, order }
}

/// `Σ g` accumulated in f64 over eight lanes (independent additions the
/// compiler vectorizes, instead of one chain of dependent ones).
fn group_sum(g: &[f32]) -> f32 {
    let mut acc = [0.0f64; 8];
    let mut chunks = g.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v as f64;
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| v as f64).sum();
    (acc.iter().sum::<f64>() + tail) as f32
}

/// Scalar kernel, quantized: rows `r0..r0 + out.len()/n` into `out`
/// `[rows, n]`. Each group is unpacked once and applied to all tokens.
pub(crate) fn quant_rows(m: &QuantMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let (n, gs, groups) = (a.n, m.group_size, m.groups());
    let mut q = vec![0.0f32; gs];
    for (i, o) in out.chunks_exact_mut(n).enumerate() {
        let r = r0 + i;
        o.fill(0.0);
        for g in 0..groups {
            m.levels(r, g, &mut q);
            let (s, b) = (m.scale(r, g), m.bias(r, g));
            for (t, ot) in o.iter_mut().enumerate() {
                let xg = &a.token(t)[g * gs..(g + 1) * gs];
                *ot += s * dot(&q, xg) + b * a.xsum[t * groups + g];
            }
        }
    }
}

/// Scalar kernel, float: rows `r0..r0 + out.len()/n` into `out` `[rows, n]`.
pub(crate) fn float_rows(m: &FloatMat, a: &Acts, r0: usize, out: &mut [f32]) {
    let mut row = vec![0.0f32; m.cols];
    for (i, o) in out.chunks_exact_mut(a.n).enumerate() {
        m.decode_row(r0 + i, &mut row);
        for (t, ot) in o.iter_mut().enumerate() {
            *ot = dot(&row, a.token(t));
        }
    }
}
