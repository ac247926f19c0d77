//! The HTTP layer: the router, the shared application state handed to
//! handlers, and one file per transport. Only this module (and the
//! connection loop in `server`) knows axum; handlers read the request,
//! call the service layer ([`crate::service`]) and write its answer.

#![allow(clippy::disallowed_types, reason = "a transport speaks HTTP")]

mod caller;
mod compress;
pub mod error;
mod events;
mod execute;
mod guard;
mod identity;
mod mcp;
mod openapi;
mod ops;
mod poll;
mod sse;
mod tree;
mod ws;
mod ws_park;
mod ws_socket;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthMode, Identity};
use crate::broker::Broker;
use crate::config::Settings;
use crate::registry::Registry;
use crate::service::Services;
use crate::store::Store;
use error::ApiError;
pub use error::head_refusal;
pub use sse::sse_frame;

/// What every handler may use. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    core: Services,
    auth: AuthMode,
    local: Identity,
    metrics: PrometheusHandle,
    started: Instant,
    /// The OpenAPI document, set once the router is assembled.
    openapi: std::sync::OnceLock<serde_json::Value>,
}

impl AppState {
    /// The HTTP layer over `core`: how callers are authenticated, and what
    /// renders `/metrics`.
    pub fn new(core: Services, auth: AuthMode, metrics: PrometheusHandle) -> Self {
        let inner = Inner { core, auth, local: Identity::local(), metrics, started: Instant::now(), openapi: std::sync::OnceLock::new() };
        Self { inner: Arc::new(inner) }
    }

    fn core(&self) -> &Services {
        &self.inner.core
    }

    fn auth(&self) -> &AuthMode {
        &self.inner.auth
    }

    fn local_identity(&self) -> &Identity {
        &self.inner.local
    }

    fn settings(&self) -> &Settings {
        self.inner.core.settings()
    }

    fn store(&self) -> &Arc<dyn Store> {
        self.inner.core.store()
    }

    fn broker(&self) -> &Broker {
        self.inner.core.broker()
    }

    fn registry(&self) -> &Registry {
        self.inner.core.registry()
    }
}

/// Whether a `GET` of `path` is an endless stream, which the connection
/// loop serves on its direct path (see `server`): the routes that write
/// their body as frames of a session.
pub fn streams(path: &str) -> bool {
    path == "/v1/stream"
}

/// The CORS layer for `TIDINGS_CORS_ORIGINS`: none when empty; `*` allows
/// any origin without credentials; an explicit list allows credentials
/// (cookies) for exactly those origins.
pub fn cors(origins: &str) -> anyhow::Result<Option<tower_http::cors::CorsLayer>> {
    use axum::http::{HeaderName, HeaderValue, Method, header};
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    let origins = origins.trim();
    if origins.is_empty() {
        return Ok(None);
    }
    let methods = [Method::GET, Method::POST, Method::PUT, Method::DELETE];
    // What a page may read of an answer beyond the safelisted headers: that
    // a publish was answered from its Idempotency-Key.
    let exposed = [HeaderName::from_static("idempotent-replayed")];
    if origins == "*" {
        return Ok(Some(CorsLayer::new().allow_origin(Any).allow_methods(methods).allow_headers(Any).expose_headers(exposed)));
    }
    let list = origins
        .split(',')
        .map(|o| o.trim())
        .filter(|o| !o.is_empty())
        .map(|o| {
            anyhow::ensure!(o != "*", "TIDINGS_CORS_ORIGINS: '*' cannot be mixed with explicit origins");
            HeaderValue::from_str(o).map_err(|_| anyhow::anyhow!("TIDINGS_CORS_ORIGINS: {o:?} is not a valid origin"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let headers = [
        header::AUTHORIZATION,
        header::CONTENT_TYPE,
        HeaderName::from_static("last-event-id"),
        HeaderName::from_static("idempotency-key"),
        header::IF_MATCH,
        header::IF_NONE_MATCH,
    ];
    Ok(Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(list))
            .allow_credentials(true)
            .allow_methods(methods)
            .allow_headers(headers)
            .expose_headers(exposed),
    ))
}

/// Builds the router and, from the same handler annotations, the OpenAPI
/// document: every route is registered through `routes!`, so none can be
/// missing from `/openapi.json` (a test checks that no plain axum route call is
/// used here).
pub fn router(state: AppState) -> Router {
    use utoipa::OpenApi as _;
    use utoipa_axum::router::OpenApiRouter;
    use utoipa_axum::routes;
    let cors = cors(&state.settings().http.cors_origins).ok().flatten();
    let guard = guard::Guard::new(&state.settings().http.cors_origins, matches!(state.auth(), AuthMode::Off));
    let (router, api) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(ops::live_page))
        .routes(routes!(ops::client_module))
        .routes(routes!(events::publish))
        .routes(routes!(events::event))
        .routes(routes!(sse::stream))
        .routes(routes!(ws::upgrade))
        .routes(routes!(poll::poll_get, poll::poll_post))
        .routes(routes!(poll::list))
        .routes(routes!(poll::delete))
        .routes(routes!(poll::ack))
        .routes(routes!(ops::registry))
        .routes(routes!(ops::health))
        .routes(routes!(ops::health_deep))
        .routes(routes!(ops::health_ready))
        .routes(routes!(ops::metrics))
        .routes(routes!(openapi::document))
        .routes(routes!(identity::get))
        .routes(routes!(identity::me))
        .routes(routes!(identity::mint))
        .routes(routes!(execute::execute))
        .routes(routes!(mcp::post))
        .routes(routes!(tree::root))
        .routes(routes!(tree::get, tree::put, tree::delete))
        .split_for_parts();
    let mut doc = openapi_paths(serde_json::to_value(&api).unwrap_or_default());
    openapi::refine(&mut doc, state.settings());
    let _ = state.inner.openapi.set(doc);
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(Arc::new(guard), observe_requests))
        .with_state(state);
    match cors {
        Some(cors) => router.layer(cors),
        None => router,
    }
}

