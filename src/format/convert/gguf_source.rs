//! A GGUF file as a conversion source: its metadata as `config.json`, its
//! tensors under the packed names (`gguf::packed_name`; a layer's stacked
//! experts as `mlp.switch_mlp.{gate,up,down}_proj.weight` `[E, rows,
//! cols]`), and the tokenizer, chat template and generation defaults
//! made from its metadata.

use super::names::{self, Name};
use super::source::{Loc, Source};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::format::gguf::{self, ExpertProj, GgmlType, GgufModel, Mapped};
use crate::format::safetensors::StDtype;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// Architectures whose GGUF tensors hold values transformed by llama.cpp's
/// converter in ways `convert` does not undo yet, with what is missing.
const NOT_YET: [(&str, &str); 4] = [
    ("qwen35moe", "its linear-attention tensors (ssm_a, reordered V heads)"),
    ("qwen3next", "its linear-attention tensors (ssm_a, reordered V heads)"),
    ("deepseek2", "its attn_k_b / attn_v_b split of kv_b_proj"),
    ("gpt-oss", "the gpt-oss family"),
];

impl Source {
    /// Open `path`, a GGUF file (or the first part of a split one).
    pub fn open_gguf(path: &Path) -> Result<Source> {
        let model = GgufModel::open(path)?;
        let arch = model.meta().str("general.architecture")?.to_string();
        if let Some((_, what)) = NOT_YET.iter().find(|(a, _)| *a == arch) {
            return Err(Error::Convert(format!(
                "{}: converting a GGUF of architecture `{arch}` is not supported yet ({what}); \
                 convert its Hugging Face checkpoint instead",
                path.display()
            )));
        }
        let config_json = model.hf_config()?;
        let config = ModelConfig::from_json(&config_json)?;
        let mut tensors = BTreeMap::new();
        let mut skipped = Vec::new();
        for (index, t) in model.tensors.iter().enumerate() {
            let raw = &t.info.name;
            let packed = match gguf::packed_name(&arch, raw) {
                None => {
                    skipped.push((raw.clone(), "GGUF tensor with no place in the packed model"));
                    continue;
                }
                Some(Mapped::Tensor(n)) => n,
                Some(Mapped::Experts { layer, proj, bias }) => {
                    let p = match proj {
                        ExpertProj::Gate => "gate_proj",
                        ExpertProj::Up => "up_proj",
                        ExpertProj::Down => "down_proj",
                        ExpertProj::GateUp => return Err(unsupported(path, raw, "fused gate and up experts")),
                    };
                    if bias {
                        return Err(unsupported(path, raw, "expert biases"));
                    }
                    format!("model.layers.{layer}.mlp.switch_mlp.{p}.weight")
                }
                Some(Mapped::Part { .. }) => return Err(unsupported(path, raw, "a split tensor")),
            };
            let n = match names::normalize(&packed, &config) {
                Name::Skip(why) => {
                    skipped.push((raw.clone(), why));
                    continue;
                }
                Name::Keep(n) => n,
            };
            let (dtype, ggml) = match t.info.ty {
                GgmlType::F32 => (StDtype::F32, None),
                GgmlType::F16 => (StDtype::F16, None),
                GgmlType::Bf16 => (StDtype::Bf16, None),
                ty => (StDtype::Other(ty.name()), Some(ty)),
            };
            if tensors.contains_key(&n) {
                return Err(Error::format(
                    path,
                    format!("two GGUF tensors map to `{n}` (the second: `{raw}`)"),
                ));
            }
            tensors.insert(
                n,
                Loc::Gguf {
                    index,
                    dtype,
                    shape: t.info.shape(),
                    ggml,
                },
            );
        }
        let texts = texts(&model)?;
        Ok(Source {
            dir: path.to_path_buf(),
            config_json,
            config,
            shards: Vec::new(),
            tensors,
            skipped,
            mlx: None,
            fp8_block: [128, 128],
            gguf: Some(model),
            texts,
        })
    }

    /// Whether q_proj and k_proj rows are in llama.cpp's interleaved rope
    /// order (GGUF `llama` models: Mixtral), to be put back in the
    /// half-split order of the Hugging Face weights.
    pub fn permuted_qk(&self) -> bool {
        self.gguf
            .as_ref()
            .and_then(|g| g.meta().str("general.architecture").ok())
            .is_some_and(|a| a == "llama")
    }
}

fn unsupported(path: &Path, tensor: &str, what: &str) -> Error {
    Error::Convert(format!(
        "{}: tensor `{tensor}`: {what} are not supported in a GGUF conversion yet",
        path.display()
    ))
}

/// The text files of the packed model, from the GGUF metadata.
fn texts(model: &GgufModel) -> Result<Vec<(&'static str, String)>> {
    let meta = model.meta();
    let json = |v: Value| serde_json::to_string_pretty(&v).map_err(|e| Error::Convert(e.to_string()));
    let mut out = vec![
        ("tokenizer.json", json(gguf::tokenizer_json(meta)?)?),
        ("tokenizer_config.json", json(gguf::tokenizer_config(meta)?)?),
        ("generation_config.json", json(gguf::generation_config(meta)?)?),
    ];
    if let Some(t) = gguf::chat_template(meta)? {
        out.push(("chat_template.jinja", t));
    }
    Ok(out)
}

/// The rows of a q or k projection of `heads` heads of `head_dim` in the
/// half-split order, from llama.cpp's interleaved order: row `h·d + i` of
/// the result is row `h·d + 2i` (`i < d/2`) or `h·d + 2(i − d/2) + 1`.
pub fn unpermute_rows(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..heads)
        .flat_map(|h| {
            (0..head_dim).map(move |i| {
                let j = if i < half { 2 * i } else { 2 * (i - half) + 1 };
                h * head_dim + j
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's permute (`w.reshape(H, 2, d/2, C).swapaxes(1, 2)`)
    /// followed by ours is the identity.
    #[test]
    fn unpermute_undoes_llamas_permute() {
        let (h, d) = (3, 8);
        // permuted[h·d + 2i + t] = hf[h·d + t·d/2 + i]
        let mut permuted = vec![0usize; h * d];
        for hh in 0..h {
            for i in 0..d / 2 {
                for t in 0..2 {
                    permuted[hh * d + 2 * i + t] = hh * d + t * d / 2 + i;
                }
            }
        }
        let back: Vec<usize> = unpermute_rows(h, d).iter().map(|&r| permuted[r]).collect();
        assert_eq!(back, (0..h * d).collect::<Vec<_>>());
    }
}
