//! Expert routing of synthetic models: uniform routing writes the bytes
//! it always wrote; skewed routing reserves a block of the hidden state
//! for the routers; and, observed through the engine's routing trace
//! (`Model::set_route_trace`), skewed routing concentrates each layer's
//! selections on a few experts while uniform spreads them.
//! `cargo test --test synth routing_report -- --ignored --nocapture` prints
//! the full report (LRU hit rates, reuse between consecutive tokens).

use super::{needed, tiny_deepseek, tiny_qwen3, tiny_qwen35, with, write};
use moeflux::config::{FfnKind, ModelConfig};
use moeflux::experts::{ExpertStore, IoMode};
use moeflux::format::packed::WeightsFile;
use moeflux::model::trace::RouteRecord;
use moeflux::synth::{preset, Plan, Routing, SynthOptions};
use moeflux::text::Tokenizer;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Uniform routing writes exactly the bytes synth wrote before skewed
/// routing existed (golden benchmarks and fixtures depend on them): CRC-32
/// of the files written by commit c78da68.
#[test]
fn uniform_routing_writes_the_bytes_it_always_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    type Crcs = &'static [(&'static str, u32)];
    let expect: [(&str, Value, Crcs); 3] = [
        (
            "qwen35",
            tiny_qwen35(),
            &[
                ("model_weights.bin", 0x7f6c_acbe),
                ("packed_experts/layer_00.bin", 0x77e4_0788),
                ("packed_experts/layer_03.bin", 0xbb94_a42d),
                ("packed_experts/layer_07.bin", 0xb7bb_740d),
            ],
        ),
        (
            "qwen3",
            tiny_qwen3(),
            &[
                ("model_weights.bin", 0xef89_85bd),
                ("packed_experts/layer_02.bin", 0x3ecf_8909),
            ],
        ),
        (
            "deepseek",
            tiny_deepseek(Some(64)),
            &[
                ("model_weights.bin", 0xb013_2abb),
                ("packed_experts/layer_01.bin", 0xfd96_779e),
            ],
        ),
    ];
    for (name, config, files) in expect {
        let dir = tmp.path().join(name);
        write(config, &dir, &SynthOptions::default());
        for (file, crc) in files {
            let got = moeflux::checksum::crc32(&std::fs::read(dir.join(file)).unwrap());
            assert_eq!(got, *crc, "{name} {file}: {got:#010x}");
        }
    }
}

