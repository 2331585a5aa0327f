//! `moeflux bench`: prefill (pp) and decode (tg) throughput, repeated,
//! with the expert traffic and the floor it implies: on the CPU, expert
//! bytes read per token over the read bandwidth of all threads; on CUDA, expert bytes
//! copied to the device per token over the pinned host→device bandwidth
//! measured in the same run, with the expert cache's hit rate.

use super::bench_cuda::print_cuda;
use super::bench_rows::{
    ahead_json, kv_json, kv_note, mean_sd, print_ahead, print_phases, print_ram, print_storage, ram_json, routing_note,
    Phases, Row,
};
use super::model_args::ModelArgs;
use anyhow::Context;
use clap::Args;
use moeflux::experts::memory::storage_read_bytes;
use moeflux::experts::CacheStats;
use moeflux::experts::StatsSnapshot;
use moeflux::synth::token_ids;
use moeflux::{BatchItem, Model, Session};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens per prefill run (0 skips the pp row); a list
    /// (`512,1024`) gives a row each, as llama-bench.
    #[arg(
        short = 'p',
        long,
        default_value = "512",
        value_delimiter = ',',
        value_name = "N[,N…]"
    )]
    pub prompt: Vec<usize>,
    /// Generated tokens per decode run (0 skips the tg row); a list gives
    /// a row each.
    #[arg(
        short = 'n',
        long,
        default_value = "128",
        value_delimiter = ',',
        value_name = "N[,N…]"
    )]
    pub gen: Vec<usize>,
    /// Repetitions of each row (1 to 1000).
    #[arg(short = 'r', long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub reps: u16,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// After the timed runs of each row, one more with the device
    /// synchronized at phase boundaries, and the time per phase printed.
    #[arg(long)]
    pub timing: bool,
    /// Evict the expert files from the page cache before every run
    /// (cold-cache numbers: experts then come from the disk).
    #[arg(long)]
    pub cold: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Tokens per prefill chunk (1 evaluates the prompt token by token)
    /// [default: the model's: 512 on the CPU, up to 4096 on CUDA].
    #[arg(long)]
    pub chunk: Option<usize>,
    /// Tokens of context evaluated (untimed) before each decode run, so
    /// that tg is measured at that depth (as after a prompt of that
    /// length); a list gives a tg row for each.
    #[arg(short = 'd', long, default_value = "0", value_delimiter = ',', value_name = "N[,N…]")]
    pub depth: Vec<usize>,
    /// Sequences evaluated together, in one forward pass per step
    /// (`Model::eval_batch`): pp runs this many prompts at once (each step
    /// takes chunk ÷ N tokens of each), tg this many streams of one token
    /// per step. tok/s is then the aggregate over all of them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
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

/// Best-of-3 read bandwidth of a 512 MiB buffer summed by every thread of
/// the pool at once (as decode reads its weights), in GB/s.
fn read_bandwidth() -> f64 {
    use rayon::prelude::*;
    let n = (512 << 20) / 8;
    let src: Vec<u64> = (0..n as u64).collect();
    let chunk = n / (4 * rayon::current_num_threads());
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = src
            .par_chunks(chunk.max(1))
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .reduce(|| 0, u64::wrapping_add);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(s);
    }
    (8 * n) as f64 / best / 1e9
}

/// The sessions of one run (`streams` of them): the context of a decode
/// at `depth` evaluated (untimed) already, each its own.
fn prepared<'m>(
    model: &'m Model,
    chunk: usize,
    depth: usize,
    vocab: usize,
    streams: usize,
) -> anyhow::Result<Vec<Session<'m>>> {
    (0..streams)
        .map(|i| {
            let mut s = model.session()?;
            s.set_chunk_size(chunk);
            if depth > 0 {
                s.eval_prompt(&token_ids(depth, vocab, 7 + i as u64), 0)?;
            }
            Ok(s)
        })
        .collect()
}

