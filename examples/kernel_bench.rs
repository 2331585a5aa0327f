//! CPU kernel benchmark: memory bandwidth of this machine, then `linear`
//! on an 8192×2048 matrix (4/8/2-bit, bf16; 1, 8, 32 and, at 4 and 8 bits, 128 tokens).
//!
//! `cargo run --release --example kernel_bench`
//!
//! Each product rotates through a set of matrices that together hold more
//! than 4× the last-level cache, so that every call streams its weights
//! from memory. Prints markdown tables (as kept in BENCHMARKS.md).
//! `--hot` uses one matrix of each kind instead (weights from cache: the
//! compute ceiling of the kernels) and skips the bandwidth tests.
//! `RAYON_NUM_THREADS` sets the number of threads.

mod common;
use common::{bf16s, l3_bytes, quant_matrix};
use moeflux::backend::cpu::matmul::{linear_with, Kernel};
use moeflux::format::{Dtype, MatrixData, MatrixView};
use std::hint::black_box;
use std::time::Instant;

const ROWS: usize = 8192;
const COLS: usize = 2048;
const GROUP: usize = 64;

/// Mean, sample standard deviation, median and best of some timings
/// (seconds).
struct Stats {
    mean: f64,
    sd: f64,
    median: f64,
    best: f64,
}

fn stats(t: &[f64]) -> Stats {
    let mean = t.iter().sum::<f64>() / t.len() as f64;
    let var = t.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (t.len().max(2) - 1) as f64;
    let mut sorted = t.to_vec();
    sorted.sort_by(f64::total_cmp);
    Stats {
        mean,
        sd: var.sqrt(),
        median: sorted[sorted.len() / 2],
        best: sorted[0],
    }
}

fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Memory bandwidth: a 1 GiB copy (read + write bytes counted) and a
/// streaming sum (read bytes), on one thread and on all of them.
fn bandwidth() {
    use rayon::prelude::*;
    const LEN: usize = 1 << 30;
    const REPS: usize = 7;
    let src: Vec<u64> = (0..LEN / 8).map(|i| i as u64).collect();
    let mut dst = vec![1u64; LEN / 8];
    let chunk = LEN / 8 / (4 * rayon::current_num_threads());
    println!("| memory, 1 GiB buffers | threads | best GB/s | median GB/s | mean ± sd GB/s |");
    println!("| --- | --- | --- | --- | --- |");
    let report = |what: &str, threads: usize, bytes: usize, f: &mut dyn FnMut()| {
        let t: Vec<f64> = (0..REPS)
            .map(|_| {
                let t0 = Instant::now();
                f();
                t0.elapsed().as_secs_f64()
            })
            .collect();
        let s = stats(&t);
        let gb = bytes as f64 / 1e9;
        let rates: Vec<f64> = t.iter().map(|x| gb / x).collect();
        let r = stats(&rates);
        println!(
            "| {what} | {threads} | {:.1} | {:.1} | {:.1} ± {:.1} |",
            gb / s.best,
            gb / s.median,
            r.mean,
            r.sd
        );
    };
    let n = rayon::current_num_threads();
    report("copy_from_slice (read + write)", 1, 2 * LEN, &mut || {
        dst.copy_from_slice(black_box(&src))
    });
    report("copy (read + write)", n, 2 * LEN, &mut || {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s))
    });
    let sum = |s: &[u64]| s.iter().fold(0u64, |a, &v| a.wrapping_add(v));
    report("streaming sum (read)", 1, LEN, &mut || {
        black_box(sum(black_box(&src)));
    });
    report("streaming sum (read)", n, LEN, &mut || {
        black_box(src.par_chunks(chunk).map(sum).reduce(|| 0, u64::wrapping_add));
    });
    black_box(&dst);
}

/// Weights of one benchmarked kind.
#[derive(Clone, Copy)]
enum Kind {
    Quant(u32),
    Bf16,
}

impl Kind {
    fn name(self) -> String {
        match self {
            Kind::Quant(b) => format!("{b}-bit g{GROUP}"),
            Kind::Bf16 => "bf16".into(),
        }
    }
}

/// A random `[ROWS, COLS]` matrix of `kind` (random words; scales and
/// biases small bf16 values).
fn matrix(kind: Kind, seed: u64) -> MatrixView {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    match kind {
        Kind::Quant(bits) => quant_matrix(ROWS, COLS, bits, GROUP, &mut s),
        Kind::Bf16 => MatrixView {
            rows: ROWS,
            cols: COLS,
            data: MatrixData::Float {
                dtype: Dtype::Bf16,
                // Random bits would include NaNs and huge values: use a plain pattern.
                data: bf16s(ROWS * COLS, 0.003),
            },
        },
    }
}

