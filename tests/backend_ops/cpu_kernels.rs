//! The CPU `linear` kernels one by one against the naive reference, the
//! SIMD kernels (AVX2, AVX-512, AVX-512 VNNI, each where this CPU has it)
//! against the scalar one, a set of products against the products one by
//! one, and the size checks.

use super::reference;
use super::util::{close, float_matrix, quant_matrix, Rng};
use moeflux::backend::cpu::matmul::{linear_set_with, linear_with, Kernel, Product};
use moeflux::format::{Dtype, MatrixData, MatrixView, Region};

fn kernels() -> Vec<Kernel> {
    [
        Kernel::Scalar,
        Kernel::Avx2,
        Kernel::Avx512,
        Kernel::Avx512Vnni,
        Kernel::Amx,
    ]
    .into_iter()
    .filter(|k| k.available())
    .collect()
}

fn cases(rng: &mut Rng) -> Vec<(String, MatrixView, Vec<f64>)> {
    let mut out = Vec::new();
    for (bits, gs, rows, cols) in [
        (2, 32, 33, 256),
        (4, 64, 45, 512),
        (8, 128, 19, 384),
        (4, 16, 7, 96),
        (4, 64, 600, 2048),
        (2, 64, 21, 320),
        (8, 32, 11, 96),
        (8, 16, 5, 64),
        (2, 128, 9, 512),
        // A last 64-byte chunk of one group (VNNI's short chunk), and a
        // group of 128 and 256 columns (a whole chunk, two).
        (4, 64, 5, 320),
        (2, 128, 5, 384),
        (4, 128, 7, 384),
        (4, 256, 3, 768),
    ] {
        let (v, d) = quant_matrix(rng, rows, cols, bits, gs, false);
        out.push((format!("q{bits} gs{gs} [{rows}, {cols}]"), v, d));
    }
    // f16 scales; more than 16 groups in a row, and a partial last 16.
    for (bits, gs, rows, cols) in [(4, 32, 13, 640), (8, 64, 6, 1280)] {
        let (v, d) = quant_matrix(rng, rows, cols, bits, gs, true);
        out.push((format!("q{bits} gs{gs} f16 scales [{rows}, {cols}]"), v, d));
    }
    for (dtype, rows, cols) in [(Dtype::Bf16, 40, 333), (Dtype::F16, 9, 64), (Dtype::F32, 23, 41)] {
        let (v, d) = float_matrix(rng, rows, cols, dtype);
        out.push((format!("{dtype:?} [{rows}, {cols}]"), v, d));
    }
    out
}

/// The tests of this file, as trials.
pub fn trials() -> Vec<libtest_mimic::Trial> {
    vec![
        super::trials::plain(
            "cpu_kernels::every_kernel_matches_the_reference_and_the_scalar_kernel",
            every_kernel_matches_the_reference_and_the_scalar_kernel,
        ),
        super::trials::plain(
            "cpu_kernels::a_set_of_products_equals_the_products_one_by_one",
            a_set_of_products_equals_the_products_one_by_one,
        ),
        super::trials::plain(
            "cpu_kernels::linear_refuses_wrong_sizes_instead_of_reading_past_them",
            linear_refuses_wrong_sizes_instead_of_reading_past_them,
        ),
    ]
}

/// The tolerance of `k` against the reference: 2e-6 for the exact
/// kernels; the fast one rounds x to 16-bit integers per group (a relative
/// error of at most 1.5e-5 per element).
fn tolerance(k: Kernel) -> f64 {
    if k.is_exact() {
        2e-6
    } else {
        5e-5
    }
}

fn every_kernel_matches_the_reference_and_the_scalar_kernel() {
    let mut rng = Rng::new(11);
    for (name, view, dense) in cases(&mut rng) {
        for n in [1, 3, 4, 6, 9, 17] {
            let x = rng.vec(n * view.cols, 1.0);
            let want = reference::linear(&dense, view.rows, view.cols, &x, n);
            let mut scalar = vec![0.0f32; n * view.rows];
            linear_with(Kernel::Scalar, &view, &x, n, &mut scalar).expect("scalar linear");
            for k in kernels() {
                let mut y = vec![0.0f32; n * view.rows];
                linear_with(k, &view, &x, n, &mut y).expect("linear");
                close(&format!("{k:?} {name} n={n}"), &y, &want, tolerance(k));
                if k != Kernel::Scalar {
                    let as_f64: Vec<f64> = scalar.iter().map(|&v| v as f64).collect();
                    close(&format!("{k:?} vs Scalar {name} n={n}"), &y, &as_f64, tolerance(k));
                }
            }
        }
    }
}

