//! `moeflux convert` / `inspect`: the real fixtures convert, MLX sources
//! are repacked byte for byte, quantization matches MLX, the expert
//! layouts and name prefixes all give the same packed model, and bad
//! input fails cleanly (message naming the culprit, nothing left behind).

#[path = "convert/bad_input.rs"]
mod bad_input;
#[path = "convert/builders.rs"]
mod builders;
#[path = "convert/synthetic.rs"]
mod synthetic;

use moeflux::format::convert::{convert, ConvertOptions};
use moeflux::format::packed::{Layout, WeightsFile};
use moeflux::format::quant::quantize_row;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use synthetic::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn bits(b: u32) -> ConvertOptions {
    ConvertOptions {
        bits: Some(b),
        ..ConvertOptions::default()
    }
}

/// Every file under `dir` (relative path → bytes).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn tensor(w: &WeightsFile, name: &str) -> Vec<u8> {
    w.region(name).unwrap().bytes().to_vec()
}

/// Bytes of expert `e` of `layer`.
fn expert(dir: &Path, layer: usize, e: usize) -> Vec<u8> {
    let l = Layout::read(dir).unwrap();
    let size = l.layer(layer).unwrap().expert_size;
    let f = std::fs::read(dir.join(format!("packed_experts/layer_{layer:02}.bin"))).unwrap();
    f[e * size..(e + 1) * size].to_vec()
}

/// What quantize_row makes of a row-major bf16 matrix: (words, scales, biases) bytes.
fn quantized(v: &[f32], cols: usize, b: u32) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (mut w, mut s, mut bi) = (vec![], vec![], vec![]);
    for row in v.chunks(cols) {
        quantize_row(row, b, 64, &mut w, &mut s, &mut bi);
    }
    (
        w.iter().flat_map(|x| x.to_le_bytes()).collect(),
        s.iter().flat_map(|x| x.to_le_bytes()).collect(),
        bi.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
}

