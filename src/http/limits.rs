//! Abuse limits owned by the HTTP layer: concurrent streams in total and per
//! identity, and the publish rate per identity. Each is a setting; a stream
//! holds a [`StreamPermit`] for its whole life and gives it back on drop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::ApiError;
use crate::auth::Identity;

/// The limits and their current use.
#[derive(Debug)]
pub(crate) struct Limits {
    max_streams: usize,
    max_streams_per_identity: usize,
    publish_rate: u32,
    streams: AtomicUsize,
    // std mutexes: held for a map lookup, never across an `.await`.
    per_identity: Mutex<HashMap<String, usize>>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// One stream's place in the limits.
#[derive(Debug)]
pub(crate) struct StreamPermit {
    limits: Arc<Limits>,
    identity: Option<String>,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        self.limits.streams.fetch_sub(1, Ordering::AcqRel);
        if let Some(sub) = &self.identity {
            let mut map = self.limits.per_identity.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = map.get_mut(sub) {
                *n -= 1;
                if *n == 0 {
                    map.remove(sub);
                }
            }
        }
    }
}

impl Limits {
    pub(crate) fn new(max_streams: usize, max_streams_per_identity: usize, publish_rate: u32) -> Self {
        Self {
            max_streams,
            max_streams_per_identity,
            publish_rate,
            streams: AtomicUsize::new(0),
            per_identity: Mutex::default(),
            buckets: Mutex::default(),
        }
    }

    /// A permit for one more stream: `503` past the total, `429` past the
    /// caller's share (per-identity counting applies when auth is on).
    pub(crate) fn acquire_stream(self: &Arc<Self>, caller: &Identity) -> Result<StreamPermit, ApiError> {
        if self.streams.fetch_add(1, Ordering::AcqRel) >= self.max_streams {
            self.streams.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "too_many_streams",
                format!("this server holds its maximum of {} streams; retry later", self.max_streams),
            )
            .retry_after(5));
        }
        let mut permit = StreamPermit { limits: self.clone(), identity: None };
        if caller.authenticated {
            let mut map = self.per_identity.lock().unwrap_or_else(|p| p.into_inner());
            let n = map.entry(caller.sub.clone()).or_default();
            if *n >= self.max_streams_per_identity {
                drop(map);
                return Err(ApiError::new(
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    "too_many_streams_for_identity",
                    format!("this identity holds its maximum of {} streams", self.max_streams_per_identity),
                )
                .retry_after(5));
            }
            *n += 1;
            permit.identity = Some(caller.sub.clone());
        }
        Ok(permit)
    }

    /// Takes `events` from the caller's publish budget (a token bucket of one
    /// second's worth); `429 rate_limited` with `Retry-After` when empty.
    pub(crate) fn take_publish(&self, caller: &Identity, events: usize) -> Result<(), ApiError> {
        if self.publish_rate == 0 {
            return Ok(());
        }
        let rate = f64::from(self.publish_rate);
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(caller.sub.clone()).or_insert(Bucket { tokens: rate, at: now });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(rate);
        bucket.at = now;
        // A batch larger than one second's budget passes only on a full bucket.
        let need = (events as f64).min(rate);
        if bucket.tokens >= need {
            bucket.tokens -= need;
            Ok(())
        } else {
            let wait = ((need - bucket.tokens) / rate).ceil().max(1.0) as u64;
            Err(ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("this identity may publish {} events per second", self.publish_rate),
            )
            .retry_after(wait))
        }
    }
}