/// Time `linear` with `n` tokens, rotating through `mats`.
fn bench_linear(kernel: Kernel, mats: &[MatrixView], n: usize, calls: usize) -> Stats {
    let x: Vec<f32> = (0..n * COLS)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut y = vec![0.0f32; n * ROWS];
    let mut times = Vec::with_capacity(calls);
    for i in 0..calls + mats.len() {
        let m = &mats[i % mats.len()];
        let t0 = Instant::now();
        if let Err(e) = linear_with(kernel, m, &x, n, &mut y) {
            eprintln!("linear failed: {e}");
            std::process::exit(1);
        }
        // The first pass over the set warms up (page faults, thread pool).
        if i >= mats.len() {
            times.push(t0.elapsed().as_secs_f64());
        }
        black_box(&y);
    }
    stats(&times)
}

fn main() {
    // `--hot`: one matrix per kind, so the products run from cache (the
    // compute ceiling of the kernels); memory bandwidth is skipped.
    let hot = std::env::args().any(|a| a == "--hot");
    let l3 = l3_bytes();
    println!(
        "CPU: {} ({} threads in the rayon pool), last-level cache {} MiB",
        cpu_model(),
        rayon::current_num_threads(),
        l3 >> 20
    );
    println!(
        "kernel: {}\n",
        match Kernel::detect_fast() {
            Kernel::Amx =>
                "amx (fast path) for quantized products of several tokens, vnni for one token, avx512 (exact), avx2 for the rest (all measured below)",
            Kernel::Avx512Vnni =>
                "vnni (fast path) for quantized products, avx512 (exact) for one-token ones, avx2 for the rest (all measured below)",
            Kernel::Avx512 => "avx512 for one-token quantized products, avx2 for the rest (both measured below)",
            Kernel::Avx2 => "avx2",
            Kernel::Scalar => "scalar",
        }
    );
    if !hot {
        bandwidth();
    }
    let placement = if hot {
        "--hot: one matrix of each kind, called again and again, so the weights come from cache (compute ceiling)"
            .to_string()
    } else {
        format!(
            "each call uses the next matrix of a set holding more than 4× the last-level cache ({} MiB), so the weights stream from memory",
            (4 * l3) >> 20
        )
    };
    println!(
        "\n`linear` y[n, {ROWS}] = x[n, {COLS}]·Wᵀ; {placement}. GB/s = weight bytes (weights + scales + biases) / time; \
         GFLOP/s = 2·rows·cols·n / time.\n"
    );
    println!(
        "| weights | kernel | n | matrices in set | MiB each | time ms (mean ± sd) | GB/s (mean) | GB/s (median) | GB/s (best) | GFLOP/s (median) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let runs: &[(Kind, &[usize])] = &[
        (Kind::Quant(4), &[1, 8, 32, 128]),
        (Kind::Quant(8), &[1, 8, 32, 128]),
        (Kind::Quant(2), &[1, 8, 32]),
        (Kind::Bf16, &[1, 8, 32]),
    ];
    for &(kind, ns) in runs {
        let one = matrix(kind, 1).nbytes();
        let count = if hot { 1 } else { (4 * l3).div_ceil(one) + 1 };
        let mats: Vec<MatrixView> = (0..count as u64).map(|i| matrix(kind, i + 1)).collect();
        // AVX-512 covers one-token quantized products only; the AVX2
        // kernels run beside it for comparison (and for the rest).
        let quant = matches!(kind, Kind::Quant(_));
        let kernels: Vec<Kernel> = [
            Kernel::Amx,
            Kernel::Avx512Vnni,
            Kernel::Avx512,
            Kernel::Avx2,
            Kernel::Scalar,
        ]
        .into_iter()
        .filter(|k| k.available())
        .filter(|&k| match k {
            Kernel::Avx512 | Kernel::Avx512Vnni | Kernel::Amx => quant,
            Kernel::Scalar => Kernel::detect() == Kernel::Scalar || matches!(kind, Kind::Quant(4)),
            Kernel::Avx2 => true,
        })
        .collect();
        for &kernel in &kernels {
            for &n in ns {
                if n > 1
                    && (kernel == Kernel::Avx512 || (kernel == Kernel::Scalar && Kernel::detect() != Kernel::Scalar))
                {
                    continue;
                }
                let calls = (160 / n).max(10).max(2 * count);
                let s = bench_linear(kernel, &mats, n, calls);
                let gb = one as f64 / 1e9;
                let flop = 2.0 * (ROWS * COLS * n) as f64;
                println!(
                    "| {} | {kernel:?} | {n} | {count} | {:.1} | {:.3} ± {:.3} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    kind.name(),
                    one as f64 / (1 << 20) as f64,
                    s.mean * 1e3,
                    s.sd * 1e3,
                    gb / s.mean,
                    gb / s.median,
                    gb / s.best,
                    flop / s.median / 1e9
                );
            }
        }
    }
}