fn values(t: &T) -> Vec<f32> {
    t.data
        .chunks(2)
        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

const FIXTURES: [&str; 7] = [
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5_moe",
    "qwen3_5_moe_mlx4",
    "qwen3_moe_mlx4",
    "deepseek_v3",
    "deepseek_v3_fp8",
];

#[test]
fn every_fixture_converts_and_reopens() {
    let tmp = tempfile::tempdir().unwrap();
    let mut converted = vec![];
    for name in FIXTURES {
        let src = fixture(name);
        if !src.join("config.json").is_file() {
            eprintln!("note: fixture {name} is absent (tools/make_fixtures.sh makes it); not converted");
            continue;
        }
        for b in [4, 16] {
            let dst = tmp.path().join(format!("{name}-{b}"));
            let r = convert(&src, &dst, &bits(b)).unwrap_or_else(|e| panic!("{name} --bits {b}: {e}"));
            let cfg = moeflux::ModelConfig::from_dir(&src).unwrap();
            assert!(r.verified_experts >= cfg.num_moe_layers(), "{name}");
            assert_eq!(r.expert_layers, cfg.num_moe_layers(), "{name}");
            let w = WeightsFile::open(&dst).unwrap();
            assert_eq!(w.manifest.num_tensors, w.manifest.tensors.len());
            assert!(
                w.manifest.tensors.values().all(|t| t.offset % 64 == 0),
                "{name}: unaligned tensor"
            );
            assert_eq!(
                w.manifest.config,
                moeflux::error::read_json::<serde_json::Value>(&src.join("config.json")).unwrap()
            );
            for f in ["config.json", "tokenizer.json"] {
                assert_eq!(
                    std::fs::read(src.join(f)).unwrap(),
                    std::fs::read(dst.join(f)).unwrap(),
                    "{name}: {f}"
                );
            }
            let layout = Layout::read(&dst).unwrap();
            for (l, ll) in &layout.layers {
                let want = if b == 16 || name.ends_with("mlx4") {
                    None
                } else {
                    Some(4)
                };
                if let Some(want) = want {
                    assert_eq!(ll.bits, want, "{name} layer {l}");
                }
            }
        }
        converted.push(name);
    }
    eprintln!("converted fixtures: {converted:?}");
    assert!(!converted.is_empty(), "no fixture found under tests/fixtures");
}

#[test]
fn mlx_fixture_is_repacked_byte_for_byte() {
    let src = fixture("qwen3_moe_mlx4");
    if !src.is_dir() {
        eprintln!("note: fixture qwen3_moe_mlx4 absent; skipped");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(&src, &dst, &ConvertOptions::default()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = WeightsFile::open(&dst).unwrap();
    let mut dense = 0;
    for (name, view) in st.tensors() {
        if name.contains("switch_mlp") || name.contains("norm") {
            continue;
        }
        assert_eq!(tensor(&w, &name), view.data(), "{name}");
        dense += 1;
    }
    assert!(dense > 20);
    let cfg = moeflux::ModelConfig::from_dir(&src).unwrap();
    let layer = cfg
        .layers
        .iter()
        .position(|l| l.ffn == moeflux::config::FfnKind::Moe)
        .unwrap();
    for e in 0..cfg.num_experts {
        let mut want = vec![];
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            for part in ["weight", "scales", "biases"] {
                let t = st
                    .tensor(&format!("model.layers.{layer}.mlp.switch_mlp.{proj}.{part}"))
                    .unwrap();
                let per = t.data().len() / cfg.num_experts;
                want.extend_from_slice(&t.data()[e * per..(e + 1) * per]);
            }
        }
        assert_eq!(expert(&dst, layer, e), want, "expert {e}");
    }
}

/// Our 4-bit conversion of a bf16 fixture equals mlx_lm.convert's of the
/// same weights: every quantized tensor and every expert, byte for byte.
#[test]
fn four_bit_conversion_equals_mlx_lm() {
    let mut compared = 0;
    for (hf, mlx) in [("qwen3_moe", "qwen3_moe_mlx4"), ("qwen3_5_moe", "qwen3_5_moe_mlx4")] {
        if !fixture(hf).is_dir() || !fixture(mlx).is_dir() {
            eprintln!("note: fixtures {hf} / {mlx} absent; skipped");
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("hf"), tmp.path().join("mlx"));
        convert(&fixture(hf), &a, &ConvertOptions::default()).unwrap();
        convert(&fixture(mlx), &b, &ConvertOptions::default()).unwrap();
        let (wa, wb) = (WeightsFile::open(&a).unwrap(), WeightsFile::open(&b).unwrap());
        assert_eq!(
            wa.manifest.tensors.keys().collect::<Vec<_>>(),
            wb.manifest.tensors.keys().collect::<Vec<_>>()
        );
        for (name, ta) in &wa.manifest.tensors {
            let tb = &wb.manifest.tensors[name];
            assert_eq!(
                (&ta.dtype, &ta.shape, ta.bits),
                (&tb.dtype, &tb.shape, tb.bits),
                "{name}"
            );
            if ta.dtype == "U32" || name.ends_with(".scales") || name.ends_with(".biases") {
                assert_eq!(tensor(&wa, name), tensor(&wb, name), "{hf}: {name}");
                compared += 1;
            }
        }
        let (fa, fb) = (files(&a.join("packed_experts")), files(&b.join("packed_experts")));
        assert_eq!(fa, fb, "{hf}: expert files differ from mlx_lm's");
    }
    eprintln!("{compared} quantized tensors equal to mlx_lm's");
}

/// An fp8 e4m3 byte, decoded by the textbook formula.
fn e4m3(b: u8) -> f32 {
    let (s, e, m) = (
        if b >> 7 == 1 { -1.0 } else { 1.0 },
        ((b >> 3) & 15) as i32,
        (b & 7) as f32,
    );
    if e == 0 {
        s * m / 8.0 / 64.0
    } else {
        s * (1.0 + m / 8.0) * (2f32).powi(e - 7)
    }
}

/// DeepSeek fp8 at --bits 16: every weight is its fp8 value times the
/// `weight_scale_inv` of its 128×128 block (edge blocks partial).
#[test]
fn fp8_fixture_dequantizes_by_blocks() {
    let src = fixture("deepseek_v3_fp8");
    if !src.is_dir() {
        eprintln!("note: fixture deepseek_v3_fp8 absent; skipped");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(&src, &dst, &bits(16)).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = WeightsFile::open(&dst).unwrap();
    let mut checked = 0;
    for (name, view) in st.tensors() {
        // (MTP layers are not converted; experts are checked by verify.)
        if view.dtype() != safetensors::Dtype::F8_E4M3 || name.contains(".experts.") || !w.has(&name) {
            continue;
        }
        let (rows, cols) = (view.shape()[0], view.shape()[1]);
        let s = st.tensor(&format!("{name}_scale_inv")).unwrap();
        let sc: Vec<f32> = s
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let got = w
            .matrix(name.strip_suffix(".weight").unwrap(), rows, cols)
            .unwrap()
            .to_f32();
        for (i, (&q, g)) in view.data().iter().zip(&got).enumerate() {
            let (r, c) = (i / cols, i % cols);
            let want = e4m3(q) * sc[(r / 128) * cols.div_ceil(128) + c / 128];
            assert_eq!(*g, half::bf16::from_f32(want).to_f32(), "{name} [{r}, {c}]");
        }
        checked += 1;
    }
    assert!(checked > 5, "{checked}");
}

#[test]
fn bf16_to_4bit_matches_quantize_row() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let ts = qwen3_moe_tensors(7, "model.", false);
    write_model(&src, &qwen3_moe_config(), &ts, 1);
    let r = convert(&src, &dst, &ConvertOptions::default()).unwrap();
    assert_eq!(r.verified_experts, 3);
    let w = WeightsFile::open(&dst).unwrap();
    for (name, cols, b) in [
        ("model.layers.0.self_attn.q_proj", HIDDEN, 4),
        ("model.layers.0.mlp.gate", HIDDEN, 8),
        ("model.layers.1.mlp.down_proj", 128, 4),
        ("model.embed_tokens", HIDDEN, 4),
        ("lm_head", HIDDEN, 4),
    ] {
        let (qw, qs, qb) = quantized(&values(find(&ts, &format!("{name}.weight"))), cols, b);
        assert_eq!(tensor(&w, &format!("{name}.weight")), qw, "{name}");
        assert_eq!(tensor(&w, &format!("{name}.scales")), qs, "{name}");
        assert_eq!(tensor(&w, &format!("{name}.biases")), qb, "{name}");
        assert_eq!(w.entry(&format!("{name}.weight")).unwrap().bits, Some(b));
    }
    let norm = w.vector("model.layers.0.input_layernorm.weight", HIDDEN).unwrap();
    assert_eq!(
        norm,
        values(find(&ts, "model.layers.0.input_layernorm.weight")),
        "qwen3_moe norms are not shifted"
    );
    for e in 0..EXPERTS {
        let mut want = vec![];
        for (p, cols) in [("gate_proj", HIDDEN), ("up_proj", HIDDEN), ("down_proj", MOE_INTER)] {
            let (qw, qs, qb) = quantized(
                &values(find(&ts, &format!("model.layers.0.mlp.experts.{e}.{p}.weight"))),
                cols,
                4,
            );
            want.extend(qw.into_iter().chain(qs).chain(qb));
        }
        assert_eq!(expert(&dst, 0, e), want, "expert {e}");
    }
}

#[test]
fn expert_layouts_and_prefixes_give_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let mut outputs = vec![];
    for (i, (prefix, stacked)) in [("model.", false), ("model.", true), ("model.language_model.", true)]
        .into_iter()
        .enumerate()
    {
        let (src, dst) = (tmp.path().join(format!("src{i}")), tmp.path().join(format!("dst{i}")));
        let mut ts = qwen3_moe_tensors(11, prefix, stacked);
        if i == 2 {
            ts.push(bf16_t("model.visual.blocks.0.attn.qkv.weight", &[4, 4], &[0.5; 16]));
            ts.push(bf16_t("mtp.fc.weight", &[4, 4], &[0.5; 16]));
        }
        write_model(&src, &qwen3_moe_config(), &ts, 2);
        let r = convert(&src, &dst, &bits(8)).unwrap();
        if i == 2 {
            assert!(r.notes.iter().any(|n| n.contains("vision tower")), "{:?}", r.notes);
            assert!(
                r.notes.iter().any(|n| n.contains("multi-token prediction")),
                "{:?}",
                r.notes
            );
        }
        let mut f = files(&dst);
        f.remove("model_weights.json"); // holds the source directory's name
        f.remove("checksums.json"); // holds model_weights.json's checksum
        outputs.push(f);
    }
    assert_eq!(outputs[0], outputs[1], "stacked experts differ from per-expert tensors");
    assert_eq!(
        outputs[0], outputs[2],
        "model.language_model. prefix changes the output"
    );
}

#[test]
fn fused_qwen3_next_projections_are_split_by_the_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let mut outputs = vec![];
    for fused in [false, true] {
        let (src, dst) = (
            tmp.path().join(format!("src{fused}")),
            tmp.path().join(format!("dst{fused}")),
        );
        write_model(
            &src,
            &builders::qwen3_next_config(),
            &builders::qwen3_next_tensors(3, fused),
            3,
        );
        convert(&src, &dst, &ConvertOptions::default()).unwrap();
        outputs.push(dst);
    }
    let (a, b) = (files(&outputs[0]), files(&outputs[1]));
    assert_eq!(
        a["model_weights.bin"], b["model_weights.bin"],
        "split of in_proj_qkvz / in_proj_ba is wrong"
    );
    let ts = builders::qwen3_next_tensors(3, false);
    let w = WeightsFile::open(&outputs[1]).unwrap();
    // The five zero-centred norms are stored as 1 + w (F32); the gated norm is not.
    for name in [
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.self_attn.q_norm.weight",
        "model.layers.1.self_attn.k_norm.weight",
    ] {
        let want: Vec<f32> = values(find(&ts, name)).iter().map(|x| 1.0 + x).collect();
        assert_eq!(w.entry(name).unwrap().dtype, "F32");
        assert_eq!(w.vector(name, want.len()).unwrap(), want, "{name}");
    }
    let gated = "model.layers.0.linear_attn.norm.weight";
    assert_eq!(w.vector(gated, builders::DV).unwrap(), values(find(&ts, gated)));
    let conv = w.entry("model.layers.0.linear_attn.conv1d.weight").unwrap();
    assert_eq!(
        (conv.shape.clone(), conv.dtype.as_str()),
        (vec![builders::CONV, 4], "F32")
    );
    let a_log = w.entry("model.layers.0.linear_attn.A_log").unwrap();
    assert_eq!(a_log.dtype, "F32");
    assert_eq!(
        w.vector("model.layers.0.linear_attn.A_log", 4).unwrap(),
        vec![0.1, -0.2, 0.3, 0.7]
    );
}