/// `linear_set_with` over matrices of several formats and token counts
/// (two sharing one input) gives, bit for bit, what `linear_with` gives
/// for each product alone.
fn a_set_of_products_equals_the_products_one_by_one() {
    let mut rng = Rng::new(13);
    let views: Vec<MatrixView> = cases(&mut rng).into_iter().map(|(_, v, _)| v).collect();
    let ns = [1, 1, 3, 1, 2, 1, 5, 1, 1, 4, 1, 1, 2];
    for k in kernels() {
        let xs: Vec<Vec<f32>> = views
            .iter()
            .zip(ns.iter().cycle())
            .map(|(v, &n)| rng.vec(n * v.cols, 1.0))
            .collect();
        let mut want = Vec::new();
        for ((v, &n), x) in views.iter().zip(ns.iter().cycle()).zip(&xs) {
            let mut y = vec![0.0f32; n * v.rows];
            linear_with(k, v, x, n, &mut y).expect("linear");
            want.push(y);
        }
        let mut got: Vec<Vec<f32>> = want.iter().map(|y| vec![f32::NAN; y.len()]).collect();
        let mut ps: Vec<Product> = views
            .iter()
            .zip(ns.iter().cycle())
            .zip(&xs)
            .zip(got.iter_mut())
            .map(|(((w, &n), x), y)| Product { w, x, n, y })
            .collect();
        linear_set_with(k, &mut ps).expect("linear set");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{k:?}: product {i} of the set differs from linear_with");
        }
        // Two products over one input (prepared once).
        let other = quant_matrix(&mut rng, 17, views[1].cols, 4, 64, true).0;
        let (a, b) = (&views[1], &other);
        let x = rng.vec(a.cols, 1.0);
        let (mut ya, mut yb) = (vec![0.0f32; a.rows], vec![0.0f32; b.rows]);
        let (mut wa, mut wb) = (ya.clone(), yb.clone());
        linear_with(k, a, &x, 1, &mut wa).expect("linear");
        linear_with(k, b, &x, 1, &mut wb).expect("linear");
        let mut ps = [
            Product {
                w: a,
                x: &x,
                n: 1,
                y: &mut ya,
            },
            Product {
                w: b,
                x: &x,
                n: 1,
                y: &mut yb,
            },
        ];
        linear_set_with(k, &mut ps).expect("linear set");
        assert!(ya == wa && yb == wb, "{k:?}: shared-input set differs");
    }
}

fn linear_refuses_wrong_sizes_instead_of_reading_past_them() {
    let mut rng = Rng::new(12);
    let (view, _) = quant_matrix(&mut rng, 8, 128, 4, 64, false);
    let MatrixData::Quant {
        bits,
        group_size,
        weight,
        scales,
        biases,
        scale_dtype,
    } = view.data.clone()
    else {
        unreachable!("quant_matrix makes a quantized view")
    };
    let with = |weight: Region, group_size: usize| MatrixView {
        rows: 8,
        cols: 128,
        data: MatrixData::Quant {
            bits,
            group_size,
            weight,
            scales: scales.clone(),
            biases: biases.clone(),
            scale_dtype,
        },
    };
    let x = rng.vec(2 * 128, 1.0);
    let mut y = vec![0.0f32; 2 * 8];
    for k in kernels() {
        assert!(linear_with(k, &view, &x, 2, &mut y).is_ok());
        assert!(linear_with(k, &view, &x[..200], 2, &mut y).is_err(), "short x accepted");
        assert!(linear_with(k, &view, &x, 2, &mut y[..15]).is_err(), "short y accepted");
        // A weight region one row short, as a corrupt layout could make it.
        let short = with(weight.sub(0, weight.len() - 64), group_size);
        assert!(
            linear_with(k, &short, &x, 2, &mut y).is_err(),
            "short weight region accepted"
        );
        assert!(
            linear_with(k, &with(weight.clone(), 48), &x, 2, &mut y).is_err(),
            "group size 48 of 128 columns accepted"
        );
    }
}
