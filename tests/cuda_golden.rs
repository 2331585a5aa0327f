//! The golden fixtures on CUDA (SPEC.md §6, GPU tolerances: relative L2 ≤
//! 2e-3 and equal argmax at every position), token by token against the
//! chunk, and the expert cache: every expert resident, a cache of three
//! slots (misses, evictions, experts split across chunks) and half the
//! experts with prefetch on and off must give bit-identical logits — all
//! on the exact (f32) path. The fast path (prefill products on tensor
//! cores) against it: `fast_*`. On a machine without a GPU the CUDA tests
//! are counted as ignored (a `libtest-mimic` harness, `common/trials.rs`).

mod common;

use common::*;
use moeflux::backend::cuda::{probe, CudaOptions};
use moeflux::backend::KvType;
use moeflux::experts::{CacheSize, Hybrid};
use moeflux::{Device, Model, Options};

const GPU_TOL: f64 = 2e-3;
/// Token by token against the chunk: other kernels (matrix-vector against
/// tiled products), the same f32 arithmetic.
const STEP_TOL: f64 = 1e-4;

/// The backend's settings, from this test binary's environment (the
/// library reads none): `MOEFLUX_STAGING=1` copies misses through staging
/// buffers, `MOEFLUX_GRAPHS=0` launches without graphs,
/// `MOEFLUX_KERNEL_CACHE` keeps the compiled kernels there
/// (`tools/device/run.sh` stages golden-staging and golden-nograph).
fn cuda_options() -> CudaOptions {
    let var = |k: &str| std::env::var(k).ok();
    CudaOptions {
        staging: var("MOEFLUX_STAGING").is_some_and(|v| v != "0"),
        graphs: var("MOEFLUX_GRAPHS").is_none_or(|v| v != "0"),
        kernel_cache: var("MOEFLUX_KERNEL_CACHE").map(Into::into),
        ..CudaOptions::default()
    }
}

/// The model on CUDA with exact (f32) products.
fn open(dir: &std::path::Path, cache: CacheSize, prefetch: bool, hybrid: Hybrid) -> Model {
    open_traced(dir, cache, prefetch, hybrid, false)
}

/// `open`, with `trace`: a streamed step's parts timed (`--trace-layers`).
fn open_traced(dir: &std::path::Path, cache: CacheSize, prefetch: bool, hybrid: Hybrid, trace: bool) -> Model {
    let opts = Options {
        device: Device::Cuda(0),
        expert_cache: cache,
        prefetch,
        hybrid: Some(hybrid),
        exact: true,
        cuda: CudaOptions {
            trace_layers: trace,
            ..cuda_options()
        },
        ..Options::default()
    };
    Model::open(dir, &opts).expect("open converted model on CUDA")
}

/// The model on CUDA as it opens by default (the fast path).
fn open_fast(dir: &std::path::Path) -> Model {
    open_fast_with(dir, CacheSize::Auto, Hybrid::Off)
}

/// The fast path with an expert cache and a split of its own.
/// Its KV caches are f32: a rounded cache (f16, the default) moves a
/// tiny model's routing at a near-tie now and then, whatever the products
/// (tests/kv_types.rs and the `kv_*` trials hold the cache types).
fn open_fast_with(dir: &std::path::Path, cache: CacheSize, hybrid: Hybrid) -> Model {
    let opts = Options {
        device: Device::Cuda(0),
        expert_cache: cache,
        hybrid: Some(hybrid),
        cuda: cuda_options(),
        cache_type_k: Some(KvType::F32),
        cache_type_v: Some(KvType::F32),
        ..Options::default()
    };
    Model::open(dir, &opts).expect("open converted model on CUDA")
}