#[test]
fn mlx_source_with_f16_scales_and_overrides_is_repacked() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    let (cfg, ts) = builders::mlx_qwen3_moe(5);
    write_model(&src, &cfg, &ts, 1);
    let r = convert(&src, &dst, &bits(8)).unwrap();
    assert!(r.notes.iter().any(|n| n.contains("MLX-quantized")), "{:?}", r.notes);
    let w = WeightsFile::open(&dst).unwrap();
    for t in ts
        .iter()
        .filter(|t| !t.name.contains("switch_mlp") && !t.name.contains("norm"))
    {
        assert_eq!(tensor(&w, &t.name), t.data, "{}", t.name);
    }
    assert_eq!(w.entry("model.layers.0.mlp.gate.weight").unwrap().bits, Some(8));
    assert_eq!(w.entry("model.layers.0.mlp.gate.scales").unwrap().dtype, "F16");
    assert_eq!(w.entry("model.layers.0.self_attn.o_proj.weight").unwrap().dtype, "BF16");
    let layout = Layout::read(&dst).unwrap();
    assert_eq!(layout.layer(0).unwrap().components[1].dtype, "F16");
    for e in 0..EXPERTS {
        let mut want = vec![];
        for p in ["gate_proj", "up_proj", "down_proj"] {
            for part in ["weight", "scales", "biases"] {
                let t = find(&ts, &format!("model.layers.0.mlp.switch_mlp.{p}.{part}"));
                let per = t.data.len() / EXPERTS;
                want.extend_from_slice(&t.data[e * per..(e + 1) * per]);
            }
        }
        assert_eq!(expert(&dst, 0, e), want, "expert {e}");
    }
}

