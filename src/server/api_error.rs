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
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
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
            e => ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: e.to_string(),
                kind: "server_error",
                param: None,
                code: None,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.to_json())).into_response()
    }
}
