//! Every op of the `Backend` trait, run on fresh random inputs and
//! compared with a naive reference (`backend_ops/reference.rs`), in the
//! manner of llama.cpp's test-backend-ops. A backend is put under test
//! with one loop in `main` over `checks::<B>()` (a `libtest-mimic` harness:
//! on a machine without a GPU the CUDA trials are counted as ignored).

#[path = "backend_ops/flash.rs"]
mod flash;
#[path = "backend_ops/fused.rs"]
mod fused;
#[path = "backend_ops/reference.rs"]
mod reference;
#[path = "backend_ops/seqs.rs"]
mod seqs;
#[path = "backend_ops/tensor.rs"]
mod tensor;
#[path = "common/trials.rs"]
mod trials;
#[path = "backend_ops/util.rs"]
mod util;

use fused::{check_add_rms_norm, check_linear_many, check_swiglu_linear};
use moeflux::backend::cpu::CpuBackend;
use moeflux::backend::cuda::{CudaBackend, CudaOptions};
use moeflux::backend::{
    AttnArgs, Backend, DeltaArgs, DeltaState, DeltaWeights, KvType, MlaArgs, MoeArgs, MoeInputs, RopeArgs, Strided,
};
use moeflux::config::Routing;
use moeflux::format::Dtype;
use moeflux::model::router::route;
use std::sync::OnceLock;
use util::{close, float_matrix, quant_matrix, write_experts, Rng};

fn run<B: Backend>(b: &B, buf: &B::Buf, len: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; len];
    b.download(buf, 0, &mut out).expect("download");
    out
}

fn up<B: Backend>(b: &B, data: &[f32]) -> B::Buf {
    b.upload(data).expect("upload")
}

/// The values a cache of type `t` holds for `data` (rows of `width`): the
/// row encoding of `backend/kv.rs`, decoded.
fn held(t: KvType, data: &[f32], width: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; data.len() / width * t.row_bytes(width)];
    t.encode(data, width, &mut bytes);
    let mut out = vec![0.0f32; data.len()];
    t.decode(&bytes, width, &mut out);
    out
}

/// A cache of type `t` holding `data` (rows of `width`), and its values.
fn cache<B: Backend>(b: &B, t: KvType, data: &[f32], width: usize) -> (B::Cache, Vec<f32>) {
    let mut c = b.alloc_cache(t, data.len() / width, width).expect("alloc_cache");
    b.cache_upload(&mut c, 0, width, data).expect("cache_upload");
    (c, held(t, data, width))
}

/// The first `rows` rows of a cache of `width`, decoded.
fn cache_rows<B: Backend>(b: &B, c: &B::Cache, rows: usize, width: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * width];
    b.cache_download(c, 0, &mut out).expect("cache_download");
    out
}

/// Every cache type stores rows where it is told, rounded as the row
/// encoding rounds them (the same bits on every backend), and reads them
/// back; rows past the end are refused.
pub fn check_kv_cache<B: Backend>(b: &B) {
    let mut rng = Rng::new(5);
    for width in [64, 96, 256] {
        let rows = 7;
        let data = rng.vec(rows * width, 3.0);
        for t in KvType::ALL {
            let mut c = b.alloc_cache(t, rows + 3, width).expect("alloc_cache");
            let src = up(b, &data);
            // Rows 2.. of the input at rows 3.. of the cache, then rows 0..2 at 0.
            b.cache_store(&src, 2, rows - 2, &mut c, 3).expect("cache_store");
            b.cache_store(&src, 0, 2, &mut c, 0).expect("cache_store");
            let mut got = vec![0.0f32; (rows - 2) * width];
            b.cache_download(&c, 3, &mut got).expect("cache_download");
            let want = held(t, &data[2 * width..], width);
            assert_eq!(got, want, "{t} cache of rows of {width}: rows 3..");
            let head = cache_rows(b, &c, 2, width);
            assert_eq!(head, held(t, &data[..2 * width], width), "{t}: rows 0..2");
            assert!(
                b.cache_store(&src, 0, 4, &mut c, rows).is_err(),
                "{t}: a store past the end is refused"
            );
        }
    }
    assert!(
        b.alloc_cache(KvType::Q8_0, 4, 40).is_err(),
        "q8_0 rows that are not whole blocks are refused"
    );
}

