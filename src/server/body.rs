//! A JSON request's body, read under bounds before anything parses it:
//! it must say it is JSON (`Content-Type: application/json`, which a web
//! page of another origin cannot send without a CORS preflight), it may
//! not be longer than `--max-body`, and it must arrive within
//! `--body-timeout`.

use super::api_error::{ApiError, ApiResult};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;
use std::time::Duration;

/// How much a request body may hold, and how long it may take.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    pub bytes: usize,
    pub timeout: Duration,
}

/// The body of a request to a JSON endpoint.
pub async fn read_json(headers: &HeaderMap, body: Body, limits: BodyLimits) -> ApiResult<Bytes> {
    if !is_json(headers) {
        return Err(ApiError::not_json());
    }
    let too_large = |n: String| {
        ApiError::too_large(format!(
            "the request body is {n} bytes; this server takes at most {} (--max-body)",
            limits.bytes
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limits.bytes as u64) {
        return Err(too_large(n.to_string()));
    }
    let read = async {
        let mut out = Vec::new();
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
            if out.len() + chunk.len() > limits.bytes {
                return Err(too_large(format!("over {}", limits.bytes)));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    };
    tokio::time::timeout(limits.timeout, read).await.map_err(|_| {
        ApiError::timeout(format!(
            "the request body did not arrive within {} s (--body-timeout)",
            limits.timeout.as_secs_f64()
        ))
    })?
}

/// `Content-Type: application/json`, with or without parameters.
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_json_content_types_are_json() {
        assert!(is_json(&headers(&[("content-type", "application/json")])));
        assert!(is_json(&headers(&[(
            "content-type",
            "Application/JSON; charset=utf-8"
        )])));
        assert!(!is_json(&headers(&[("content-type", "text/plain")])));
        assert!(!is_json(&headers(&[(
            "content-type",
            "application/x-www-form-urlencoded"
        )])));
        assert!(!is_json(&headers(&[])));
    }
}
