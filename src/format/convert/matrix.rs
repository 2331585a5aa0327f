//! A source weight matrix, whatever its storage (float, fp8 with block
//! scales, MLX-quantized), viewed as logical rows `[rows, cols]`; and the
//! encoding of its rows into the packed form chosen for it.

use super::{fp8, gguf};
use crate::error::{Error, Result};
use crate::format::gguf::{BlockFormat, GgmlType};
use crate::format::quant::{dequantize_row, quantize_row};
use crate::format::Dtype;
use half::{bf16, f16};
use std::ops::Range;
use std::sync::Arc;

/// How a source matrix is stored. Row `p` means physical row `p` of the
/// tensor viewed as 2-D (`[E, R, C]` stacks are `[E·R, C]`).
#[derive(Clone)]
pub enum Storage<'a> {
    /// `[n, cols]` BF16, F16 or F32.
    Float { dtype: Dtype, data: &'a [u8] },
    /// `[n, cols]` e4m3 with multipliers `[ceil(n/B0), ceil(cols/B1)]`.
    Fp8 {
        data: &'a [u8],
        scale_inv: Arc<[f32]>,
        block: [usize; 2],
    },
    /// GGUF blocks of `ty`, `[n, row_bytes(cols)]`.
    Gguf { ty: GgmlType, data: &'a [u8] },
    /// MLX affine: weight `[n, cols·bits/32]` u32, scales and biases
    /// `[n, cols/group_size]` of `scale_dtype`.
    Quant {
        bits: u32,
        group_size: usize,
        weight: &'a [u8],
        scales: &'a [u8],
        biases: &'a [u8],
        scale_dtype: Dtype,
    },
}

/// Which physical rows make up the logical rows.
#[derive(Clone)]
enum RowMap {
    /// Logical row `r` is physical row `start + r`.
    From(usize),
    /// Logical row `r` is physical row `list[r]`.
    List(Arc<[usize]>),
}

/// A logical `[rows, cols]` matrix over a source tensor.
#[derive(Clone)]
pub struct SrcMatrix<'a> {
    /// The source tensor, for messages.
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub storage: Storage<'a>,
    map: RowMap,
}

/// What a matrix becomes in the packed model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// Already MLX-quantized: rows copied as they are.
    Repack,
    /// Quantized here (MLX-exact), bf16 scales and biases.
    Quantize { bits: u32, group_size: usize },
    /// Kept as floats of this dtype.
    Float(Dtype),
}

/// The packed parts of a matrix: bytes per row of `weight` and of each of
/// `scales` / `biases` (0 for floats), their dtypes and the bits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutForm {
    pub weight_dtype: Dtype,
    pub weight_row: usize,
    pub scale_dtype: Dtype,
    pub scale_row: usize,
    /// `Some((bits, group_size))` when quantized.
    pub quant: Option<(u32, usize)>,
}

impl OutForm {
    pub fn weight_shape(&self, rows: usize) -> Vec<usize> {
        vec![rows, self.weight_row / self.weight_dtype.size()]
    }
    pub fn scale_shape(&self, rows: usize) -> Vec<usize> {
        vec![rows, self.scale_row / self.scale_dtype.size()]
    }
}

impl<'a> SrcMatrix<'a> {
    pub fn new(name: String, rows: usize, cols: usize, storage: Storage<'a>) -> SrcMatrix<'a> {
        SrcMatrix {
            name,
            rows,
            cols,
            storage,
            map: RowMap::From(0),
        }
    }

    fn phys(&self, r: usize) -> usize {
        match &self.map {
            RowMap::From(s) => s + r,
            RowMap::List(l) => l[r],
        }
    }

    /// Logical rows `[start, start + n)` as a matrix of their own.
    pub fn slice(&self, start: usize, n: usize) -> SrcMatrix<'a> {
        let map = match &self.map {
            RowMap::From(s) => RowMap::From(s + start),
            RowMap::List(l) => RowMap::List(l[start..start + n].into()),
        };
        SrcMatrix {
            name: self.name.clone(),
            rows: n,
            cols: self.cols,
            storage: self.storage.clone(),
            map,
        }
    }