/// Quantized (2/4/8-bit, bf16 and f16 scales, several group sizes) and
/// float matrices; one token and several; odd row counts; a matrix large
/// enough to be split across threads.
pub fn check_linear<B: Backend>(b: &B) {
    let mut rng = Rng::new(1);
    let quant = [
        (2, 64, 37, 256, false),
        (4, 64, 37, 256, false),
        (8, 64, 37, 256, false),
        (4, 32, 65, 512, true),
        (2, 128, 129, 512, false),
        (8, 128, 17, 1024, true),
        (4, 16, 9, 64, false),
        (2, 16, 9, 64, false),
        (4, 64, 1001, 1024, false),
        // Short and wide: CUDA splits each row's columns over 4 warps.
        (4, 64, 45, 4096, false),
        (2, 64, 9, 8192, true),
    ];
    for &(bits, gs, rows, cols, f16) in &quant {
        let (view, dense) = quant_matrix(&mut rng, rows, cols, bits, gs, f16);
        let m = b.matrix(&view).expect("matrix");
        for n in [1, 2, 3, 5, 8, 13, 70] {
            let x = rng.vec(n * cols, 1.0);
            let mut y = b.alloc(n * rows).expect("alloc");
            b.linear(&m, &up(b, &x), n, &mut y).expect("linear");
            let want = reference::linear(&dense, rows, cols, &x, n);
            close(
                &format!("linear q{bits} gs{gs} f16={f16} [{rows}, {cols}] n={n}"),
                &run(b, &y, n * rows),
                &want,
                2e-6,
            );
        }
    }
    for (dtype, rows, cols) in [
        (Dtype::Bf16, 37, 256),
        (Dtype::F16, 31, 203),
        (Dtype::F32, 33, 77),
        (Dtype::Bf16, 700, 1000),
    ] {
        let (view, dense) = float_matrix(&mut rng, rows, cols, dtype);
        let m = b.matrix(&view).expect("matrix");
        for n in [1, 2, 3, 7, 11] {
            let x = rng.vec(n * cols, 1.0);
            let mut y = b.alloc(n * rows).expect("alloc");
            b.linear(&m, &up(b, &x), n, &mut y).expect("linear");
            let want = reference::linear(&dense, rows, cols, &x, n);
            close(
                &format!("linear {dtype:?} [{rows}, {cols}] n={n}"),
                &run(b, &y, n * rows),
                &want,
                2e-6,
            );
        }
    }
    // Several CUDA gemm tiles (128 rows × 64 tokens) each way, ragged on
    // every edge (the last column step of 1000 is a quarter full).
    let big = [
        quant_matrix(&mut rng, 300, 1024, 4, 64, false),
        float_matrix(&mut rng, 300, 1000, Dtype::F32),
    ];
    for (view, dense) in &big {
        let (rows, cols, n) = (view.rows, view.cols, 150);
        let m = b.matrix(view).expect("matrix");
        let x = rng.vec(n * cols, 1.0);
        let mut y = b.alloc(n * rows).expect("alloc");
        b.linear(&m, &up(b, &x), n, &mut y).expect("linear");
        let want = reference::linear(dense, rows, cols, &x, n);
        close(
            &format!("linear [{rows}, {cols}] n={n}"),
            &run(b, &y, n * rows),
            &want,
            2e-6,
        );
    }
}

pub fn check_embed<B: Backend>(b: &B) {
    let mut rng = Rng::new(2);
    let tables = [
        quant_matrix(&mut rng, 50, 128, 4, 64, false),
        quant_matrix(&mut rng, 50, 128, 2, 32, true),
        float_matrix(&mut rng, 50, 96, Dtype::Bf16),
        float_matrix(&mut rng, 50, 96, Dtype::F32),
    ];
    for (view, dense) in &tables {
        let m = b.matrix(view).expect("matrix");
        let tokens = [0u32, 49, 7, 7, 23];
        let cols = view.cols;
        let mut y = b.alloc(tokens.len() * cols).expect("alloc");
        b.embed(&m, &tokens, &mut y).expect("embed");
        let want: Vec<f64> = tokens
            .iter()
            .flat_map(|&t| dense[t as usize * cols..][..cols].iter().copied())
            .collect();
        close(
            &format!("embed [{}, {cols}]", view.rows),
            &run(b, &y, tokens.len() * cols),
            &want,
            1e-7,
        );
        assert!(
            b.embed(&m, &[50], &mut y).is_err(),
            "embed accepted a token outside the table"
        );
    }
}

