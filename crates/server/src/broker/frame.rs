//! What the broker hands a client: a [`Frame`] (one event, its envelope
//! shared by every client it goes to, each transport's rendering built once)
//! and, once the pushing stops, why ([`Detached`]).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use tidings_protocol::event::{Event, EventId};

/// One event frame, shared by every client that receives it. Cloning bumps
/// one reference count (no allocation per client), and a queue slot is one
/// pointer, so a queue that a burst filled stays small.
///
/// A frame holds the envelope JSON, not any wire format: each transport
/// writes its own framing around the same shared bytes (SSE `id:`/`data:`
/// lines, a JSON-RPC notification), so the broker serves every transport.
/// A transport whose framing cannot be spliced around shared bytes (a
/// WebSocket message is one payload) renders it once per event, into the
/// frame, for every client it goes to ([`Frame::rendered`]).
#[derive(Debug, Clone)]
pub struct Frame(Arc<FrameData>);

/// What a [`Frame`] shares.
#[derive(Debug)]
pub struct FrameData {
    /// The event id.
    pub id: EventId,
    /// The complete envelope JSON, shared (see [`tidings_protocol::event::encode_envelope`]).
    pub envelope: Bytes,
    /// When it was committed (Unix ms), for publish-to-send latency.
    pub recorded_ms: i64,
    /// The trace context it was stored with, when spans are exported
    /// (`crate::telemetry`): what a delivery's span links to.
    pub trace: Option<opentelemetry::trace::SpanContext>,
    /// The one transport rendering of this event, built by its first client.
    rendered: OnceLock<Bytes>,
    /// Its SSE frame (`id:`, `data:`), built by its first SSE client: an
    /// SSE frame is spliced around nothing, so every stream writes the
    /// same shared bytes.
    sse: OnceLock<Bytes>,
    /// Its SSE frame compressed on its own, built by its first compressed
    /// stream and shared by all of them (docs/streams.md#compression).
    sse_compressed: OnceLock<Bytes>,
    /// Its transport rendering compressed on its own, built by its first
    /// compressed connection and shared by all of them.
    rendered_compressed: OnceLock<Bytes>,
}

impl Frame {
    /// A frame for event `id` with its envelope.
    pub fn new(id: EventId, envelope: Bytes, recorded_ms: i64) -> Self {
        Self::traced(id, envelope, recorded_ms, None)
    }

    fn traced(id: EventId, envelope: Bytes, recorded_ms: i64, trace: Option<opentelemetry::trace::SpanContext>) -> Self {
        Self(Arc::new(FrameData {
            id,
            envelope,
            recorded_ms,
            trace,
            rendered: OnceLock::new(),
            sse: OnceLock::new(),
            sse_compressed: OnceLock::new(),
            rendered_compressed: OnceLock::new(),
        }))
    }

    /// The event as `render` frames it, built once per event and shared by
    /// every client it is sent to. One transport renders (the WebSocket's
    /// `stream.event`); the first `render` given is the one kept.
    pub fn rendered(&self, render: fn(&FrameData) -> Bytes) -> Bytes {
        self.0.rendered.get_or_init(|| render(&self.0)).clone()
    }

    /// The event as an SSE stream writes it (`render`), built once per
    /// event and shared by every stream it is sent to.
    pub fn sse(&self, render: fn(&FrameData) -> Bytes) -> Bytes {
        self.0.sse.get_or_init(|| render(&self.0)).clone()
    }

    /// The event's transport rendering ([`Frame::rendered`]) as `compress`
    /// compresses it alone, built once per event and shared by every
    /// connection it is sent to.
    pub fn rendered_compressed(&self, render: fn(&FrameData) -> Bytes, compress: fn(&[u8]) -> Bytes) -> Bytes {
        self.0.rendered_compressed.get_or_init(|| compress(&self.rendered(render))).clone()
    }

    /// The event's SSE frame (`render`) and that frame as `compress`
    /// compresses it alone, each built once per event and shared by every
    /// stream it is sent to.
    pub fn sse_compressed(&self, render: fn(&FrameData) -> Bytes, compress: fn(&[u8]) -> Bytes) -> (Bytes, Bytes) {
        let plain = self.sse(render);
        let packed = self.0.sse_compressed.get_or_init(|| compress(&plain)).clone();
        (plain, packed)
    }

    /// The frame of a parsed event (the envelope is shared, not copied).
    pub fn of(event: &Event) -> Self {
        Self::traced(event.id, event.envelope.clone(), event.recorded_ms, trace_of(event))
    }

    /// The frame of an event that is not needed afterwards: the envelope
    /// moves in (cloning it would turn its buffer into a shared one, an
    /// allocation per event on replay).
    pub fn from_event(event: Event) -> Self {
        let trace = trace_of(&event);
        Self::traced(event.id, event.envelope, event.recorded_ms, trace)
    }
}

/// The span context `event` was stored with, when spans are exported.
pub(crate) fn trace_of(event: &Event) -> Option<opentelemetry::trace::SpanContext> {
    crate::telemetry::tracer()?;
    let traceparent = event.body.traceparent.clone()?;
    crate::telemetry::remote(&tidings_protocol::trace::TraceContext { traceparent, tracestate: event.body.tracestate.clone() })
}

impl std::ops::Deref for Frame {
    type Target = FrameData;

    fn deref(&self) -> &FrameData {
        &self.0
    }
}

/// Why a subscription stopped receiving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detached {
    /// Its queue overflowed while it was live: a slow client.
    QueueFull,
    /// Events waited in its queue and it took none within the timeout.
    NoProgress,
    /// Its queue overflowed while it was still replaying: it should catch up
    /// from the store and subscribe again.
    Lagged,
    /// The broker stopped (server shutdown).
    Closed,
}

impl Detached {
    /// The `reason` of the notice that ends a stream dropped as slow, for
    /// the two ways a client is (none for the others).
    pub fn drop_reason(self) -> Option<tidings_protocol::wire::DropReason> {
        match self {
            Self::QueueFull => Some(tidings_protocol::wire::DropReason::QueueFull),
            Self::NoProgress => Some(tidings_protocol::wire::DropReason::NoProgress),
            Self::Lagged | Self::Closed => None,
        }
    }

    /// The `reason` label of `tidings_clients_dropped_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::NoProgress => "no_progress",
            Self::Lagged => "lagged",
            Self::Closed => "closed",
        }
    }

    pub(super) fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::QueueFull,
            2 => Self::NoProgress,
            3 => Self::Lagged,
            _ => Self::Closed,
        }
    }
}
