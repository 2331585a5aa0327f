//! `bench`'s CUDA table: tok/s with the expert cache's hit rate, the bytes
//! streamed per token, the rate misses were served at, and the floor.

use super::bench_rows::{
    kv_json, kv_note, mean_sd, print_phases, print_ram, print_storage, ram_json, routing_note, Row,
};
use super::model_args::ModelArgs;
use moeflux::experts::{CacheStats, SplitModel};
use moeflux::Model;
use std::io::Write;

/// What a CUDA row shows of the expert cache.
struct CacheCols {
    hit_rate: f64,
    mb_per_tok: f64,
    /// Expert MB per token computed on the CPU (`--hybrid`).
    cpu_mb_per_tok: f64,
    copy_gbps: f64,
    floor: Option<f64>,
}

/// What the copies ahead of need (router guesses, the last token's
/// experts, whole next layers) came to over `tokens` tokens: experts a
/// token, their share of the experts copied, and the share of them hit
/// before they were evicted. None without any.
fn ahead_cols(c: &CacheStats, tokens: usize) -> Option<(f64, f64, f64)> {
    (c.prefetched > 0).then(|| {
        let pf = c.prefetched as f64;
        (
            pf / tokens.max(1) as f64,
            pf / (pf + c.misses as f64),
            c.prefetch_hits as f64 / pf,
        )
    })
}

/// How often the router's guesses copied ahead were used before their
/// eviction, rank by rank (`1st 97% of 1200`, best first): what a guess
/// of each rank is worth. None when none was copied.
fn rank_line(c: &CacheStats) -> Option<String> {
    let ranks: Vec<String> = c
        .rank_copied
        .iter()
        .zip(&c.rank_used)
        .enumerate()
        .filter(|(_, (&n, _))| n > 0)
        .map(|(r, (&n, &u))| format!("{} {:.0}% of {n}", ordinal(r + 1), 100.0 * u as f64 / n as f64))
        .collect();
    (!ranks.is_empty()).then(|| format!("router guesses used before eviction, by rank: {}", ranks.join(", ")))
}

/// How many of a layer's experts at one token it used again at the next,
/// and whether that is enough for them to be copied ahead.
fn repeat_line(c: &CacheStats) -> Option<String> {
    (c.repeat_seen > 0 && !c.resident).then(|| {
        let share = c.repeat_again as f64 / c.repeat_seen as f64;
        let min = moeflux::experts::repeats::REPEAT_MIN;
        let copied = match share >= min {
            true => "copied ahead",
            false => "not copied ahead",
        };
        format!(
            "a layer's experts used again at its next token: {:.0}% of {} ({copied}: the bar is {:.0}%)",
            100.0 * share,
            c.repeat_seen,
            100.0 * min
        )
    })
}

/// `1st`, `2nd`, `3rd`, `4th`, … (ranks up to [`moeflux::experts::GUESS_RANKS`]).
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, r) if r != 11 => "st",
        (2, r) if r != 12 => "nd",
        (3, r) if r != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// `copy_gbps` is the achieved streaming rate: bytes copied over the
/// timed runs' wall time. The floor: copies at the pinned H2D rate and,
/// with a split, the CPU's share at its modelled rate, both at once.
fn cache_cols(c: &CacheStats, tokens: usize, secs: f64, h2d_gbps: f64, split: Option<&SplitModel>) -> CacheCols {
    let looked = (c.hits + c.misses).max(1) as f64;
    let per_tok = c.bytes_copied as f64 / tokens.max(1) as f64;
    let cpu_per_tok = c.bytes_on_host as f64 / tokens.max(1) as f64;
    let cpu_s = split.map_or(0.0, |m| cpu_per_tok * m.cpu_s_per_byte);
    let copy_s = per_tok / (h2d_gbps * 1e9);
    let floor_s = copy_s.max(cpu_s);
    CacheCols {
        hit_rate: c.hits as f64 / looked,
        mb_per_tok: per_tok / 1e6,
        cpu_mb_per_tok: cpu_per_tok / 1e6,
        copy_gbps: if secs > 0.0 {
            c.bytes_copied as f64 / secs / 1e9
        } else {
            0.0
        },
        floor: (floor_s > 0.0).then(|| 1.0 / floor_s),
    }
}

