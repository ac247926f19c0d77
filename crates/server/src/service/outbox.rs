//! The mover of the SQL outbox (PostgreSQL): what an application published
//! from its own transaction with `tidings.publish(...)` enters the log
//! here, exactly once, in the order the commits became visible, with ids
//! gap-free among every other publish. Each row is checked as an HTTP
//! publish is (the envelope's fields, reserved types, the registry: in
//! strict mode a payload that breaks its schema is set aside with its code,
//! counted and shown in `/health/deep`, never delivered; in warn mode it is
//! stored, logged and counted). The application's role is trusted as a
//! publisher (it was granted EXECUTE): its events may name any agent, and
//! its idempotency keys are scoped by the role.

use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use super::Services;
use super::error::Refusal as _;
use super::publish::{PublishError, registered_records};
use crate::metrics as m;
use crate::store::{IdempotencyKey, OutboxDecision, OutboxRow, Publish};
use tidings_protocol::event::{EventError, PublishRequest};

/// Rows one move takes at most (one transaction).
const BATCH: usize = 500;
/// How often the outbox is looked at without a wake-up. `tidings.publish`
/// notifies only when it sees no other committed row waiting (a NOTIFY per
/// call serialises the callers' commits); a call that saw one but committed
/// after the mover emptied the outbox waits for this sweep. A NOTIFY lost
/// with the LISTEN session is recovered by the reconnect's wake-up.
const SWEEP: Duration = Duration::from_millis(100);
/// While moves find rows, the next one follows this soon: under load the
/// mover polls instead of waiting for wake-ups nobody sends.
const BUSY: Duration = Duration::from_millis(2);

/// Moves the outbox whenever `tidings.publish` commits (and every
/// [`SWEEP`]) until `cancel`; nothing on a store without one.
pub async fn run_mover(core: Services, cancel: CancellationToken) {
    let Some(wake) = core.store().outbox_wakeups() else { return };
    let mut sweep = tokio::time::interval(SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = wake.notified() => {}
            _ = sweep.tick() => {}
        }
        while !cancel.is_cancelled() {
            // The payload's limit, and room for the other fields.
            let max_bytes = core.settings().publish.max_payload + 64 * 1024;
            // The rows' trace contexts, when spans are exported: the move's
            // span is under the first and linked to each.
            let traced = crate::telemetry::tracer().map(|_| (std::time::SystemTime::now(), std::sync::Mutex::new(Vec::new())));
            let decide = |row: &OutboxRow| {
                if let (Some((_, contexts)), Some(traceparent)) = (&traced, &row.traceparent) {
                    let trace =
                        tidings_protocol::trace::TraceContext { traceparent: traceparent.clone(), tracestate: row.tracestate.clone() };
                    contexts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(crate::telemetry::remote(&trace));
                }
                decide(&core, row)
            };
            match core.store().outbox_move(BATCH, max_bytes, &decide).await {
                Ok(moved) => {
                    if let Some((started, contexts)) = traced {
                        let contexts = contexts.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
                        let attributes = vec![
                            opentelemetry::KeyValue::new("tidings.outbox.rows", moved.rows as i64),
                            opentelemetry::KeyValue::new("tidings.outbox.appended", moved.appended as i64),
                        ];
                        let kind = opentelemetry::trace::SpanKind::Internal;
                        drop(crate::telemetry::batch_since("outbox-move", kind, contexts.iter().map(Some), attributes, Some(started)));
                    }
                    if moved.appended > 0 {
                        core.broker().wake();
                    }
                    m::outbox_moved(moved.rows.saturating_sub(moved.set_aside.len()) as u64, &moved.set_aside, &moved.delays_ms);
                    m::idempotent_replays(moved.replayed as u64);
                    if moved.busy || moved.rows == 0 {
                        break;
                    }
                    if moved.rows < BATCH {
                        tokio::time::sleep(BUSY).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %crate::report::chain(&e), "could not move the SQL outbox; retrying");
                    break;
                }
            }
        }
    }
}

/// What one row becomes.
fn decide(core: &Services, row: &OutboxRow) -> OutboxDecision {
    match prepare(core, row) {
        Ok(publish) => OutboxDecision::Publish(publish),
        Err(e) => {
            tracing::warn!(seq = row.seq, code = e.code(), error = %crate::report::chain(&e), "set aside an event published from SQL");
            OutboxDecision::SetAside { code: e.code(), message: e.to_string() }
        }
    }
}

fn prepare(core: &Services, row: &OutboxRow) -> Result<Publish, PublishError> {
    let value: serde_json::Value = serde_json::from_str(&row.event).map_err(|e| PublishError::MalformedJson(e.to_string()))?;
    let request: PublishRequest = crate::json::from_object(value).map_err(|e| PublishError::InvalidEvent(e.to_string()))?;
    let now = chrono::DateTime::from_timestamp_millis(row.created_ms).unwrap_or_else(chrono::Utc::now);
    // Checked when the call was made; again here, as for any row.
    let trace = tidings_protocol::trace::TraceContext::parse(row.traceparent.as_deref(), row.tracestate.as_deref())?;
    let body = request
        .into_body(core.settings().publish.max_payload, now)
        .map_err(|e| match e {
            EventError::InvalidName(_) => PublishError::InvalidEventName(e.to_string()),
            EventError::InvalidField(_) => PublishError::InvalidEvent(e.to_string()),
            EventError::PayloadTooLarge { .. } => PublishError::PayloadTooLarge(e.to_string()),
        })?
        .traced(trace.as_ref());
    if tidings_protocol::event::names::RESERVED.contains(&body.event_type.as_str()) {
        return Err(PublishError::ReservedEventType(format!("{:?} is written by tidings itself", body.event_type)));
    }
    let records = registered_records(core.registry(), &body, &|message| message)?;
    let key = row.idempotency_key.as_ref().map(|key| IdempotencyKey {
        scope: format!("role:{}", row.publisher),
        key: key.clone(),
        body_hash: Sha256::digest(row.event.as_bytes()).into(),
        answer: vec![0],
        now_ms: chrono::Utc::now().timestamp_millis(),
        window_ms: i64::try_from(core.settings().history.idempotency_window.as_millis()).unwrap_or(i64::MAX),
    });
    Ok(Publish { records, key })
}
