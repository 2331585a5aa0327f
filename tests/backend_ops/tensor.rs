//! The tensor-core products of the CUDA backend (SPEC §6's fast path:
//! activations split into two f16 parts, quantization levels exact in
//! f16, f32 sums) against the reference, for products of more than 16
//! tokens and batched decode steps through matrices of 512 rows or more: within `TC_TOL`, and, where the kernels take the matrix, not
//! bit for bit the f32 path's result (so the test knows they ran).
//! Matrices the kernels do not take (float32, columns that are no whole
//! 64-column step, groups shorter than a 16-byte chunk) go the f32 way:
//! bit for bit the exact backend's result.

use super::reference;
use super::util::{close, float_matrix, quant_matrix, Rng};
use super::{moe_case, run, up};
use moeflux::backend::cuda::CudaBackend;
use moeflux::backend::Backend;
use moeflux::config::Routing;
use moeflux::format::Dtype;

/// The op tolerance of the tensor-core products.
const TC_TOL: f64 = 1e-5;

/// `got` (tensor cores) against `exact` (the f32 kernels' result): not
/// the same bits where the tensor cores should have run, the same
/// elsewhere.
fn expect_path(what: &str, got: &[f32], exact: &[f32], tc: bool) {
    let same = got.iter().zip(exact).all(|(a, b)| a.to_bits() == b.to_bits());
    match tc {
        true => assert!(
            !same,
            "{what}: the f32 kernels' bits: the tensor-core kernel did not run"
        ),
        false => assert!(
            same,
            "{what}: not the f32 kernels' result, for a product they should take"
        ),
    }
}

/// `y = x·Wᵀ` on a backend.
fn product<B: Backend>(b: &B, view: &moeflux::format::MatrixView, x: &[f32], n: usize) -> Vec<f32> {
    let m = b.matrix(view).expect("matrix");
    let mut y = b.alloc(n * view.rows).expect("alloc");
    b.linear(&m, &up(b, x), n, &mut y).expect("linear");
    run(b, &y, n * view.rows)
}

pub fn check_linear_tc(b: &CudaBackend, exact: &CudaBackend) {
    let mut rng = Rng::new(21);
    // (bits, group, rows, cols, f16 scales, tensor cores)
    let quant = [
        (4, 64, 37, 256, false, true),
        (8, 64, 129, 512, true, true),
        (2, 128, 300, 1024, false, true),
        (4, 32, 65, 512, true, true),
        (2, 64, 45, 4096, false, true),
        (4, 16, 9, 128, false, false),
        (8, 32, 20, 96, false, false),
    ];
    for &(bits, gs, rows, cols, f16, tc) in &quant {
        let (view, dense) = quant_matrix(&mut rng, rows, cols, bits, gs, f16);
        for n in [17, 70, 130] {
            let x = rng.vec(n * cols, 1.0);
            let got = product(b, &view, &x, n);
            let want = reference::linear(&dense, rows, cols, &x, n);
            let what = format!("linear_tc q{bits} gs{gs} f16={f16} [{rows}, {cols}] n={n}");
            close(&what, &got, &want, TC_TOL);
            expect_path(&what, &got, &product(exact, &view, &x, n), tc);
        }
    }
    for (dtype, rows, cols, tc) in [
        (Dtype::Bf16, 700, 1024, true),
        (Dtype::F16, 31, 256, true),
        (Dtype::Bf16, 33, 200, false),
        (Dtype::F32, 33, 128, false),
    ] {
        let (view, dense) = float_matrix(&mut rng, rows, cols, dtype);
        for n in [17, 100] {
            let x = rng.vec(n * cols, 1.0);
            let got = product(b, &view, &x, n);
            let want = reference::linear(&dense, rows, cols, &x, n);
            let what = format!("linear_tc {dtype:?} [{rows}, {cols}] n={n}");
            close(&what, &got, &want, TC_TOL);
            expect_path(&what, &got, &product(exact, &view, &x, n), tc);
        }
    }
    // Batched decode steps: 2 to 8 tokens through a quantized matrix
    // take matvec_tc (every layout below: a quarter group of 1, 2 or 4
    // words), whatever its rows; 9 to 16 tokens one 16-token tile,
    // columns split into parts, through matrices of at least 512 rows
    // (STEP_MIN_TOKENS, STEP_MIN_ROWS); matvec_tok otherwise, matvec_q
    // for one token.
    for &(bits, gs, rows, cols, f16, big) in &[
        (4, 64, 2100, 512, false, true),
        (8, 32, 520, 4096, true, true),
        (2, 128, 8192, 256, false, true),
        // Parts of one step each, were groups not kept whole.
        (4, 128, 512, 1024, false, true),
        (4, 64, 300, 512, false, false),
    ] {
        let (view, dense) = quant_matrix(&mut rng, rows, cols, bits, gs, f16);
        for n in [1, 2, 5, 8, 9, 16] {
            let x = rng.vec(n * cols, 1.0);
            let got = product(b, &view, &x, n);
            let want = reference::linear(&dense, rows, cols, &x, n);
            let what = format!("linear_tc step q{bits} gs{gs} [{rows}, {cols}] n={n}");
            close(&what, &got, &want, TC_TOL);
            let tc = (2..=8).contains(&n) || (big && n > 8);
            expect_path(&what, &got, &product(exact, &view, &x, n), tc);
        }
    }
    let (view, dense) = float_matrix(&mut rng, 1024, 1024, Dtype::Bf16);
    for n in [3, 16] {
        let x = rng.vec(n * 1024, 1.0);
        let got = product(b, &view, &x, n);
        let want = reference::linear(&dense, 1024, 1024, &x, n);
        let what = format!("linear_tc step Bf16 [1024, 1024] n={n}");
        close(&what, &got, &want, TC_TOL);
        expect_path(&what, &got, &product(exact, &view, &x, n), n >= 5);
    }
    // Activations far from 1 in magnitude: each row (matvec_tc: each
    // token's group) is scaled by a power of two before it is split into
    // f16 parts (f16 alone would overflow above 65504 and lose digits
    // below 6e-5).
    let (view, dense) = quant_matrix(&mut rng, 64, 512, 4, 64, false);
    for scale in [3e5f32, 1e-7] {
        for n in [4, 20] {
            let x: Vec<f32> = rng.vec(n * 512, 1.0).iter().map(|v| v * scale).collect();
            let got = product(b, &view, &x, n);
            let want = reference::linear(&dense, 64, 512, &x, n);
            let what = format!("linear_tc q4 activations ×{scale:e} n={n}");
            close(&what, &got, &want, TC_TOL);
            expect_path(&what, &got, &product(exact, &view, &x, n), true);
        }
    }
}