pub fn check_norms<B: Backend>(b: &B) {
    let mut rng = Rng::new(3);
    for (rows, dim) in [(1, 64), (5, 200), (3, 2048)] {
        let x = rng.vec(rows * dim, 3.0);
        let z = rng.vec(rows * dim, 4.0);
        let w = rng.vec(dim, 1.5);
        let mut y = b.alloc(rows * dim).expect("alloc");
        b.rms_norm(&up(b, &x), &up(b, &w), rows, dim, 1e-6, &mut y)
            .expect("rms_norm");
        close(
            &format!("rms_norm [{rows}, {dim}]"),
            &run(b, &y, rows * dim),
            &reference::rms_norm(&x, &w, rows, dim, 1e-6),
            2e-6,
        );
        b.gated_rms_norm(&up(b, &x), &up(b, &z), &up(b, &w), rows, dim, 1e-5, &mut y)
            .expect("gated_rms_norm");
        let want = reference::gated_rms_norm(&x, &z, &w, rows, dim, 1e-5);
        close(
            &format!("gated_rms_norm [{rows}, {dim}]"),
            &run(b, &y, rows * dim),
            &want,
            2e-6,
        );
    }
}

/// add, add_scaled_rows (plain and sigmoid), swiglu, sigmoid_mul, copy.
pub fn check_elementwise<B: Backend>(b: &B) {
    let mut rng = Rng::new(4);
    let (rows, dim) = (7, 129);
    let len = rows * dim;
    let (x, y0, g) = (rng.vec(len, 2.0), rng.vec(len, 2.0), rng.vec(len, 6.0));
    let mut y = up(b, &y0);
    b.add(&mut y, &up(b, &x), len - 3).expect("add");
    let mut want: Vec<f64> = y0.iter().zip(&x).map(|(a, c)| *a as f64 + *c as f64).collect();
    for i in len - 3..len {
        want[i] = y0[i] as f64;
    }
    close("add (partial length)", &run(b, &y, len), &want, 1e-7);

    for sig in [false, true] {
        let scale = rng.vec(rows, 3.0);
        let mut y = up(b, &y0);
        b.add_scaled_rows(&mut y, &up(b, &x), &up(b, &scale), rows, dim, sig)
            .expect("add_scaled_rows");
        let want = reference::add_scaled_rows(&y0, &x, &scale, dim, sig);
        close(&format!("add_scaled_rows sigmoid={sig}"), &run(b, &y, len), &want, 1e-6);
    }

    let mut out = b.alloc(len).expect("alloc");
    b.swiglu(&up(b, &g), &up(b, &x), len, &mut out).expect("swiglu");
    close("swiglu", &run(b, &out, len), &reference::swiglu(&g, &x), 1e-6);

    let mut xm = up(b, &x);
    b.sigmoid_mul(&mut xm, &up(b, &g), len).expect("sigmoid_mul");
    close("sigmoid_mul", &run(b, &xm, len), &reference::sigmoid_mul(&x, &g), 1e-6);

    // Rows 1..4 of x's columns 5..5+40 into dst rows 0, 3, 6 at column 2.
    let s = Strided {
        rows: 3,
        width: 40,
        src_off: dim + 5,
        src_stride: dim,
        dst_off: 2,
        dst_stride: 3 * 50,
    };
    let dst0 = rng.vec(500, 1.0);
    let mut dst = up(b, &dst0);
    b.copy(&up(b, &x), &mut dst, s).expect("copy");
    let mut want: Vec<f64> = dst0.iter().map(|&v| v as f64).collect();
    for r in 0..s.rows {
        for i in 0..s.width {
            want[s.dst_off + r * s.dst_stride + i] = x[s.src_off + r * s.src_stride + i] as f64;
        }
    }
    close("copy (strided)", &run(b, &dst, 500), &want, 0.0);
}