/// The document as OpenAPI spells paths: axum's catch-all `{*path}` (which
/// the routes are registered with) is the template `{path}`, so tools can
/// generate and call the tree routes.
fn openapi_paths(mut doc: serde_json::Value) -> serde_json::Value {
    if let Some(paths) = doc.get_mut("paths").and_then(|p| p.as_object_mut()) {
        let renamed: serde_json::Map<String, serde_json::Value> =
            std::mem::take(paths).into_iter().map(|(path, item)| (path.replace("{*", "{"), item)).collect();
        *paths = renamed;
    }
    doc
}

async fn not_found() -> ApiError {
    ApiError::new(axum::http::StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(axum::http::StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this endpoint does not take that method")
}

/// Gives every request an id (`x-request-id`, echoed when the client sent
/// one), refuses it before anything runs when its head is over the limits
/// or [`guard`] refuses it, logs it at debug level with the query string
/// redacted (tokens may travel there), and counts it by route template
/// (never the raw path: bounded labels).
/// Cancelled when the client of a non-`GET` request goes away before its
/// answer. Such requests run detached, so that a write is never cut off
/// half-way; what only waits on the client's behalf (a long poll, on HTTP or
/// MCP) watches this and gives its place back.
#[derive(Clone, Debug)]
pub(crate) struct ClientGone(pub(crate) CancellationToken);

#[expect(clippy::disallowed_methods, reason = "the request's observer finishes after the response is handed to the connection")]
async fn observe_requests(axum::extract::State(guard): axum::extract::State<Arc<guard::Guard>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "unmatched".to_owned());
    let request_id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .map(str::to_owned)
        .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let query = request.uri().query().map(crate::auth::redact_query);
    let mutates = request.method() != axum::http::Method::GET && request.method() != axum::http::Method::HEAD;
    // Cancelled when the client goes away before its answer (a write runs
    // on, detached; what waits for it, a long poll, stops).
    let gone = CancellationToken::new();
    let mut request = request;
    if mutates {
        request.extensions_mut().insert(ClientGone(gone.clone()));
    }
    let refused = match crate::server::HeadRefusal::check(&request) {
        Some(refusal) => Some(error::head_refusal(refusal)),
        None => guard.check(&request).map(IntoResponse::into_response),
    };
    let handle = async move {
        let mut response = match refused {
            Some(refusal) => refusal,
            None => next.run(request).await.into_response(),
        };
        let status = response.status().as_u16();
        tracing::debug!(request_id, %method, path, query, status, elapsed_ms = started.elapsed().as_millis() as u64, "request");
        if let Ok(value) = axum::http::HeaderValue::from_str(&request_id) {
            response.headers_mut().insert("x-request-id", value);
        }
        crate::metrics::http_request(route, status);
        response
    };
    if !mutates {
        // A read (a stream, a poll) whose client is gone may stop at once.
        return handle.await;
    }
    // A write runs on its own task, so a client that goes away does not
    // cancel it half-way: a publish that commits is counted (and answered,
    // for nobody) like any other, and no store call is cut off mid-flight.
    let on_drop = gone.drop_guard();
    let answered = tokio::spawn(handle).await;
    on_drop.disarm();
    match answered {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %crate::report::chain(&e), "a request handler panicked");
            ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error").into_response()
        }
    }
}