pub fn check_moe_tc(b: &CudaBackend, exact: &CudaBackend) {
    let mut rng = Rng::new(22);
    let softmax = Routing::Softmax { norm_topk_prob: true };
    let noaux = Routing::NoauxTc {
        n_group: 2,
        topk_group: 1,
        routed_scaling_factor: 1.5,
        norm_topk_prob: true,
    };
    // ((bits, group), (hidden, inter, experts), tokens, k, routing, tensor cores)
    let cases = [
        ((4, 32), (128, 64, 6), 40, 2, &softmax, true),
        ((8, 64), (256, 128, 8), 100, 3, &softmax, true),
        // Groups of more than one 64-token tile.
        ((4, 64), (128, 192, 6), 200, 2, &noaux, true),
        ((2, 64), (128, 64, 4), 33, 2, &softmax, true),
        // Tiles of 16 tokens (3 a group on average; the cases above take
        // tiles of 32 and 64: cuda/tensor.rs expert_tile).
        ((4, 64), (128, 64, 16), 24, 2, &softmax, true),
        // 2-bit in groups of 32: shorter than a 16-byte chunk, f32 kernels.
        ((2, 32), (128, 64, 6), 40, 2, &softmax, false),
        // Batched decode steps of 5 to 16 tokens (moe_up_mt /
        // moe_down_mt): groups of one pair to more than an mma's 8
        // columns, every layout of a quarter group (1, 2 or 4 words).
        ((4, 64), (128, 64, 8), 6, 2, &softmax, true),
        ((4, 32), (256, 64, 4), 8, 2, &softmax, true),
        ((8, 64), (128, 192, 4), 16, 2, &noaux, true),
        ((2, 64), (128, 64, 16), 5, 4, &softmax, true),
        ((4, 128), (256, 128, 6), 12, 3, &softmax, true),
        // Enough blocks on a 132-SM H100 for blocks of 2 tiles of down,
        // the last block's second past the matrix's last row (1040 rows:
        // 65 tiles); a larger expert.
        ((8, 16), (1040, 128, 34), 16, 8, &softmax, true),
        ((4, 64), (256, 512, 34), 16, 8, &softmax, true),
        // Fewer tokens keep the f32 kernels.
        ((4, 64), (128, 64, 8), 1, 2, &softmax, false),
        ((4, 64), (128, 64, 8), 4, 2, &softmax, false),
    ];
    for (q, shape, n, k, routing, tc) in cases {
        // The same inputs through both backends (the same seed).
        let seed = rng.u64();
        let (got, _) = moe_case(b, &mut Rng::new(seed), q, shape, n, k, routing, TC_TOL);
        let (f32s, _) = moe_case(exact, &mut Rng::new(seed), q, shape, n, k, routing, TC_TOL);
        expect_path(&format!("moe_tc q{} gs{} n={n}", q.0, q.1), &got, &f32s, tc);
    }
}
