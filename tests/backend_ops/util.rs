//! Random inputs, test matrices and expert files, and the comparison.

use half::{bf16, f16};
use moeflux::experts::{ExpertStore, IoMode};
use moeflux::format::packed::{expert_file_name, LayerLayout, Layout, EXPERTS_DIR, LAYOUT_FILE};
use moeflux::format::{Dtype, MatrixData, MatrixView, Region};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// splitmix64: reproducible inputs without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[-scale, scale)`.
    pub fn f32(&mut self, scale: f32) -> f32 {
        ((self.u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.f32(scale)).collect()
    }
}

/// `‖got − want‖/‖want‖` and `max|got − want| / max|want|` must both be
/// within `tol` (0: exact).
pub fn close(what: &str, got: &[f32], want: &[f64], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let (mut num, mut den, mut maxd, mut maxw) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = g as f64 - w;
        num += d * d;
        den += w * w;
        maxd = maxd.max(d.abs());
        maxw = maxw.max(w.abs());
    }
    let rel = num.sqrt() / den.sqrt().max(1e-300);
    let rmax = maxd / maxw.max(1e-300);
    eprintln!("{what}: rel L2 {rel:.2e}, max {rmax:.2e} (tol {tol:.0e})");
    assert!(
        rel <= tol && rmax <= tol,
        "{what}: rel L2 error {rel:.3e}, max error {rmax:.3e} of max |want|, tolerance {tol:.0e}"
    );
    rel
}

/// A quantized `[rows, cols]` matrix as its three byte arrays, and the
/// same matrix dequantized by the reference.
pub struct QuantParts {
    pub words: Vec<u8>,
    pub scales: Vec<u8>,
    pub biases: Vec<u8>,
    pub dense: Vec<f64>,
}

/// Random words (every bit pattern), scales of both signs, biases around
/// the middle of the range, rounded to bf16 (or f16).
pub fn quant_parts(rng: &mut Rng, rows: usize, cols: usize, bits: usize, gs: usize, f16_scales: bool) -> QuantParts {
    let words: Vec<u32> = (0..rows * cols * bits / 32).map(|_| rng.u64() as u32).collect();
    let groups = rows * cols / gs;
    let half_range = ((1u32 << bits) - 1) as f32 / 2.0;
    let round = |v: f32| -> (f32, [u8; 2]) {
        if f16_scales {
            let h = f16::from_f32(v);
            (h.to_f32(), h.to_le_bytes())
        } else {
            let h = bf16::from_f32(v);
            (h.to_f32(), h.to_le_bytes())
        }
    };
    let (mut sf, mut bf, mut sb, mut bb) = (vec![], vec![], vec![], vec![]);
    for _ in 0..groups {
        let s = rng.f32(0.05);
        let (s, sbytes) = round(s);
        let (b, bbytes) = round(-s * half_range * (1.0 + rng.f32(0.3)));
        sf.push(s);
        bf.push(b);
        sb.extend(sbytes);
        bb.extend(bbytes);
    }
    let dense = super::reference::dequant(&words, &sf, &bf, rows, cols, bits, gs);
    QuantParts {
        words: words.iter().flat_map(|w| w.to_le_bytes()).collect(),
        scales: sb,
        biases: bb,
        dense,
    }
}

fn region(bytes: Vec<u8>) -> Region {
    Region::whole(Arc::new(bytes))
}

pub fn quant_matrix(
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    bits: usize,
    gs: usize,
    f16_scales: bool,
) -> (MatrixView, Vec<f64>) {
    let p = quant_parts(rng, rows, cols, bits, gs, f16_scales);
    let view = MatrixView {
        rows,
        cols,
        data: MatrixData::Quant {
            bits: bits as u32,
            group_size: gs,
            weight: region(p.words),
            scales: region(p.scales),
            biases: region(p.biases),
            scale_dtype: if f16_scales { Dtype::F16 } else { Dtype::Bf16 },
        },
    };
    (view, p.dense)
}

pub fn float_matrix(rng: &mut Rng, rows: usize, cols: usize, dtype: Dtype) -> (MatrixView, Vec<f64>) {
    let mut bytes = Vec::with_capacity(rows * cols * dtype.size());
    let mut dense = Vec::with_capacity(rows * cols);
    for _ in 0..rows * cols {
        let v = rng.f32(0.1);
        match dtype {
            Dtype::Bf16 => {
                bytes.extend(bf16::from_f32(v).to_le_bytes());
                dense.push(bf16::from_f32(v).to_f32() as f64);
            }
            Dtype::F16 => {
                bytes.extend(f16::from_f32(v).to_le_bytes());
                dense.push(f16::from_f32(v).to_f32() as f64);
            }
            _ => {
                bytes.extend(v.to_le_bytes());
                dense.push(v as f64);
            }
        }
    }
    let view = MatrixView {
        rows,
        cols,
        data: MatrixData::Float {
            dtype,
            data: region(bytes),
        },
    };
    (view, dense)
}

/// Write `packed_experts/` for a two-layer model whose layer 1 has `ne`
/// random experts; returns the open store and each expert's dequantized
/// `[gate [inter, hidden], up, down [hidden, inter]]`.
pub fn write_experts(
    rng: &mut Rng,
    dir: &Path,
    hidden: usize,
    inter: usize,
    ne: usize,
    bits: usize,
    gs: usize,
) -> (Arc<ExpertStore>, Vec<[Vec<f64>; 3]>) {
    let ll = LayerLayout::quantized(hidden, inter, bits as u32, gs);
    let mut file = vec![0u8; ne * ll.expert_size];
    let mut experts = Vec::with_capacity(ne);
    for (e, blob) in file.chunks_exact_mut(ll.expert_size).enumerate() {
        let mut dense = Vec::with_capacity(3);
        for (p, (rows, cols)) in [(inter, hidden), (inter, hidden), (hidden, inter)]
            .into_iter()
            .enumerate()
        {
            let q = quant_parts(rng, rows, cols, bits, gs, false);
            for (c, bytes) in ll.components[3 * p..3 * p + 3]
                .iter()
                .zip([&q.words, &q.scales, &q.biases])
            {
                assert_eq!(c.size, bytes.len(), "expert {e} component {}", c.name);
                blob[c.offset..c.offset + c.size].copy_from_slice(bytes);
            }
            dense.push(q.dense);
        }
        let [g, u, d]: [Vec<f64>; 3] = dense.try_into().expect("three matrices");
        experts.push([g, u, d]);
    }
    let edir = dir.join(EXPERTS_DIR);
    std::fs::create_dir_all(&edir).expect("mkdir");
    std::fs::write(edir.join(expert_file_name(1)), &file).expect("write experts");
    let layout = Layout {
        num_layers: 2,
        num_experts: ne,
        group_size: gs,
        layers: BTreeMap::from([("1".to_string(), ll)]),
    };
    std::fs::write(edir.join(LAYOUT_FILE), serde_json::to_vec(&layout).expect("json")).expect("write layout");
    let store = ExpertStore::open(dir, 2, IoMode::default(), 2).expect("open expert store");
    (Arc::new(store), experts)
}
