//! The MoE step on the GPU: route on the device, then run each routed
//! (token, expert) pair through gate/up and down and combine the pairs
//! of each token in a fixed order.
//!
//! With every expert resident and few tokens (decode), the expert kernels
//! read the routed ids and a device table directly: no host round trip.
//! Otherwise the ids come back to the host, which groups the pairs by
//! expert (each expert's weights read once per chunk), has the expert
//! cache copy the missing experts in, and launches one grouped kernel per
//! matrix. A streamed step of few pairs (decode) then runs the resident
//! path's two kernels, the pairs' expert addresses carried with the
//! launches (`PairBases`). Each pair's arithmetic is the same on every
//! path.

use super::buf::{CudaBuf, DevMem};
use super::cache::ExpertCache;
use super::driver::{Gpu, MAX_GRID_Y};
use super::host_cpu::HostSum;
use super::hybrid::{self, HostStep, HYBRID_TOKENS};
use super::moe_groups::{expert_layout, experts_tc, run_experts, run_experts_tc, ELayout, Groups};
use super::moe_mt;
use super::moe_routed::{routed_pairs, PairBases, Pairs, PAIR_BASES};
use super::tensor::{self, Half};
use super::timeline::Mark;
use crate::backend::{MoeArgs, MoeInputs};
use crate::config::Routing;
use crate::cuda_args;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Tokens up to which a resident model routes on the device alone (one
/// block row per (token, expert) pair: a batched decode step of up to 16
/// sequences stays off the host).
const DEVICE_ROUTE_TOKENS: usize = 16;
/// Experts per launch while streaming: the GPU computes one chunk while
/// the next is read and copied.
pub(crate) const STREAM_CHUNK: usize = 32;
/// Tokens from which a step is a prompt's chunk: its misses stream
/// through probation instead of evicting the resident set.
const STREAM_TOKENS: usize = 64;
/// Most experts per token the router kernel takes.
const MAX_K: usize = 64;
/// Softmax routing over at most 32 × this many experts (and k ≤ 32) runs
/// one warp per token (`moe_route_warp`); larger, in a block (`moe_route`).
const ROUTE_WARP_MAX_J: usize = 32;
/// Most groups the `noaux_tc` router kernel takes.
const MAX_GROUPS: usize = 64;

/// Route `n` tokens on the device: ids `[n, k]` (u32) and weights `[n, k]`;
/// with `hint` (the next MoE layer's router logits `[E]` on this layer's
/// input), one more row of ids and weights: the guess at that layer's
/// experts. With `split` (the tokens' x and their experts' layout), where
/// the one-warp router runs, x is also split for `moe_mt` in the same
/// launch (`moe_route_split`) and returned; else the caller splits it.
#[allow(clippy::too_many_arguments)]
fn route(
    gpu: &Arc<Gpu>,
    logits: &CudaBuf,
    hint: Option<&CudaBuf>,
    bias: Option<&CudaBuf>,
    a: &MoeArgs,
    ids: &DevMem,
    wts: &CudaBuf,
    split: Option<(&CudaBuf, &ELayout)>,
) -> Result<Option<Half>> {
    let e = a.n_experts;
    let (mode, norm, n_group, topk_group, scale) = match *a.routing {
        Routing::Softmax { norm_topk_prob } => (0, norm_topk_prob, 1, 1, 1.0f32),
        Routing::NoauxTc {
            n_group,
            topk_group,
            routed_scaling_factor,
            norm_topk_prob,
        } => {
            if n_group == 0 || n_group > MAX_GROUPS || !e.is_multiple_of(n_group) || topk_group > n_group {
                return Err(Error::Invalid(format!(
                    "noaux_tc routing: {e} experts in {n_group} groups keeping {topk_group} (the CUDA router takes at most {MAX_GROUPS} groups)"
                )));
            }
            (1, norm_topk_prob, n_group, topk_group, routed_scaling_factor)
        }
        Routing::SoftmaxGroups {
            n_group,
            topk_group,
            routed_scaling_factor,
        } => {
            if n_group == 0 || n_group > MAX_GROUPS || !e.is_multiple_of(n_group) || topk_group > n_group {
                return Err(Error::Invalid(format!(
                    "group-limited routing: {e} experts in {n_group} groups keeping {topk_group} (the CUDA router takes at most {MAX_GROUPS} groups)"
                )));
            }
            (2, false, n_group, topk_group, routed_scaling_factor)
        }
    };
    if let Some(b) = bias {
        b.want("router bias", e)?;
    }
    if let Some(h) = hint {
        h.want("router hint logits", e)?;
    }
    let rows = a.n + hint.is_some() as usize;
    let smem = ((2 * e + n_group) * 4) as u32;
    let bp = match bias {
        Some(b) => b.read(gpu)?,
        None => 0,
    };
    let hp = match hint {
        Some(h) => h.read(gpu)?,
        None => 0,
    };
    let (lp, ip, wp) = (logits.read(gpu)?, ids.ptr(), wts.write(gpu, rows * a.k)?);
    let (ee, k, mode, norm, ng, tg) = (
        e as i32,
        a.k as i32,
        mode,
        norm as i32,
        n_group as i32,
        topk_group as i32,
    );
    let nn = a.n as i32;
    if mode == 0 && e <= 32 * ROUTE_WARP_MAX_J && a.k <= 32 {
        let Some((x, el)) = split else {
            gpu.launch(
                gpu.k.moe_route_warp,
                (rows as u32, 1, 1),
                32,
                0,
                cuda_args![lp, ip, wp, ee, k, norm, hp, nn],
            )?;
            return Ok(None);
        };
        // The same routing, and x split for the experts in the same launch.
        let (half, pb, gs) = tensor::half_rows(gpu, a.n, a.hidden, el.fmt, el.gs_shift)?;
        let (xp, h, cc) = (x.read(gpu)?, half.arg, a.hidden as i32);
        gpu.launch(
            gpu.k.moe_route_split,
            (rows as u32, 1, 1),
            64,
            0,
            cuda_args![lp, ip, wp, ee, k, norm, hp, nn, xp, h.hi, h.lo, h.inv, h.sum, cc, gs, pb],
        )?;
        return Ok(Some(half));
    }
    gpu.launch(
        gpu.k.moe_route,
        (rows as u32, 1, 1),
        256,
        smem,
        cuda_args![lp, bp, ip, wp, ee, k, mode, norm, ng, tg, scale, hp, nn],
    )?;
    Ok(None)
}

/// Host-side grouping: the distinct experts in order, and for each the
/// pairs routed to it.
fn group_pairs(ids: &[u32], n_experts: usize) -> Result<BTreeMap<u32, Vec<i32>>> {
    let mut by: BTreeMap<u32, Vec<i32>> = BTreeMap::new();
    for (p, &e) in ids.iter().enumerate() {
        if e as usize >= n_experts {
            return Err(Error::Backend {
                backend: "cuda",
                msg: format!("the router chose expert {e} of {n_experts}"),
            });
        }
        by.entry(e).or_default().push(p as i32);
    }
    Ok(by)
}

type MoeIo<'a> = MoeInputs<'a, CudaBuf>;

/// `out[t] += Σ_j w[t,j] · expert_j(x[t])` for one layer; `cache` is the
/// model's expert cache when `store` is the one it holds.
pub(crate) fn moe(gpu: &Arc<Gpu>, cache: Option<&ExpertCache>, io: MoeIo, a: MoeArgs, out: &mut CudaBuf) -> Result<()> {
    let (n, k, e) = (a.n, a.k, a.n_experts);
    io.x.want("moe input", n * a.hidden)?;
    io.logits.want("moe router logits", n * e)?;
    out.want("moe output", n * a.hidden)?;
    if e != io.store.num_experts() {
        return Err(Error::Invalid(format!(
            "{e} router outputs for {} experts",
            io.store.num_experts()
        )));
    }
    if k == 0 || k > e || k > MAX_K {
        return Err(Error::Invalid(format!(
            "{k} experts per token of {e} (the CUDA router takes 1 to {MAX_K})"
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let ll = io.store.layer_layout(a.layer)?;
    let el = expert_layout(ll, io.store.group_size(), a.hidden, a.inter)?;
    // A hint is used only where it can help: one token, streaming.
    let hint = io
        .hint
        .as_ref()
        .map(|h| (h.layer, h.logits))
        .filter(|_| n == 1 && cache.is_some_and(|c| c.prefetching() && c.store_id() == io.store.id()));
    let rows = n + hint.is_some() as usize;
    let ids = DevMem::new(gpu, rows * k * 4)?;
    let wts = CudaBuf::zeroed(gpu, rows * k)?;
    let table = cache.filter(|c| c.resident()).and_then(|c| c.table_row(a.layer));
    // A resident batched decode step on tensor cores splits x for them in
    // the routing's launch.
    let mt = table.is_some() && n <= DEVICE_ROUTE_TOKENS && moe_mt::takes(gpu, &el, n);
    let split = mt.then_some((io.x, &el));
    let xh = route(gpu, io.logits, hint.map(|h| h.1), io.bias, &a, &ids, &wts, split)?;
    let h = CudaBuf::zeroed(gpu, n * k * a.inter)?; // [pairs, inter]
                                                    // `out` still reads as zeros (no shared expert): assign, do not add.
    let assign = out.take_zero(n * a.hidden) as i32;
    let op = out.write(gpu, n * a.hidden)?;
    match table {
        // A batched decode step on tensor cores: the same kernels as the
        // host's groups, each pair its own group.
        Some(t) if mt => {
            let d = CudaBuf::zeroed(gpu, n * k * a.hidden)?; // [pairs, hidden]
            let experts = moe_mt::Experts::Table {
                table: t,
                ids: ids.ptr(),
            };
            let xh = match xh {
                Some(xh) => xh,
                None => moe_mt::split_x(gpu, &el, io.x, &a)?,
            };
            moe_mt::run(gpu, el, &xh, &h, &d, experts, &a)?;
            combine(gpu, op, &d, &wts, &a, assign)
        }
        Some(t) if n <= DEVICE_ROUTE_TOKENS => {
            // All on the device: gate/up per pair, then down + combine per token.
            routed_pairs(
                gpu,
                el,
                io.x,
                &h,
                &wts,
                Pairs::Table {
                    table: t,
                    ids: ids.ptr(),
                },
                &a,
                op,
                assign,
            )
        }
        // Resident, on tensor cores: the pairs grouped on the device.
        Some(t) if experts_tc(gpu, &el, n, &a) => {
            let d = CudaBuf::zeroed(gpu, n * k * a.hidden)?; // [pairs, hidden]
            device_grouped(gpu, el, io.x, &ids, t, &h, &d, &a)?;
            combine(gpu, op, &d, &wts, &a, assign)
        }
        _ => {
            let to = Combine { op, assign };
            let cpu_part = grouped(gpu, cache, &io, el, &ids, &wts, hint.map(|h| h.0), &h, &a, to)?;
            if let Some(p) = cpu_part {
                hybrid::add_sum(gpu, out, p)?;
            }
            cache.map_or(Ok(()), |c| c.mark(Mark::Summed))
        }
    }
}

/// Where a host-grouped step's weighted sum goes: `out` at `op`, assigned
/// or added to.
#[derive(Clone, Copy)]
struct Combine {
    op: u64,
    assign: i32,
}

/// `out[t] (+)= Σ_j w[t, j]·d[t·k + j]` (`assign`: out reads as zeros and
/// is written, not added to); `op` is out's address.
fn combine(gpu: &Gpu, op: u64, d: &CudaBuf, wts: &CudaBuf, a: &MoeArgs, assign: i32) -> Result<()> {
    let (dp, wp) = (d.read(gpu)?, wts.read(gpu)?);
    let (nn, kk, hid) = (a.n as i32, a.k as i32, a.hidden as i32);
    let grid = ((a.n * a.hidden).div_ceil(256).clamp(1, 8192) as u32, 1, 1);
    gpu.launch(
        gpu.k.moe_combine,
        grid,
        256,
        0,
        cuda_args![op, dp, wp, nn, kk, hid, assign],
    )
}

/// The resident path of a long step: the pairs grouped by expert on the
/// device (`moe_count`, `moe_scatter`: each expert's pairs in ascending
/// order, as `group_pairs` makes them), one group per expert (`table`:
/// the layer's row of expert addresses; empty groups do nothing), then
/// the tensor-core expert kernels. No host round trip.
#[allow(clippy::too_many_arguments)]
fn device_grouped(
    gpu: &Arc<Gpu>,
    el: ELayout,
    x: &CudaBuf,
    ids: &DevMem,
    table: u64,
    h: &CudaBuf,
    d: &CudaBuf,
    a: &MoeArgs,
) -> Result<()> {
    let (e, np) = (a.n_experts, a.n * a.k);
    if e > MAX_GRID_Y {
        return Err(Error::Invalid(format!(
            "{e} experts in one launch (at most {MAX_GRID_Y})"
        )));
    }
    // [counts i32 × E][starts i32 × E][pairs i32 × np]
    let mem = DevMem::new(gpu, 4 * (2 * e + np))?;
    let (counts, starts, pairs) = (mem.ptr(), mem.ptr() + 4 * e as u64, mem.ptr() + 8 * e as u64);
    let (ip, npi) = (ids.ptr(), np as i32);
    gpu.launch(gpu.k.moe_count, (e as u32, 1, 1), 256, 0, cuda_args![ip, npi, counts])?;
    gpu.launch(
        gpu.k.moe_scatter,
        (e as u32, 1, 1),
        256,
        0,
        cuda_args![ip, npi, counts, starts, pairs],
    )?;
    let xh = tensor::to_half(gpu, x.read(gpu)?, None, a.n, a.n, a.hidden, el.fmt, el.gs_shift)?;
    let g = Groups {
        n: e,
        n_pairs: np,
        ptrs: table,
        starts,
        counts,
        pairs,
    };
    run_experts_tc(gpu, el, &xh, h, d, &g, a)
}

/// The host-grouped path: download the ids, fetch the experts (in chunks
/// that fit the cache), launch per chunk, and add the pairs up into `to`.
/// A step of at most `PAIR_BASES` pairs on the f32 kernels whose experts
/// fit in one launch carries their addresses to the resident path's
/// kernels instead (no group table, the combine in the down launch).
/// With a split model, the misses of a short step are shared with the
/// CPU; its weighted sum `[n, hidden]` is returned, to be added to the
/// output.
#[allow(clippy::too_many_arguments)]
fn grouped(
    gpu: &Arc<Gpu>,
    cache: Option<&ExpertCache>,
    io: &MoeIo,
    el: ELayout,
    ids: &DevMem,
    wts: &CudaBuf,
    hint: Option<usize>,
    h: &CudaBuf,
    a: &MoeArgs,
    to: Combine,
) -> Result<Option<HostSum>> {
    let (n, k) = (a.n, a.k);
    let split = cache.filter(|c| a.decode && n <= HYBRID_TOKENS && c.split().is_some());
    // The ids of the n tokens, then (with a hint) the next layer's guess;
    // for a split, the weights and the activations in the same wait.
    let mut host = vec![0u32; (n + hint.is_some() as usize) * k];
    let mut wh = vec![0f32; if split.is_some() { n * k } else { 0 }];
    let mut xh = vec![0f32; if split.is_some() { n * a.hidden } else { 0 }];
    let (wp, xp) = match split {
        Some(_) => (wts.read(gpu)?, io.x.read(gpu)?),
        None => (0, 0),
    };
    if let Some(c) = cache.filter(|_| a.decode && n <= HYBRID_TOKENS) {
        c.mark(Mark::Route)?;
    }
    gpu.publish_many(&mut [
        (bytemuck::cast_slice_mut(&mut host), ids.ptr()),
        (bytemuck::cast_slice_mut(&mut wh), wp),
        (bytemuck::cast_slice_mut(&mut xh), xp),
    ])?;
    if let Some(c) = cache {
        c.ids_back();
    }
    let by = group_pairs(&host[..n * k], a.n_experts)?;
    let experts: Vec<u32> = by.keys().copied().collect();
    // Without the model's cache (a store it does not hold), a cache just
    // for this call.
    let own;
    let cache = match cache {
        Some(c) => c,
        None => {
            own = ExpertCache::new(gpu, io.store, &[a.layer], experts.len(), 0, false)?;
            &own
        }
    };
    // x in f16 once for every launch of the step, when the experts run on
    // tensor cores.
    let x16 = match experts_tc(gpu, &el, n, a) || moe_mt::takes(gpu, &el, n) {
        true => Some(moe_mt::split_x(gpu, &el, io.x, a)?),
        false => None,
    };
    let per_launch = if cache.resident() {
        cache.free_slots()
    } else {
        STREAM_CHUNK.min(cache.free_slots())
    };
    let carried = x16.is_none() && n * k <= PAIR_BASES && experts.len() <= per_launch;
    // [pairs, hidden], for the grouped kernels.
    let d = match carried {
        true => None,
        false => Some(CudaBuf::zeroed(gpu, n * k * a.hidden)?),
    };
    let launch = |chunk: &[u32], addrs: &[u64]| -> Result<()> {
        let Some(d) = &d else {
            // Every expert of the step in one launch: pair p's address is
            // its expert's (0 for one the CPU computes).
            let mut pb = PairBases::default();
            for (b, e) in pb.p.iter_mut().zip(&host[..n * k]) {
                *b = chunk.iter().position(|c| c == e).map_or(0, |i| addrs[i]);
            }
            routed_pairs(gpu, el, io.x, h, wts, Pairs::Carried(&pb), a, to.op, to.assign)?;
            return cache.release(a.layer, chunk);
        };
        let groups = chunk.len();
        let mut starts = Vec::with_capacity(groups);
        let mut counts = Vec::with_capacity(groups);
        let mut pairs = Vec::new();
        for ex in chunk {
            let ps = &by[ex];
            starts.push(pairs.len() as i32);
            counts.push(ps.len() as i32);
            pairs.extend_from_slice(ps);
        }
        // One upload: [ptrs u64 × G][starts i32 × G][counts i32 × G][pairs i32 × P].
        let mut desc: Vec<u8> = Vec::with_capacity(16 * groups + 4 * pairs.len());
        desc.extend_from_slice(bytemuck::cast_slice(addrs));
        desc.extend_from_slice(bytemuck::cast_slice(&starts));
        desc.extend_from_slice(bytemuck::cast_slice(&counts));
        desc.extend_from_slice(bytemuck::cast_slice(&pairs));
        let dm = DevMem::from_host(gpu, &desc)?;
        let base = dm.ptr();
        let g = Groups {
            n: groups,
            n_pairs: pairs.len(),
            ptrs: base,
            starts: base + 8 * groups as u64,
            counts: base + 12 * groups as u64,
            pairs: base + 16 * groups as u64,
        };
        match &x16 {
            Some(xh) if moe_mt::takes(gpu, &el, n) => moe_mt::run(gpu, el, xh, h, d, moe_mt::Experts::Groups(&g), a)?,
            _ => run_experts(gpu, el, io.x, x16.as_ref(), h, d, &g, a)?,
        }
        cache.release(a.layer, chunk)
    };
    // A prompt's chunk through a cache that does not hold every expert:
    // hits first, misses into room that evicts nothing resident
    // (`experts/cache_stream.rs`).
    let stream = gpu.opts.prompt_stream && !cache.resident() && !a.decode && n >= STREAM_TOKENS;
    // Copies for the next layer: the experts it used at the last token and
    // the guess of its router, or all of them for a long chunk (unless the
    // chunk streams: a whole layer's copies would evict the resident set).
    let ahead = || -> Result<()> {
        if stream {
            return Ok(());
        }
        match (n, hint) {
            // The router's guesses first: they are the likelier to be used.
            (1, Some(next)) => {
                cache.prefetch_hint(io.store, next, &host[k..])?;
                cache.predict(io.store, a.layer, &experts)
            }
            (1, None) => cache.predict(io.store, a.layer, &experts),
            _ => cache.prefetch_next_layer(io.store, a.layer, n, k),
        }
    };
    // Where copies are only queued (the files registered with the driver),
    // they start before the CPU computes its share of the step, so that
    // the link is busy meanwhile; where they read files first, after.
    // A split step fetches its device share at once: where copies are only
    // queued, as many experts as the cache has free slots (a batched
    // step's ~57); where files are read first, one launch's chunk.
    let queue_only = cache.copies_queue_only();
    let split_max = match queue_only {
        true => cache.free_slots(),
        false => per_launch,
    };
    let splits = split.is_some() && experts.len() <= split_max;
    let early = splits && queue_only;
    let mut cpu_part = None;
    // Streaming needs room for two launches' misses (one copied while the
    // other computes); a cache too small for that (`--expert-cache 0`)
    // holds little to keep, and its misses go as a decode step's.
    let room = match stream {
        true => cache.stream_room()?,
        false => 0,
    };
    if !splits && stream && room >= 2 * per_launch {
        let mut hits = Vec::with_capacity(experts.len());
        let mut misses = Vec::with_capacity(experts.len());
        for &e in &experts {
            match cache.holds(a.layer, e)? {
                true => hits.push(e),
                false => misses.push(e),
            }
        }
        // Misses a launch at a time: one launch's copies while the one
        // before computes.
        let chunks = hits.chunks(per_launch).chain(misses.chunks(per_launch));
        for chunk in chunks {
            let addrs = cache.fetch_stream(io.store, a.layer, chunk)?;
            launch(chunk, &addrs)?;
        }
        cache.mark(Mark::Experts)?;
    } else if !splits {
        for chunk in experts.chunks(per_launch) {
            let addrs = cache.fetch(io.store, a.layer, chunk)?;
            launch(chunk, &addrs)?;
        }
        cache.mark(Mark::Experts)?;
    } else {
        let tokens = (n * k).div_ceil(experts.len().max(1));
        let addrs = cache.fetch_split(io.store, a.layer, &experts, tokens)?;
        let (mut on_gpu, mut gpu_addrs, mut on_host) = (Vec::new(), Vec::new(), Vec::new());
        for (&e, addr) in experts.iter().zip(&addrs) {
            match addr {
                Some(p) => {
                    on_gpu.push(e);
                    gpu_addrs.push(*p);
                }
                None => on_host.push(e),
            }
        }
        let gpu_part = || {
            // Carried, the launch also assigns or adds the step's sum.
            if !on_gpu.is_empty() || carried {
                launch(&on_gpu, &gpu_addrs)?;
            }
            cache.mark(Mark::Experts)?;
            match early {
                true => ahead(),
                false => Ok(()),
            }
        };
        if on_host.is_empty() {
            gpu_part()?;
        } else {
            // The rows of the host's pairs stay zero in `d` (the GPU's
            // launch writes only its own): queue the owed fill now.
            if let Some(d) = &d {
                d.read(gpu)?;
            }
            let step = HostStep {
                ids: &host[..n * k],
                weights: &wh,
                x: &xh,
                n,
                k,
                hidden: a.hidden,
                inter: a.inter,
            };
            cpu_part = Some(hybrid::with_cpu_part(
                cache, io.store, a.layer, &on_host, &step, gpu_part,
            )?);
        }
    }
    if !early {
        // Reads into staging buffers (queued here for the staging thread,
        // which reads while this thread launches the next layer): after
        // the CPU's share, as they would take its cores.
        if cpu_part.is_some() {
            hybrid::wait_cpu(cache)?;
        }
        ahead()?;
    }
    cache.mark(Mark::Add)?;
    if let Some(d) = &d {
        combine(gpu, to.op, d, wts, a, to.assign)?;
    }
    Ok(cpu_part)
}
