//! A lossy HTTP proxy for peer tests and benchmarks: it forwards everything
//! to its target but answers every `every`-th peer delivery (a `receive`
//! EXECUTE on `POST /v1/execute`) itself, as a success, without forwarding
//! it. The sender believes it delivered; the receiver never hears of it:
//! the loss a mirror must survive through gap detection and re-reads
//! (docs/ref-federation.md, "Gap re-reads"). Loopback only; it stops with
//! the returned guard.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::response::IntoResponse as _;
use serde_json::json;

/// A running proxy.
#[derive(Debug)]
pub struct LossyProxy {
    /// Its base URL (`http://127.0.0.1:<port>`).
    pub base: String,
    dropped: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl LossyProxy {
    /// Deliveries answered without forwarding so far.
    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a proxy on a loopback port in front of `target` (a base URL)
/// that drops every `every`-th delivery (`0`: none).
pub async fn start(target: String, every: usize) -> std::io::Result<LossyProxy> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (seen, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let http = reqwest::Client::new();
    let counted = dropped.clone();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (http, target, seen, dropped) = (http.clone(), target.clone(), seen.clone(), counted.clone());
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 64 << 20).await.unwrap_or_default();
            let receive = parts.uri.path() == "/v1/execute" && contains(&body, br#""operation":"receive""#);
            if receive && every > 0 && seen.fetch_add(1, Ordering::Relaxed) % every == every - 1 {
                dropped.fetch_add(1, Ordering::Relaxed);
                return axum::Json(json!({"status": 200, "result": {"event_id": null, "duplicate": false}})).into_response();
            }
            let url = format!("{target}{}", parts.uri.path_and_query().map_or("", |p| p.as_str()));
            let mut forward = http.request(parts.method, url).body(body);
            for name in ["content-type", "x-chain-id", "if-match", "if-none-match", "authorization"] {
                if let Some(v) = parts.headers.get(name) {
                    forward = forward.header(name, v);
                }
            }
            match forward.send().await {
                Ok(r) => {
                    let status = r.status();
                    let headers: Vec<_> =
                        ["content-type", "etag"].iter().filter_map(|n| r.headers().get(*n).map(|v| (*n, v.clone()))).collect();
                    let bytes = r.bytes().await.unwrap_or_default();
                    let mut response = (status, bytes).into_response();
                    for (name, value) in headers {
                        response.headers_mut().insert(name, value);
                    }
                    response
                }
                Err(_) => axum::http::StatusCode::BAD_GATEWAY.into_response(),
            }
        }
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(LossyProxy { base, dropped, task })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
