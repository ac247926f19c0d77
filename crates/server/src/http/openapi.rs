//! The OpenAPI description served at `/openapi.json`, generated from the
//! handlers' `#[utoipa::path]` annotations: the router is assembled with
//! `utoipa-axum`, so a route cannot exist without appearing here.

use axum::Json;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

mod schemas;
pub(crate) use schemas::refine;

/// Every error answer: a stable code and a human message (some codes add
/// fields, such as `supported` for `envelope_version_unsupported`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// The stable code (`invalid_filter`, `cursor_expired`, ...).
    pub(crate) error: String,
    /// What went wrong, for people.
    pub(crate) message: String,
}

/// The filter parameters shared by `/v1/stream` and `/v1/poll` (for the
/// document; the handlers parse them as [`crate::filter::FilterQuery`]).
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct FilterParams {
    /// JSON filter `{types, agents, targets, payload}` (a bare list means types).
    filter: Option<String>,
    /// Comma list of type globs (`*` one segment, `**` one or more).
    types: Option<String>,
    /// Comma list of agent ids.
    agents: Option<String>,
    /// Comma list of references (`ref` or any `links[].ref`).
    targets: Option<String>,
    /// Comma list of envelope versions the client understands.
    accept_envelope: Option<String>,
}

/// The document's frame: title, tags and security schemes. Paths come from
/// the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "tidings",
        description = "Event-stream broker: publish events, receive exactly the ones your filter asks for over SSE or long-poll, \
                       resume with nothing lost. Every error answer is `{error, message}` with a stable code. Besides the codes \
                       listed per operation: an unknown path answers 404 `not_found`, a wrong method 405 `method_not_allowed`, \
                       a request target over 48 KiB 414 `uri_too_long`, a head with more than 100 headers or over 64 KiB \
                       431 `headers_too_large`, a head that does not parse 400 `malformed_request` (each closes the connection), \
                       a token that is missing where one is needed, expired, malformed or wrongly signed 401 `unauthorized` (with \
                       `WWW-Authenticate: Bearer`), and an unexpected failure 500 `internal` (details are logged, never sent)."
    ),
    components(schemas(ErrorBody)),
    modifiers(&Security),
    tags(
        (name = "events", description = "Publishing and the registry"),
        (name = "streams", description = "Server-Sent Events, polling and durable consumers"),
        (name = "operations", description = "Health, metrics, the live page and this document"),
        (name = "tree", description = "The entity tree: CAS writes that append change events"),
    )
)]
pub(crate) struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build()),
        );
        components.add_security_scheme("access_token_query", SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::new("access_token"))));
        components.add_security_scheme("access_token_cookie", SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::new("access_token"))));
    }
}

/// Serves the document built with the router.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses((status = 200, description = "This document", body = Object)))]
pub(crate) async fn document(axum::extract::State(app): axum::extract::State<super::AppState>) -> impl IntoResponse {
    Json(app.inner.openapi.get().cloned().unwrap_or_default())
}
