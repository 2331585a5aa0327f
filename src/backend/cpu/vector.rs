//! Small vector helpers the CPU kernels share.

/// `Σ a[i]·b[i]`.
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