/// The tokens of run `seed` for each of `streams` sequences (the first
/// stream's are those of a single-stream run).
fn run_tokens(n: usize, vocab: usize, seed: u64, streams: usize) -> Vec<Vec<u32>> {
    (0..streams)
        .map(|i| token_ids(n.max(1), vocab, seed + 7919 * i as u64))
        .collect()
}

/// Run a prompt (pp) or a token-by-token decode (tg) after what each
/// session holds: one session alone as a user would, several together
/// in one `eval_batch` per step (a prompt step takes chunk ÷ N tokens of
/// each).
fn run_once(model: &Model, ss: &mut [Session<'_>], toks: &[Vec<u32>], pp: bool) -> anyhow::Result<()> {
    if let [s] = ss {
        let p0 = s.pos();
        if pp {
            s.eval_prompt(&toks[0], p0)?;
        } else {
            for (i, &tk) in toks[0].iter().enumerate() {
                s.eval_token(tk, p0 + i)?;
            }
        }
        return Ok(());
    }
    let len = toks.iter().map(Vec::len).min().unwrap_or(0);
    let step = match pp {
        true => (ss[0].chunk_size() / ss.len()).max(1),
        false => 1,
    };
    for at in (0..len).step_by(step) {
        let end = (at + step).min(len);
        let mut items: Vec<BatchItem> = ss
            .iter_mut()
            .zip(toks)
            .map(|(session, t)| BatchItem {
                session,
                tokens: &t[at..end],
                all: false,
            })
            .collect();
        model.eval_batch(&mut items)?;
    }
    Ok(())
}

fn cache_delta(a: CacheStats, b: CacheStats) -> CacheStats {
    CacheStats {
        hits: b.hits - a.hits,
        misses: b.misses - a.misses,
        bypassed: b.bypassed - a.bypassed,
        prefetched: b.prefetched - a.prefetched,
        prefetch_hits: b.prefetch_hits - a.prefetch_hits,
        bytes_copied: b.bytes_copied - a.bytes_copied,
        on_host: b.on_host - a.on_host,
        bytes_on_host: b.bytes_on_host - a.bytes_on_host,
        stall_ns: b.stall_ns - a.stall_ns,
        host_steps: b.host_steps - a.host_steps,
        host_ns: b.host_ns - a.host_ns,
        host_last: b.host_last - a.host_last,
        hints: b.hints - a.hints,
        guesses: b.guesses - a.guesses,
        rank_copied: std::array::from_fn(|i| b.rank_copied[i] - a.rank_copied[i]),
        rank_used: std::array::from_fn(|i| b.rank_used[i] - a.rank_used[i]),
        repeat_seen: b.repeat_seen - a.repeat_seen,
        repeat_again: b.repeat_again - a.repeat_again,
        layer_parts_ns: std::array::from_fn(|i| b.layer_parts_ns[i] - a.layer_parts_ns[i]),
        layer_steps: b.layer_steps - a.layer_steps,
        layer_host_ns: std::array::from_fn(|i| b.layer_host_ns[i] - a.layer_host_ns[i]),
        ..b
    }
}

fn add_cache(a: Option<CacheStats>, d: CacheStats) -> CacheStats {
    let a = a.unwrap_or(CacheStats {
        slots: d.slots,
        resident: d.resident,
        ..CacheStats::default()
    });
    CacheStats {
        hits: a.hits + d.hits,
        misses: a.misses + d.misses,
        bypassed: a.bypassed + d.bypassed,
        prefetched: a.prefetched + d.prefetched,
        prefetch_hits: a.prefetch_hits + d.prefetch_hits,
        bytes_copied: a.bytes_copied + d.bytes_copied,
        on_host: a.on_host + d.on_host,
        bytes_on_host: a.bytes_on_host + d.bytes_on_host,
        stall_ns: a.stall_ns + d.stall_ns,
        host_steps: a.host_steps + d.host_steps,
        host_ns: a.host_ns + d.host_ns,
        host_last: a.host_last + d.host_last,
        hints: a.hints + d.hints,
        guesses: a.guesses + d.guesses,
        rank_copied: std::array::from_fn(|i| a.rank_copied[i] + d.rank_copied[i]),
        rank_used: std::array::from_fn(|i| a.rank_used[i] + d.rank_used[i]),
        repeat_seen: a.repeat_seen + d.repeat_seen,
        repeat_again: a.repeat_again + d.repeat_again,
        layer_parts_ns: std::array::from_fn(|i| a.layer_parts_ns[i] + d.layer_parts_ns[i]),
        layer_steps: a.layer_steps + d.layer_steps,
        layer_host_ns: std::array::from_fn(|i| a.layer_host_ns[i] + d.layer_host_ns[i]),
        ..a
    }
}

fn delta(a: StatsSnapshot, b: StatsSnapshot) -> StatsSnapshot {
    b.since(&a)
}

pub fn run(mut a: BenchArgs) -> anyhow::Result<()> {
    // Each stream's session holds the deepest context and the longest run
    // after it, as llama-bench sizes its context to the test.
    a.model.sequences = a.parallel as usize;
    if a.model.ctx.is_none() {
        let most = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        let need = most(&a.depth) + most(&a.prompt).max(most(&a.gen));
        a.model.ctx = Some(need.max(1));
    }
    let t0 = Instant::now();
    let model = a.model.open_model()?;
    let load_s = t0.elapsed().as_secs_f64();
    let vocab = model.n_vocab();
    let store = model.expert_store();
    let reps = usize::from(a.reps);
    let chunk = a.chunk.unwrap_or_else(|| model.prefill_chunk());
    let mut rows = Vec::new();

    let streams = a.parallel as usize;
    let measure = |name: String, n_tok: usize, pp: bool, tg_depth: usize| -> anyhow::Result<Row> {
        let mut tps = Vec::new();
        let mut traffic = StatsSnapshot::default();
        let mut cache: Option<CacheStats> = None;
        let mut secs = 0.0;
        let mut storage = Some(0u64);
        let depth = if pp { 0 } else { tg_depth };
        // Tokens of a run: all streams'.
        let run_tok = n_tok * streams;
        for r in 0..a.warmup {
            let mut ss = prepared(&model, chunk, depth, vocab, streams)?;
            run_once(&model, &mut ss, &run_tokens(n_tok, vocab, 1000 + r as u64, streams), pp)?;
        }
        for r in 0..reps {
            let mut ss = prepared(&model, chunk, depth, vocab, streams)?;
            if a.cold {
                evict(&a.model.model)?;
            }
            let toks = run_tokens(n_tok, vocab, r as u64 + 1, streams);
            let before = store.stats();
            let cache_before = model.expert_cache_stats();
            let disk_before = storage_read_bytes();
            let t = Instant::now();
            run_once(&model, &mut ss, &toks, pp)?;
            let dt = t.elapsed().as_secs_f64();
            storage = match (storage, disk_before, storage_read_bytes()) {
                (Some(s), Some(b0), Some(b1)) => Some(s + b1.saturating_sub(b0)),
                _ => None,
            };
            if let (Some(b0), Some(b1)) = (cache_before, model.expert_cache_stats()) {
                cache = Some(add_cache(cache, cache_delta(b0, b1)));
            }
            let d = delta(before, store.stats());
            traffic.bytes_read += d.bytes_read;
            traffic.read_ns += d.read_ns;
            secs += dt;
            tps.push(run_tok as f64 / dt);
            eprintln!("  {name} run {}/{reps}: {:.2} tok/s", r + 1, run_tok as f64 / dt);
        }
        let phases = if a.timing {
            let mut ss = prepared(&model, chunk, depth, vocab, streams)?;
            model.reset_timing();
            model.set_timing(true);
            let t0 = Instant::now();
            let r = run_once(&model, &mut ss, &run_tokens(n_tok, vocab, 2000, streams), pp);
            let wall = t0.elapsed().as_secs_f64();
            model.set_timing(false);
            r?;
            Some(Phases {
                times: model.phase_times(),
                ops: model.cpu_op_times(),
                wall,
                tokens: run_tok.max(1),
            })
        } else {
            None
        };
        Ok(Row {
            phases,
            name,
            tps,
            bytes_per_tok: traffic.bytes_read as f64 / (reps * run_tok) as f64,
            read_gbps: traffic.bytes_read as f64 / secs / 1e9,
            cache,
            tokens: reps * run_tok,
            secs,
            streams,
            storage,
        })
    };
    for &p in a.prompt.iter().filter(|&&p| p > 0) {
        let name = if chunk < p {
            format!("pp{p} (chunk {chunk})")
        } else {
            format!("pp{p}")
        };
        rows.push(measure(name, p, true, 0)?);
    }
    for &depth in &a.depth {
        for &n in a.gen.iter().filter(|&&n| n > 0) {
            let name = match depth {
                0 => format!("tg{n}"),
                d => format!("tg{n} @ d{d}"),
            };
            rows.push(measure(name, n, false, depth)?);
        }
    }
    let bw = model.on_compute_threads(read_bandwidth);
    let threads = model.cpu_threads().map_or(rayon::current_num_threads(), |p| p.threads);
    // The CPU's kernel (on CUDA, the one hybrid misses would use).
    let kernel = model
        .cpu_kernel()
        .unwrap_or_else(moeflux::backend::cpu::matmul::Kernel::detect)
        .name();
    let h2d = match model.pinned_copy_bandwidth() {
        Some(r) => Some(r?),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    if let Some(h2d) = h2d {
        return print_cuda(&mut out, &a.model, a.json, &model, &rows, load_s, h2d);
    }

    if a.json {
        let j: Vec<_> = rows
            .iter()
            .map(|r| {
                let (m, sd) = mean_sd(&r.tps);
                serde_json::json!({"test": r.name, "streams": r.streams, "tok_s_mean": m, "tok_s_sd": sd, "runs": r.tps,
                    "per_stream_tok_s": m / r.streams as f64,
                    "expert_bytes_per_token": r.bytes_per_tok, "expert_read_gb_s": r.read_gbps,
                    "floor_tok_s": bw * 1e9 / r.bytes_per_tok.max(1.0),
                    "storage_bytes_per_token": r.storage.map(|b| b as f64 / r.tokens.max(1) as f64)})
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::json!({"model": model.name(), "synth_routing": moeflux::synth::synth_routing(&a.model.model).map(|r| r.name()),
                "device": model.device_name(), "io": store.mode().name(), "io_auto": a.model.io == moeflux::experts::IoMode::Auto,
                "cold": a.cold, "load_s": load_s, "read_gb_s": bw, "threads": threads,
                "kernel": kernel, "ram_tier": ram_json(model.ram_stats()),
                "read_ahead": ahead_json(store.ahead_stats()), "kv_cache": kv_json(&model), "results": j})
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "model {}{} | device {} | io {}{}{} | kernel {} | load {:.1} s | read {:.1} GB/s ({} threads)",
        model.name(),
        routing_note(&a.model.model),
        model.device_name(),
        store.mode(),
        if a.model.io == moeflux::experts::IoMode::Auto {
            " (auto)"
        } else {
            ""
        },
        if a.cold { " (cold page cache)" } else { "" },
        kernel,
        load_s,
        bw,
        threads
    )?;
    writeln!(out, "{}", kv_note(&model))?;
    writeln!(
        out,
        "| test | tok/s | expert MB/token | expert read GB/s | floor tok/s (experts at read GB/s) |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    for r in &rows {
        let (m, sd) = mean_sd(&r.tps);
        let floor = bw * 1e9 / r.bytes_per_tok.max(1.0);
        writeln!(
            out,
            "| {} | {:.2} ± {:.2} | {:.1} | {:.2} | {:.1} |",
            r.label(),
            m,
            sd,
            r.bytes_per_tok / 1e6,
            r.read_gbps,
            floor
        )?;
    }
    print_storage(&mut out, &rows)?;
    print_ram(&mut out, model.ram_stats())?;
    print_ahead(&mut out, store.ahead_stats())?;
    print_phases(&mut out, &rows)?;
    Ok(())
}
