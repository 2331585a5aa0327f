//! Test support for the fast-path kernels over several tokens
//! (`vnni_gemm`, `amx`): random quantized rows and activations, and a
//! check of a kernel against `vnni`'s tiles, which compute the same
//! integer group sums.

use super::qmatvec::{Acts, Order, QuantMat};
use super::vnni;

/// A linear congruential generator: reproducible test data.
pub(super) struct Lcg(pub u32);

impl Lcg {
    pub fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        self.0
    }
    /// Uniform in [−0.5, 0.5).
    pub fn f32(&mut self) -> f32 {
        (self.next() >> 8) as f32 / (1 << 24) as f32 - 0.5
    }
}

/// A layout to test: bits, group size, columns, f16 (not bf16) scales.
pub(super) type Layout = (usize, usize, usize, bool);

/// For each layout and each token count of `ns`: random `[rows, cols]`
/// weights and x, x quantized as the fast path does; `kernel(m, a, r0,
/// out)` computes rows `r0..rows` into `out` `[rows − r0, n]`, which must
/// match `vnni::quant_rows` (its tiles: `a` carries no other layout)
/// within 1e-5 of the output's RMS.
pub(super) fn check_against_vnni_tiles(
    seed: u32,
    layouts: &[Layout],
    rows: usize,
    r0: usize,
    ns: &[usize],
    mut kernel: impl FnMut(&QuantMat, &Acts, usize, &mut [f32]),
) {
    if !vnni::available() {
        eprintln!("no AVX-512 VNNI here: nothing to compare");
        return;
    }
    let mut rng = Lcg(seed);
    for &(bits, gs, cols, f16) in layouts {
        let w: Vec<u8> = (0..rows * cols * bits / 8).map(|_| rng.next() as u8).collect();
        let mut half = || -> Vec<u8> {
            (0..rows * cols / gs)
                .flat_map(|_| {
                    let v = 0.02 * rng.f32();
                    match f16 {
                        true => half::f16::from_f32(v).to_le_bytes(),
                        false => half::bf16::from_f32(v).to_le_bytes(),
                    }
                })
                .collect()
        };
        let (s, b) = (half(), half());
        let m = QuantMat {
            bits,
            group_size: gs,
            cols,
            weight: &w,
            scales: &s,
            biases: &b,
            f16_scales: f16,
        };
        assert!(vnni::quant_supported(&m));
        for &n in ns {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut a = Acts::new(&x, n, cols, Some(gs));
            a.xq = vnni::quantize_x(&x, &a.xsum, cols, gs, bits, Order::Words);
            let rn = rows - r0;
            let mut want = vec![0.0f32; rn * n];
            // SAFETY: VNNI is available, the layout is supported and the
            // sizes match.
            unsafe { vnni::quant_rows(&m, &a, r0, &mut want) };
            // The tiled kernels read the same levels by 32-byte blocks.
            a.xq = vnni::quantize_x(&x, &a.xsum, cols, gs, bits, Order::Blocks);
            let mut got = vec![f32::NAN; rn * n];
            kernel(&m, &a, r0, &mut got);
            let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-5 * rms,
                    "{bits}-bit g{gs} [{rows}, {cols}] n={n}: element {i}: {g} against {e}"
                );
            }
        }
    }
}
