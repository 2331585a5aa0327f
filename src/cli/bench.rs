//! `moeflux bench`: prefill (pp) and decode (tg) throughput, repeated,
//! with the expert traffic and the floor it implies.

use anyhow::Context;
use clap::Args;
use moeflux::experts::{IoMode, StatsSnapshot};
use moeflux::{Model, Options};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    /// Packed model directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt tokens per prefill run (0 skips the pp row).
    #[arg(short = 'p', long, default_value_t = 512)]
    pub prompt: usize,
    /// Generated tokens per decode run (0 skips the tg row).
    #[arg(short = 'n', long, default_value_t = 128)]
    pub gen: usize,
    /// Repetitions of each row.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub reps: usize,
    /// Device: auto or cpu.
    #[arg(long, default_value = "auto")]
    pub device: moeflux::Device,
    /// How experts are read: pread, mmap or direct.
    #[arg(long, default_value = "pread")]
    pub io: IoMode,
    /// Evict the expert files from the page cache before every run
    /// (cold-cache numbers: experts then come from the disk).
    #[arg(long)]
    pub cold: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Deterministic token ids (xorshift), spread over the vocabulary.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

/// Drop the expert files from the page cache (POSIX_FADV_DONTNEED).
fn evict(dir: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let ex = dir.join("packed_experts");
    for e in std::fs::read_dir(&ex).with_context(|| ex.display().to_string())? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "bin") {
            let f = std::fs::File::open(&p)?;
            f.sync_all().ok();
            // SAFETY: plain syscall on an open descriptor.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    Ok(())
}

/// Best-of-3 bandwidth of a 512 MiB memory copy, in GB/s of bytes read.
fn copy_bandwidth() -> f64 {
    let n = 512 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    n as f64 / best / 1e9
}

struct Row {
    name: String,
    tps: Vec<f64>,
    bytes_per_tok: f64,
    read_gbps: f64,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (m, var.sqrt())
}

fn delta(a: StatsSnapshot, b: StatsSnapshot) -> StatsSnapshot {
    StatsSnapshot {
        experts_read: b.experts_read - a.experts_read,
        bytes_read: b.bytes_read - a.bytes_read,
        read_ns: b.read_ns - a.read_ns,
    }
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let opts = Options {
        device: a.device,
        io_mode: a.io,
        ..Options::default()
    };
    let t0 = Instant::now();
    let model = Model::open(&a.model, &opts).with_context(|| format!("opening {}", a.model.display()))?;
    let load_s = t0.elapsed().as_secs_f64();
    let vocab = model.n_vocab();
    let store = model.expert_store();
    let reps = a.reps.max(1);
    let mut rows = Vec::new();

    let measure = |name: String, n_tok: usize, pp: bool| -> anyhow::Result<Row> {
        let mut tps = Vec::new();
        let mut traffic = StatsSnapshot::default();
        let mut secs = 0.0;
        for r in 0..reps {
            if a.cold {
                evict(&a.model)?;
            }
            let mut s = model.session()?;
            let toks = tokens(n_tok.max(1), vocab, r as u64 + 1);
            let before = store.stats();
            let t = Instant::now();
            if pp {
                s.eval_prompt(&toks, 0)?;
            } else {
                for (pos, &tk) in toks.iter().enumerate() {
                    s.eval_token(tk, pos)?;
                }
            }
            let dt = t.elapsed().as_secs_f64();
            let d = delta(before, store.stats());
            traffic.bytes_read += d.bytes_read;
            traffic.read_ns += d.read_ns;
            secs += dt;
            tps.push(n_tok as f64 / dt);
            eprintln!("  {name} run {}/{reps}: {:.2} tok/s", r + 1, n_tok as f64 / dt);
        }
        Ok(Row {
            name,
            tps,
            bytes_per_tok: traffic.bytes_read as f64 / (reps * n_tok) as f64,
            read_gbps: traffic.bytes_read as f64 / secs / 1e9,
        })
    };
    if a.prompt > 0 {
        rows.push(measure(format!("pp{}", a.prompt), a.prompt, true)?);
    }
    if a.gen > 0 {
        rows.push(measure(format!("tg{}", a.gen), a.gen, false)?);
    }
    let bw = copy_bandwidth();

    if a.json {
        let j: Vec<_> = rows
            .iter()
            .map(|r| {
                let (m, sd) = mean_sd(&r.tps);
                serde_json::json!({"test": r.name, "tok_s_mean": m, "tok_s_sd": sd, "runs": r.tps,
                    "expert_bytes_per_token": r.bytes_per_tok, "expert_read_gb_s": r.read_gbps,
                    "floor_tok_s": bw * 1e9 / r.bytes_per_tok.max(1.0)})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"model": model.name(), "device": model.device_name(), "io": format!("{:?}", store.mode()),
                "cold": a.cold, "load_s": load_s, "memcpy_gb_s": bw, "results": j})
        );
        return Ok(());
    }
    println!(
        "model {} | device {} | io {:?}{} | load {:.1} s | memcpy {:.1} GB/s",
        model.name(),
        model.device_name(),
        store.mode(),
        if a.cold { " (cold page cache)" } else { "" },
        load_s,
        bw
    );
    println!("| test | tok/s | expert MB/token | expert read GB/s | floor tok/s (memcpy) |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        let (m, sd) = mean_sd(&r.tps);
        let floor = bw * 1e9 / r.bytes_per_tok.max(1.0);
        println!(
            "| {} | {:.2} ± {:.2} | {:.1} | {:.2} | {:.1} |",
            r.name,
            m,
            sd,
            r.bytes_per_tok / 1e6,
            r.read_gbps,
            floor
        );
    }
    Ok(())
}
