//! How long an HTTP/2 connection has had no stream open, and whether one
//! of its streams has stopped taking bytes.
//!
//! Each request holds a guard until its response body is done (a stream's
//! body lives as long as the stream), and [`Streams::idle_for`] resolves
//! once no guard has been held for the given time. hyper's HTTP/2 server
//! has no such deadline of its own; without it a client that sends the
//! preface, or an unfinished HEADERS frame, holds a connection for as long
//! as it likes.
//!
//! A client can also read its socket and never grant a stream flow-control
//! window: hyper then holds the stream's next chunk and stops pulling its
//! body, so neither the socket's write deadline nor the broker (whose kill
//! reaches only a body that is polled) ever sees it. Each body notes when
//! it handed hyper a chunk that hyper has not come back for, and
//! [`Streams::stalled_for`] resolves once one has waited longer than the
//! write deadline: the connection is then closed, as a plain HTTP/1.1
//! connection whose client takes no bytes is.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// The streams whose last chunk hyper has not come back for, by stream
    /// number: since when.
    waiting: Mutex<HashMap<u64, Instant>>,
    /// The number the next stream gets.
    next: AtomicU64,
}

impl Default for Streams {
    fn default() -> Self {
        Self {
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            changed: Notify::new(),
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }
}

impl Streams {
    /// A stream opened; it is open until the guard drops.
    pub(super) fn opened(self: &Arc<Self>) -> Guard {
        self.open.fetch_add(1, Ordering::AcqRel);
        Guard { streams: self.clone(), number: self.next.fetch_add(1, Ordering::Relaxed) }
    }

    /// Resolves once a stream has waited longer than `limit` for hyper to
    /// take its next chunk (checked a few times per `limit`).
    pub(super) async fn stalled_for(&self, limit: Duration) {
        let mut tick = tokio::time::interval((limit / 4).max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let oldest = self.waiting.lock().unwrap_or_else(|p| p.into_inner()).values().min().copied();
            if oldest.is_some_and(|since| since.elapsed() > limit) {
                return;
            }
        }
    }

    fn waiting(&self, number: u64, since: Option<Instant>) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        match since {
            Some(since) => waiting.insert(number, since),
            None => waiting.remove(&number),
        };
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
    number: u64,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.streams.waiting(self.number, None);
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
    /// A chunk was handed to hyper and it has not come back since.
    handed: bool,
    /// What is left of a chunk larger than [`PIECE`], handed in pieces.
    rest: Bytes,
}

/// The most a body hands hyper at once: hyper comes back for more only
/// once a piece is sent whole, so the stall deadline measures progress by
/// at most this much (a large page taken slowly, but taken, is not a
/// stall).
const PIECE: usize = 16 * 1024;

impl Tracked {
    pub(super) fn new(body: axum::body::Body, guard: Guard) -> Self {
        Self { body, guard: Some(guard), handed: false, rest: Bytes::new() }
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = if self.rest.is_empty() {
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if data.len() > PIECE => {
                        self.rest = data;
                        let piece = self.rest.split_to(PIECE);
                        Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
                    }
                    Ok(data) => Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
                    Err(frame) => Poll::Ready(Some(Ok(frame))),
                },
                other => other,
            }
        } else {
            let n = self.rest.len().min(PIECE);
            let piece = self.rest.split_to(n);
            Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
        };
        let handed = matches!(&polled, Poll::Ready(Some(Ok(frame))) if frame.data_ref().is_some_and(|d| !d.is_empty()));
        // Each chunk handed restarts the wait; a poll after one ends it.
        if let Some(guard) = &self.guard
            && (handed || self.handed)
        {
            guard.streams.waiting(guard.number, handed.then(Instant::now));
        }
        self.handed = handed;
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let hint = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut out = http_body::SizeHint::new();
        out.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            out.set_upper(upper + rest);
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests start the tasks they drive")]
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

    #[tokio::test(start_paused = true)]
    async fn stalled_once_a_chunk_waits_longer_than_the_limit() {
        use http_body_util::BodyExt as _;
        let streams = Arc::new(Streams::default());
        let limit = Duration::from_secs(4);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::io::Error>>(4);
        let body = axum::body::Body::new(http_body_util::StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|f| (f, rx))
        })));
        let mut body = Tracked::new(body, streams.opened());
        let stalled = tokio::spawn({
            let streams = streams.clone();
            async move {
                streams.stalled_for(limit).await;
                Instant::now()
            }
        });
        // A body that waits for data is not stalled, however long it waits.
        let taker = tokio::spawn(async move {
            let frame = body.frame().await.unwrap().unwrap();
            (body, frame)
        });
        tokio::time::sleep(limit * 3).await;
        assert!(!stalled.is_finished(), "waiting for data is not a stall");
        tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"chunk")))).await.unwrap();
        let (mut body, _) = taker.await.unwrap();
        // A chunk taken and the body polled again within the limit: no stall.
        tokio::time::sleep(limit / 2).await;
        tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"next")))).await.unwrap();
        body.frame().await.unwrap().unwrap();
        // Then hyper never comes back for more.
        let handed = Instant::now();
        assert!(stalled.await.unwrap() - handed > limit);
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_chunk_taken_slowly_in_pieces_is_not_a_stall() {
        use http_body_util::BodyExt as _;
        let streams = Arc::new(Streams::default());
        let limit = Duration::from_secs(4);
        let big = Bytes::from(vec![7u8; 2 * PIECE + PIECE / 2]);
        let mut body = Tracked::new(axum::body::Body::from(big.clone()), streams.opened());
        let stalled = tokio::spawn({
            let streams = streams.clone();
            async move { streams.stalled_for(limit).await }
        });
        // Three pieces, each taken within the limit, the whole well past it.
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= PIECE);
            got.extend_from_slice(&data);
            tokio::time::sleep(limit * 3 / 4).await;
        }
        assert_eq!(got, big, "the pieces are the chunk, in order");
        assert!(!stalled.is_finished(), "a chunk taken piece by piece in time is not a stall");
    }
}
