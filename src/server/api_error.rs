//! Errors as the OpenAI API returns them:
//! `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

use crate::error::Error;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// One error reply.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

pub type ApiResult<T> = std::result::Result<T, ApiError>;

impl ApiError {
    /// 400: a field of the request (`param`) is wrong.
    pub fn field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(message)
        }
    }

    /// 400 without a field to blame.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 400 for a feature this server does not have yet.
    pub fn unsupported(param: &str, what: &str) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::field(param, format!("{what} is not supported by this server yet"))
        }
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "invalid or missing API key: send `Authorization: Bearer KEY` with the key given to --api-key"
                .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 503: loading, full queue, shutting down.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("service_unavailable"),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::client(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 405: the route exists, not for this method.
    pub fn method_not_allowed(method: &str) -> ApiError {
        ApiError::client(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("this endpoint does not take {method} requests"),
        )
    }

    /// 408: the body did not arrive in time.
    pub fn timeout(message: impl Into<String>) -> ApiError {
        ApiError::client(StatusCode::REQUEST_TIMEOUT, "request_timeout", message)
    }

    /// 413: the body is over the limit.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::client(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", message)
    }

    /// 415: a JSON endpoint sent something that does not say it is JSON.
    pub fn not_json() -> ApiError {
        ApiError::client(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "the request body must be JSON, sent with `Content-Type: application/json`",
        )
    }

    /// 403: a web page of another origin, not allowed by --cors-origin.
    pub fn forbidden_origin(origin: &str) -> ApiError {
        ApiError::client(
            StatusCode::FORBIDDEN,
            "origin_not_allowed",
            format!("requests from web pages of {origin} are not allowed; start the server with --cors-origin {origin} to allow them"),
        )
    }

    /// 500: the server failed (the model, a file it reads, a thread).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    fn client(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
        }
    }

    /// The body, also sent as an SSE event when a stream fails part-way.
    pub fn to_json(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Errors of the library: bad input (`Invalid`, a token outside the
/// vocabulary, a context overflow) is the client's (400); anything else
/// is the server's (500).
impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        match e {
            Error::Invalid(msg) => ApiError::bad_request(msg),
            e @ Error::TokenOutOfRange { .. } => ApiError::bad_request(e.to_string()),
            e @ Error::ContextFull { .. } => ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::bad_request(e.to_string())
            },
            e => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.to_json())).into_response()
    }
}