/// The logits of every position, as one chunk and token by token.
fn run(model: &Model, tokens: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let mut s = model.session().expect("session");
    let chunk = s.eval_all(tokens, 0).expect("eval_all");
    let mut s = model.session().expect("session");
    let mut steps = Vec::with_capacity(chunk.len());
    for (pos, &t) in tokens.iter().enumerate() {
        steps.extend(s.eval_token(t, pos).expect("eval_token"));
    }
    (chunk, steps)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check(name: &str, flags: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(name, &dst, flags);
    let r = reference(name);
    let model = open(&dst, CacheSize::Auto, true, Hybrid::Auto);
    assert!(
        model.expert_cache().is_some_and(|c| c.resident),
        "{name}: the tiny model should be resident"
    );
    let vocab = model.n_vocab();
    let (chunk, steps) = run(&model, &r.tokens);
    let mut worst = 0.0f64;
    for (pos, want) in r.logits.iter().enumerate() {
        let got = &chunk[pos * vocab..(pos + 1) * vocab];
        let e = rel_l2(got, want);
        worst = worst.max(e);
        assert!(
            e <= GPU_TOL,
            "{name}: position {pos}: relative L2 {e:.3e} > {GPU_TOL:e}"
        );
        assert_eq!(argmax(got), argmax(want), "{name}: argmax differs at position {pos}");
        let step = &steps[pos * vocab..(pos + 1) * vocab];
        let e = rel_l2(step, got);
        assert!(
            e <= STEP_TOL,
            "{name}: token-by-token vs chunk at position {pos}: {e:.3e}"
        );
    }
    eprintln!(
        "{name}: CUDA worst relative L2 over {} positions: {worst:.2e}",
        r.logits.len()
    );

    let three = three_slots(&model);
    drop(model);
    for (cache, prefetch) in [
        (three, false),
        (CacheSize::Percent(50.0), true),
        (CacheSize::Percent(50.0), false),
    ] {
        let m = open(&dst, cache, prefetch, Hybrid::Off);
        let report = m.expert_cache().expect("a cache report");
        assert!(!report.resident, "{name}: {cache:?} should not hold every expert");
        let (c2, s2) = run(&m, &r.tokens);
        let stats = m.expert_cache_stats().expect("cache stats");
        eprintln!("{name}: {cache:?} prefetch={prefetch}: {stats:?}");
        assert!(stats.misses > 0, "{name}: {cache:?}: no miss counted");
        assert!(
            bits(&c2) == bits(&chunk),
            "{name}: {cache:?} prefetch={prefetch}: chunk logits differ from the resident run"
        );
        assert!(
            bits(&s2) == bits(&steps),
            "{name}: {cache:?} prefetch={prefetch}: token-by-token logits differ from the resident run"
        );
    }
    // Misses copied through staging buffers from O_DIRECT reads, half of
    // the experts kept in a RAM tier: the same logits, some from the tier.
    let opts = Options {
        device: Device::Cuda(0),
        expert_cache: three,
        io_mode: moeflux::experts::IoMode::Direct,
        ram_cache: CacheSize::Percent(50.0),
        exact: true,
        cuda: CudaOptions {
            staging: true,
            ..cuda_options()
        },
        ..Options::default()
    };
    let m = Model::open(&dst, &opts).expect("open with a RAM tier");
    let (c2, s2) = run(&m, &r.tokens);
    assert!(bits(&c2) == bits(&chunk), "{name}: RAM tier: chunk logits differ");
    assert!(
        bits(&s2) == bits(&steps),
        "{name}: RAM tier: token-by-token logits differ"
    );
    let ram = m.ram_stats().expect("a RAM tier");
    assert!(ram.hits > 0, "{name}: the RAM tier served nothing: {ram:?}");
    drop(m);
    // A quarter of the expert files pinned, the other layers held in the
    // device cache for good where it can spare them, the rest staged.
    let opts = Options {
        device: Device::Cuda(0),
        expert_cache: CacheSize::Percent(80.0),
        hybrid: Some(Hybrid::Off),
        exact: true,
        cuda: CudaOptions {
            pin: CacheSize::Percent(25.0),
            ..cuda_options()
        },
        ..Options::default()
    };
    let m = Model::open(&dst, &opts).expect("open with some layers pinned");
    let report = m.expert_cache().expect("a cache report");
    let (c2, s2) = run(&m, &r.tokens);
    eprintln!(
        "{name}: tiers: {} layers pinned, {} held: {:?}",
        report.pinned_layers,
        report.held_layers,
        m.expert_cache_stats()
    );
    assert!(bits(&c2) == bits(&chunk), "{name}: tiers: chunk logits differ");
    assert!(bits(&s2) == bits(&steps), "{name}: tiers: token-by-token logits differ");
    if name == "qwen3_next" {
        // 4 MoE layers of 8 experts, 25 slots: one layer pinned (none
        // when staging is asked for), one held (16 slots stay free), the
        // rest staged.
        let (p, h) = (report.pinned_layers, report.held_layers);
        let pinned = if cuda_options().staging { 0 } else { 1 };
        assert!(p == pinned && h == 1, "{name}: tiers: {p} pinned, {h} held");
    }
    drop(m);
    // Misses of one-token steps computed on the CPU (every one, or as the
    // cost model splits them): other arithmetic, the same f32 values to
    // within the step tolerance. The first also times its steps' parts
    // (`--trace-layers`), under the same checks of its logits.
    for (i, (cache, hybrid)) in [
        (three, Hybrid::Cpu),
        (CacheSize::Percent(50.0), Hybrid::Cpu),
        (CacheSize::Percent(50.0), Hybrid::Auto),
    ]
    .into_iter()
    .enumerate()
    {
        let m = open_traced(&dst, cache, true, hybrid, i == 0);
        let (c2, s2) = run(&m, &r.tokens);
        let stats = m.expert_cache_stats().expect("cache stats");
        eprintln!("{name}: {cache:?} hybrid={hybrid}: {stats:?}");
        if hybrid == Hybrid::Cpu {
            assert!(stats.on_host > 0, "{name}: {cache:?}: no miss computed on the CPU");
        }
        if i == 0 {
            // Every step's misses on the CPU: the part that holds the
            // wait for its sum has time in it.
            let parts = stats.layer_parts_ns;
            assert!(
                stats.layer_steps > 0 && parts[4] > 0,
                "{name}: traced steps: {} steps, parts {parts:?} ns",
                stats.layer_steps
            );
        }
        assert!(
            bits(&c2) == bits(&chunk),
            "{name}: {cache:?} hybrid={hybrid}: chunk logits (no split in prefill) differ"
        );
        for pos in 0..r.tokens.len() {
            let (a, b) = (
                &s2[pos * vocab..(pos + 1) * vocab],
                &steps[pos * vocab..(pos + 1) * vocab],
            );
            let e = rel_l2(a, b);
            assert!(
                e <= STEP_TOL,
                "{name}: {cache:?} hybrid={hybrid}: position {pos}: {e:.3e} from the resident steps"
            );
            assert_eq!(argmax(a), argmax(b), "{name}: hybrid={hybrid}: argmax differs at {pos}");
        }
    }
}

/// Tokens of a prompt long enough for the tensor cores (more than 16): the
/// reference's, again and again.
const FAST_PROMPT: usize = 48;

/// SPEC §6's fast path on CUDA: a 48-token chunk with its products on
/// tensor cores against the exact path (every position within 2e-3, the
/// same argmax), its first positions against transformers, and greedy
/// decoding after a 24-token prompt against the exact path's.
fn check_fast(name: &str, flags: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert(name, &dst, flags);
    let r = reference(name);
    let (exact, fast) = (open(&dst, CacheSize::Auto, true, Hybrid::Off), open_fast(&dst));
    let tokens: Vec<u32> = r.tokens.iter().cycle().take(FAST_PROMPT).copied().collect();
    let e = exact.session().unwrap().eval_all(&tokens, 0).unwrap();
    let f = fast.session().unwrap().eval_all(&tokens, 0).unwrap();
    let vocab = fast.n_vocab();
    let mut worst = 0.0f64;
    for (pos, (fp, ep)) in f.chunks_exact(vocab).zip(e.chunks_exact(vocab)).enumerate() {
        let err = rel_l2(fp, ep);
        worst = worst.max(err);
        assert!(
            err <= GPU_TOL,
            "{name}: position {pos}: fast vs exact relative L2 {err:.3e}"
        );
        assert_eq!(
            argmax(fp),
            argmax(ep),
            "{name}: argmax differs from the exact path at {pos}"
        );
        if let Some(want) = r.logits.get(pos) {
            let err = rel_l2(fp, want);
            assert!(err <= GPU_TOL, "{name}: position {pos}: fast vs transformers {err:.3e}");
            assert_eq!(
                argmax(fp),
                argmax(want),
                "{name}: argmax differs from transformers at {pos}"
            );
        }
    }
    assert!(
        bits(&f) != bits(&e),
        "{name}: the fast path gave the exact logits (did it run?)"
    );
    eprintln!("{name}: CUDA fast vs exact, worst relative L2 over {FAST_PROMPT} positions: {worst:.2e}");
    let greedy = |m: &Model| {
        let mut s = m.session().unwrap();
        let prompt = &tokens[..24];
        let mut logits = s.eval_prompt(prompt, 0).unwrap();
        let mut out = Vec::new();
        for i in 0..8 {
            let t = argmax(&logits) as u32;
            out.push(t);
            logits = s.eval_token(t, prompt.len() + i).unwrap();
        }
        out
    };
    let want = greedy(&exact);
    assert_eq!(greedy(&fast), want, "{name}: greedy tokens differ from the exact path");
    // Every one-token step's misses on the CPU, with its fast kernel.
    let hybrid = open_fast_with(&dst, three_slots(&exact), Hybrid::Cpu);
    assert_eq!(
        greedy(&hybrid),
        want,
        "{name}: greedy tokens with the misses on the CPU differ from the exact path"
    );
    let stats = hybrid.expert_cache_stats().expect("cache stats");
    assert!(stats.on_host > 0, "{name}: no miss computed on the CPU");
}

fn devices_parse() {
    assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
    assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
    assert_eq!("auto".parse::<Device>().unwrap(), Device::Auto);
    assert!("cuda:x".parse::<Device>().is_err());
    assert!("gpu".parse::<Device>().is_err());
}

/// `auto` takes CUDA exactly when it is usable, and the CPU quietly otherwise.
fn auto_chooses_cuda_when_present() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("packed");
    convert("qwen3_moe_mlx4", &dst, &[]);
    let model = Model::open(&dst, &Options::default()).expect("open with auto");
    let want = if probe().is_ok() { "cuda" } else { "cpu" };
    assert_eq!(model.device_name(), want);
}

