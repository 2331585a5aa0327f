//! The OpenAI request fields both completion endpoints share: reading a
//! JSON body field by field (so that a wrong one is named in the 400),
//! sampling, stop strings, and the fields refused for now.

use super::api_error::{ApiError, ApiResult};
use crate::generate::GenerationStats;
use crate::text::{Rng, SamplingParams};
use serde_json::{json, Map, Value};

/// A request body: one JSON object. A field that is `null` counts as absent.
pub struct Body(Map<String, Value>);

impl Body {
    pub fn parse(bytes: &[u8]) -> ApiResult<Body> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(m)) => Ok(Body(m)),
            Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object")),
            Err(e) => Err(ApiError::bad_request(format!(
                "the request body is not valid JSON: {e}"
            ))),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    pub fn f32(&self, key: &str) -> ApiResult<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| ApiError::field(key, format!("`{key}` must be a number"))),
        }
    }

    pub fn i64(&self, key: &str) -> ApiResult<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|x| x.fract() == 0.0 && x.abs() < 9e18)
                        .map(|x| x as i64)
                })
                .map(Some)
                .ok_or_else(|| ApiError::field(key, format!("`{key}` must be an integer"))),
        }
    }

    pub fn bool(&self, key: &str) -> ApiResult<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| ApiError::field(key, format!("`{key}` must be true or false"))),
        }
    }

    pub fn str(&self, key: &str) -> ApiResult<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| ApiError::field(key, format!("`{key}` must be a string"))),
        }
    }

    pub fn object(&self, key: &str) -> ApiResult<Option<&Map<String, Value>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_object()
                .map(Some)
                .ok_or_else(|| ApiError::field(key, format!("`{key}` must be an object"))),
        }
    }
}

/// What a completion request asks for besides its prompt.
#[derive(Debug, Clone)]
pub struct Options {
    pub sampling: SamplingParams,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// Log-probabilities of the answer's tokens, with this many
    /// alternatives each.
    pub logprobs: Option<usize>,
}

/// Sampling and streaming fields over the model's defaults (SPEC.md §7):
/// a field the request sets wins, an unset one keeps the default. Fields
/// this server cannot honour yet are refused with a 400 naming them.
pub fn options(body: &Body, defaults: &SamplingParams) -> ApiResult<Options> {
    refuse_unsupported(body)?;
    let mut p = defaults.clone();
    if let Some(t) = body.f32("temperature")? {
        check(t.is_finite() && t >= 0.0, "temperature", "must be ≥ 0")?;
        p.temperature = t;
    }
    if let Some(v) = body.f32("top_p")? {
        check(v > 0.0 && v <= 1.0, "top_p", "must be in (0, 1]")?;
        p.top_p = v;
    }
    if let Some(v) = body.f32("min_p")? {
        check((0.0..=1.0).contains(&v), "min_p", "must be in [0, 1]")?;
        p.min_p = v;
    }
    if let Some(k) = body.i64("top_k")? {
        check(k >= -1, "top_k", "must be ≥ 0 (0 or -1: no limit)")?;
        p.top_k = usize::try_from(k).unwrap_or(0);
    }
    if let Some(v) = body.f32("repetition_penalty")? {
        check(v.is_finite() && v > 0.0, "repetition_penalty", "must be > 0")?;
        p.repetition_penalty = v;
    }
    for (key, dst) in [
        ("presence_penalty", &mut p.presence_penalty),
        ("frequency_penalty", &mut p.frequency_penalty),
    ] {
        if let Some(v) = body.f32(key)? {
            check((-2.0..=2.0).contains(&v), key, "must be in [-2, 2]")?;
            *dst = v;
        }
    }
    p.seed = Some(match body.i64("seed")? {
        Some(s) => s as u64,
        None => Rng::entropy_seed(),
    });
    p.stop = stop_strings(body)?;
    p.logit_bias = logit_bias(body)?;
    let max = match (body.i64("max_completion_tokens")?, body.i64("max_tokens")?) {
        (Some(n), _) => Some(("max_completion_tokens", n)),
        (None, Some(n)) => Some(("max_tokens", n)),
        (None, None) => None,
    };
    if let Some((key, n)) = max {
        check(n >= 1, key, "must be ≥ 1")?;
        p.max_tokens = Some(n as usize);
    }
    let stream = body.bool("stream")?.unwrap_or(false);
    let include_usage = match body.object("stream_options")? {
        Some(o) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::field(
                    "stream_options.include_usage",
                    "`stream_options.include_usage` must be true or false",
                ))
            }
        },
        None => false,
    };
    Ok(Options {
        sampling: p,
        stream,
        include_usage,
        logprobs: logprobs(body)?,
    })
}