/// Skewed routing: in Qwen models the last 64 hidden dimensions are read by
/// the routers and written by the embedding alone; DeepSeek's selection
/// bias holds the experts' preferences. The models run.
#[test]
fn skewed_routing_reserves_a_block_of_the_hidden_state_for_the_routers() {
    let tmp = tempfile::tempdir().unwrap();
    let skewed = SynthOptions {
        routing: moeflux::synth::Routing::Skewed,
        ..SynthOptions::default()
    };
    let (h, block) = (128, 64..128);
    for (name, config) in [("qwen35", tiny_qwen35()), ("qwen3", tiny_qwen3())] {
        let dir = tmp.path().join(name);
        write(config, &dir, &skewed);
        let cfg = ModelConfig::from_dir(&dir).unwrap();
        let wf = WeightsFile::open(&dir).unwrap();
        let rows = |m: &moeflux::format::MatrixView| -> Vec<Vec<f32>> {
            let mut r = vec![0.0; m.cols];
            (0..m.rows)
                .map(|i| {
                    m.row_f32(i, &mut r);
                    r.clone()
                })
                .collect()
        };
        for (base, r, c) in needed(&cfg) {
            if c == 0 {
                continue;
            }
            let m = wf.matrix(&base, r, c).unwrap();
            let values = rows(&m);
            let writer = base.ends_with("o_proj") || base.ends_with("out_proj") || base.ends_with("down_proj");
            if writer {
                assert!(values[block.clone()].iter().flatten().all(|&x| x == 0.0), "{base}");
                assert!(values[..block.start].iter().flatten().any(|&x| x != 0.0), "{base}");
            }
            if base.ends_with("mlp.gate") {
                for row in &values {
                    assert!(row[..block.start].iter().all(|&x| x == 0.0), "{base}");
                    let read = row[block.clone()].iter().filter(|&&x| x != 0.0).count();
                    assert!(read > 56, "{base}: {read} of the block's 64 weights are not 0");
                }
            }
            if base == "model.embed_tokens" {
                // The block's first half is the same ±1 in every token (4-bit: within a quantization step).
                for row in &values[1..] {
                    for j in 64..96 {
                        assert!((row[j] - values[0][j]).abs() < 0.3 && row[j].abs() > 0.7, "{j}");
                    }
                }
            }
        }
        let store = ExpertStore::open(&dir, cfg.num_hidden_layers, IoMode::Pread, 2).unwrap();
        let layer = (0..cfg.num_hidden_layers)
            .find(|&i| cfg.layers[i].ffn == FfnKind::Moe)
            .unwrap();
        let blob = &store.read(layer, &[3]).unwrap()[0];
        let [_, _, down] = store.layer_layout(layer).unwrap().matrices(blob, 64).unwrap();
        let down = rows(&down); // [hidden, inter]
        assert_eq!(down.len(), h);
        assert!(down[block.clone()].iter().flatten().all(|&x| x == 0.0));
        assert!(down[..block.start].iter().flatten().any(|&x| x != 0.0));
        let model = moeflux::Model::open(&dir, &moeflux::Options::default()).unwrap();
        let logits = model.session().unwrap().eval_all(&[5, 17, 300, 2], 0).unwrap();
        assert!(logits.iter().all(|x| x.is_finite()), "{name}");
    }
    let dir = tmp.path().join("deepseek");
    write(tiny_deepseek(Some(64)), &dir, &skewed);
    let bias = WeightsFile::open(&dir)
        .unwrap()
        .vector("model.layers.1.mlp.gate.e_score_correction_bias", 16)
        .unwrap();
    let mean = bias.iter().sum::<f32>() / 16.0;
    assert!(
        bias.iter().all(|&b| b >= 0.0) && (0.05..0.15).contains(&mean),
        "{bias:?}"
    );
    let model = moeflux::Model::open(&dir, &moeflux::Options::default()).unwrap();
    let logits = model.session().unwrap().eval_all(&[5, 17, 300, 2], 0).unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
    // Too narrow a model has no room for the block.
    let narrow = with(tiny_qwen3(), json!({"hidden_size": 64, "head_dim": 16}));
    let err = Plan::new("n", narrow, &skewed).err().unwrap().to_string();
    assert!(err.contains("skewed routing needs at least 128"), "{err}");
}

/// Ordinary English, for prompts.
const PROSE: &str = "The river ran past the old mill at the edge of the town, where the children went to watch \
the water turn the great wheel. In the spring the snow on the mountains melted and the river rose, and the men \
of the town worked through the night to keep the water from the houses near the bank. Nobody could remember a \
year when the mill had stopped; the miller said that his father had built the wheel from the wood of a single \
oak, and that it would turn for another hundred years if people took care of it.\n\n\
How does a hash map find a value so quickly? It computes a number from the key, uses that number to pick a \
bucket, and then compares the key with the few entries stored in that bucket. When the table grows too full, \
it allocates a larger array and moves every entry, which is why a single insert can be slow while the average \
stays fast. A binary search tree keeps its keys in order instead, so it can answer range questions, but each \
lookup follows a path from the root and costs time in proportion to the height of the tree.\n\n\
Please write a short letter to a friend who is moving to a new city next week. Tell her that you will miss the \
long walks you took together on Sunday mornings, that you hope she finds a place near a park, and that you \
will visit in the summer when the days are long and the trains are not so crowded.";

