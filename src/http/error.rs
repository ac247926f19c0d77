//! API errors: one enum, mapped once to a status and a JSON body
//! `{"error": <stable code>, "message": <human text>, ...}`. Internal details
//! (database errors, panics) are logged, never sent to the client.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::store::StoreError;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: Option<Value>,
    retry_after: Option<u64>,
    bearer_challenge: bool,
}

impl ApiError {
    /// An error with a status, a stable code and a message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), extra: None, retry_after: None, bearer_challenge: false }
    }

    /// `400` with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// `422` with `code`.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// `413` with `code`.
    pub fn too_large(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, code, message)
    }

    /// `401`, with `WWW-Authenticate: Bearer`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        let mut err = Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
        err.bearer_challenge = true;
        err
    }

    /// `403` with `code`.
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }

    /// Asks the client to come back after `secs`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Adds fields to the JSON body.
    pub fn with_extra(mut self, extra: Value) -> Self {
        self.extra = Some(extra);
        self
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "store unavailable");
                let mut err =
                    Self::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "the event store is unavailable; retry later");
                err.retry_after = Some(1);
                err
            }
            StoreError::Other(e) => {
                tracing::error!(error = ?e, "store error");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.code, "message": self.message });
        if let (Some(Value::Object(extra)), Value::Object(map)) = (self.extra, &mut body) {
            map.extend(extra);
        }
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.bearer_challenge {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
