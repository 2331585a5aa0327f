//! ggml's block formats: dequantization of rows to f32 (the plain scalar
//! reference, equal bit for bit to gguf-py's `dequantize`) and the dot
//! product of a row with f32 activations, read straight from the blocks
//! (one block's values at a time on the stack, never a row).
//!
//! A format is picked once per tensor ([`BlockFormat::new`]); its row
//! functions then take whole rows: `row.len()` bytes holding
//! `row.len() / bytes · elems` values.

mod kquants;
mod legacy;
mod nonlinear;

use super::types::GgmlType;
use half::{bf16, f16};

/// One block format's layout and kernels.
trait Block {
    /// Values per block.
    const ELEMS: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// `b.len() == BYTES`, `out.len() == ELEMS`.
    fn dequant(b: &[u8], out: &mut [f32]);
    /// `b.len() == BYTES`, `x.len() == ELEMS`.
    fn dot(b: &[u8], x: &[f32]) -> f32;
}

fn dequant_row<B: Block>(row: &[u8], out: &mut [f32]) {
    for (b, o) in row.chunks_exact(B::BYTES).zip(out.chunks_exact_mut(B::ELEMS)) {
        B::dequant(b, o);
    }
}

fn dot_row<B: Block>(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for (b, x) in row.chunks_exact(B::BYTES).zip(x.chunks_exact(B::ELEMS)) {
        s += B::dot(b, x);
    }
    s
}

/// A little-endian f16 at byte `i`, widened.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `Σ q·x` over equal-length slices (a multiple of 8), in 8 lanes so that
/// the compiler vectorizes it.
#[inline(always)]
pub(crate) fn dot_lanes(q: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (qc, xc) in q.chunks_exact(8).zip(x.chunks_exact(8)) {
        for j in 0..8 {
            acc[j] += qc[j] * xc[j];
        }
    }
    acc.iter().sum()
}

/// `Σ x` in 8 lanes (length a multiple of 8).
#[inline(always)]
pub(crate) fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for xc in x.chunks_exact(8) {
        for j in 0..8 {
            acc[j] += xc[j];
        }
    }
    acc.iter().sum()
}

/// Plain floats as one-element blocks.
macro_rules! float_block {
    ($name:ident, $bytes:expr, $conv:expr) => {
        struct $name;
        impl Block for $name {
            const ELEMS: usize = 8;
            const BYTES: usize = 8 * $bytes;
            fn dequant(b: &[u8], out: &mut [f32]) {
                for (o, c) in out.iter_mut().zip(b.chunks_exact($bytes)) {
                    *o = $conv(c);
                }
            }
            fn dot(b: &[u8], x: &[f32]) -> f32 {
                let mut v = [0.0f32; 8];
                Self::dequant(b, &mut v);
                dot_lanes(&v, x)
            }
        }
    };
}
float_block!(F32Block, 4, |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
float_block!(F16Block, 2, |c: &[u8]| f16::from_le_bytes([c[0], c[1]]).to_f32());
float_block!(Bf16Block, 2, |c: &[u8]| bf16::from_le_bytes([c[0], c[1]]).to_f32());

/// A supported block format: its sizes and row kernels.
#[derive(Clone, Copy)]
pub struct BlockFormat {
    pub ty: GgmlType,
    /// Values per block (1 for the float types).
    pub elems: usize,
    /// Bytes per block.
    pub bytes: usize,
    dequant: fn(&[u8], &mut [f32]),
    dot: fn(&[u8], &[f32]) -> f32,
}

impl std::fmt::Debug for BlockFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockFormat({})", self.ty)
    }
}

fn format_of<B: Block>(ty: GgmlType, elems: usize, bytes: usize) -> BlockFormat {
    BlockFormat {
        ty,
        elems,
        bytes,
        dequant: dequant_row::<B>,
        dot: dot_row::<B>,
    }
}

impl BlockFormat {
    /// The kernels of `ty`; `None` for a type moeflux does not compute with.
    pub fn new(ty: GgmlType) -> Option<BlockFormat> {
        use GgmlType as T;
        let (elems, bytes) = ty.block()?;
        Some(match ty {
            T::F32 => format_of::<F32Block>(ty, elems, bytes),
            T::F16 => format_of::<F16Block>(ty, elems, bytes),
            T::Bf16 => format_of::<Bf16Block>(ty, elems, bytes),
            T::Q4_0 => format_of::<legacy::Q4_0>(ty, elems, bytes),
            T::Q4_1 => format_of::<legacy::Q4_1>(ty, elems, bytes),
            T::Q5_0 => format_of::<legacy::Q5_0>(ty, elems, bytes),
            T::Q5_1 => format_of::<legacy::Q5_1>(ty, elems, bytes),
            T::Q8_0 => format_of::<legacy::Q8_0>(ty, elems, bytes),
            T::Q2K => format_of::<kquants::Q2K>(ty, elems, bytes),
            T::Q3K => format_of::<kquants::Q3K>(ty, elems, bytes),
            T::Q4K => format_of::<kquants::Q4K>(ty, elems, bytes),
            T::Q5K => format_of::<kquants::Q5K>(ty, elems, bytes),
            T::Q6K => format_of::<kquants::Q6K>(ty, elems, bytes),
            T::Iq4Nl => format_of::<nonlinear::Iq4Nl>(ty, elems, bytes),
            T::Iq4Xs => format_of::<nonlinear::Iq4Xs>(ty, elems, bytes),
            T::Mxfp4 => format_of::<nonlinear::Mxfp4>(ty, elems, bytes),
            _ => return None,
        })
    }

    /// Bytes of a row of `n` values (`n` a multiple of `elems`).
    pub fn row_bytes(&self, n: usize) -> usize {
        n / self.elems * self.bytes
    }

    /// Checks the lengths the kernels rely on: whole blocks, and `n`
    /// values for the row's bytes. The float types' kernels work on 8
    /// values at a time; their tails go value by value.
    fn check(&self, row: &[u8], n: usize) {
        assert!(
            n.is_multiple_of(self.elems) && row.len() == self.row_bytes(n),
            "{}: {} bytes do not hold {n} values",
            self.ty,
            row.len()
        );
    }

    /// Dequantize a row: `out.len()` values from `row`.
    pub fn dequantize_row(&self, row: &[u8], out: &mut [f32]) {
        self.check(row, out.len());
        let (body, tail) = self.split(row, out.len());
        (self.dequant)(&row[..body], &mut out[..tail]);
        for (i, o) in out.iter_mut().enumerate().skip(tail) {
            *o = self.float_at(row, i);
        }
    }

    /// `Σ w·x` over a row of `x.len()` values.
    pub fn dot(&self, row: &[u8], x: &[f32]) -> f32 {
        self.check(row, x.len());
        let (body, tail) = self.split(row, x.len());
        let mut s = (self.dot)(&row[..body], &x[..tail]);
        for (i, xi) in x.iter().enumerate().skip(tail) {
            s += self.float_at(row, i) * xi;
        }
        s
    }

    /// For the float types, the bytes and values the 8-wide kernel covers;
    /// the whole row otherwise.
    fn split(&self, row: &[u8], n: usize) -> (usize, usize) {
        if self.elems == 1 {
            let whole = n / 8 * 8;
            (whole * self.bytes, whole)
        } else {
            (row.len(), n)
        }
    }

    /// Value `i` of a float row.
    fn float_at(&self, row: &[u8], i: usize) -> f32 {
        let b = &row[i * self.bytes..(i + 1) * self.bytes];
        match self.ty {
            GgmlType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            GgmlType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
            _ => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        }
    }
}