#[test]
fn bits_16_keeps_bf16_and_bits_experts_overrides_experts_only() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let ts = qwen3_moe_tensors(13, "model.", true);
    write_model(&src, &qwen3_moe_config(), &ts, 1);
    let dst = tmp.path().join("b16");
    convert(&src, &dst, &bits(16)).unwrap();
    let w = WeightsFile::open(&dst).unwrap();
    let q = find(&ts, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(w.entry(&q.name).unwrap().dtype, "BF16");
    assert_eq!(tensor(&w, &q.name), q.data);
    let ll = Layout::read(&dst).unwrap().layer(0).unwrap().clone();
    assert_eq!(ll.bits, 16);
    assert_eq!(
        (ll.components[0].dtype.as_str(), &ll.components[0].shape),
        ("BF16", &vec![MOE_INTER, HIDDEN])
    );
    assert_eq!((ll.components[1].size, ll.components[1].shape.len()), (0, 0));
    let gu = find(&ts, "model.layers.0.mlp.experts.gate_up_proj");
    let dn = find(&ts, "model.layers.0.mlp.experts.down_proj");
    let (g, d) = (gu.data.len() / EXPERTS, dn.data.len() / EXPERTS);
    for e in 0..EXPERTS {
        let want: Vec<u8> = [&gu.data[e * g..(e + 1) * g], &dn.data[e * d..(e + 1) * d]].concat();
        assert_eq!(expert(&dst, 0, e), want, "expert {e}");
    }
    let mixed = tmp.path().join("mixed");
    let opts = ConvertOptions {
        bits: Some(8),
        bits_experts: Some(2),
        ..ConvertOptions::default()
    };
    convert(&src, &mixed, &opts).unwrap();
    let w = WeightsFile::open(&mixed).unwrap();
    assert_eq!(w.entry("model.layers.0.self_attn.q_proj.weight").unwrap().bits, Some(8));
    assert_eq!(Layout::read(&mixed).unwrap().layer(0).unwrap().bits, 2);
}

#[test]
fn inspect_describes_source_and_packed_dirs() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    write_model(&src, &qwen3_moe_config(), &qwen3_moe_tensors(1, "model.", false), 1);
    // A real tokenizer in place of the stand-in (inspect checks it, as run does).
    std::fs::copy(fixture("qwen3_moe").join("tokenizer.json"), src.join("tokenizer.json")).unwrap();
    convert(&src, &dst, &ConvertOptions::default()).unwrap();
    for (dir, kind) in [(&src, "source checkpoint"), (&dst, "packed moeflux model")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_moeflux"))
            .arg("inspect")
            .arg(dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for want in [
            kind,
            "qwen3_moe",
            "1 MoE, 1 dense FFN",
            "K = 2",
            "expert_size",
            "dense part",
        ] {
            assert!(text.contains(want), "missing `{want}` in:\n{text}");
        }
    }
    // 4-bit: 3 · (64·64/2 + 2 · 64·(64/64)·2) bytes
    let packed = std::process::Command::new(env!("CARGO_BIN_EXE_moeflux"))
        .arg("inspect")
        .arg(&dst)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&packed.stdout).contains("6912 bytes"));
}
