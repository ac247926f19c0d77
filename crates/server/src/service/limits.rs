//! Abuse limits, for every transport: concurrent streams in total and per
//! identity, and the publish rate per identity. Each is a setting; a stream
//! holds a [`StreamPermit`] for its whole life and gives it back on drop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::{Kind, Refusal};
use crate::auth::Identity;

/// A limit that refused a request.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The server holds its maximum of streams.
    #[error("this server holds its maximum of {0} streams; retry later")]
    TooManyStreams(usize),
    /// The identity holds its maximum of streams.
    #[error("this identity holds its maximum of {0} streams")]
    TooManyStreamsForIdentity(usize),
    /// A batch larger than the identity's whole budget (its burst).
    #[error("a batch of {events} events is over this identity's burst of {burst}; publish it in batches of at most {burst}")]
    OverBurst {
        /// Events in the batch.
        events: usize,
        /// The budget (one second's worth).
        burst: u32,
    },
    /// The identity's publish budget is spent.
    #[error("this identity may publish {rate} events per second")]
    RateLimited {
        /// The configured rate.
        rate: u32,
        /// Seconds until enough budget is back.
        retry_after: u64,
    },
}

impl Refusal for LimitError {
    fn code(&self) -> &'static str {
        match self {
            Self::TooManyStreams(_) => "too_many_streams",
            Self::TooManyStreamsForIdentity(_) => "too_many_streams_for_identity",
            Self::RateLimited { .. } | Self::OverBurst { .. } => "rate_limited",
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::TooManyStreams(_) => Kind::Unavailable,
            Self::TooManyStreamsForIdentity(_) | Self::RateLimited { .. } | Self::OverBurst { .. } => Kind::TooMany,
        }
    }

    fn retry_after(&self) -> Option<u64> {
        Some(match self {
            Self::TooManyStreams(_) | Self::TooManyStreamsForIdentity(_) => 5,
            Self::RateLimited { retry_after, .. } => *retry_after,
            // The bucket is full again after a second; the batch must be split.
            Self::OverBurst { .. } => 1,
        })
    }
}

/// The limits and their current use.
#[derive(Debug)]
pub struct Limits {
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
pub struct StreamPermit {
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
    /// Limits with these settings (`0` for `publish_rate`: no limit).
    pub fn new(max_streams: usize, max_streams_per_identity: usize, publish_rate: u32) -> Self {
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
    pub fn acquire_stream(self: &Arc<Self>, caller: &Identity) -> Result<StreamPermit, LimitError> {
        if self.streams.fetch_add(1, Ordering::AcqRel) >= self.max_streams {
            self.streams.fetch_sub(1, Ordering::AcqRel);
            return Err(LimitError::TooManyStreams(self.max_streams));
        }
        let mut permit = StreamPermit { limits: self.clone(), identity: None };
        if caller.authenticated {
            let mut map = self.per_identity.lock().unwrap_or_else(|p| p.into_inner());
            let n = map.entry(caller.sub.clone()).or_default();
            if *n >= self.max_streams_per_identity {
                drop(map);
                return Err(LimitError::TooManyStreamsForIdentity(self.max_streams_per_identity));
            }
            *n += 1;
            permit.identity = Some(caller.sub.clone());
        }
        Ok(permit)
    }

    /// Takes `events` from the caller's publish budget (a token bucket of one
    /// second's worth, one token per event); `429 rate_limited` with
    /// `Retry-After` when it holds too few. Called once a publish is valid,
    /// so a refused request costs nothing.
    pub fn take_publish(&self, caller: &Identity, events: usize) -> Result<(), LimitError> {
        if self.publish_rate == 0 {
            return Ok(());
        }
        let rate = f64::from(self.publish_rate);
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(caller.sub.clone()).or_insert(Bucket { tokens: rate, at: now });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(rate);
        bucket.at = now;
        // Every event costs one token; a batch larger than the bucket (one
        // second's worth) could never pass: it is refused whole, to be split.
        if events as u64 > u64::from(self.publish_rate) {
            return Err(LimitError::OverBurst { events, burst: self.publish_rate });
        }
        let need = events as f64;
        if bucket.tokens >= need {
            bucket.tokens -= need;
            Ok(())
        } else {
            let wait = ((need - bucket.tokens) / rate).ceil().max(1.0) as u64;
            Err(LimitError::RateLimited { rate: self.publish_rate, retry_after: wait })
        }
    }
}
