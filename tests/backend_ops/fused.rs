//! The fused ops (`linear_many`, `swiglu_linear`, `add_rms_norm`): each
//! against the naive reference, and bit for bit against the ops it fuses
//! on the same backend (every backend promises the same arithmetic).

use super::reference;
use super::util::{close, float_matrix, quant_matrix, Rng};
use super::{run, up};
use moeflux::backend::Backend;
use moeflux::format::{Dtype, MatrixView};

/// One matrix of a test: (bits, group size, rows, f16 scales), bits 16 is bf16.
type Spec = (usize, usize, usize, bool);

fn make(rng: &mut Rng, (bits, gs, rows, f16): Spec, cols: usize) -> (MatrixView, Vec<f64>) {
    match bits {
        16 => float_matrix(rng, rows, cols, Dtype::Bf16),
        _ => quant_matrix(rng, rows, cols, bits, gs, f16),
    }
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i} is {} fused, {} composed", got[i], want[i]);
    }
}

/// Sets of matrices with the same columns: formats mixed (an 8-bit router
/// beside 4-bit projections, a 1-row gate), few rows and more rows than
/// one launch's blocks cover (grid stride), more matrices than one launch
/// takes, and matrices the one-token kernel does not take (bf16; a group
/// smaller than a 16-byte chunk), which must fall back.
pub fn check_linear_many<B: Backend>(b: &B) {
    check_linear_many_with(b, &[1, 3], 2e-6);
}

/// check_linear_many for products of `ns` tokens, within `tol` of the
/// reference (and bit for bit `linear`'s result for each matrix alone).
pub fn check_linear_many_with<B: Backend>(b: &B, ns: &[usize], tol: f64) {
    let mut rng = Rng::new(21);
    let sets: [(&str, usize, Vec<Spec>); 4] = [
        (
            "mixer-like",
            256,
            vec![
                (4, 64, 300, false),
                (4, 32, 129, true),
                (8, 64, 17, false),
                (8, 128, 1, false),
            ],
        ),
        (
            "large",
            64,
            vec![(4, 64, 9000, false), (8, 64, 37, true), (2, 64, 130, false)],
        ),
        (
            "five, two that fall back",
            128,
            vec![
                (4, 64, 33, false),
                (16, 0, 20, false),
                (8, 32, 65, false),
                (2, 128, 9, true),
                (4, 16, 12, false),
                (4, 128, 40, false),
                (8, 64, 3, true),
            ],
        ),
        ("one", 512, vec![(4, 64, 70, false)]),
    ];
    for (name, cols, specs) in &sets {
        let mats: Vec<(MatrixView, Vec<f64>)> = specs.iter().map(|&s| make(&mut rng, s, *cols)).collect();
        let ms: Vec<B::Matrix> = mats.iter().map(|(v, _)| b.matrix(v).expect("matrix")).collect();
        let ws: Vec<&B::Matrix> = ms.iter().collect();
        for &n in ns {
            let x = rng.vec(n * cols, 1.0);
            let xb = up(b, &x);
            // Outputs: zeroed buffers and buffers holding old values.
            let mut ys: Vec<B::Buf> = specs
                .iter()
                .enumerate()
                .map(|(i, s)| match i % 2 {
                    0 => b.alloc(n * s.2).expect("alloc"),
                    _ => up(b, &rng.vec(n * s.2, 5.0)),
                })
                .collect();
            let mut yr: Vec<&mut B::Buf> = ys.iter_mut().collect();
            b.linear_many(&ws, &xb, n, &mut yr).expect("linear_many");
            for (i, ((view, dense), y)) in mats.iter().zip(&ys).enumerate() {
                let rows = view.rows;
                let what = format!("linear_many {name} matrix {i} {:?} [{rows}, {cols}] n={n}", specs[i]);
                let got = run(b, y, n * rows);
                close(&what, &got, &reference::linear(dense, rows, *cols, &x, n), tol);
                let mut one = b.alloc(n * rows).expect("alloc");
                b.linear(&ms[i], &xb, n, &mut one).expect("linear");
                same_bits(&format!("{what} vs linear"), &got, &run(b, &one, n * rows));
            }
        }
    }
    let mut y = b.alloc(8).expect("alloc");
    let m = b
        .matrix(&quant_matrix(&mut rng, 8, 64, 4, 64, false).0)
        .expect("matrix");
    assert!(
        b.linear_many(&[&m, &m], &up(b, &rng.vec(64, 1.0)), 1, &mut [&mut y])
            .is_err(),
        "linear_many accepted two matrices and one output"
    );
}

/// Matrices the one-token kernel takes (several formats) and ones it does
/// not (bf16; a small group), one token and several.
pub fn check_swiglu_linear<B: Backend>(b: &B) {
    let mut rng = Rng::new(22);
    let cases: [(Spec, usize); 5] = [
        ((4, 64, 37, false), 256),
        ((8, 128, 300, true), 512),
        ((2, 64, 4300, false), 128),
        ((4, 16, 9, false), 64),
        ((16, 0, 33, false), 96),
    ];
    for (spec, cols) in cases {
        let (view, dense) = make(&mut rng, spec, cols);
        let m = b.matrix(&view).expect("matrix");
        let rows = spec.2;
        for n in [1, 2, 5] {
            let g = rng.vec(n * cols, 6.0);
            let u = rng.vec(n * cols, 2.0);
            let (gb, ub) = (up(b, &g), up(b, &u));
            let mut y = b.alloc(n * rows).expect("alloc");
            b.swiglu_linear(&m, &gb, &ub, n, cols, &mut y).expect("swiglu_linear");
            let what = format!("swiglu_linear {spec:?} [{rows}, {cols}] n={n}");
            let got = run(b, &y, n * rows);
            close(
                &what,
                &got,
                &reference::swiglu_linear(&dense, rows, cols, &g, &u, n),
                2e-6,
            );
            let mut h = b.alloc(n * cols).expect("alloc");
            b.swiglu(&gb, &ub, n * cols, &mut h).expect("swiglu");
            let mut want = b.alloc(n * rows).expect("alloc");
            b.linear(&m, &h, n, &mut want).expect("linear");
            same_bits(&format!("{what} vs swiglu + linear"), &got, &run(b, &want, n * rows));
        }
    }
}

