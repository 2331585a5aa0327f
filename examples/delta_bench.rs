//! The CPU GatedDeltaNet decode op alone: one token through
//! `gated_delta_seqs` (the model's path) for 30 layers of the Qwen3.6-35B
//! shape (16 key heads, 32 value heads of 128 × 128, conv 4), each layer
//! with its own 2 MiB state, on the backend's pool as a decode pass runs.
//!
//! `cargo run --release --example delta_bench [-- --gap-mb N]`
//!
//! `--gap-mb N` reads N MiB of other memory on the calling thread before
//! each call (a serial gap; 0 by default), to see how the op's time
//! depends on what ran before it. Prints µs a call per round and the gap's
//! mean length; the op's state traffic is 4 MiB a call (read and write).

use moeflux::backend::cpu::CpuBackend;
use moeflux::backend::{Backend, DeltaArgs, DeltaWeights, Seg};
use std::time::Instant;

const LAYERS: usize = 30;
const ROUNDS: usize = 5;
const ITERS: usize = 40;

fn main() {
    let gap_mb: usize = std::env::args()
        .skip_while(|a| a != "--gap-mb")
        .nth(1)
        .map(|v| v.parse().expect("--gap-mb takes a whole number of MiB"))
        .unwrap_or(0);
    let b = CpuBackend::with_options(0, false).expect("CPU backend");
    let (hk, hv, dk, dv, kern) = (16, 32, 128, 128, 4);
    let conv_dim = 2 * hk * dk + hv * dv;
    let up = |v: f32, n: usize| b.upload(&vec![v; n]).expect("upload");
    let (mut qkv, mut a, mut beta) = (up(0.01, conv_dim), up(0.1, hv), up(0.1, hv));
    let (conv_w, a_log, dt) = (up(0.1, conv_dim * kern), up(0.1, hv), up(0.1, hv));
    let mut convs: Vec<_> = (0..LAYERS).map(|_| up(0.0, conv_dim * (kern - 1))).collect();
    let mut ssms: Vec<_> = (0..LAYERS).map(|_| up(0.0, hv * dv * dk)).collect();
    let mut out = b.alloc(hv * dv).expect("alloc");
    let args = DeltaArgs {
        n: 1,
        k_heads: hk,
        v_heads: hv,
        k_dim: dk,
        v_dim: dv,
        kernel: kern,
    };
    let other = vec![1.0f32; (gap_mb.max(1) << 18) * 2];
    let mut sink = 0.0f32;
    b.run(|| {
        for round in 0..ROUNDS {
            let (mut op, mut gap) = (0.0f64, 0.0f64);
            for _ in 0..ITERS {
                for l in 0..LAYERS {
                    let t = Instant::now();
                    if gap_mb > 0 {
                        let off = (l * 4096) % (gap_mb << 18);
                        sink += other[off..off + (gap_mb << 18)].iter().step_by(16).sum::<f32>();
                    }
                    gap += t.elapsed().as_secs_f64();
                    let t = Instant::now();
                    let w = DeltaWeights {
                        conv_w: &conv_w,
                        a_log: &a_log,
                        dt_bias: &dt,
                    };
                    let mut states = [(&mut convs[l], &mut ssms[l])];
                    let segs = [Seg { off: 0, n: 1, pos0: 0 }];
                    b.gated_delta_seqs(&mut qkv, &mut a, &mut beta, w, &mut states, &segs, args, &mut out)
                        .expect("gated_delta_seqs");
                    op += t.elapsed().as_secs_f64();
                }
            }
            let calls = (ITERS * LAYERS) as f64;
            println!(
                "round {round}: {:.1} µs a call (gap {:.1} µs)",
                op * 1e6 / calls,
                gap * 1e6 / calls
            );
        }
    });
    std::hint::black_box(sink);
}