pub fn check_rope<B: Backend>(b: &B) {
    let mut rng = Rng::new(5);
    // (heads, head_stride, rot_off, rot_dim, interleaved, mscale, pos0)
    for (heads, hs, off, rot, il, ms, pos0) in [
        (4, 64, 0, 64, false, 1.0, 0),
        (3, 80, 0, 16, false, 1.0, 17),
        (2, 96, 0, 64, true, 1.3, 1000),
        (5, 40, 0, 32, true, 0.7, 3),
        (2, 192, 128, 64, true, 1.1, 40),
        (3, 48, 32, 16, false, 1.0, 5),
    ] {
        let n = 3;
        let ts = heads * hs + 6;
        let x = rng.vec(n * ts, 1.0);
        let inv_freq: Vec<f32> = (0..rot / 2)
            .map(|j| 10000f32.powf(-2.0 * j as f32 / rot as f32))
            .collect();
        let a = RopeArgs {
            n_tokens: n,
            n_heads: heads,
            head_stride: hs,
            token_stride: ts,
            rot_off: off,
            rot_dim: rot,
            pos0,
            interleaved: il,
            mscale: ms,
        };
        let mut xb = up(b, &x);
        b.rope(&mut xb, &up(b, &inv_freq), a).expect("rope");
        close(
            &format!("rope {a:?}"),
            &run(b, &xb, n * ts),
            &reference::rope(&x, &inv_freq, a),
            2e-6,
        );
    }
}

/// Attention of `n` queries at `pos0..` over (query, KV) heads of
/// (head_dim, v_dim) dimensions, scaled by 1/√head_dim.
pub fn attn_args(n: usize, pos0: usize, (h, hkv): (usize, usize), (hd, vd): (usize, usize)) -> AttnArgs {
    AttnArgs {
        n,
        pos0,
        n_heads: h,
        n_kv_heads: hkv,
        head_dim: hd,
        v_dim: vd,
        scale: (hd as f32).powf(-0.5),
    }
}

/// Short contexts, and deep ones whose keys CUDA splits over blocks (a
/// KV head's group a block, and a group too large for that).
pub fn check_attention<B: Backend>(b: &B) {
    let mut rng = Rng::new(6);
    for (n, pos0, h, hkv, hd, vd) in [
        (1, 0, 4, 4, 32, 32),
        (1, 9, 8, 2, 64, 64),
        (5, 3, 6, 2, 32, 48),
        (4, 0, 4, 1, 16, 16),
        (1, 3000, 16, 2, 256, 256),
        (3, 1500, 8, 2, 64, 64),
        (1, 2000, 20, 1, 64, 64),
        (2, 1200, 32, 2, 128, 128),
    ] {
        let cap = pos0 + n + 2;
        let q = rng.vec(n * h * hd, 2.0);
        let k = rng.vec(cap * hkv * hd, 2.0);
        let v = rng.vec(cap * hkv * vd, 1.0);
        let a = attn_args(n, pos0, (h, hkv), (hd, vd));
        for t in KvType::ALL {
            if t == KvType::Q8_0 && (hd % 32 != 0 || vd % 32 != 0) {
                continue;
            }
            let ((kc, kh), (vc, vh)) = (cache(b, t, &k, hkv * hd), cache(b, t, &v, hkv * vd));
            let mut out = b.alloc(n * h * vd).expect("alloc");
            b.attention(&up(b, &q), &kc, &vc, a, &mut out).expect("attention");
            // f32 sums over thousands of keys round more than over tens.
            let tol = if cap > 1000 { 1e-5 } else { 2e-6 };
            close(
                &format!("attention over a {t} cache {a:?}"),
                &run(b, &out, n * h * vd),
                &reference::attention(&q, &kh, &vh, a),
                tol,
            );
        }
    }
}

