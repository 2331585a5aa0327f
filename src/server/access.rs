//! Who may use the server: the API key (`--api-key`), and which web pages
//! (`--cors-origin`). By default only the server's own origin (the chat
//! page at `/`) may call it from a browser: a request that carries an
//! `Origin` of another site is refused with 403, and no CORS header lets a
//! page of another site read a reply.

use super::api_error::ApiError;
use super::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

/// With `--api-key`: the request must carry `Authorization: Bearer KEY`
/// (the scheme in any case, RFC 7235), compared in constant time.
pub async fn authorize(State(shared): State<AppState>, headers: HeaderMap, req: Request, next: Next) -> Response {
    if let Some(key) = &shared.config.api_key {
        let given = bearer(&headers).unwrap_or("");
        if !keys_match(given.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// The token of an `Authorization: Bearer TOKEN` header.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once([' ', '\t'])?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// `given == expected`, in a time that depends only on their lengths: every
/// byte of the longer one is compared, and nothing ends the loop early.
pub fn keys_match(given: &[u8], expected: &[u8]) -> bool {
    let n = given.len().max(expected.len());
    let mut diff = u8::from(given.len() != expected.len());
    for i in 0..n {
        let a = given.get(i).copied().unwrap_or(0);
        let b = expected.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(a ^ b);
    }
    diff == 0
}

/// The CORS layer for `--cors-origin` (none: no CORS headers at all, so
/// that browsers keep other origins from reading replies).
pub fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION]),
    )
}

/// Refuse a request sent by a web page of an origin that is neither the
/// server's own nor allowed by `--cors-origin` (a simple request, such as
/// a form post, reaches the server without a preflight).
pub async fn check_origin(State(shared): State<AppState>, headers: HeaderMap, req: Request, next: Next) -> Response {
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        if !origin_allowed(origin, host, &shared.config.cors_origins) {
            return ApiError::forbidden_origin(origin).into_response();
        }
    }
    next.run(req).await
}

/// Whether a page of `origin` may call a server reached as `host`.
pub fn origin_allowed(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    let same = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .zip(host)
        .is_some_and(|(authority, host)| authority.eq_ignore_ascii_case(host.trim()));
    same || allowed.iter().any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_only_when_equal() {
        assert!(keys_match(b"sesame", b"sesame"));
        assert!(!keys_match(b"sesam", b"sesame"));
        assert!(!keys_match(b"sesamf", b"sesame"));
        assert!(!keys_match(b"", b"sesame"));
        assert!(!keys_match(b"sesame\0", b"sesame"));
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        let mut h = HeaderMap::new();
        for (value, token) in [
            ("Bearer k1", Some("k1")),
            ("bearer k1", Some("k1")),
            ("BEARER   k1 ", Some("k1")),
            ("Basic k1", None),
            ("Bearerk1", None),
        ] {
            h.insert(header::AUTHORIZATION, value.parse().unwrap());
            assert_eq!(bearer(&h), token, "{value}");
        }
    }

    #[test]
    fn only_the_own_origin_and_allowed_ones_pass() {
        let none: Vec<String> = Vec::new();
        assert!(origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080"), &none));
        assert!(!origin_allowed("https://evil.example", Some("127.0.0.1:8080"), &none));
        assert!(!origin_allowed("null", Some("127.0.0.1:8080"), &none));
        let some = vec!["https://app.example".to_string()];
        assert!(origin_allowed("https://app.example", Some("127.0.0.1:8080"), &some));
        assert!(!origin_allowed("https://evil.example", Some("127.0.0.1:8080"), &some));
        let any = vec!["*".to_string()];
        assert!(origin_allowed("https://evil.example", None, &any));
    }
}
