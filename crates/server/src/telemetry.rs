//! OpenTelemetry spans of an event's way through tidings (docs/tracing.md):
//! the publish, the group commit it joined, the broker's fan-out of it, and
//! each transport batch that delivered it, exported over OTLP/HTTP by the
//! OpenTelemetry SDK.
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and `OTEL_SDK_DISABLED` is
//! not `true`: then [`tracer`] is `None`, and every place that would start a
//! span pays one load of a `OnceLock` and a branch, nothing else (no span,
//! no context kept with a frame). When on, the SDK reads the standard
//! variables itself (`OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, ...); the default sampler,
//! `parentbased_always_on`, follows the publisher's sampled flag.
//!
//! The trace an event carries is the W3C context it was stored with. When
//! its publish is traced here, that is the publish span's own context
//! (same trace, tidings' span as the parent), so every later span of the
//! event (fan-out, deliveries) and whoever receives the envelope continue
//! from the publish.

use std::str::FromStr as _;
use std::sync::OnceLock;

use opentelemetry::trace::{Link, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};

use tidings_protocol::trace::TraceContext;

/// The `messaging.system` of every span.
const SYSTEM: &str = "tidings";

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
#[error("starting the OTLP span exporter: {0}")]
pub struct TelemetryError(String);

/// The exporter while it runs: dropping it (or [`Telemetry::shutdown`])
/// flushes the spans not yet sent.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Sends what is buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "the OTLP span exporter did not flush at shutdown");
        }
    }
}

/// Whether the standard variables ask for spans to be exported.
pub fn configured() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Starts exporting spans when [`configured`]; `None` otherwise. Once per
/// process: a second call exports nothing more.
pub fn init() -> Result<Option<Telemetry>, TelemetryError> {
    if !configured() || TRACER.get().is_some() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().build().map_err(|e| TelemetryError(e.to_string()))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("tidings");
    }
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
    let _ = TRACER.set(opentelemetry::trace::TracerProvider::tracer(&provider, "tidings"));
    Ok(Some(Telemetry { provider }))
}

/// The tracer, when spans are exported.
pub fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}

/// The span context a stored trace context names (a remote parent), if it
/// parses (stored contexts were checked on the way in).
pub fn remote(trace: &TraceContext) -> Option<SpanContext> {
    let mut parts = trace.traceparent.split('-');
    let (_, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let state = trace.tracestate.as_deref().and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    let context = SpanContext::new(TraceId::from_hex(trace_id).ok()?, SpanId::from_hex(span_id).ok()?, flags, true, state);
    context.is_valid().then_some(context)
}

/// The stored form of a span's context: its `traceparent`, and the
/// `tracestate` it carries.
pub fn context_of(span: &SpanContext, tracestate: Option<&str>) -> TraceContext {
    TraceContext {
        traceparent: format!("00-{}-{}-{:02x}", span.trace_id(), span.span_id(), span.trace_flags().to_u8()),
        tracestate: tracestate.map(str::to_owned),
    }
}

/// Starts a span of `kind` named `name` under `parent` (a root without
/// one), linked to `links`, with `attributes`; `None` when off.
pub fn start(
    name: &'static str,
    kind: SpanKind,
    parent: Option<&SpanContext>,
    links: &[SpanContext],
    attributes: Vec<KeyValue>,
) -> Option<Span> {
    start_at(name, kind, parent, links, attributes, None)
}

fn start_at(
    name: &'static str,
    kind: SpanKind,
    parent: Option<&SpanContext>,
    links: &[SpanContext],
    attributes: Vec<KeyValue>,
    started: Option<std::time::SystemTime>,
) -> Option<Span> {
    let tracer = tracer()?;
    let parent = parent.map_or_else(Context::new, |p| Context::new().with_remote_span_context(p.clone()));
    let mut attributes = attributes;
    attributes.push(KeyValue::new("messaging.system", SYSTEM));
    let links = links.iter().map(|l| Link::with_context(l.clone())).collect();
    let mut builder = tracer.span_builder(name).with_kind(kind).with_attributes(attributes).with_links(links);
    if let Some(started) = started {
        builder = builder.with_start_time(started);
    }
    Some(builder.start_with_context(tracer, &parent))
}

/// A batch that carried events with these contexts (`None` for an event
/// without one): one span, under the first and linked to each, or `None`
/// when off or when no event of the batch is traced.
pub fn batch<'a>(
    name: &'static str,
    kind: SpanKind,
    contexts: impl IntoIterator<Item = Option<&'a SpanContext>>,
    attributes: Vec<KeyValue>,
) -> Option<Span> {
    batch_since(name, kind, contexts, attributes, None)
}

/// [`batch`] for work that began at `started` (when the span is made
/// after it, once its events are known).
pub fn batch_since<'a>(
    name: &'static str,
    kind: SpanKind,
    contexts: impl IntoIterator<Item = Option<&'a SpanContext>>,
    attributes: Vec<KeyValue>,
    started: Option<std::time::SystemTime>,
) -> Option<Span> {
    tracer()?;
    let traced: Vec<SpanContext> = contexts.into_iter().flatten().filter(|c| c.is_sampled()).cloned().collect();
    let first = traced.first()?.clone();
    start_at(name, kind, Some(&first), &traced, attributes, started)
}

/// A producer span for a write that enters the log (a publish, a tree
/// write), when spans are exported.
#[derive(Debug, Default)]
pub struct Entering {
    /// The span; it ends when dropped.
    pub span: Option<Span>,
    /// Its context, when sampled: the group commit's span is under it.
    pub context: Option<SpanContext>,
    /// The context the write's events are stored with, when sampled (the
    /// span's own, with the `tracestate` as sent).
    pub stored: Option<TraceContext>,
}

impl Entering {
    /// Starts the span `name` under `trace` (a root without one), with the
    /// `attributes` made only when spans are exported.
    pub fn start(name: &'static str, trace: Option<&TraceContext>, attributes: impl FnOnce() -> Vec<KeyValue>) -> Self {
        if tracer().is_none() {
            return Self::default();
        }
        let parent = trace.and_then(remote);
        let span = start(name, SpanKind::Producer, parent.as_ref(), &[], attributes());
        let context = span.as_ref().map(|s| opentelemetry::trace::Span::span_context(s).clone()).filter(SpanContext::is_sampled);
        let stored = context.as_ref().map(|c| context_of(c, trace.and_then(|t| t.tracestate.as_deref())));
        Self { span, context, stored }
    }

    /// Records the outcome: `attributes` on success, an error status with
    /// the refusal's `code` otherwise.
    pub fn end(self, outcome: Result<Vec<KeyValue>, &'static str>) {
        use opentelemetry::trace::Span as _;
        let Some(mut span) = self.span else { return };
        match outcome {
            Ok(attributes) => span.set_attributes(attributes),
            Err(code) => span.set_status(opentelemetry::trace::Status::error(code)),
        }
    }
}
