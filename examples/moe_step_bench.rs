//! One token's MoE step on the CPU, as decode and `--hybrid`'s CPU share
//! run it: the time of a step against its number of experts, with the
//! weights coming from memory.
//!
//! `cargo run --release --example moe_step_bench [-- THREADS [COUNTS [STEPS]]]`
//! (COUNTS: the experts a step to time, comma-separated, default
//! 1,2,4,8,16; STEPS timed for each, default 300: more for a profiler)
//!
//! Experts of the Qwen3.6-35B-A3B shape (hidden 2048, intermediate 512,
//! 4-bit in groups of 64; 1,769,472 bytes each), enough of them to hold
//! more than 4× the last-level cache, used in rotation so that every step
//! reads its experts from memory. Steps are 150 µs apart (as the layers
//! of a streamed CUDA token are a few hundred µs apart). Prints a markdown
//! table: experts a step, median and mean µs, GB/s of expert bytes at the
//! median. What it is for: a step's cost that does not depend on its size
//! (docs/notes/2026-11-22-to-12-02-benchmark-log.md, "Where a streamed token's
//! time goes, from the host").

mod common;
use common::{l3_bytes, quant_matrix};
use moeflux::backend::cpu::MoeStep;
use moeflux::format::MatrixView;
use std::time::{Duration, Instant};

const HIDDEN: usize = 2048;
const INTER: usize = 512;
const GROUP: usize = 64;
const WARMUP: usize = 20;
/// The pause between steps, as between the layers of a streamed token.
const GAP: Duration = Duration::from_micros(150);

fn main() {
    let threads = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let counts: Vec<usize> = match std::env::args().nth(2) {
        Some(a) => a.split(',').filter_map(|c| c.parse().ok()).collect(),
        None => vec![1, 2, 4, 8, 16],
    };
    if counts.is_empty() || counts.contains(&0) {
        eprintln!("moe_step_bench: COUNTS must be experts a step, comma-separated, each at least 1");
        std::process::exit(2);
    }
    let steps: usize = std::env::args()
        .nth(3)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300)
        .max(2);
    let one = 3 * (INTER * HIDDEN / 2 + 2 * 2 * INTER * HIDDEN / GROUP);
    let count = (4 * l3_bytes()).div_ceil(one) + 8;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let experts: Vec<[MatrixView; 3]> = (0..count)
        .map(|_| {
            [
                quant_matrix(INTER, HIDDEN, 4, GROUP, &mut seed),
                quant_matrix(INTER, HIDDEN, 4, GROUP, &mut seed),
                quant_matrix(HIDDEN, INTER, 4, GROUP, &mut seed),
            ]
        })
        .collect();
    let step = match MoeStep::new(threads, false) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("moe_step_bench: {e}");
            std::process::exit(1);
        }
    };
    let x: Vec<f32> = (0..HIDDEN).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let mut out = vec![0f32; HIDDEN];
    println!(
        "{threads} threads, {count} experts of {one} bytes in rotation ({} MiB), steps {} µs apart\n",
        (count * one) >> 20,
        GAP.as_micros()
    );
    println!("| experts a step | median µs | mean ± sd µs | GB/s (median) |");
    println!("| --- | --- | --- | --- |");
    let mut at = 0;
    for e in counts {
        let weights = vec![1.0 / e as f32; e];
        let mut times = Vec::with_capacity(steps);
        for i in 0..steps + WARMUP {
            let mats: Vec<[MatrixView; 3]> = (0..e).map(|j| experts[(at + j) % count].clone()).collect();
            at += e;
            let t0 = Instant::now();
            if let Err(err) = step.step(&x, INTER, &mats, &weights, &mut out) {
                eprintln!("moe_step_bench: {err}");
                std::process::exit(1);
            }
            if i >= WARMUP {
                times.push(t0.elapsed().as_secs_f64());
            }
            std::thread::sleep(GAP);
        }
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let sd = (times.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / (times.len() - 1) as f64).sqrt();
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "| {e} | {:.1} | {:.1} ± {:.1} | {:.1} |",
            median * 1e6,
            mean * 1e6,
            sd * 1e6,
            (e * one) as f64 / median / 1e9
        );
    }
    std::hint::black_box(&out);
}
