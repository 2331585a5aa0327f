//! What the benchmark examples share.

use moeflux::format::{Dtype, MatrixData, MatrixView, Region};
use std::sync::Arc;

/// Last-level cache size in bytes (sysfs), 32 MiB when unknown.
pub fn l3_bytes() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size").unwrap_or_default();
    let t = text.trim();
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        _ => (t, 1),
    };
    num.parse::<usize>().map(|v| v * mult).unwrap_or(32 << 20)
}

/// `len` bytes of xorshift64 output from the state `s` (nonzero).
pub fn random_bytes(len: usize, s: &mut u64) -> Region {
    let mut v = vec![0u8; len];
    for c in v.chunks_mut(8) {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        c.copy_from_slice(&s.to_le_bytes()[..c.len()]);
    }
    Region::whole(Arc::new(v))
}

/// `len` bf16 values `v`.
pub fn bf16s(len: usize, v: f32) -> Region {
    Region::whole(Arc::new(half::bf16::from_f32(v).to_le_bytes().repeat(len)))
}

/// A `[rows, cols]` matrix of random `bits`-bit levels in groups of
/// `group`, with bf16 scales and biases of normal size (random bits
/// would include denormals, which slow some CPUs' float units by 2× and
/// no real model has).
pub fn quant_matrix(rows: usize, cols: usize, bits: u32, group: usize, s: &mut u64) -> MatrixView {
    MatrixView {
        rows,
        cols,
        data: MatrixData::Quant {
            bits,
            group_size: group,
            weight: random_bytes(rows * cols * bits as usize / 8, s),
            scales: bf16s(rows * cols / group, 0.01),
            biases: bf16s(rows * cols / group, -0.07),
            scale_dtype: Dtype::Bf16,
        },
    }
}