/// The residual add and the norm: x must hold the f32 sums, out the norm
/// of them, both as `add` then `rms_norm` make them.
pub fn check_add_rms_norm<B: Backend>(b: &B) {
    let mut rng = Rng::new(23);
    for (rows, dim) in [(1, 64), (5, 200), (3, 2048), (2, 1000), (4, 16)] {
        let len = rows * dim;
        let (x0, y0, w) = (rng.vec(len, 3.0), rng.vec(len, 2.0), rng.vec(dim, 1.5));
        let (mut x, yb, wb) = (up(b, &x0), up(b, &y0), up(b, &w));
        let mut out = b.alloc(len).expect("alloc");
        b.add_rms_norm(&mut x, &yb, &wb, rows, dim, 1e-6, &mut out)
            .expect("add_rms_norm");
        let sum: Vec<f32> = x0.iter().zip(&y0).map(|(a, c)| a + c).collect();
        let what = format!("add_rms_norm [{rows}, {dim}]");
        let (got_x, got) = (run(b, &x, len), run(b, &out, len));
        same_bits(&format!("{what} residual"), &got_x, &sum);
        close(&what, &got, &reference::rms_norm(&sum, &w, rows, dim, 1e-6), 2e-6);
        let mut xc = up(b, &x0);
        b.add(&mut xc, &yb, len).expect("add");
        let mut want = b.alloc(len).expect("alloc");
        b.rms_norm(&xc, &wb, rows, dim, 1e-6, &mut want).expect("rms_norm");
        same_bits(&format!("{what} vs add + rms_norm"), &got, &run(b, &want, len));
    }
}

/// Products of several tokens (a batched decode step) against each token
/// alone: bit for bit where a backend promises it (`tol` None: CUDA's
/// `matvec_qt` for 2 to 8 tokens, against `matvec_q`), else within `tol`
/// (CUDA's tensor-core `matvec_tc`). The quantized formats, a short
/// wide matrix (split columns), a tall one (blocks striding over rows),
/// wide rows (large tiles of shared memory), odd token counts (a tile
/// half used), rows that end inside a 16-row tile; `linear` and
/// `swiglu_linear`; each also against the reference.
pub fn check_token_tiles<B: Backend>(b: &B, ns: &[usize], tol: Option<f64>) {
    let ref_tol = tol.unwrap_or(0.0).max(2e-6);
    let alone = |what: &str, got: &[f32], want: &[f32]| match tol {
        None => same_bits(what, got, want),
        Some(t) => {
            let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            close(what, got, &want, t);
        }
    };
    let mut rng = Rng::new(23);
    // (The 5 groups of [21, 320] leave the last 16-row tile's scales a
    // tail of bytes short of a 16-byte copy: matvec_tc loads those plainly.)
    let cases: [(Spec, usize); 8] = [
        ((4, 64, 300, false), 2048),
        ((4, 64, 21, false), 320),
        ((8, 64, 37, true), 512),
        ((2, 64, 130, false), 256),
        ((4, 32, 45, false), 4096),
        ((8, 128, 9000, false), 1024),
        ((4, 64, 64, true), 6144),
        ((2, 128, 33, false), 10240),
    ];
    for (spec, cols) in cases {
        let (view, dense) = make(&mut rng, spec, cols);
        let m = b.matrix(&view).expect("matrix");
        let rows = spec.2;
        for &n in ns {
            let x = rng.vec(n * cols, 1.0);
            let u = rng.vec(n * cols, 2.0);
            let (xb, ub) = (up(b, &x), up(b, &u));
            let mut y = b.alloc(n * rows).expect("alloc");
            b.linear(&m, &xb, n, &mut y).expect("linear");
            let mut z = b.alloc(n * rows).expect("alloc");
            b.swiglu_linear(&m, &xb, &ub, n, cols, &mut z).expect("swiglu_linear");
            let what = format!("{spec:?} [{rows}, {cols}] n={n}");
            let (got, gotz) = (run(b, &y, n * rows), run(b, &z, n * rows));
            close(
                &format!("linear {what}"),
                &got,
                &reference::linear(&dense, rows, cols, &x, n),
                ref_tol,
            );
            close(
                &format!("swiglu_linear {what}"),
                &gotz,
                &reference::swiglu_linear(&dense, rows, cols, &x, &u, n),
                ref_tol,
            );
            for t in 0..n {
                let xt = up(b, &x[t * cols..(t + 1) * cols]);
                let ut = up(b, &u[t * cols..(t + 1) * cols]);
                let mut one = b.alloc(rows).expect("alloc");
                b.linear(&m, &xt, 1, &mut one).expect("linear");
                let row = t * rows..(t + 1) * rows;
                alone(
                    &format!("linear {what} token {t} vs alone"),
                    &got[row.clone()],
                    &run(b, &one, rows),
                );
                b.swiglu_linear(&m, &xt, &ut, 1, cols, &mut one).expect("swiglu_linear");
                alone(
                    &format!("swiglu_linear {what} token {t} vs alone"),
                    &gotz[row],
                    &run(b, &one, rows),
                );
            }
        }
    }
}
