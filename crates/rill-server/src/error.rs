//! Errors in OpenAI's JSON shape, with the right status. Every failure of a request becomes
//! one [`ApiError`] here, once; handlers never build error bodies themselves.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: Some("invalid_value"),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or wrong API key (send `Authorization: Bearer <key>`)".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("forbidden"),
        }
    }

    pub fn busy() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is at its limit of concurrent requests; retry shortly".into(),
            kind: "server_error",
            param: None,
            code: Some("overloaded"),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }
}

/// Engine errors at the edge: bad input is the client's (400), the rest is ours (500).
impl From<rill_engine::Error> for ApiError {
    fn from(e: rill_engine::Error) -> Self {
        use rill_engine::Error as E;
        match &e {
            E::InvalidParam { field, .. } => ApiError::invalid(*field, e.to_string()),
            E::PromptTooLong { .. } => ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::invalid("messages", e.to_string())
            },
            E::Template(_) | E::TemplateLimit(_) | E::Tokenizer(_) => {
                ApiError::invalid("messages", e.to_string())
            }
            E::Grammar(_) => ApiError::invalid("response_format", e.to_string()),
            E::Image(_) => ApiError::invalid("messages", e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}});
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was never read, so this connection cannot carry another
            // request: say so, or a client may send its next request on it as it closes.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}
