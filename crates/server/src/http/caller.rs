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
/// other (`400 invalid_query`), not axum's plain-text one. Strict: a
/// parameter the endpoint does not take is refused (`type=a.b`, a typo of
/// `types`, would otherwise stream everything), and so is one given twice
/// (`since=1&since=2`), rather than one of them silently winning.
#[derive(Debug)]
pub(crate) struct Params<T>(pub(crate) T);

/// The query parameters an endpoint takes, besides `access_token`, which
/// every endpoint takes (for browsers, which cannot set a header on an
/// `EventSource` or a WebSocket).
pub(crate) trait QueryNames {
    /// The endpoint, as its refusals name it.
    const ENDPOINT: &'static str;
    /// Every parameter it takes.
    const NAMES: &'static [&'static str];
}

impl<T: serde::de::DeserializeOwned + QueryNames + Send, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        if let Some((unknown, _)) =
            form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k != "access_token" && !T::NAMES.contains(&k.as_ref()))
        {
            return Err(ApiError::bad_request("invalid_query", unknown_parameter::<T>(&unknown)));
        }
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Params(value)),
            Err(rejection) => Err(ApiError::bad_request("invalid_query", query_refusal(&rejection.body_text()))),
        }
    }
}

/// Says which parameter is unknown, what the endpoint takes, and the one
/// meant when it is a near miss (`type` for `types`).
fn unknown_parameter<T: QueryNames>(name: &str) -> String {
    // Bounded: a name is echoed, never a whole hostile query.
    let shown: String = name.chars().take(64).collect();
    let near = T::NAMES.iter().find(|known| edits(name, known) <= 2 || (name.len() >= 3 && known.starts_with(name)));
    let hint = near.map(|n| format!("; did you mean `{n}`?")).unwrap_or_default();
    format!("{} takes no query parameter `{shown}`{hint} (it takes {}, and access_token)", T::ENDPOINT, T::NAMES.join(", "))
}

/// The edit distance between two short names (capped: longer names are
/// not near misses).
fn edits(a: &str, b: &str) -> usize {
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (previous + usize::from(ca != cb)).min(row[j] + 1).min(here + 1);
            previous = here;
        }
    }
    row[b.len()]
}

/// The framework's refusal of a query string, in tidings' words.
fn query_refusal(text: &str) -> String {
    let reason = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(text);
    match reason.strip_prefix("duplicate field `").and_then(|rest| rest.strip_suffix('`')) {
        Some(name) => format!("the query parameter `{name}` is given twice"),
        None => format!("the query string is not valid: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_are_named() {
        assert_eq!((edits("type", "types"), edits("sinse", "since"), edits("x", "consumer_id")), (1, 1, 11));
        struct Q;
        impl QueryNames for Q {
            const ENDPOINT: &'static str = "GET /v1/stream";
            const NAMES: &'static [&'static str] = &["types", "since"];
        }
        assert_eq!(
            unknown_parameter::<Q>("type"),
            "GET /v1/stream takes no query parameter `type`; did you mean `types`? (it takes types, since, and access_token)"
        );
        assert!(!unknown_parameter::<Q>("zzzzzz").contains("did you mean"));
        assert_eq!(
            query_refusal("Failed to deserialize query string: duplicate field `since`"),
            "the query parameter `since` is given twice"
        );
    }
}
