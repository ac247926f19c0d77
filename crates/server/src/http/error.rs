//! API errors: every typed refusal of the service layer ([`Refusal`]) is
//! mapped here, once, to a status and a JSON body `{"error": <stable code>,
//! "message": <human text>, ...}`; the few refusals of HTTP's own wire
//! format (a body that cannot be read, an unknown route) are built here too.
//! Internal details (database errors, panics) are logged, never sent to the
//! client.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::server::HeadRefusal;
use crate::service::error::{Kind, Refusal};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: Option<Value>,
    retry_after: Option<u64>,
    bearer_challenge: bool,
    close: bool,
}

impl ApiError {
    /// An error with a status, a stable code and a message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), extra: None, retry_after: None, bearer_challenge: false, close: false }
    }

    /// `400` with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// `413` with `code`.
    pub fn too_large(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, code, message)
    }

    /// Closes the connection after this answer (the request was not read
    /// to its end).
    pub fn closing(mut self) -> Self {
        self.close = true;
        self
    }

    /// The stable code.
    pub(crate) fn code(&self) -> &'static str {
        self.code
    }

    /// The human text.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The fields the answer adds beside `error` and `message`.
    pub(crate) fn details(&self) -> Option<&Value> {
        self.extra.as_ref()
    }

    /// `403` with `code`.
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }
}

/// The answer to a request head over the server's limits (then the
/// connection closes: the rest of the request was not read).
pub fn head_refusal(refusal: HeadRefusal) -> Response {
    use crate::server::{MAX_HEAD, MAX_HEADERS, MAX_TARGET};
    let error = match refusal {
        HeadRefusal::Malformed => ApiError::new(StatusCode::BAD_REQUEST, "malformed_request", "the request is not well-formed HTTP/1.1"),
        HeadRefusal::UriTooLong => {
            ApiError::new(StatusCode::URI_TOO_LONG, "uri_too_long", format!("the request target is longer than {MAX_TARGET} bytes"))
        }
        HeadRefusal::HeadersTooLarge => ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("the request head has more than {MAX_HEADERS} headers or {MAX_HEAD} bytes"),
        ),
    };
    error.closing().into_response()
}

/// The status of each kind of refusal: the one place HTTP statuses are chosen.
pub(crate) fn status(kind: Kind) -> StatusCode {
    match kind {
        Kind::Invalid => StatusCode::BAD_REQUEST,
        Kind::Unauthenticated => StatusCode::UNAUTHORIZED,
        Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::Gone => StatusCode::GONE,
        Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Kind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        Kind::TooMany => StatusCode::TOO_MANY_REQUESTS,
        Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The JSON-RPC error code of each kind of refusal (`data.code` carries the
/// stable code).
pub(super) fn rpc_code(kind: Kind) -> i64 {
    match kind {
        Kind::Invalid | Kind::TooLarge | Kind::Unprocessable | Kind::NotAcceptable => tidings_protocol::ws::rpc::INVALID_PARAMS,
        Kind::Unauthenticated => tidings_protocol::ws::rpc::UNAUTHENTICATED,
        Kind::Forbidden => tidings_protocol::ws::rpc::FORBIDDEN,
        Kind::NotFound | Kind::Gone => tidings_protocol::ws::rpc::NOT_FOUND,
        Kind::Conflict => tidings_protocol::ws::rpc::CONFLICT,
        Kind::TooMany | Kind::Unavailable => tidings_protocol::ws::rpc::TRY_LATER,
        Kind::Internal => tidings_protocol::ws::rpc::INTERNAL,
    }
}

impl<E: Refusal + 'static> From<E> for ApiError {
    fn from(e: E) -> Self {
        let kind = e.kind();
        match kind {
            Kind::Unavailable if e.code() == "store_unavailable" => tracing::warn!(error = %crate::report::chain(&e), "store unavailable"),
            Kind::Internal => tracing::error!(error = ?e, "internal error"),
            _ => {}
        }
        let mut err = Self::new(status(kind), e.code(), e.message());
        err.retry_after = e.retry_after();
        err.extra = e.details();
        err.bearer_challenge = kind == Kind::Unauthenticated;
        err
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
        if self.close {
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.bearer_challenge {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
