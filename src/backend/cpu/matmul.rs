//! Matrix products on the CPU: `y[n, rows] = x[n, cols] · Wᵀ` for MLX
//! affine 2/4/8-bit and bf16/f16/f32 weights. Rows are split across the
//! rayon pool; each row is decoded once and applied to all `n` inputs.

use crate::format::{Dtype, MatrixData, MatrixView};
use rayon::prelude::*;

/// A resident CPU matrix: a view of mapped (or owned) bytes.
#[derive(Debug, Clone)]
pub struct CpuMatrix {
    pub view: MatrixView,
}

impl CpuMatrix {
    pub fn new(view: &MatrixView) -> CpuMatrix {
        CpuMatrix { view: view.clone() }
    }
}

/// `y[n, rows] = x[n, cols] · Wᵀ`.
pub fn linear(w: &MatrixView, x: &[f32], n: usize, y: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    debug_assert!(x.len() >= n * cols && y.len() >= n * rows);
    // Work on rows in blocks so that each task decodes a contiguous range.
    const BLOCK: usize = 16;
    let mut out_t = vec![0.0f32; rows * n]; // [rows, n]
    out_t.par_chunks_mut(BLOCK * n).enumerate().for_each(|(bi, chunk)| {
        let mut row = vec![0.0f32; cols];
        for (j, o) in chunk.chunks_mut(n).enumerate() {
            let r = bi * BLOCK + j;
            decode_row(w, r, &mut row);
            for (t, ot) in o.iter_mut().enumerate() {
                *ot = dot(&row, &x[t * cols..(t + 1) * cols]);
            }
        }
    });
    for t in 0..n {
        for r in 0..rows {
            y[t * rows + r] = out_t[r * n + t];
        }
    }
}

fn decode_row(w: &MatrixView, r: usize, out: &mut [f32]) {
    match &w.data {
        MatrixData::Float { dtype: Dtype::F32, data } => {
            let b = &data.bytes()[r * w.cols * 4..(r + 1) * w.cols * 4];
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        _ => w.row_f32(r, out),
    }
}

#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators: vectorizes and keeps the sum accurate.
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `y[t] = row tokens[t] of the table`.
pub fn embed(table: &MatrixView, tokens: &[u32], y: &mut [f32]) {
    let cols = table.cols;
    y[..tokens.len() * cols]
        .par_chunks_mut(cols)
        .zip(tokens.par_iter())
        .for_each(|(o, &t)| decode_row(table, t as usize, o));
}
