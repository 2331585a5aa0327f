//! The weight formats the kernels know and the matrix arguments they take
//! (`Mat`, `MatSet` in kernels/common.cuh and kernels/matvec.cu): shared by
//! the resident matrices (`matrix.rs`), the tensor-core products
//! (`tensor.rs`) and the experts (`moe.rs`).

use crate::error::{Error, Result};
use crate::format::Dtype;

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
    if !gs.is_power_of_two() || gs < 8 || !cols.is_multiple_of(gs) || !(gs * bits as usize).is_multiple_of(32) {
        return Err(Error::Invalid(format!(
            "group size {gs} with {bits}-bit weights over {cols} columns: the CUDA kernels need a power of two ≥ 8 that divides the columns into whole words"
        )));
    }
    Ok(gs.trailing_zeros() as i32)
}

/// The `Mat` kernel argument (kernels/common.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MatArg {
    pub w: u64,
    pub s: u64,
    pub b: u64,
    pub rows: i32,
    pub cols: i32,
    pub fmt: i32,
    pub gs_shift: i32,
    pub vec: i32,
    /// `matvec_q`: warps sharing each row group's columns (set per launch).
    pub split: i32,
}

/// Most matrices in one `matvec_q` launch (`MQ_SET` in kernels/matvec.cu).
pub(crate) const MQ_SET: usize = 4;

/// The `MatSet` argument of `matvec_q` (kernels/matvec.cu): matrix i with
/// output `y[i]` takes the blocks `[first[i], first[i + 1])`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatSet {
    pub m: [MatArg; MQ_SET],
    pub y: [u64; MQ_SET],
    pub first: [i32; MQ_SET + 1],
    pub count: i32,
}

// The kernel's struct: 4 × 48 + 4 × 8 + 5 × 4 + 4 bytes.
const _: () = assert!(std::mem::size_of::<MatSet>() == 248);

impl MatSet {
    /// The set of `parts` (matrix, output address, blocks it takes), in
    /// launch order, and the blocks of all; `what` names the kernel in
    /// the error for more than `MQ_SET` parts.
    pub fn new(what: &str, parts: &[(MatArg, u64, usize)]) -> Result<(MatSet, usize)> {
        if parts.len() > MQ_SET {
            return Err(Error::Invalid(format!(
                "{} matrices in one {what} launch (at most {MQ_SET})",
                parts.len()
            )));
        }
        let mut set = MatSet {
            m: [MatArg::default(); MQ_SET],
            y: [0; MQ_SET],
            first: [0; MQ_SET + 1],
            count: parts.len() as i32,
        };
        let mut blocks = 0usize;
        for (i, &(m, y, b)) in parts.iter().enumerate() {
            set.m[i] = m;
            set.y[i] = y;
            set.first[i] = blocks as i32;
            blocks += b;
        }
        for f in &mut set.first[parts.len()..] {
            *f = blocks as i32;
        }
        Ok((set, blocks))
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