/// The CUDA table (or JSON): tok/s, the expert cache's hit rate, bytes
/// streamed per token, the rate misses were served at, and the floor.
pub(super) fn print_cuda(
    out: &mut impl Write,
    args: &ModelArgs,
    json: bool,
    model: &Model,
    rows: &[Row],
    load_s: f64,
    h2d: f64,
) -> anyhow::Result<()> {
    let gpu = model.gpu_name().unwrap_or("?");
    let k = model.config().num_experts_per_tok;
    let prefill = match model.cuda_tensor_cores() {
        Some(true) => "tensor cores (split f16)",
        _ => "f32 (exact)",
    };
    let cache = model.expert_cache();
    let split = cache.and_then(|c| c.split);
    let cache_desc = match cache {
        Some(c) if c.resident => format!(
            "all {} experts resident ({:.2} GB)",
            c.experts,
            c.expert_bytes as f64 / 1e9
        ),
        Some(c) => format!(
            "{:.2} GB = {} of {} experts ({:.0}%){}{}",
            c.budget_bytes as f64 / 1e9,
            c.slots,
            c.experts,
            100.0 * c.slots as f64 / c.experts.max(1) as f64,
            if args.no_prefetch {
                ", no prefetch"
            } else {
                ", prefetch"
            },
            tiers_note(&c, model.config().num_experts)
        ),
        None => "none".into(),
    };
    if json {
        let j: Vec<_> = rows
            .iter()
            .map(|r| {
                let (m, sd) = mean_sd(&r.tps);
                let c = r.cache.unwrap_or_default();
                let cols = cache_cols(&c, r.tokens, r.secs, h2d, split.as_ref());
                let ahead = ahead_cols(&c, r.tokens);
                serde_json::json!({"test": r.name, "streams": r.streams, "tok_s_mean": m, "tok_s_sd": sd, "runs": r.tps,
                    "per_stream_tok_s": m / r.streams as f64,
                    "hits": c.hits, "misses": c.misses, "bypassed": c.bypassed, "on_cpu": c.on_host,
                    "prefetched": c.prefetched, "prefetch_hits": c.prefetch_hits,
                    "hit_rate": cols.hit_rate, "bytes_streamed_per_token": cols.mb_per_tok * 1e6,
                    "bytes_on_cpu_per_token": cols.cpu_mb_per_tok * 1e6,
                    "cpu_steps": c.host_steps, "cpu_step_us": c.host_ns as f64 / 1e3 / c.host_steps.max(1) as f64,
                    "cpu_last": c.host_last, "guesses_per_hint": c.guesses as f64 / c.hints.max(1) as f64,
                    "copied_ahead_per_token": ahead.map(|a| a.0),
                    "guess_rank_copied": c.rank_copied, "guess_rank_used": c.rank_used,
                    "repeat_seen": c.repeat_seen, "repeat_again": c.repeat_again,
                    "copied_ahead_used": ahead.map(|a| a.2),
                    "copy_gb_s": cols.copy_gbps, "stall_s": c.stall_ns as f64 * 1e-9, "floor_tok_s": cols.floor,
                    "layer_parts_us": (c.layer_steps > 0).then(|| moeflux::experts::budget::LAYER_PARTS.iter().zip(c.layer_parts_ns)
                        .map(|(name, ns)| (name.to_string(), serde_json::json!(ns as f64 / 1e3 / c.layer_steps as f64)))
                        .collect::<serde_json::Map<_, _>>()),
                    "storage_bytes_per_token": r.storage.map(|b| b as f64 / r.tokens.max(1) as f64)})
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::json!({"model": model.name(), "synth_routing": moeflux::synth::synth_routing(&args.model).map(|r| r.name()),
                "device": format!("{} ({gpu})", args.device), "prefill_products": prefill, "expert_cache": cache_desc,
                "hybrid": split.map(|m| m.describe()), "ram_tier": ram_json(model.ram_stats()), "load_s": load_s, "h2d_pinned_gb_s": h2d,
                "layers_pinned": cache.filter(|c| !c.resident).map(|c| c.pinned_layers),
                "layers_held": cache.filter(|c| !c.resident).map(|c| c.held_layers), "kv_cache": kv_json(model), "results": j})
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "model {}{} | device cuda ({gpu}) | prefill products {prefill} | expert cache {cache_desc} | load {load_s:.1} s | pinned H2D {h2d:.1} GB/s",
        model.name(),
        routing_note(&args.model)
    )?;
    writeln!(out, "{}", kv_note(model))?;
    if let Some(m) = &split {
        writeln!(out, "{}", m.describe())?;
    }
    writeln!(
        out,
        "| test | tok/s | hit rate | MB streamed/token | MB on CPU/token | copy GB/s | floor tok/s |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    for r in rows {
        let (m, sd) = mean_sd(&r.tps);
        let c = r.cache.unwrap_or_default();
        let cols = cache_cols(&c, r.tokens, r.secs, h2d, split.as_ref());
        let floor = cols.floor.map_or("-".to_string(), |f| format!("{f:.1}"));
        // A resident model looks its experts up on the device, uncounted:
        // every lookup hits.
        let hit = match cache.is_some_and(|c| c.resident) {
            true => "resident".to_string(),
            false => format!("{:.1}%", 100.0 * cols.hit_rate),
        };
        writeln!(
            out,
            "| {} | {:.2} ± {:.2} | {hit} | {:.1} | {:.1} | {:.1} | {floor} |",
            r.label(),
            m,
            sd,
            cols.mb_per_tok,
            cols.cpu_mb_per_tok,
            cols.copy_gbps
        )?;
    }
    for r in rows {
        let c = r.cache.unwrap_or_default();
        if c.host_steps > 0 {
            let per = |ns: u64| ns as f64 / 1e3 / c.host_steps as f64;
            writeln!(
                out,
                "{} CPU steps: {} of {:.1} experts each, {:.0} µs of CPU; the GPU's share was done first in {:.0}% of them",
                r.label(),
                c.host_steps,
                c.on_host as f64 / c.host_steps as f64,
                per(c.host_ns),
                100.0 * c.host_last as f64 / c.host_steps as f64
            )?;
        }
        if c.layer_steps > 0 {
            let parts: Vec<String> = moeflux::experts::budget::LAYER_PARTS
                .iter()
                .zip(c.layer_parts_ns)
                .map(|(name, ns)| format!("{name} {:.1}", ns as f64 / 1e3 / c.layer_steps as f64))
                .collect();
            let total: u64 = c.layer_parts_ns.iter().sum();
            writeln!(
                out,
                "{} a MoE layer on the GPU, µs ({} steps): {} = {:.1}; the host: ids to copies issued {:.1}, then to the next routing {:.1}",
                r.label(),
                c.layer_steps,
                parts.join(" + "),
                total as f64 / 1e3 / c.layer_steps as f64,
                c.layer_host_ns[0] as f64 / 1e3 / c.layer_steps as f64,
                c.layer_host_ns[1] as f64 / 1e3 / c.layer_steps as f64
            )?;
        }
        if let Some((per_tok, share, used)) = ahead_cols(&c, r.tokens) {
            writeln!(
                out,
                "{} copied ahead of need: {per_tok:.1} experts a token ({:.0}% of the experts copied), {:.0}% of them hit before eviction",
                r.label(),
                100.0 * share,
                100.0 * used
            )?;
        }
        if c.hints > 0 && c.guesses < c.hints * k as u64 {
            writeln!(
                out,
                "{} router guesses copied ahead: {:.2} of {k} per layer (tuned on token times)",
                r.label(),
                c.guesses as f64 / c.hints as f64
            )?;
        }
        if let Some(line) = rank_line(&c) {
            writeln!(out, "{} {line}", r.label())?;
        }
        if let Some(line) = repeat_line(&c) {
            writeln!(out, "{} {line}", r.label())?;
        }
    }
    print_storage(out, rows)?;
    print_ram(out, model.ram_stats())?;
    print_phases(out, rows)?;
    Ok(())
}

/// `, layers pinned 33 / held 7 / staged 0` where not every MoE layer's
/// expert file is pinned (`experts::tiers`), else nothing.
fn tiers_note(c: &moeflux::backend::cuda::CacheReport, n_experts: usize) -> String {
    let layers = c.experts / n_experts.max(1);
    if c.pinned_layers >= layers {
        return String::new();
    }
    let staged = layers.saturating_sub(c.pinned_layers + c.held_layers);
    format!(
        ", layers pinned {} / held {} / staged {staged}",
        c.pinned_layers, c.held_layers
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_named_only_when_some_layer_is_not_pinned() {
        let mut c = moeflux::backend::cuda::CacheReport {
            budget_bytes: 0,
            expert_bytes: 0,
            slots: 2560,
            experts: 40 * 256,
            resident: false,
            minimum: false,
            load_s: 0.0,
            split: None,
            pinned_layers: 40,
            held_layers: 0,
        };
        assert_eq!(tiers_note(&c, 256), "");
        (c.pinned_layers, c.held_layers) = (30, 7);
        assert_eq!(tiers_note(&c, 256), ", layers pinned 30 / held 7 / staged 3");
    }

    #[test]
    fn copies_ahead_are_counted_per_token() {
        let c = CacheStats {
            misses: 100,
            prefetched: 300,
            prefetch_hits: 225,
            ..CacheStats::default()
        };
        let (per_tok, share, used) = ahead_cols(&c, 10).expect("copies ahead");
        assert_eq!(per_tok, 30.0);
        assert_eq!(share, 0.75);
        assert_eq!(used, 0.75);
        assert!(ahead_cols(&CacheStats::default(), 10).is_none());
    }

    #[test]
    fn guesses_are_reported_by_rank() {
        assert_eq!(rank_line(&CacheStats::default()), None);
        let mut c = CacheStats::default();
        c.rank_copied[..3].copy_from_slice(&[200, 100, 40]);
        c.rank_used[..3].copy_from_slice(&[190, 75, 10]);
        assert_eq!(
            rank_line(&c).as_deref(),
            Some("router guesses used before eviction, by rank: 1st 95% of 200, 2nd 75% of 100, 3rd 25% of 40")
        );
        c.repeat_seen = 800;
        c.repeat_again = 24;
        assert_eq!(
            repeat_line(&c).as_deref(),
            Some("a layer's experts used again at its next token: 3% of 800 (not copied ahead: the bar is 50%)")
        );
        c.resident = true;
        assert_eq!(repeat_line(&c), None, "nothing is copied ahead when resident");
        assert_eq!(
            [1, 2, 3, 4, 8, 11, 12, 13, 21, 22].map(ordinal),
            ["1st", "2nd", "3rd", "4th", "8th", "11th", "12th", "13th", "21st", "22nd"]
        );
    }
}
