//! `GET /`: a small chat page (plain HTML and JavaScript, no build step).

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("page.html");

pub async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}