/// Chat's `logprobs: true` with `top_logprobs` in [0, 20], or text
/// completions' `logprobs: N` (N alternatives, at most 20).
fn logprobs(body: &Body) -> ApiResult<Option<usize>> {
    let top = body.i64("top_logprobs")?;
    if let Some(n) = top {
        check((0..=20).contains(&n), "top_logprobs", "must be in [0, 20]")?;
    }
    let top = top.unwrap_or(0) as usize;
    let on = match body.get("logprobs") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(top),
        Some(v) => match v.as_u64().filter(|&n| n <= 20) {
            Some(n) => Some(n as usize),
            None => {
                return Err(ApiError::field(
                    "logprobs",
                    "`logprobs` must be true or false (chat) or a number of alternatives in [0, 20]",
                ))
            }
        },
    };
    if on.is_none() && top > 0 {
        return Err(ApiError::field("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
    }
    Ok(on)
}

fn check(ok: bool, key: &str, want: &str) -> ApiResult<()> {
    if ok {
        Ok(())
    } else {
        Err(ApiError::field(key, format!("`{key}` {want}")))
    }
}

/// Most `stop` strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// Longest `stop` string, in bytes.
pub const MAX_STOP_BYTES: usize = 1024;

/// `stop`: a string or a list of at most [`MAX_STOP`] strings.
fn stop_strings(body: &Body) -> ApiResult<Vec<String>> {
    let bad = || ApiError::field("stop", "`stop` must be a string or a list of strings");
    let list = match body.get("stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() > MAX_STOP => {
            return Err(ApiError::field(
                "stop",
                format!("`stop` has {} strings; at most {MAX_STOP} are allowed", a.len()),
            ))
        }
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<ApiResult<Vec<_>>>()?,
        Some(_) => return Err(bad()),
    };
    if list.iter().any(String::is_empty) {
        return Err(ApiError::field("stop", "`stop` strings must not be empty"));
    }
    if let Some(long) = list.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::field(
            "stop",
            format!(
                "a `stop` string is {} bytes long; at most {MAX_STOP_BYTES} are allowed",
                long.len()
            ),
        ));
    }
    Ok(list)
}

/// `logit_bias`: `{"TOKEN_ID": BIAS}` with biases in [-100, 100].
fn logit_bias(body: &Body) -> ApiResult<Vec<(u32, f32)>> {
    let Some(map) = body.object("logit_bias")? else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(k, v)| {
            let id = k.parse::<u32>().map_err(|_| {
                ApiError::field("logit_bias", format!("`logit_bias` keys must be token ids, got {k:?}"))
            })?;
            let bias = v.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
                ApiError::field(
                    "logit_bias",
                    format!("`logit_bias` values must be numbers in [-100, 100], got {v}"),
                )
            })?;
            Ok((id, bias as f32))
        })
        .collect()
}

/// Fields asking for something this server does not do (yet).
fn refuse_unsupported(body: &Body) -> ApiResult<()> {
    if let Some(n) = body.i64("n")? {
        if n != 1 {
            return Err(ApiError::field(
                "n",
                format!(
                    "`n` must be 1: this server makes one choice per request (got {n}); send several requests instead"
                ),
            ));
        }
    }
    if let Some(n) = body.i64("best_of")? {
        if n != 1 {
            return Err(ApiError::unsupported("best_of", "`best_of` other than 1"));
        }
    }
    if body.bool("echo")? == Some(true) {
        return Err(ApiError::unsupported("echo", "`echo`"));
    }
    if body.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "`suffix`"));
    }
    Ok(())
}

/// `usage`, with the prompt tokens the slot already held as `cached_tokens`.
pub fn usage(s: &GenerationStats) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": s.reused_tokens},
    })
}

/// moeflux's own per-request figures (an extra field OpenAI clients
/// ignore; the built-in chat page shows them).
pub fn timings(s: &GenerationStats) -> Value {
    let cache = s.prefill_experts.cache.zip(s.decode_experts.cache);
    let hit_rate = cache.and_then(|(p, d)| {
        let (hits, n) = (p.hits + d.hits, p.hits + p.misses + d.hits + d.misses);
        (n > 0).then(|| hits as f64 / n as f64)
    });
    json!({
        "prompt_n": s.prompt_tokens - s.reused_tokens,
        "cached_n": s.reused_tokens,
        "prompt_per_second": s.prefill_tok_s,
        "predicted_n": s.generated_tokens,
        "predicted_per_second": s.decode_tok_s,
        "time_to_first_token_s": s.time_to_first_token_s,
        "expert_cache_hit_rate": hit_rate,
        "expert_bytes_per_token": s.decode_bytes_per_token,
    })
}

/// A fresh response id: `prefix` and 24 hex digits.
pub fn response_id(prefix: &str) -> String {
    format!(
        "{prefix}-{:016x}{:08x}",
        Rng::entropy_seed(),
        Rng::entropy_seed() as u32
    )
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
