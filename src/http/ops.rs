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

/// The live page: a filter builder and a live list of envelopes, embedded
/// in the binary (no build step).
pub(crate) async fn live_page() -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"))], include_str!("assets/live.html")).into_response()
}

/// Liveness: the process serves HTTP.
pub(crate) async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness and state. `503` while the database is down, so a load balancer
/// stops routing publishers here.
pub(crate) async fn health_deep(State(app): State<AppState>) -> Response {
    let store = app.store();
    let probe = tokio::time::timeout(Duration::from_secs(2), async { (store.ping().await, store.head().await, store.floor().await) }).await;
    let (up, head, floor) = match probe {
        Ok((Ok(()), Ok(head), Ok(floor))) => (true, Some(head), Some(floor)),
        _ => (false, None, None),
    };
    let (listener, reconnects) = store.listener();
    let body = json!({
        "status": if up { "ok" } else { "degraded" },
        "store": store.kind().as_str(),
        "database": if up { "up" } else { "down" },
        "head_event_id": head,
        "history_from": floor.map(|f| f + 1),
        "broker_position": app.broker().position(),
        "listener": { "state": listener, "reconnects": reconnects },
        "uptime_seconds": app.inner.started.elapsed().as_secs(),
        "events": {
            "registered_types": app.registry().len(),
            "in_flight_subscriptions": app.broker().client_count(),
            "broker_lag_ms": app.broker().lag_ms(),
        },
    });
    let status = if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(body)).into_response()
}

/// Prometheus exposition.
pub(crate) async fn metrics(State(app): State<AppState>) -> Response {
    let text = app.inner.metrics.render();
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"))], text).into_response()
}

/// The event-type registry.
pub(crate) async fn registry(State(app): State<AppState>, _caller: super::caller::Caller) -> Json<Value> {
    let registry = app.registry();
    Json(json!({
        "mode": registry.mode(),
        "types": registry.docs().collect::<Vec<_>>(),
    }))
}
