//! The SQL outbox's shape in the store (PostgreSQL): what an application's
//! `tidings.publish(...)` left in `tidings.outbox`, and what a move of it
//! into the log did. The store moves rows exactly once, in the order it
//! sees them committed, in one transaction with their deletion; what each
//! row becomes (its records, or why it is set aside) is decided by the
//! caller (the service that moves the outbox), which knows the registry.

use super::Publish;

/// One committed row of `tidings.outbox`.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// Its place in the outbox.
    pub seq: i64,
    /// The event as a publish request (JSON object text).
    pub event: String,
    /// The idempotency key the application gave, if any.
    pub idempotency_key: Option<String>,
    /// The database role that called `tidings.publish` (its keys' scope).
    pub publisher: String,
    /// When the call was made, Unix ms.
    pub created_ms: i64,
    /// The W3C trace context of the call, if it had one (docs/tracing.md).
    pub traceparent: Option<String>,
    /// Its `tracestate`, if any.
    pub tracestate: Option<String>,
}

/// How a move decides each row (a type of its own, so the row's lifetime
/// stays higher-ranked through `async_trait`).
pub type Decide<'a> = dyn Fn(&OutboxRow) -> OutboxDecision + Send + Sync + 'a;

/// What to do with a row: publish it, or set it aside.
#[derive(Debug, Clone)]
pub enum OutboxDecision {
    /// Publish it (its records and key).
    Publish(Publish),
    /// Keep it out of the log: a stable code and why.
    SetAside {
        /// The stable error code (`payload_schema_violation`, ...).
        code: &'static str,
        /// Why, for an operator.
        message: String,
    },
}

/// What one move did.
#[derive(Debug, Clone, Default)]
pub struct OutboxMoved {
    /// Rows taken (moved, answered by a key, or set aside).
    pub rows: usize,
    /// Events appended to the log.
    pub appended: usize,
    /// Rows whose idempotency key was already recorded with the same event
    /// (nothing stored for them).
    pub replayed: usize,
    /// Rows set aside, with their code.
    pub set_aside: Vec<&'static str>,
    /// For each row moved, the time from its call to its move, ms.
    pub delays_ms: Vec<i64>,
    /// Another process holds the move now (nothing was done here).
    pub busy: bool,
}

/// The outbox as `/health/deep` shows it.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct OutboxStatus {
    /// Committed rows waiting to be moved.
    pub depth: i64,
    /// Age of the oldest of them, ms (0 when none).
    pub oldest_age_ms: i64,
    /// Rows set aside (never moved).
    pub set_aside: i64,
}
