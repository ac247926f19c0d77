//! How long an HTTP/2 connection has had no stream open: each request
//! holds a guard until its response body is done (a stream's body lives as
//! long as the stream), and [`Streams::idle_for`] resolves once no guard
//! has been held for the given time. hyper's HTTP/2 server has no such
//! deadline of its own; without it a client that sends the preface, or an
//! unfinished HEADERS frame, holds a connection for as long as it likes.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The streams of one connection.
#[derive(Debug)]
pub(super) struct Streams {
    open: AtomicUsize,
    /// When the last stream ended (or the connection began).
    idle_since: Mutex<Instant>,
    /// Woken when the last open stream ends.
    changed: Notify,
}

impl Default for Streams {
    fn default() -> Self {
        Self { open: AtomicUsize::new(0), idle_since: Mutex::new(Instant::now()), changed: Notify::new() }
    }
}

impl Streams {
    /// A stream opened; it is open until the guard drops.
    pub(super) fn opened(self: &Arc<Self>) -> Guard {
        self.open.fetch_add(1, Ordering::AcqRel);
        Guard { streams: self.clone() }
    }

    /// Resolves once no stream has been open for `limit`.
    pub(super) async fn idle_for(&self, limit: Duration) {
        loop {
            let changed = self.changed.notified();
            if self.open.load(Ordering::Acquire) > 0 {
                changed.await;
                continue;
            }
            let since = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
            tokio::select! {
                _ = tokio::time::sleep_until(since + limit) => {}
                _ = changed => continue,
            }
            let still = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) == since;
            if still && self.open.load(Ordering::Acquire) == 0 {
                return;
            }
        }
    }
}

/// A stream's hold on its connection.
#[derive(Debug)]
pub(super) struct Guard {
    streams: Arc<Streams>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        *self.streams.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        if self.streams.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.streams.changed.notify_waiters();
        }
    }
}

/// A response body holding its stream's [`Guard`] until it is done.
#[derive(Debug)]
pub(super) struct Tracked {
    body: axum::body::Body,
    guard: Option<Guard>,
}

impl Tracked {
    pub(super) fn new(body: axum::body::Body, guard: Guard) -> Self {
        Self { body, guard: Some(guard) }
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_only_once_no_stream_was_open_for_the_limit() {
        let streams = Arc::new(Streams::default());
        let limit = Duration::from_secs(10);
        // No stream at all: idle after the limit from the start.
        let started = Instant::now();
        streams.idle_for(limit).await;
        assert_eq!(started.elapsed(), limit);
        // A stream open for a minute holds it; the limit counts from its end.
        let guard = streams.opened();
        let waiting = tokio::spawn({
            let streams = streams.clone();
            async move {
                streams.idle_for(limit).await;
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "an open stream keeps the connection");
        let ended = Instant::now();
        drop(guard);
        assert_eq!(waiting.await.unwrap() - ended, limit);
    }
}
