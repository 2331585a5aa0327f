//! `bench`'s measured rows and what every table prints of them: mean ±
//! sd, the storage line, the phases of `--timing`.

use moeflux::experts::{AheadStats, CacheStats, RamStats};
use moeflux::Model;
use std::io::Write;
use std::path::Path;

pub(super) struct Row {
    pub(super) name: String,
    pub(super) tps: Vec<f64>,
    pub(super) bytes_per_tok: f64,
    pub(super) read_gbps: f64,
    /// CUDA: the expert cache's counters over the timed runs.
    pub(super) cache: Option<CacheStats>,
    pub(super) tokens: usize,
    /// Seconds of the timed runs.
    pub(super) secs: f64,
    /// `--timing`: one extra, synchronized run.
    pub(super) phases: Option<Phases>,
    /// Sequences run together (`--parallel`); tok/s is their aggregate.
    pub(super) streams: usize,
    /// Bytes the timed runs fetched from storage (`/proc/self/io`), where known.
    pub(super) storage: Option<u64>,
}

impl Row {
    /// The row's label: with several streams, `NAME ×N`.
    pub(super) fn label(&self) -> String {
        match self.streams {
            1 => self.name.clone(),
            n => format!("{} ×{n}", self.name),
        }
    }
}

/// What `--timing` measured in its run.
pub(super) struct Phases {
    /// Seconds per phase.
    pub(super) times: moeflux::model::timing::PhaseTimes,
    /// CPU: seconds and calls per kind of operation.
    pub(super) ops: Option<Vec<moeflux::backend::cpu::OpTime>>,
    /// Seconds of the whole run.
    pub(super) wall: f64,
    pub(super) tokens: usize,
}

pub(super) fn print_phases(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    for r in rows.iter().filter(|r| r.streams > 1) {
        let (m, _) = mean_sd(&r.tps);
        writeln!(
            out,
            "{}: {} sequences per forward pass, {:.2} tok/s each",
            r.label(),
            r.streams,
            m / r.streams as f64
        )?;
    }
    for r in rows {
        if let Some(ph) = &r.phases {
            let (p, n) = (&ph.times, ph.tokens);
            let ms = |s: f64| 1e3 * s / n.max(1) as f64;
            writeln!(
                out,
                "{} phases, ms/token (one synchronized run): attention {:.3} | routing {:.3} | experts {:.3} | dense ffn {:.3} | lm head {:.3}",
                r.label(),
                ms(p.attention),
                ms(p.routing),
                ms(p.experts),
                ms(p.dense_ffn),
                ms(p.lm_head)
            )?;
            if let Some(ops) = &ph.ops {
                let timed: f64 = ops.iter().map(|o| o.secs).sum();
                let parts: Vec<String> = ops
                    .iter()
                    .map(|o| format!("{} {:.3} ({:.0} calls)", o.name, ms(o.secs), o.calls as f64 / n as f64))
                    .collect();
                writeln!(
                    out,
                    "{} cpu operations, ms/token: {} | other {:.3} | total {:.3}",
                    r.label(),
                    parts.join(" | "),
                    ms(ph.wall - timed),
                    ms(ph.wall)
                )?;
            }
        }
    }
    Ok(())
}

pub(super) fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (m, var.sqrt())
}

/// ` | routing R (synth)` for a model `synth` made, else nothing.
pub(super) fn routing_note(dir: &Path) -> String {
    moeflux::synth::synth_routing(dir).map_or(String::new(), |r| format!(" | routing {} (synth)", r.name()))
}

/// The RAM tier's counters for `--json` (null without one).
pub(super) fn ram_json(ram: Option<RamStats>) -> serde_json::Value {
    match ram {
        Some(r) => serde_json::json!({"slots": r.slots, "bytes": r.slots * r.slot_bytes,
            "hits": r.hits, "misses": r.misses, "hit_rate": r.hit_rate()}),
        None => serde_json::Value::Null,
    }
}

/// The RAM tier's line (`--ram-cache`), over the whole run.
pub(super) fn print_ram(out: &mut impl Write, ram: Option<RamStats>) -> std::io::Result<()> {
    if let Some(r) = ram {
        writeln!(
            out,
            "RAM tier: {} experts ({:.2} GB), hit rate {:.1}% over the run, warm-up included ({} from disk)",
            r.slots,
            (r.slots * r.slot_bytes) as f64 / 1e9,
            100.0 * r.hit_rate(),
            r.misses
        )?;
    }
    Ok(())
}

/// The reads ahead's counters for `--json` (null when off).
pub(super) fn ahead_json(a: Option<AheadStats>) -> serde_json::Value {
    match a {
        Some(a) => serde_json::json!({"read": a.read, "used": a.used}),
        None => serde_json::Value::Null,
    }
}

/// The reads ahead's line (the CPU with `--io direct`), over the whole run.
pub(super) fn print_ahead(out: &mut impl Write, a: Option<AheadStats>) -> std::io::Result<()> {
    if let Some(a) = a {
        writeln!(
            out,
            "read ahead from disk: {} experts (the next layer's router guesses), {:.1}% of them used, over the run",
            a.read,
            100.0 * a.used as f64 / a.read.max(1) as f64
        )?;
    }
    Ok(())
}

/// Per row, what came from storage rather than the page cache or memory
/// (`/proc/self/io`), when the timed runs read more than a megabyte.
pub(super) fn print_storage(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    for r in rows {
        if let Some(b) = r.storage.filter(|&b| b > 1 << 20) {
            writeln!(
                out,
                "{}: {:.1} MB/token read from storage ({:.2} GB/s over the timed runs; /proc/self/io)",
                r.label(),
                b as f64 / r.tokens.max(1) as f64 / 1e6,
                b as f64 / r.secs.max(1e-9) / 1e9
            )?;
        }
    }
    Ok(())
}

/// The KV caches of a run, for the header: their types, the context and
/// sequences they hold, their bytes a token (all layers, and one
/// attention layer) and in all.
pub fn kv_note(model: &Model) -> String {
    let (kv, p) = (model.kv_types(), model.memory_plan());
    format!(
        "KV {}/{} | ctx {} × {} | KV {} B/token ({} B/token/layer) {:.2} GB",
        kv.k,
        kv.v,
        p.ctx,
        p.sequences,
        p.kv_per_token,
        model.kv_bytes_per_token_layer(),
        p.kv_bytes as f64 / 1e9
    )
}

/// [`kv_note`] as JSON fields.
pub fn kv_json(model: &Model) -> serde_json::Value {
    let (kv, p) = (model.kv_types(), model.memory_plan());
    serde_json::json!({"type_k": kv.k.name(), "type_v": kv.v.name(), "ctx": p.ctx, "sequences": p.sequences,
        "bytes_per_token": p.kv_per_token, "bytes_per_token_layer": model.kv_bytes_per_token_layer(),
        "bytes": p.kv_bytes, "expert_room_bytes": p.expert_room, "activation_bytes": p.activations,
        "margin_bytes": p.margin})
}