/// Small models (hidden 512) of each architecture, with the experts per
/// layer and per token of the presets: 256 and 8 (Qwen3.6-35B-A3B,
/// DeepSeek-V3), 128 and 8 (Qwen3-30B-A3B).
fn configs() -> Vec<(&'static str, Value, usize)> {
    let types = super::hybrid_layer_types(8);
    let small = json!({"hidden_size": 512, "moe_intermediate_size": 64, "vocab_size": 4096});
    let q35 = with(
        preset("qwen3.6-35b-a3b").unwrap(),
        json!({"num_hidden_layers": 8, "layer_types": types, "num_attention_heads": 8, "num_key_value_heads": 2,
               "head_dim": 64, "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
               "linear_value_head_dim": 64, "shared_expert_intermediate_size": 64}),
    );
    let q3 = with(
        preset("qwen3-30b-a3b").unwrap(),
        json!({"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
               "intermediate_size": 512}),
    );
    let ds = with(
        preset("deepseek-v3").unwrap(),
        json!({"num_hidden_layers": 6, "first_k_dense_replace": 1, "num_attention_heads": 8,
               "num_key_value_heads": 8, "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
               "qk_rope_head_dim": 16, "v_head_dim": 32, "intermediate_size": 512}),
    );
    vec![
        ("qwen3.6 (qwen3_5_moe)", with(q35, small.clone()), 256),
        ("qwen3 (qwen3_moe)", with(q3, small.clone()), 128),
        ("deepseek_v3", with(ds, small), 256),
    ]
}

/// Synthesize `config` with `routing` into `dir`, run `tokens` (default:
/// [`PROSE`]) through it on the CPU and return its routing, per MoE layer,
/// token by token.
fn routes(config: &Value, routing: Routing, dir: &Path, tokens: Option<&[u32]>) -> BTreeMap<usize, Vec<Vec<u32>>> {
    let opts = SynthOptions {
        routing,
        ..SynthOptions::default()
    };
    Plan::new("routing", config.clone(), &opts)
        .unwrap()
        .write(dir, true, &|_| {}, None)
        .unwrap();
    trace(dir, &moeflux::Options::default(), tokens)
}

/// The routing of `tokens` (default: [`PROSE`]) through the model in `dir`.
fn trace(dir: &Path, opts: &moeflux::Options, tokens: Option<&[u32]>) -> BTreeMap<usize, Vec<Vec<u32>>> {
    let prose;
    let tokens = match tokens {
        Some(t) => t,
        None => {
            prose = Tokenizer::from_dir(dir).unwrap().encode(PROSE, false).unwrap();
            &prose
        }
    };
    let model = moeflux::Model::open(dir, opts).unwrap();
    model.set_route_trace(true);
    model.session().unwrap().eval_prompt(tokens, 0).unwrap();
    let mut by_layer: BTreeMap<usize, Vec<(usize, Vec<u32>)>> = BTreeMap::new();
    for RouteRecord { layer, pos, experts } in model.take_route_trace() {
        by_layer.entry(layer).or_default().push((pos, experts));
    }
    by_layer
        .into_iter()
        .map(|(l, mut v)| {
            v.sort_by_key(|(p, _)| *p);
            (l, v.into_iter().map(|(_, e)| e).collect())
        })
        .collect()
}

/// Hit rate of an LRU cache of `slots` experts over the token sequence,
/// counted after the first `warm` tokens.
fn lru_hit_rate(seq: &[Vec<u32>], slots: usize, warm: usize) -> f64 {
    let mut cache: Vec<u32> = Vec::new(); // most recent last
    let (mut hits, mut looks) = (0usize, 0usize);
    for (t, experts) in seq.iter().enumerate() {
        for e in experts {
            let hit = match cache.iter().position(|x| x == e) {
                Some(i) => {
                    cache.remove(i);
                    true
                }
                None => {
                    if cache.len() == slots {
                        cache.remove(0);
                    }
                    false
                }
            };
            cache.push(*e);
            if t >= warm {
                looks += 1;
                hits += hit as usize;
            }
        }
    }
    hits as f64 / looks.max(1) as f64
}

/// Mean share of a token's experts that token `t + gap` also uses.
fn reuse(seq: &[Vec<u32>], gap: usize) -> f64 {
    let pairs: Vec<f64> = seq
        .iter()
        .zip(seq.iter().skip(gap))
        .map(|(a, b)| a.iter().filter(|e| b.contains(e)).count() as f64 / a.len() as f64)
        .collect();
    pairs.iter().sum::<f64>() / pairs.len().max(1) as f64
}