pub fn check_mla<B: Backend>(b: &B) {
    let mut rng = Rng::new(7);
    for (n, pos0, h, dn, dr, dv, r) in [
        (1, 0, 2, 16, 8, 16, 32),
        (1, 6, 4, 32, 16, 24, 64),
        (4, 2, 3, 16, 8, 32, 48),
        (3, 5, 2, 16, 32, 16, 64),
    ] {
        let cap = pos0 + n + 1;
        let q = rng.vec(n * h * (dn + dr), 1.0);
        let latent = rng.vec(cap * r, 1.0);
        let k_pe = rng.vec(cap * dr, 1.0);
        let kv_b = rng.vec(h * (dn + dv) * r, 0.3);
        let a = MlaArgs {
            n,
            pos0,
            n_heads: h,
            nope: dn,
            rope: dr,
            v_dim: dv,
            kv_lora_rank: r,
            scale: ((dn + dr) as f32).powf(-0.5),
        };
        for t in KvType::ALL {
            if t == KvType::Q8_0 && (r % 32 != 0 || dr % 32 != 0) {
                continue;
            }
            let ((lc, lh), (pc, ph)) = (cache(b, t, &latent, r), cache(b, t, &k_pe, dr));
            let mut out = b.alloc(n * h * dv).expect("alloc");
            b.mla_attention(&up(b, &q), &lc, &pc, &up(b, &kv_b), a, &mut out)
                .expect("mla_attention");
            let want = reference::mla_attention(&q, &lh, &ph, &kv_b, a);
            close(
                &format!("mla_attention over a {t} cache {a:?}"),
                &run(b, &out, n * h * dv),
                &want,
                5e-6,
            );
        }
    }
}

/// Two calls in a row (state carried over), then the final states.
pub fn check_gated_delta<B: Backend>(b: &B) {
    let mut rng = Rng::new(8);
    // (Key heads over 128 dimensions take CUDA's delta_scan, up to 128
    // delta_scan128; heads of 128 and 128 over 128 tokens or more the
    // chunked form of 64-token chunks: two whole chunks and part of a
    // third, then exactly two.)
    for (hk, hv, dk, dv, kern, calls) in [
        (2, 4, 16, 8, 4, [3, 1, 40, 2]),
        (1, 1, 32, 32, 1, [3, 1, 40, 2]),
        (2, 2, 8, 16, 2, [3, 1, 40, 2]),
        (1, 2, 160, 20, 3, [3, 1, 40, 2]),
        (2, 4, 128, 128, 4, [3, 150, 128, 2]),
    ] {
        let cd = 2 * hk * dk + hv * dv;
        let conv_w = rng.vec(cd * kern, 0.6);
        let a_log = rng.vec(hv, 1.0);
        let dt_bias = rng.vec(hv, 1.0);
        let conv0 = rng.vec((kern - 1) * cd, 1.0);
        let ssm0 = rng.vec(hv * dv * dk, 0.5);
        let (cw, al, dtb) = (up(b, &conv_w), up(b, &a_log), up(b, &dt_bias));
        let w = DeltaWeights::<B> {
            conv_w: &cw,
            a_log: &al,
            dt_bias: &dtb,
        };
        let (mut conv, mut ssm) = (up(b, &conv0), up(b, &ssm0));
        let mut conv_ref: Vec<f64> = conv0.iter().map(|&v| v as f64).collect();
        let mut ssm_ref: Vec<f64> = ssm0.iter().map(|&v| v as f64).collect();
        for (call, n) in calls.into_iter().enumerate() {
            let qkv = rng.vec(n * cd, 2.0);
            let (av, bv) = (rng.vec(n * hv, 2.0), rng.vec(n * hv, 2.0));
            let args = DeltaArgs {
                n,
                k_heads: hk,
                v_heads: hv,
                k_dim: dk,
                v_dim: dv,
                kernel: kern,
            };
            let mut out = b.alloc(n * hv * dv).expect("alloc");
            let st = DeltaState::<B> {
                conv: &mut conv,
                ssm: &mut ssm,
            };
            b.gated_delta(&up(b, &qkv), &up(b, &av), &up(b, &bv), w, st, args, &mut out)
                .expect("gated_delta");
            let din = reference::DeltaIn {
                qkv: &qkv,
                a: &av,
                b: &bv,
                conv_w: &conv_w,
                a_log: &a_log,
                dt_bias: &dt_bias,
            };
            let want = reference::gated_delta(&din, &mut conv_ref, &mut ssm_ref, args);
            close(
                &format!("gated_delta call {call} {args:?}"),
                &run(b, &out, n * hv * dv),
                &want,
                5e-6,
            );
        }
        close(
            &format!("gated_delta conv state kernel={kern}"),
            &run(b, &conv, (kern - 1) * cd),
            &conv_ref,
            0.0,
        );
        close(
            &format!("gated_delta ssm state hv={hv}"),
            &run(b, &ssm, hv * dv * dk),
            &ssm_ref,
            5e-6,
        );
    }
    // States shorter than the shapes need: an error, not a read past them.
    let (cd, n) = (2 * 8 + 2 * 8, 3);
    let args = DeltaArgs {
        n,
        k_heads: 1,
        v_heads: 2,
        k_dim: 8,
        v_dim: 8,
        kernel: 2,
    };
    let (cw, al, dtb) = (
        up(b, &rng.vec(cd * 2, 0.6)),
        up(b, &rng.vec(2, 1.0)),
        up(b, &rng.vec(2, 1.0)),
    );
    let w = DeltaWeights::<B> {
        conv_w: &cw,
        a_log: &al,
        dt_bias: &dtb,
    };
    let (qkv, av, bv) = (
        up(b, &rng.vec(n * cd, 1.0)),
        up(b, &rng.vec(n * 2, 1.0)),
        up(b, &rng.vec(n * 2, 1.0)),
    );
    for (conv_len, ssm_len, what) in [
        (cd, 2 * 8 * 8 - 1, "recurrent state"),
        (cd - 1, 2 * 8 * 8, "conv state"),
    ] {
        let (mut conv, mut ssm) = (up(b, &vec![0.0; conv_len]), up(b, &vec![0.0; ssm_len]));
        let mut out = b.alloc(n * 16).expect("alloc");
        let st = DeltaState::<B> {
            conv: &mut conv,
            ssm: &mut ssm,
        };
        let err = b
            .gated_delta(&qkv, &av, &bv, w, st, args, &mut out)
            .expect_err("a short state");
        assert!(err.to_string().contains(what), "{what}: {err}");
    }
}