    /// The logical rows `rows`, in that order, as a matrix of their own.
    pub fn select(&self, rows: &[usize]) -> SrcMatrix<'a> {
        let list: Vec<usize> = rows.iter().map(|&r| self.phys(r)).collect();
        SrcMatrix {
            name: self.name.clone(),
            rows: list.len(),
            cols: self.cols,
            storage: self.storage.clone(),
            map: RowMap::List(list.into()),
        }
    }

    /// The source bytes this matrix reads from (whole tensors).
    pub fn source_slices(&self) -> Vec<&'a [u8]> {
        match &self.storage {
            Storage::Float { data, .. } | Storage::Fp8 { data, .. } | Storage::Gguf { data, .. } => vec![data],
            Storage::Quant {
                weight, scales, biases, ..
            } => vec![weight, scales, biases],
        }
    }

    /// The source bytes of logical `rows` when they are contiguous (empty
    /// for a row selection).
    pub fn source_rows(&self, rows: Range<usize>) -> Vec<&'a [u8]> {
        let RowMap::From(s) = self.map else {
            return vec![];
        };
        let (r0, r1) = (s + rows.start, s + rows.end);
        let part = |d: &'a [u8], row_bytes: usize| &d[r0 * row_bytes..r1 * row_bytes];
        match &self.storage {
            Storage::Float { dtype, data } => vec![part(data, self.cols * dtype.size())],
            Storage::Fp8 { data, .. } => vec![part(data, self.cols)],
            Storage::Gguf { ty, data } => vec![part(data, gguf_row_bytes(*ty, self.cols))],
            Storage::Quant {
                bits,
                group_size,
                weight,
                scales,
                biases,
                scale_dtype,
            } => {
                let sr = self.cols / group_size * scale_dtype.size();
                vec![
                    part(weight, self.cols * *bits as usize / 8),
                    part(scales, sr),
                    part(biases, sr),
                ]
            }
        }
    }

    /// `(bits, group_size, scale dtype)` of an MLX-quantized source, or of
    /// a GGUF one whose blocks the affine form holds exactly.
    pub fn quant_params(&self) -> Option<(u32, usize, Dtype)> {
        match &self.storage {
            Storage::Gguf { ty, .. } => gguf::affine(*ty).map(|(b, g)| (b, g, Dtype::F16)),
            Storage::Quant {
                bits,
                group_size,
                scale_dtype,
                ..
            } => Some((*bits, *group_size, *scale_dtype)),
            _ => None,
        }
    }

    /// The float dtype the matrix keeps when it is not quantized (fp8
    /// becomes bf16).
    pub fn float_dtype(&self) -> Dtype {
        match &self.storage {
            Storage::Float { dtype, .. } => *dtype,
            Storage::Fp8 { .. } | Storage::Quant { .. } | Storage::Gguf { .. } => Dtype::Bf16,
        }
    }

    /// Source bytes of one row (for progress).
    pub fn src_row_bytes(&self) -> usize {
        match &self.storage {
            Storage::Float { dtype, .. } => self.cols * dtype.size(),
            Storage::Fp8 { .. } => self.cols,
            Storage::Gguf { ty, .. } => gguf_row_bytes(*ty, self.cols),
            Storage::Quant {
                bits,
                group_size,
                scale_dtype,
                ..
            } => self.cols * *bits as usize / 8 + 2 * (self.cols / group_size) * scale_dtype.size(),
        }
    }

    /// Logical row `r` as f32.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let p = self.phys(r);
        let c = self.cols;
        match &self.storage {
            Storage::Float { dtype, data } => {
                let es = dtype.size();
                dtype.decode_into(&data[p * c * es..(p + 1) * c * es], out);
            }
            Storage::Fp8 { data, scale_inv, block } => fp8::dequantize_row(data, scale_inv, *block, c, p, out),
            Storage::Gguf { ty, data } => {
                let rb = gguf_row_bytes(*ty, c);
                if let Some(f) = BlockFormat::new(*ty) {
                    f.dequantize_row(&data[p * rb..(p + 1) * rb], out);
                }
            }
            Storage::Quant {
                bits,
                group_size,
                scale_dtype,
                ..
            } => {
                let (w, s, b) = self.quant_row(r);
                let words: Vec<u32> = w
                    .chunks_exact(4)
                    .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                    .collect();
                let s = scale_dtype.to_f32(s);
                let b = scale_dtype.to_f32(b);
                dequantize_row(&words, &s, &b, *bits, *group_size, out);
            }
        }
    }

    /// Raw `(weight, scales, biases)` bytes of logical row `r` of an
    /// MLX-quantized source (empty slices otherwise).
    pub fn quant_row(&self, r: usize) -> (&'a [u8], &'a [u8], &'a [u8]) {
        let p = self.phys(r);
        match &self.storage {
            Storage::Quant {
                bits,
                group_size,
                weight,
                scales,
                biases,
                scale_dtype,
            } => {
                let wr = self.cols * *bits as usize / 8;
                let sr = self.cols / group_size * scale_dtype.size();
                (
                    &weight[p * wr..(p + 1) * wr],
                    &scales[p * sr..(p + 1) * sr],
                    &biases[p * sr..(p + 1) * sr],
                )
            }
            _ => (&[], &[], &[]),
        }
    }

    /// The packed form of this matrix under `target`.
    pub fn out_form(&self, target: Target) -> Result<OutForm> {
        let (bits, gs, sd) = match target {
            Target::Float(dt) => {
                return Ok(OutForm {
                    weight_dtype: dt,
                    weight_row: self.cols * dt.size(),
                    scale_dtype: Dtype::Bf16,
                    scale_row: 0,
                    quant: None,
                })
            }
            Target::Quantize { bits, group_size } => (bits, group_size, Dtype::Bf16),
            Target::Repack => self
                .quant_params()
                .ok_or_else(|| Error::Convert(format!("`{}` is not quantized and cannot be repacked", self.name)))?,
        };
        Ok(OutForm {
            weight_dtype: Dtype::U32,
            weight_row: self.cols * bits as usize / 8,
            scale_dtype: sd,
            scale_row: self.cols / gs * sd.size(),
            quant: Some((bits, gs)),
        })
    }

    /// Encode logical `rows` into `w`, `s`, `b` (each holding that many
    /// rows of the `form` sizes; `s`/`b` empty for floats).
    pub fn encode_rows(
        &self,
        target: Target,
        form: &OutForm,
        rows: Range<usize>,
        w: &mut [u8],
        s: &mut [u8],
        b: &mut [u8],
    ) {
        let (r0, n) = (rows.start, rows.len());
        let (wr, sr) = (form.weight_row, form.scale_row);
        let mut row = vec![0f32; self.cols];
        let (mut words, mut sc, mut bi) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let r = r0 + i;
            let wo = &mut w[i * wr..(i + 1) * wr];
            match target {
                Target::Repack => match &self.storage {
                    Storage::Gguf { ty, data } => {
                        let (p, rb) = (self.phys(r), gguf_row_bytes(*ty, self.cols));
                        let (so, bo) = (&mut s[i * sr..(i + 1) * sr], &mut b[i * sr..(i + 1) * sr]);
                        gguf::row_to_affine(*ty, &data[p * rb..(p + 1) * rb], wo, so, bo);
                    }
                    _ => {
                        let (qw, qs, qb) = self.quant_row(r);
                        wo.copy_from_slice(qw);
                        s[i * sr..(i + 1) * sr].copy_from_slice(qs);
                        b[i * sr..(i + 1) * sr].copy_from_slice(qb);
                    }
                },
                Target::Quantize { bits, group_size } => {
                    self.row_f32(r, &mut row);
                    words.clear();
                    sc.clear();
                    bi.clear();
                    quantize_row(&row, bits, group_size, &mut words, &mut sc, &mut bi);
                    for (o, x) in wo.chunks_exact_mut(4).zip(&words) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                    for (o, x) in s[i * sr..(i + 1) * sr].chunks_exact_mut(2).zip(&sc) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                    for (o, x) in b[i * sr..(i + 1) * sr].chunks_exact_mut(2).zip(&bi) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                }
                Target::Float(dt) => match &self.storage {
                    Storage::Float { dtype, data } if *dtype == dt => {
                        let p = self.phys(r);
                        wo.copy_from_slice(&data[p * wr..(p + 1) * wr]);
                    }
                    _ => {
                        self.row_f32(r, &mut row);
                        encode_floats(dt, &row, wo);
                    }
                },
            }
        }
    }
}

/// Bytes of a GGUF row of `cols` values (whole blocks, checked at load).
fn gguf_row_bytes(ty: GgmlType, cols: usize) -> usize {
    ty.row_bytes(cols).unwrap_or(0)
}

/// Encode `v` as little-endian floats of `dtype` (round to nearest even).
pub fn encode_floats(dtype: Dtype, v: &[f32], out: &mut [u8]) {
    match dtype {
        Dtype::Bf16 => {
            for (o, x) in out.chunks_exact_mut(2).zip(v) {
                o.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
            }
        }
        Dtype::F16 => {
            for (o, x) in out.chunks_exact_mut(2).zip(v) {
                o.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
        }
        Dtype::F32 | Dtype::U32 => {
            for (o, x) in out.chunks_exact_mut(4).zip(v) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}

/// `x` rounded to `dtype` and back (what storing it as `dtype` keeps).
pub fn round_to(dtype: Dtype, x: f32) -> f32 {
    match dtype {
        Dtype::Bf16 => bf16::from_f32(x).to_f32(),
        Dtype::F16 => f16::from_f32(x).to_f32(),
        Dtype::F32 | Dtype::U32 => x,
    }
}