/// Share of all selections that go to the busiest `frac` of the experts.
fn top_share(seq: &[Vec<u32>], n_experts: usize, frac: f64) -> f64 {
    let mut uses = vec![0usize; n_experts];
    seq.iter().flatten().for_each(|&e| uses[e as usize] += 1);
    uses.sort_unstable_by(|a, b| b.cmp(a));
    let top = ((n_experts as f64 * frac).ceil() as usize).max(1);
    uses[..top].iter().sum::<usize>() as f64 / uses.iter().sum::<usize>().max(1) as f64
}

#[test]
fn skewed_routing_concentrates_selections_and_uniform_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, config, e) in configs() {
        let chance = 8.0 / e as f64; // the share of a token's experts a random other token also uses
        for routing in [Routing::Uniform, Routing::Skewed] {
            let layers = routes(&config, routing, &tmp.path().join("m"), None);
            assert!(!layers.is_empty());
            for (layer, seq) in &layers {
                let (share, lru, next) = (top_share(seq, e, 0.1), lru_hit_rate(seq, e / 8, 32), reuse(seq, 1));
                let msg = format!(
                    "{name}, {routing:?}, layer {layer}: busiest tenth of the experts take {share:.2} of the \
                     selections, an LRU cache of an eighth of them hits {lru:.2}, the next token reuses {next:.2}"
                );
                match routing {
                    Routing::Uniform => assert!(share < 0.5 && lru < 0.4, "{msg}"),
                    Routing::Skewed => assert!(share > 0.55 && lru > 0.45 && next > 3.0 * chance, "{msg}"),
                }
            }
        }
    }
}

/// The table of one model's routing.
fn report(title: &str, layers: &BTreeMap<usize, Vec<Vec<u32>>>, e: usize) {
    let n = layers.values().next().map_or(0, |s| s.len());
    println!("\n{title} ({n} tokens); LRU counted after 32 tokens");
    println!("| layer | top 10% share | LRU 12.5% | LRU 25% | LRU 50% | reuse t+1 | reuse t+16 |");
    println!("|---|---|---|---|---|---|---|");
    for (layer, seq) in layers {
        println!(
            "| {layer} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            top_share(seq, e, 0.1),
            lru_hit_rate(seq, e / 8, 32),
            lru_hit_rate(seq, e / 4, 32),
            lru_hit_rate(seq, e / 2, 32),
            reuse(seq, 1),
            reuse(seq, 16),
        );
    }
}

#[test]
#[ignore]
fn routing_report() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, config, e) in configs() {
        for routing in [Routing::Uniform, Routing::Skewed] {
            for source in ["prose", "random ids"] {
                let ids = moeflux::synth::token_ids(600, 4093, 1);
                let tokens = (source != "prose").then_some(&ids[..]);
                let layers = routes(&config, routing, &tmp.path().join("m"), tokens);
                report(&format!("{name}, {routing:?} routing, {source}"), &layers, e);
            }
        }
    }
}

/// The same report for the model in `$MOEFLUX_ROUTING_MODEL` (a full-size
/// `synth --layers N` model, say), on the default device.
#[test]
#[ignore]
fn routing_report_of_a_model() {
    let Some(dir) = std::env::var_os("MOEFLUX_ROUTING_MODEL") else {
        eprintln!("set MOEFLUX_ROUTING_MODEL to a model directory");
        return;
    };
    let dir = Path::new(&dir);
    let cfg = moeflux::ModelConfig::from_dir(dir).unwrap();
    let opts = moeflux::Options::default(); // device auto
    let ids = moeflux::synth::token_ids(600, cfg.vocab_size - 3, 1);
    let routing = moeflux::synth::synth_routing(dir).map_or("?", |r| r.name());
    for (source, tokens) in [("prose", None), ("random ids", Some(&ids[..]))] {
        let layers = trace(dir, &opts, tokens);
        report(
            &format!("{}, {routing} routing, {source}", dir.display()),
            &layers,
            cfg.num_experts,
        );
    }
}