/// A tiny expert file in a tempdir, read through `ExpertStore`; random
/// router logits routed by each routing the models use (the host router
/// is the reference for the choice of experts); tokens that share experts.
pub fn check_moe<B: Backend>(b: &B) {
    let mut rng = Rng::new(9);
    let cases = [
        (4, 1, 2, Routing::Softmax { norm_topk_prob: false }),
        (2, 3, 3, Routing::Softmax { norm_topk_prob: true }),
        (
            8,
            5,
            2,
            Routing::NoauxTc {
                n_group: 3,
                topk_group: 2,
                routed_scaling_factor: 2.5,
                norm_topk_prob: true,
            },
        ),
        (
            4,
            7,
            3,
            Routing::NoauxTc {
                n_group: 2,
                topk_group: 1,
                routed_scaling_factor: 1.0,
                norm_topk_prob: false,
            },
        ),
        (
            4,
            6,
            2,
            Routing::SoftmaxGroups {
                n_group: 3,
                topk_group: 2,
                routed_scaling_factor: 16.0,
            },
        ),
        (
            8,
            3,
            3,
            Routing::SoftmaxGroups {
                n_group: 1,
                topk_group: 1,
                routed_scaling_factor: 1.0,
            },
        ),
    ];
    for (bits, n, k, routing) in &cases {
        moe_case(b, &mut rng, (*bits, 32), (128, 64, 6), *n, *k, routing, 5e-6);
    }
}

/// Router logits of NaN (a model whose activations diverged) for one
/// token of three: every backend routes that token to experts in range,
/// as the host router does (NaN ranks lowest, ties to the lower index),
/// instead of failing or reading past the layer's experts; the other
/// tokens' results are unchanged.
pub fn check_moe_nan<B: Backend>(b: &B) {
    let mut rng = Rng::new(31);
    let routings = [
        Routing::Softmax { norm_topk_prob: true },
        Routing::NoauxTc {
            n_group: 2,
            topk_group: 1,
            routed_scaling_factor: 1.0,
            norm_topk_prob: true,
        },
        Routing::SoftmaxGroups {
            n_group: 2,
            topk_group: 1,
            routed_scaling_factor: 1.0,
        },
    ];
    for routing in &routings {
        moe_case_with(b, &mut rng, (4, 32), (128, 64, 6), 3, 2, routing, 5e-6, &[1]);
    }
}

