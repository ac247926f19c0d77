//! The values settings take beyond numbers and strings: the choices
//! (`TIDINGS_AUTH`, `TIDINGS_DELIVERY`, ...), secrets that never print,
//! peers, retention, and the parsers of durations and sizes.

use std::time::Duration;

use clap::ValueEnum;

/// `TIDINGS_AUTH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthSetting {
    /// Bearer JWTs (needs a key).
    Jwt,
    /// No tokens: local development only, loopback addresses only.
    Off,
}

/// `TIDINGS_BROKER_READS`: where the broker reads the log's tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BrokerReads {
    /// The primary (the default).
    Primary,
    /// The hot standbys of `TIDINGS_REPLICA_URLS`, the primary when none
    /// has replayed a notified commit in time.
    Replica,
}

/// `TIDINGS_DELIVERY`: when an event may be shown to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Delivery {
    /// Once committed on the primary (the default).
    Committed,
    /// Once the primary's synchronous standby has it too (PostgreSQL with
    /// synchronous replication): a failover to that standby then loses
    /// nothing any client was shown or any publisher was answered `201`.
    Replicated,
}

/// `TIDINGS_COMPRESSION`: whether streams are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Compression {
    /// Every stream is sent as it is (the default).
    Off,
    /// SSE streams are gzip-compressed for clients that accept it, and
    /// WebSockets use `permessage-deflate` when they offer it, each event
    /// compressed once for every connection (docs/streams.md#compression).
    On,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// A secret setting. It travels in the application state, so no `Debug`
/// print (a log line, a panic message) may show it: it prints as
/// `Secret(REDACTED)`, and only [`Secret::expose`] reads it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(REDACTED)")
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self(s)
    }
}

pub(super) fn secret(s: &str) -> Result<Secret, String> {
    Ok(Secret(s.to_owned()))
}

/// `TIDINGS_PEERS`, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peers(pub Vec<tidings_protocol::peer::Peer>);

pub(super) fn peers(s: &str) -> Result<Peers, String> {
    tidings_protocol::peer::parse_setting(s).map(Peers)
}

pub(super) fn peer_allow(s: &str) -> Result<tidings_outbound::PeerAllow, String> {
    tidings_outbound::PeerAllow::parse(s)
}

/// Parses a duration setting (`250ms`, `30s`, `5m`, `7d`).
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 250ms, 30s, 5m, 7d)"))
}

/// History retention: `off`, a maximum age (`7d`), a maximum count of
/// events (`1000000`), or both (`7d,1000000`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Events older than this are pruned.
    pub max_age: Option<Duration>,
    /// At most this many of the newest events are kept.
    pub max_events: Option<u64>,
}

impl Retention {
    /// Whether anything is ever pruned.
    pub fn is_on(&self) -> bool {
        self.max_age.is_some() || self.max_events.is_some()
    }
}

pub(super) fn retention(s: &str) -> Result<Retention, String> {
    let mut r = Retention::default();
    if s.trim() == "off" || s.trim().is_empty() {
        return Ok(r);
    }
    for part in s.split(',').map(str::trim) {
        if let Ok(n) = part.parse::<u64>() {
            if n == 0 {
                return Err("a retention count must be at least 1".into());
            }
            r.max_events = Some(n);
        } else {
            r.max_age = Some(duration(part).map_err(|e| format!("{part:?}: {e}; or a count of events, or off"))?);
        }
    }
    Ok(r)
}

pub(super) fn byte_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, factor) = match s.to_ascii_lowercase() {
        x if x.ends_with("kib") => (s[..s.len() - 3].to_owned(), 1024),
        x if x.ends_with("mib") => (s[..s.len() - 3].to_owned(), 1024 * 1024),
        _ => (s.to_owned(), 1),
    };
    digits.trim().parse::<usize>().map(|n| n * factor).map_err(|_| format!("{s:?} is not a size (write 65536, 64KiB or 1MiB)"))
}
