//! The caller of a request, as an axum extractor: the verified identity from
//! a bearer token, or the local identity when authentication is off. Also
//! the query extractor whose refusals are JSON like every other. Every
//! handler that needs a caller takes [`Caller`]; `/health`, `/health/ready`,
//! `/health/deep` and `/metrics` do not, so they never require a token.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use super::AppState;
use super::error::ApiError;
use crate::auth::{AuthMode, Identity, find_token};

/// The verified caller.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) Identity);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        match state.auth() {
            AuthMode::Off => Ok(Caller(state.local_identity().clone())),
            AuthMode::Jwt(verifier) => {
                let header_str = |name| parts.headers.get(name).and_then(|v| v.to_str().ok());
                let cookie_taken = takes_cookie(parts);
                let token = find_token(header_str(header::AUTHORIZATION), cookie(parts), parts.uri.query())
                    .ok_or(crate::auth::AuthError::Missing { cookie: cookie_taken })?;
                Ok(Caller(verifier.verify(&token)?))
            }
        }
    }
}

/// The `Cookie` header, where an `access_token` cookie may authenticate:
/// only the two requests a browser cannot add a header to, an
/// `EventSource` (`GET /v1/stream`) and a WebSocket (`GET /v1/ws`, whose
/// `Origin` the guard checks). A cookie goes with every request a page on
/// another site makes the browser send (a link, an image, a form), so
/// nowhere else does it authenticate: such a request cannot move a durable
/// consumer's cursor or write anything.
fn cookie(parts: &Parts) -> Option<&str> {
    takes_cookie(parts).then(|| parts.headers.get(header::COOKIE).and_then(|v| v.to_str().ok())).flatten()
}

/// Whether an `access_token` cookie authenticates this request.
fn takes_cookie(parts: &Parts) -> bool {
    let path = parts.uri.path();
    parts.method == axum::http::Method::GET && (path == "/v1/stream" || path == "/v1/ws")
}

/// The caller where a bearer token is optional (`POST /v1/execute`, whose
/// EXECUTEs are signed and carry their own capabilities, so a peer
/// delivering to an inbox needs no token here): `None` when authentication
/// is on and no token was sent; a token that is sent must verify.
#[derive(Debug, Clone)]
pub(crate) struct MaybeCaller(pub(crate) Option<Identity>);

impl FromRequestParts<AppState> for MaybeCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        match state.auth() {
            AuthMode::Off => Ok(MaybeCaller(Some(state.local_identity().clone()))),
            AuthMode::Jwt(verifier) => {
                let header_str = |name| parts.headers.get(name).and_then(|v| v.to_str().ok());
                match find_token(header_str(header::AUTHORIZATION), cookie(parts), parts.uri.query()) {
                    None => Ok(MaybeCaller(None)),
                    Some(token) => Ok(MaybeCaller(Some(verifier.verify(&token)?))),
                }
            }
        }
    }
}

/// Query parameters as an extractor whose refusal is a JSON error like every
/// other (`400 invalid_query`), not axum's plain-text one. A parameter given
/// twice (`since=1&since=2`) is refused rather than one of them silently
/// winning: the request is ambiguous.
#[derive(Debug)]
pub(crate) struct Params<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Params(value)),
            Err(rejection) => Err(ApiError::bad_request("invalid_query", rejection.body_text())),
        }
    }
}