/// A prompt of 256 tokens (a chunk that streams its misses) through a
/// cache of half the experts of a synthetic model large enough for a
/// stream ring (24 layers of 256 experts), twice in a row: the logits of
/// the same cache with the misses placed as a decode step's, bit for
/// bit, and those of the resident model within the step tolerance; the
/// second pass hits what the first left in main.
fn prompt_stream() {
    use moeflux::synth::{preset, Plan, SynthOptions};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let mut config = preset("qwen3-30b-a3b").unwrap();
    for (k, v) in [
        ("hidden_size", 128),
        ("num_hidden_layers", 24),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("head_dim", 32),
        ("num_experts", 256),
        ("moe_intermediate_size", 64),
        ("intermediate_size", 256),
        ("vocab_size", 512),
    ] {
        config[k] = v.into();
    }
    let plan = Plan::new("stream", config, &SynthOptions::default()).unwrap();
    plan.write(&dir, false, &|_| {}, None).unwrap();
    let tokens: Vec<u32> = (0..256).map(|i| (i * 37 + 11) % 509).collect();
    let with = |cache: CacheSize, stream: bool| {
        let opts = Options {
            device: Device::Cuda(0),
            expert_cache: cache,
            hybrid: Some(Hybrid::Off),
            exact: true,
            cuda: CudaOptions {
                prompt_stream: stream,
                ..cuda_options()
            },
            ..Options::default()
        };
        Model::open(&dir, &opts).expect("open on CUDA")
    };
    let want = with(CacheSize::Auto, true)
        .session()
        .unwrap()
        .eval_all(&tokens, 0)
        .unwrap();
    let (streamed, placed) = (
        with(CacheSize::Percent(50.0), true),
        with(CacheSize::Percent(50.0), false),
    );
    for pass in 0..2 {
        let a = streamed.session().unwrap().eval_all(&tokens, 0).unwrap();
        let b = placed.session().unwrap().eval_all(&tokens, 0).unwrap();
        assert_eq!(bits(&a), bits(&b), "pass {pass}: streamed and placed differ");
        let e = rel_l2(&a, &want);
        assert!(e <= STEP_TOL, "pass {pass}: vs resident {e:.3e}");
    }
    let (s, p) = (
        streamed.expert_cache_stats().unwrap(),
        placed.expert_cache_stats().unwrap(),
    );
    eprintln!("prompt stream: streamed {s:?}\nplaced {p:?}");
    // Placed, every chunk copies about every expert (a copy ahead of a
    // whole layer counts as a hit); streamed, about half of them.
    assert!(
        3 * s.bytes_copied < 2 * p.bytes_copied,
        "streaming copied {} bytes against {}",
        s.bytes_copied,
        p.bytes_copied
    );
}

fn main() {
    let mut all = vec![
        trials::plain("devices_parse", devices_parse),
        trials::plain("auto_chooses_cuda_when_present", auto_chooses_cuda_when_present),
        trials::cuda("prompt_stream", prompt_stream),
    ];
    macro_rules! golden_trial {
        ($name:ident, $fixture:expr, $flags:expr) => {
            all.push(trials::cuda(stringify!($name), || check($fixture, $flags)));
            all.push(trials::cuda(concat!("fast_", stringify!($name)), || {
                check_fast($fixture, $flags)
            }));
            all.push(trials::cuda(concat!("kv_", stringify!($name)), || {
                common::kv::check_kv_types($fixture, $flags, Device::Cuda(0))
            }));
        };
    }
    crate::for_each_golden_fixture!(golden_trial!());
    trials::run(all)
}