/// One MoE step of `n` tokens through `ne` random experts of
/// `[inter, hidden]` / `[hidden, inter]` (`bits`, group `gs`), each token
/// to `k` of them, against the reference within `tol`; returns the
/// backend's output and its relative L2 error.
#[allow(clippy::too_many_arguments)]
pub fn moe_case<B: Backend>(
    b: &B,
    rng: &mut Rng,
    bits_gs: (usize, usize),
    shape: (usize, usize, usize),
    n: usize,
    k: usize,
    routing: &Routing,
    tol: f64,
) -> (Vec<f32>, f64) {
    moe_case_with(b, rng, bits_gs, shape, n, k, routing, tol, &[])
}

/// [`moe_case`] with the router logits of the tokens `nan_rows` all NaN;
/// those tokens' outputs are left out of the comparison.
#[allow(clippy::too_many_arguments)]
pub fn moe_case_with<B: Backend>(
    b: &B,
    rng: &mut Rng,
    (bits, gs): (usize, usize),
    (hidden, inter, ne): (usize, usize, usize),
    n: usize,
    k: usize,
    routing: &Routing,
    tol: f64,
    nan_rows: &[usize],
) -> (Vec<f32>, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, experts) = write_experts(rng, dir.path(), hidden, inter, ne, bits, gs);
    let x = rng.vec(n * hidden, 1.0);
    let out0 = rng.vec(n * hidden, 1.0);
    let mut logits = rng.vec(n * ne, 3.0);
    for &t in nan_rows {
        logits[t * ne..(t + 1) * ne].fill(f32::NAN);
    }
    let bias = matches!(routing, Routing::NoauxTc { .. }).then(|| rng.vec(ne, 0.5));
    let routes = route(routing, &logits, n, k, bias.as_deref());
    let bias_buf = bias.as_ref().map(|v| up(b, v));
    let mut out = up(b, &out0);
    let (xb, lb) = (up(b, &x), up(b, &logits));
    let m = MoeInputs {
        x: &xb,
        logits: &lb,
        bias: bias_buf.as_ref(),
        store: &store,
        hint: None,
    };
    b.moe(
        m,
        MoeArgs {
            layer: 1,
            n,
            hidden,
            inter,
            n_experts: ne,
            k,
            routing,
            decode: n == 1,
        },
        &mut out,
    )
    .expect("moe");
    assert!(
        routes.ids.iter().all(|&e| (e as usize) < ne),
        "the host router chose past {ne} experts"
    );
    let mut want: Vec<f64> = out0.iter().map(|&v| v as f64).collect();
    for t in 0..n {
        let xt = &x[t * hidden..(t + 1) * hidden];
        for j in 0..k {
            let [gate, upm, down] = &experts[routes.ids[t * k + j] as usize];
            let g = reference::linear(gate, inter, hidden, xt, 1);
            let u = reference::linear(upm, inter, hidden, xt, 1);
            let act: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(a, c)| (a / (1.0 + (-a).exp()) * c) as f32)
                .collect();
            let d = reference::linear(down, hidden, inter, &act, 1);
            for (o, dv) in want[t * hidden..(t + 1) * hidden].iter_mut().zip(&d) {
                *o += routes.weights[t * k + j] as f64 * dv;
            }
        }
    }
    let got = run(b, &out, n * hidden);
    // The rows compared: all but the NaN tokens'.
    let err = close(
        &format!("moe q{bits} gs{gs} [{hidden}, {inter}] x{ne} n={n} k={k} {routing:?} NaN rows {nan_rows:?}"),
        &rows_but(&got, hidden, nan_rows),
        &rows_but(&want, hidden, nan_rows),
        tol,
    );
    (got, err)
}

/// The rows of `v` (`cols` each) but those in `skip`, in order.
fn rows_but<T: Copy>(v: &[T], cols: usize, skip: &[usize]) -> Vec<T> {
    v.chunks_exact(cols)
        .enumerate()
        .filter(|(t, _)| !skip.contains(t))
        .flat_map(|(_, r)| r.iter().copied())
        .collect()
}

