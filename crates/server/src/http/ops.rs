//! Operator endpoints: `/health` (liveness), `/health/deep` (readiness and
//! state), `/metrics` (Prometheus text) and `/v1/registry`. None of them
//! needs a token.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;

/// The operator console: the live list of events with a filter builder,
/// the server's state, consumers, peers, subscriptions, the tree and a
/// publish form, embedded in the binary (no build step). The page needs no
/// token; everything it reads does.
#[utoipa::path(get, path = "/", tag = "operations", responses((status = 200, description = "The operator console (HTML)", content_type = "text/html", body = String)))]
pub(crate) async fn live_page() -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"))], include_str!("assets/console.html")).into_response()
}

/// The JavaScript client (`clients/js`, compiled), so a page can
/// `import { stream } from "/tidings.js"` with no build step. Code, not data:
/// like the live page it needs no token. Revalidated on every load
/// (`no-cache` with an `ETag` of the build), so an upgraded server is picked
/// up at once.
#[utoipa::path(get, path = "/tidings.js", tag = "operations", responses(
    (status = 200, description = "The JavaScript client (an ES module)", content_type = "text/javascript", body = String),
    (status = 304, description = "Not modified (`If-None-Match`)"),
))]
pub(crate) async fn client_module(request_headers: axum::http::HeaderMap) -> Response {
    const MODULE: &str = include_str!("../../../../clients/js/dist/tidings.js");
    static ETAG: std::sync::LazyLock<HeaderValue> = std::sync::LazyLock::new(|| {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(MODULE.as_bytes());
        HeaderValue::from_str(&format!("\"{}\"", hex::encode(&digest[..8]))).expect("hex is a valid header value")
    });
    let fresh = request_headers.get(header::IF_NONE_MATCH).is_some_and(|v| v.as_bytes() == ETAG.as_bytes());
    let head = [(header::CACHE_CONTROL, HeaderValue::from_static("no-cache")), (header::ETAG, ETAG.clone())];
    if fresh {
        return (StatusCode::NOT_MODIFIED, head).into_response();
    }
    (head, [(header::CONTENT_TYPE, HeaderValue::from_static("text/javascript; charset=utf-8"))], MODULE).into_response()
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/health", tag = "operations", responses((status = 200, description = "Liveness: `{\"status\": \"ok\"}`", body = Object)))]
pub(crate) async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness and state. `503` while the database is down, so a load balancer
/// stops routing publishers here.
#[utoipa::path(
    get,
    path = "/health/deep",
    tag = "operations",
    responses(
        (status = 200, description = "`{status, store, database, head_event_id, history_from, epoch: {number, fork, base, reason, started_ms}, broker_position, listener, replicas: {standbys: [{replica, usable, up, lag_events, lag_ms, reads, last_error?}], primary_history_reads, primary_broker_reads} (null without TIDINGS_REPLICA_URLS; for an admin token, else null), outbox: {depth, oldest_age_ms, set_aside} (PostgreSQL; else null), delivery: {mode: replicated, synchronous_standby: confirming|stalled|none_named|unknown, confirmed_through} (TIDINGS_DELIVERY=replicated; else null), uptime_seconds, freshness: {broker_behind_events, broker_behind_ms, listener_silence_ms, outbox_oldest_ms} (null while the database is down), peers: [{peer, endpoint, state: idle|delivering|failing, delivery: {lanes, backlog, delivered, failed_attempts, lost, last_error?, last_delivered_ms?}}], mirrors: [{name, peer, pattern, state, subscription_id?, applies: {outcome: n}, last_error?}] (peers and mirrors: for an admin token, else null), events: {registered_types, in_flight_subscriptions, broker_lag_ms}}`", body = Object),
        (status = 503, description = "The same document while the database is down", body = Object),
    )
)]
pub(crate) async fn health_deep(
    State(app): State<AppState>,
    caller: Result<super::caller::MaybeCaller, super::error::ApiError>,
) -> Response {
    // Peers (endpoints learned from requests included) and mirror upstreams
    // are shown to admins only: with auth on, a token with `admin`.
    let admin = matches!(caller, Ok(super::caller::MaybeCaller(Some(ref identity))) if identity.admin);
    let store = app.store();
    let probe = tokio::time::timeout(Duration::from_secs(2), async {
        let bounds = store.bounds().await?;
        Ok::<_, crate::store::StoreError>((bounds, store.epochs(bounds.epoch).await?))
    })
    .await;
    let (up, head, floor, epoch) = match probe {
        Ok(Ok((bounds, epochs))) => (true, Some(bounds.head), Some(bounds.floor), Some(epochs.current().clone())),
        _ => (false, None, None, None),
    };
    // Its own deadline: a large outbox may make it slow, never the database
    // "down".
    let outbox = if up {
        tokio::time::timeout(Duration::from_secs(1), store.outbox_status()).await.ok().and_then(|s| s.ok()).flatten()
    } else {
        None
    };
    let listener = store.listener();
    let peers = if up && admin { app.core().subscriptions().peers().await.ok() } else { None };
    let body = json!({
        "status": if up { "ok" } else { "degraded" },
        "store": store.kind().as_str(),
        "database": if up { "up" } else { "down" },
        "head_event_id": head,
        "history_from": floor.map(|f| f + 1),
        // The log's current epoch: a new one began where the store may have
        // lost history (docs/failover.md).
        "epoch": epoch,
        "broker_position": app.broker().position(),
        "listener": { "state": listener.state, "reconnects": listener.reconnects },
        // Standbys' addresses are shown to admins only, like peers.
        "replicas": store.replicas().filter(|_| admin),
        // The SQL outbox (PostgreSQL's tidings.publish): rows waiting to be
        // moved into the log, the oldest one's age, and rows set aside.
        "outbox": outbox,
        // TIDINGS_DELIVERY=replicated: whether the synchronous standby
        // confirms what is shown and answered.
        "delivery": store.delivery(),
        "uptime_seconds": app.inner.started.elapsed().as_secs(),
        "peers": peers,
        "mirrors": if admin { app.core().subscriptions().mirrors() } else { Value::Null },
        // How far delivery is behind commits (docs/metrics.md, "Freshness").
        "freshness": if up {
            tokio::time::timeout(Duration::from_secs(1), crate::service::freshness::measure(app.core())).await.ok().and_then(|f| f.ok())
        } else {
            None
        },
        "events": {
            "registered_types": app.registry().len(),
            "in_flight_subscriptions": app.broker().client_count(),
            "broker_lag_ms": app.broker().lag_ms(),
        },
    });
    let status = if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

/// Readiness, for load balancers and Kubernetes: `200` while this process
/// takes new clients, `503` from the moment a drain begins (SIGTERM), while
/// it still serves the ones it has (DESIGN "Scaling out"). The database is
/// not part of it: during an outage every process is equally unable, and
/// streams stay open on heartbeats.
#[utoipa::path(
    get,
    path = "/health/ready",
    tag = "operations",
    responses(
        (status = 200, description = "`{status: \"ready\"}`", body = Object),
        (status = 503, description = "`{status: \"draining\"}`: the process is on its way out", body = Object),
    )
)]
pub(crate) async fn health_ready(State(app): State<AppState>) -> Response {
    if app.core().draining() {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "draining"}))).into_response()
    } else {
        (StatusCode::OK, Json(json!({"status": "ready"}))).into_response()
    }
}

/// Prometheus exposition.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String)))]
pub(crate) async fn metrics(State(app): State<AppState>) -> Response {
    crate::metrics::collect_process();
    let text = app.inner.metrics.render();
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"))], text).into_response()
}

/// The event-type registry.
#[utoipa::path(
    get,
    path = "/v1/registry",
    tag = "events",
    responses(
        (status = 200, description = "`{mode, types: [{name, description, renamed_from, payload_schema}]}`", body = Object),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn registry(State(app): State<AppState>, _caller: super::caller::Caller) -> Json<Value> {
    let registry = app.registry();
    Json(json!({
        "mode": registry.mode(),
        "types": registry.docs().collect::<Vec<_>>(),
    }))
}
