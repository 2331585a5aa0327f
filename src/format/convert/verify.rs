//! The verification pass: re-open the written model with the readers the
//! engine uses (`WeightsFile`, `layout.json` + `LayerLayout::matrices`)
//! and compare against the source. Every dense tensor is opened and its
//! first and last rows checked; a sample of experts per layer (first,
//! middle, last) is checked in full. Repacked rows must be byte-identical,
//! float rows exact, quantized rows within the quantization error bound.

use super::matrix::{round_to, SrcMatrix, Storage, Target};
use super::plan::{float_dtype, Item, Plan};
use crate::error::{Error, Result};
use crate::format::packed::{expert_file_name, Layout, WeightsFile, EXPERTS_DIR};
use crate::format::{AlignedBytes, MatrixData, MatrixView, Region};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// Check the model written to `dir` against `plan`; returns the number of
/// experts checked.
pub fn verify(dir: &Path, plan: &Plan) -> Result<usize> {
    let wf = WeightsFile::open(dir)?;
    let mut layout = None;
    let mut experts = 0;
    for item in &plan.items {
        match item {
            Item::Matrix(m) => {
                let view = wf.matrix(&m.name, m.src.rows, m.src.cols)?;
                for r in [0, m.src.rows.saturating_sub(1)]
                    .into_iter()
                    .filter(|&r| r < m.src.rows)
                {
                    compare_row(&m.src, m.target, &view, r, &m.name)?;
                }
            }
            Item::Vector(v) => {
                let n = v.shape.iter().product();
                let got = wf.vector(&v.name, n)?;
                let mut want = vec![0f32; n];
                float_dtype(&v.src)?.decode_into(v.src.data, &mut want);
                let one = if v.add_one { 1.0 } else { 0.0 };
                if let Some(i) = (0..n).find(|&i| !same(got[i], want[i] + one)) {
                    return Err(mismatch(
                        &v.name,
                        format!("element {i}: wrote {}, source gives {}", got[i], want[i] + one),
                    ));
                }
            }
            Item::Experts(l) => {
                if layout.is_none() {
                    layout = Some(Layout::read(dir)?);
                }
                let Some(layout) = &layout else { continue };
                let ll = layout
                    .layer(l.layer)
                    .ok_or_else(|| mismatch(&format!("layer {}", l.layer), "missing from layout.json".into()))?;
                let n = l.experts.len();
                ll.validate(l.layer, l.experts[0][2].rows, l.experts[0][0].rows, layout.group_size)?;
                let path = dir.join(EXPERTS_DIR).join(expert_file_name(l.layer));
                let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
                let mut ids = vec![0, n / 2, n - 1];
                ids.dedup();
                for e in ids {
                    let mut buf = AlignedBytes::zeroed(ll.expert_size);
                    file.read_exact_at(buf.as_mut_slice(), (e * ll.expert_size) as u64)
                        .map_err(|err| Error::io(&path, err))?;
                    let views = ll.matrices(&Region::whole(Arc::new(buf)), layout.group_size)?;
                    for (k, (view, src)) in views.iter().zip(&l.experts[e]).enumerate() {
                        let what = format!(
                            "layer {} expert {e} {}",
                            l.layer,
                            ["gate_proj", "up_proj", "down_proj"][k]
                        );
                        if (view.rows, view.cols) != (src.rows, src.cols) {
                            return Err(mismatch(
                                &what,
                                format!("shape [{}, {}] in the layout", view.rows, view.cols),
                            ));
                        }
                        for r in 0..src.rows {
                            compare_row(src, l.target, view, r, &what)?;
                        }
                    }
                    experts += 1;
                }
            }
        }
    }
    Ok(experts)
}

fn mismatch(what: &str, detail: String) -> Error {
    Error::Convert(format!("verification failed: {what}: {detail}"))
}

fn same(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Compare row `r` of the written matrix with the source.
fn compare_row(src: &SrcMatrix, target: Target, view: &MatrixView, r: usize, what: &str) -> Result<()> {
    let cols = src.cols;
    let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
    match (target, &view.data) {
        (Target::Repack, MatrixData::Quant { .. }) if matches!(src.storage, Storage::Gguf { .. }) => {
            // GGUF blocks held exactly: every value is ggml's, bit for bit.
            view.row_f32(r, &mut got);
            src.row_f32(r, &mut want);
            match got.iter().zip(&want).position(|(a, b)| !same(*a, *b)) {
                None => Ok(()),
                Some(c) => Err(mismatch(
                    what,
                    format!("row {r}, column {c}: {} where the GGUF block holds {}", got[c], want[c]),
                )),
            }
        }
        (
            Target::Repack,
            MatrixData::Quant {
                weight, scales, biases, ..
            },
        ) => {
            let (w, s, b) = src.quant_row(r);
            let parts = [(weight, w, "weight"), (scales, s, "scales"), (biases, b, "biases")];
            for (region, want, part) in parts {
                let got = &region.bytes()[r * want.len()..(r + 1) * want.len()];
                if got != want {
                    return Err(mismatch(what, format!("row {r}: {part} bytes differ from the source")));
                }
            }
            Ok(())
        }
        (
            Target::Quantize { bits, group_size },
            MatrixData::Quant {
                scales,
                biases,
                scale_dtype,
                ..
            },
        ) => {
            view.row_f32(r, &mut got);
            src.row_f32(r, &mut want);
            let gpr = cols / group_size;
            let es = scale_dtype.size();
            let mut s = vec![0f32; gpr];
            let mut b = vec![0f32; gpr];
            scale_dtype.decode_into(&scales.bytes()[r * gpr * es..(r + 1) * gpr * es], &mut s);
            scale_dtype.decode_into(&biases.bytes()[r * gpr * es..(r + 1) * gpr * es], &mut b);
            // One step (rounding, plus clamping at the far edge of the
            // range) and the bf16 rounding of scale and bias.
            let levels = ((1u32 << bits) - 1) as f32;
            for c in 0..cols {
                let g = c / group_size;
                let bound = s[g].abs() * (1.0 + levels / 128.0) + b[g].abs() / 128.0 + 1e-6;
                if (got[c] - want[c]).abs() > bound || got[c].is_nan() != want[c].is_nan() {
                    return Err(mismatch(
                        what,
                        format!("row {r} col {c}: wrote {}, source {} (bound {bound})", got[c], want[c]),
                    ));
                }
            }
            Ok(())
        }
        (Target::Float(dt), MatrixData::Float { .. }) => {
            view.row_f32(r, &mut got);
            src.row_f32(r, &mut want);
            if let Some(c) = (0..cols).find(|&c| !same(got[c], round_to(dt, want[c]))) {
                return Err(mismatch(
                    what,
                    format!("row {r} col {c}: wrote {}, source {}", got[c], want[c]),
                ));
            }
            Ok(())
        }
        _ => Err(mismatch(what, "stored in another form than planned".into())),
    }
}