/// `download_parts` against `download` of each part: small parts and
/// parts of a megabyte (CUDA fetches those in one transfer), in order and
/// not, with gaps and overlaps.
pub fn check_download_parts<B: Backend>(b: &B) {
    let mut rng = Rng::new(24);
    let big = 248_320;
    let data = rng.vec(8 * big + 100, 1.0);
    let buf = up(b, &data);
    let cases: [Vec<(usize, usize)>; 4] = [
        vec![(0, 10), (10, 5)],
        (0..8).map(|i| (i * big, big)).collect(),
        vec![(3 * big + 7, big), (50, big), (big / 2, 2 * big)],
        vec![(0, 0), (8 * big, 100)],
    ];
    for parts in &cases {
        let got = b.download_parts(&buf, parts).expect("download_parts");
        assert_eq!(got.len(), parts.len(), "download_parts {parts:?}: vectors");
        for (&(off, len), v) in parts.iter().zip(&got) {
            assert_eq!(
                v.as_slice(),
                &data[off..off + len],
                "download_parts part ({off}, {len})"
            );
        }
    }
    assert!(
        b.download_parts(&buf, &[(0, 10), (8 * big, 101)]).is_err(),
        "download_parts read past the end of the buffer"
    );
}

/// One op's check on a backend.
type Check<B> = fn(&B);

/// Every op check, by name, for a backend.
fn checks<B: Backend>() -> Vec<(&'static str, Check<B>)> {
    vec![
        ("linear", check_linear::<B>),
        ("linear_many", check_linear_many::<B>),
        ("swiglu_linear", check_swiglu_linear::<B>),
        ("add_rms_norm", check_add_rms_norm::<B>),
        ("embed", check_embed::<B>),
        ("norms", check_norms::<B>),
        ("elementwise", check_elementwise::<B>),
        ("rope", check_rope::<B>),
        ("kv_cache", check_kv_cache::<B>),
        ("attention", check_attention::<B>),
        ("mla_attention", check_mla::<B>),
        ("gated_delta", check_gated_delta::<B>),
        ("attention_seqs", seqs::check_attention_seqs::<B>),
        ("gated_delta_seqs", seqs::check_gated_delta_seqs::<B>),
        ("moe", check_moe::<B>),
        ("moe_nan", check_moe_nan::<B>),
        ("download_parts", check_download_parts::<B>),
    ]
}

/// The CUDA backend with f32 products everywhere (`exact`), opened once
/// per test binary (only where a device is).
fn cuda() -> &'static CudaBackend {
    static B: OnceLock<CudaBackend> = OnceLock::new();
    B.get_or_init(|| {
        let opts = CudaOptions {
            tensor_cores: false,
            ..CudaOptions::default()
        };
        CudaBackend::with_options(0, &opts).expect("open CUDA device 0")
    })
}

/// The CUDA backend as models open it by default: prefill products on
/// tensor cores where the device has them.
fn cuda_tc() -> &'static CudaBackend {
    static B: OnceLock<CudaBackend> = OnceLock::new();
    B.get_or_init(|| CudaBackend::new(0).expect("open CUDA device 0"))
}

fn main() {
    let mut all = Vec::new();
    for (name, check) in checks::<CpuBackend>() {
        all.push(trials::plain(format!("cpu::{name}"), move || check(&CpuBackend::new())));
    }
    for (name, check) in checks::<CudaBackend>() {
        all.push(trials::cuda(format!("cuda::{name}"), move || check(cuda())));
    }
    all.push(trials::cuda("cuda::linear_tc", || {
        tensor::check_linear_tc(cuda_tc(), cuda())
    }));
    all.push(trials::cuda("cuda::moe_tc", || tensor::check_moe_tc(cuda_tc(), cuda())));
    all.push(trials::cuda("cuda::attention_tc", || {
        flash::check_attention_tc(cuda_tc(), cuda())
    }));
    all.push(trials::cuda("cuda::linear_many_tc", || {
        fused::check_linear_many_with(cuda_tc(), &[2, 8, 17, 70], 1e-5)
    }));
    all.push(trials::cuda("cuda::token_tiles", || {
        fused::check_token_tiles(cuda(), &[2, 3, 4, 5, 7, 8], None);
        fused::check_token_tiles(cuda_tc(), &[2, 3, 5, 8], Some(1e-5));
    }));
    all.extend(cpu_kernels::trials());
    trials::run(all)
}

/// The CPU kernels one by one (the scalar one is the reference for the
/// SIMD ones), and the checks `linear` makes before reading any bytes.
#[path = "backend_ops/cpu_kernels.rs"]
mod cpu_kernels;
