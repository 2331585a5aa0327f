//! Reading `config.json` fields: the text model's merged fields, typed
//! getters that name the field at fault, the accepted limits, and the
//! settings read from several keys (RoPE, which layers are MoE, which are
//! linear attention).

use super::*;
use serde_json::{Map, Value};

/// The JSON object holding the text model's fields: `text_config` merged
/// over the top level (the top level keeps `model_type`).
pub(crate) fn text_fields(root: &Map<String, Value>) -> Map<String, Value> {
    let mut m = root.clone();
    if let Some(Value::Object(tc)) = root.get("text_config") {
        for (k, v) in tc {
            if k != "model_type" {
                m.insert(k.clone(), v.clone());
            }
        }
    }
    m
}

pub(crate) struct Fields<'a>(pub(crate) &'a Map<String, Value>);

impl Fields<'_> {
    pub(crate) fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }
    pub(crate) fn usize(&self, k: &str) -> Result<usize> {
        self.usize_opt(k)?
            .ok_or_else(|| Error::config(k, "missing (required for this architecture)"))
    }
    pub(crate) fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| Error::config(k, format!("expected a non-negative integer, found {v}"))),
        }
    }
    pub(crate) fn usize_or(&self, k: &str, d: usize) -> Result<usize> {
        Ok(self.usize_opt(k)?.unwrap_or(d))
    }
    pub(crate) fn f64_opt(&self, k: &str) -> Result<Option<f64>> {
        f64_in(self.0, k)
    }
    pub(crate) fn bool_or(&self, k: &str, d: bool) -> Result<bool> {
        match self.get(k) {
            None => Ok(d),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| Error::config(k, format!("expected true or false, found {v}"))),
        }
    }
    pub(crate) fn usize_list(&self, k: &str) -> Result<Vec<usize>> {
        match self.get(k) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|x| x as usize)
                        .ok_or_else(|| Error::config(k, format!("expected integers, found {v}")))
                })
                .collect(),
            Some(v) => Err(Error::config(k, format!("expected a list, found {v}"))),
        }
    }
    pub(crate) fn obj(&self, k: &str) -> Option<&Map<String, Value>> {
        self.get(k).and_then(|v| v.as_object())
    }
}

pub(crate) fn f64_in(m: &Map<String, Value>, k: &str) -> Result<Option<f64>> {
    match m.get(k).filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::config(k, format!("expected a number, found {v}"))),
    }
}

/// The largest layer, head or expert count accepted.
pub(crate) const MAX_COUNT: usize = 1 << 16;
/// The largest width (hidden size, head size, MLP width, rank) accepted.
pub(crate) const MAX_DIM: usize = 1 << 24;
/// The largest vocabulary: token ids are u32.
pub(crate) const MAX_VOCAB: usize = 1 << 31;

pub(crate) fn at_most(field: &str, v: usize, max: usize) -> Result<()> {
    if v > max {
        return Err(Error::config(
            field,
            format!("{v} is larger than the largest accepted value, {max}"),
        ));
    }
    Ok(())
}

pub(crate) struct RopeSettings {
    pub(crate) theta: f64,
    pub(crate) partial_rotary_factor: Option<f64>,
    pub(crate) yarn: Option<Yarn>,
}

/// `rope_theta` / `partial_rotary_factor` / yarn at the top level, in
/// `rope_parameters` (transformers 5) or in `rope_scaling`.
pub(crate) fn rope_settings(f: &Fields) -> Result<RopeSettings> {
    let params = f.obj("rope_parameters");
    let scaling = f.obj("rope_scaling");
    let lookup = |k: &str| -> Result<Option<f64>> {
        if let Some(v) = f.f64_opt(k)? {
            return Ok(Some(v));
        }
        for m in [params, scaling].into_iter().flatten() {
            if let Some(v) = f64_in(m, k)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    };
    let theta = lookup("rope_theta")?.unwrap_or(10000.0);
    let partial_rotary_factor = lookup("partial_rotary_factor")?;
    let mut yarn = None;
    for m in [scaling, params].into_iter().flatten() {
        let kind = m
            .get("rope_type")
            .or_else(|| m.get("type"))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        match kind {
            "default" => {}
            "yarn" => {
                let factor = f64_in(m, "factor")?.ok_or_else(|| Error::config("rope_scaling.factor", "missing"))?;
                let omp = match f64_in(m, "original_max_position_embeddings")? {
                    Some(v) => v,
                    None => f
                        .f64_opt("max_position_embeddings")?
                        .ok_or_else(|| Error::config("rope_scaling.original_max_position_embeddings", "missing"))?,
                };
                yarn = Some(Yarn {
                    factor,
                    original_max_position_embeddings: omp,
                    beta_fast: f64_in(m, "beta_fast")?.unwrap_or(32.0),
                    beta_slow: f64_in(m, "beta_slow")?.unwrap_or(1.0),
                    mscale: f64_in(m, "mscale")?,
                    mscale_all_dim: f64_in(m, "mscale_all_dim")?,
                    attention_factor: f64_in(m, "attention_factor")?,
                    truncate: match m.get("truncate") {
                        None | Some(Value::Null) => true,
                        Some(Value::Bool(b)) => *b,
                        Some(v) => return Err(Error::config("rope_scaling.truncate", format!("{v} is not a boolean"))),
                    },
                });
                break;
            }
            other => {
                return Err(Error::config(
                    "rope_scaling.rope_type",
                    format!("`{other}` is not supported (default or yarn)"),
                ))
            }
        }
    }
    Ok(RopeSettings {
        theta,
        partial_rotary_factor,
        yarn,
    })
}

/// Qwen rule: layer i is MoE iff i ∉ mlp_only_layers and (i+1) % step == 0.
pub(crate) fn qwen_moe_layers(f: &Fields, n: usize) -> Result<Vec<FfnKind>> {
    let only = f.usize_list("mlp_only_layers")?;
    if let Some(&bad) = only.iter().find(|&&i| i >= n) {
        return Err(Error::config(
            "mlp_only_layers",
            format!("names layer {bad}, but the model has {n} layers"),
        ));
    }
    let step = f.usize_or("decoder_sparse_step", 1)?;
    if step == 0 {
        return Err(Error::config("decoder_sparse_step", "must be greater than 0"));
    }
    Ok((0..n)
        .map(|i| {
            if !only.contains(&i) && (i + 1) % step == 0 {
                FfnKind::Moe
            } else {
                FfnKind::Dense
            }
        })
        .collect())
}

/// `layer_types` if present, else every `full_attention_interval`-th layer.
pub(crate) fn hybrid_attn_kinds(f: &Fields, n: usize) -> Result<Vec<AttnKind>> {
    if let Some(v) = f.get("layer_types") {
        let a = v
            .as_array()
            .ok_or_else(|| Error::config("layer_types", "expected a list"))?;
        if a.len() != n {
            return Err(Error::config(
                "layer_types",
                format!("has {} entries for {} layers", a.len(), n),
            ));
        }
        return a
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(AttnKind::Full),
                Some("linear_attention") => Ok(AttnKind::Linear),
                _ => Err(Error::config(
                    "layer_types",
                    format!("unknown layer type {t} (expected full_attention or linear_attention)"),
                )),
            })
            .collect();
    }
    let every = f.usize_or("full_attention_interval", 4)?;
    if every == 0 {
        return Err(Error::config("full_attention_interval", "must be greater than 0"));
    }
    Ok((0..n)
        .map(|i| {
            if (i + 1) % every == 0 {
                AttnKind::Full
            } else {
                AttnKind::Linear
            }
        })
        .collect())
}
