//! File formats: checkpoints we read (safetensors, GGUF), the packed model
//! directory we write and run from, MLX affine quantization, and the
//! converter.

pub mod checksums;
pub mod convert;
pub mod gguf;
pub mod outdir;
pub mod packed;
pub mod quant;
pub mod safetensors;
pub mod watch;

use crate::error::{Error, Result};
use half::{bf16, f16};
use std::sync::Arc;

/// Element types that appear in packed models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// Packed quantized words (see `quant`).
    U32,
    Bf16,
    F16,
    F32,
}

impl Dtype {
    pub fn parse(s: &str, tensor: &str) -> Result<Dtype> {
        Ok(match s {
            "U32" => Dtype::U32,
            "BF16" => Dtype::Bf16,
            "F16" => Dtype::F16,
            "F32" => Dtype::F32,
            other => {
                return Err(Error::Dtype {
                    name: tensor.to_string(),
                    dtype: other.to_string(),
                })
            }
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U32 => "U32",
            Dtype::Bf16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
        }
    }
    pub fn size(self) -> usize {
        match self {
            Dtype::U32 | Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }
    /// Decode little-endian float bytes of this dtype.
    pub fn to_f32(self, b: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; b.len() / self.size()];
        self.decode_into(b, &mut out);
        out
    }

    /// Decode little-endian float bytes of this dtype into `out`.
    pub fn decode_into(self, b: &[u8], out: &mut [f32]) {
        match self {
            Dtype::Bf16 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            Dtype::F16 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            Dtype::F32 | Dtype::U32 => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
    }
}

/// Bytes owned with 8-byte alignment (expert blobs read from disk), so
/// that packed words can be viewed as `u32` in place.
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    pub fn zeroed(len: usize) -> AlignedBytes {
        AlignedBytes {
            words: vec![0u64; len.div_ceil(8)],
            len,
        }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

impl AsRef<[u8]> for AlignedBytes {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

/// A shared, cheaply clonable byte range of a mapped file or an owned
/// buffer.
#[derive(Clone)]
pub struct Region {
    src: Arc<dyn AsRef<[u8]> + Send + Sync>,
    off: usize,
    len: usize,
}

impl Region {
    pub fn new(src: Arc<dyn AsRef<[u8]> + Send + Sync>, off: usize, len: usize) -> Region {
        assert!(off + len <= (*src).as_ref().len(), "region past the end of its source");
        Region { src, off, len }
    }
    pub fn whole(src: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Region {
        let len = (*src).as_ref().len();
        Region { src, off: 0, len }
    }
    pub fn bytes(&self) -> &[u8] {
        &(*self.src).as_ref()[self.off..self.off + self.len]
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// A sub-range, relative to this one; `None` when it does not fit.
    pub fn try_sub(&self, off: usize, len: usize) -> Option<Region> {
        (off.checked_add(len)? <= self.len).then(|| self.sub(off, len))
    }
    /// A sub-range, relative to this one.
    pub fn sub(&self, off: usize, len: usize) -> Region {
        assert!(off + len <= self.len, "sub-region past the end");
        Region {
            src: self.src.clone(),
            off: self.off + off,
            len,
        }
    }
    /// The bytes as `u32` words; copies only when the range is unaligned.
    pub fn words(&self) -> std::borrow::Cow<'_, [u32]> {
        let b = self.bytes();
        match bytemuck::try_cast_slice(b) {
            Ok(w) => std::borrow::Cow::Borrowed(w),
            Err(_) => std::borrow::Cow::Owned(
                b.chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
        }
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Region({}..{})", self.off, self.off + self.len)
    }
}

/// The storage of a weight matrix.
#[derive(Debug, Clone)]
pub enum MatrixData {
    /// MLX affine: `weight` `[rows, cols·bits/32]` u32, `scales`/`biases`
    /// `[rows, cols/group_size]` of `scale_dtype` (BF16 or F16).
    Quant {
        bits: u32,
        group_size: usize,
        weight: Region,
        scales: Region,
        biases: Region,
        scale_dtype: Dtype,
    },
    /// Plain `[rows, cols]` row-major floats.
    Float { dtype: Dtype, data: Region },
}

/// A weight matrix of logical shape `[rows, cols]` (PyTorch `Linear`
/// layout: `y = W·x`, one row per output).
#[derive(Debug, Clone)]
pub struct MatrixView {
    pub rows: usize,
    pub cols: usize,
    pub data: MatrixData,
}

impl MatrixView {
    /// Bytes of weight data (weights + scales + biases).
    pub fn nbytes(&self) -> usize {
        match &self.data {
            MatrixData::Quant {
                weight, scales, biases, ..
            } => weight.len() + scales.len() + biases.len(),
            MatrixData::Float { data, .. } => data.len(),
        }
    }

    /// Row `r` dequantized to f32 (reference path and embeddings).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.cols);
        match &self.data {
            MatrixData::Quant {
                bits,
                group_size,
                weight,
                scales,
                biases,
                scale_dtype,
            } => {
                let wpr = self.cols * *bits as usize / 32;
                let gpr = self.cols / group_size;
                let es = scale_dtype.size();
                let words = weight.sub(r * wpr * 4, wpr * 4);
                let s = scale_dtype.to_f32(&scales.bytes()[r * gpr * es..(r + 1) * gpr * es]);
                let b = scale_dtype.to_f32(&biases.bytes()[r * gpr * es..(r + 1) * gpr * es]);
                quant::dequantize_row(&words.words(), &s, &b, *bits, *group_size, out);
            }
            MatrixData::Float { dtype, data } => {
                let es = dtype.size();
                let row = dtype.to_f32(&data.bytes()[r * self.cols * es..(r + 1) * self.cols * es]);
                out.copy_from_slice(&row);
            }
        }
    }

    /// The whole matrix as f32 `[rows, cols]` (tests and small matrices).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.row_f32(r, row);
        }
        out
    }
}
