//! The HTTP layer: the router, the shared application state handed to
//! handlers, and one file per transport. Only this module knows axum.

pub mod error;
mod events;
mod ops;
mod poll;
mod sse;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::config::Settings;
use crate::filter::FilterLimits;
use crate::registry::Registry;
use crate::store::EventLog;
use error::ApiError;

/// What every handler may use. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: Settings,
    store: Arc<dyn EventLog>,
    broker: Broker,
    registry: Arc<Registry>,
    metrics: PrometheusHandle,
    shutdown: CancellationToken,
    started: Instant,
}

impl AppState {
    /// Bundles the handles.
    pub fn new(
        settings: Settings,
        store: Arc<dyn EventLog>,
        broker: Broker,
        registry: Arc<Registry>,
        metrics: PrometheusHandle,
        shutdown: CancellationToken,
    ) -> Self {
        Self { inner: Arc::new(Inner { settings, store, broker, registry, metrics, shutdown, started: Instant::now() }) }
    }

    fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    fn store(&self) -> &Arc<dyn EventLog> {
        &self.inner.store
    }

    fn broker(&self) -> &Broker {
        &self.inner.broker
    }

    fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    fn consumer_ttl_ms(&self) -> i64 {
        self.inner.settings.consumer_ttl.as_millis().min(i64::MAX as u128) as i64
    }

    fn filter_limits(&self) -> FilterLimits {
        let s = &self.inner.settings;
        FilterLimits {
            max_bytes: s.max_filter_bytes,
            max_list: s.max_filter_list,
            rule: crate::filter::RuleLimits { max_depth: s.max_rule_depth, max_nodes: s.max_rule_nodes },
        }
    }
}

/// Builds the router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(ops::live_page))
        .route("/v1/events", post(events::publish))
        .route("/v1/stream", get(sse::stream))
        .route("/v1/poll", get(poll::poll_get).post(poll::poll_post))
        .route("/v1/consumers", get(poll::list))
        .route("/v1/consumers/{id}", axum::routing::delete(poll::delete))
        .route("/v1/consumers/{id}/ack", post(poll::ack))
        .route("/v1/registry", get(ops::registry))
        .route("/health", get(ops::health))
        .route("/health/deep", get(ops::health_deep))
        .route("/metrics", get(ops::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(count_requests))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(axum::http::StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(axum::http::StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this endpoint does not take that method")
}

/// Counts requests by route template (never the raw path: bounded labels).
async fn count_requests(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_else(|| "unmatched".to_owned());
    let response = next.run(request).await.into_response();
    metrics::counter!(crate::metrics::HTTP_REQUESTS, "route" => route, "status" => response.status().as_u16().to_string()).increment(1);
    response
}
