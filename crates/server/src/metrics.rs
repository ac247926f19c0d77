//! The Prometheus metrics catalog: every family's name in one place, the
//! recorder installed once per process, every family registered and
//! zero-initialised at start-up so dashboards see it before the first event,
//! and one function per thing that happened (`client_dropped(reason)`,
//! `peer_delivery(outcome)`, ...): the names are private, so code records
//! only through those, and the catalog is all there is.
//!
//! Label values are bounded: transports, drop reasons, registered type names
//! (unregistered ones are counted as `unregistered`), route templates and
//! status codes. Never ids or free-form strings.

#![allow(clippy::disallowed_macros, reason = "the catalog is where metrics are recorded")]

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Always 1, labelled with the version that runs.
const BUILD_INFO: &str = "tidings_build_info";
/// Events appended, by registered type.
const EVENTS_PUBLISHED: &str = "tidings_events_published_total";
/// Publishes answered from their Idempotency-Key (nothing stored).
const PUBLISH_IDEMPOTENT_REPLAYS: &str = "tidings_publish_idempotent_replays_total";
/// Rows of the SQL outbox moved into the log (or answered by their key).
const OUTBOX_MOVED: &str = "tidings_outbox_moved_total";
/// Rows of the SQL outbox set aside, by code.
const OUTBOX_SET_ASIDE: &str = "tidings_outbox_set_aside_total";
/// From a `tidings.publish` call to its move into the log.
const OUTBOX_DELAY: &str = "tidings_outbox_delay_seconds";
/// Frames written to clients, by transport.
const EVENTS_DELIVERED: &str = "tidings_events_delivered_total";
/// Connected clients, by transport.
const CLIENTS_CONNECTED: &str = "tidings_clients_connected";
/// Clients ended by the server, by reason.
const CLIENTS_DROPPED: &str = "tidings_clients_dropped_total";
/// Streams opened compressed (SSE gzip, WebSocket permessage-deflate).
const STREAMS_COMPRESSED: &str = "tidings_streams_compressed_total";
/// Depth of client queues that hold events, sampled once per sweep.
const QUEUE_DEPTH: &str = "tidings_queue_depth";
/// Commit-to-broker time: from `recorded_at` order to fan-out.
const BROKER_LAG: &str = "tidings_broker_lag_seconds";
/// Publish-to-send time, from the append to the frame leaving the queue.
const DELIVERY_LATENCY: &str = "tidings_delivery_latency_seconds";
/// LISTEN reconnects.
const LISTENER_RECONNECTS: &str = "tidings_listener_reconnects_total";
/// Events sent from history rather than live.
const REPLAYED_EVENTS: &str = "tidings_replayed_events_total";
/// Registry problems accepted in warn mode, by kind.
const REGISTRY_VIOLATIONS: &str = "tidings_registry_violations_total";
/// HTTP requests, by route template and status.
const HTTP_REQUESTS: &str = "tidings_http_requests_total";
/// Poll requests.
const POLL_REQUESTS: &str = "tidings_poll_requests_total";
/// Durable consumers' distance behind the head, sampled by the expiry sweep.
const CONSUMER_LAG: &str = "tidings_consumer_lag_events";
/// 1 while the store answers, 0 while it does not.
const DATABASE_UP: &str = "tidings_database_up";
/// 1 while the wake-up listener (LISTEN) is connected.
const LISTENER_UP: &str = "tidings_listener_up";
const BROKER_BEHIND: &str = "tidings_broker_behind_seconds";
const LISTENER_SILENCE: &str = "tidings_listener_silence_seconds";
const OUTBOX_OLDEST: &str = "tidings_outbox_oldest_age_seconds";
/// History reads (catch-up, polls), by the server that answered them
/// (`primary`, `replica`).
const HISTORY_READS: &str = "tidings_history_reads_total";
/// The broker's reads of the log's tail, by the server that answered them
/// (`primary`, `replica`); counted on PostgreSQL with standbys.
const BROKER_READS: &str = "tidings_broker_reads_total";
/// 1 while a hot standby serves history, by standby.
const REPLICA_UP: &str = "tidings_replica_up";
/// How far a hot standby is behind the primary, by standby.
const REPLICA_LAG: &str = "tidings_replica_lag_seconds";
/// Replay gaps announced to clients, by reason (`pruned`, `replay_limit`,
/// `beyond_head`, `history_lost`).
const REPLAY_GAPS: &str = "tidings_replay_gaps_total";
/// Epochs the event log began, by reason (`timeline`, `system`,
/// `head_behind`, `operator`): each may have lost a suffix of history.
const EPOCHS_BEGUN: &str = "tidings_epochs_begun_total";
const REPLICATION_STALLED: &str = "tidings_replication_stalled";
/// Payload-rule evaluations stopped by `TIDINGS_RULE_BUDGET` (the event did not match).
const FILTER_BUDGET_EXCEEDED: &str = "tidings_filter_budget_exceeded_total";

/// Path-subscription notifications, by outcome (delivered, or why not).
const SUBSCRIPTION_NOTIFICATIONS: &str = "tidings_subscription_notifications_total";
/// Subscriptions the leading engine matches changes against.
const SUBSCRIPTIONS: &str = "tidings_subscriptions";
/// Outcomes of a matching change: the label values of `outcome`.
pub const NOTIFICATION_OUTCOMES: &[&str] =
    &["delivered", "rate_limited", "max_events_reached", "max_duration_reached", "deliver_token_expired"];

/// Notifications carried to peers' inboxes, by outcome.
const PEER_DELIVERIES: &str = "tidings_peer_deliveries_total";
/// Outcomes of a delivery to a peer: the label values of `outcome`.
pub const PEER_OUTCOMES: &[&str] = &["delivered", "duplicate", "refused", "given_up"];
/// Delivery attempts to peers that failed and were retried.
const PEER_RETRIES: &str = "tidings_peer_delivery_retries_total";
/// TLS certificate reloads (`SIGHUP`), by `outcome` (`ok`, `failed`).
const TLS_RELOADS: &str = "tidings_tls_reloads_total";
/// Events per group commit, by `kind` (`publish`, `tree`: groups of two requests or more).
const PUBLISH_GROUP_EVENTS: &str = "tidings_publish_group_events";
/// Remote subscriptions ended because their deliveries kept failing.
const PEER_EVICTIONS: &str = "tidings_peer_evictions_total";
/// Per peer, the log events the courier's slowest lane to it is behind the head.
const PEER_BACKLOG: &str = "tidings_peer_backlog_events";
/// Deliveries received from peers, by outcome (`appended`, `duplicate`).
const PEER_RECEIVED: &str = "tidings_peer_received_total";

/// Notifications a mirror applied, by outcome.
const MIRROR_APPLIES: &str = "tidings_mirror_applies_total";
/// Per mirror, re-attachments after its relay stopped answering.
const MIRROR_REPAIRS: &str = "tidings_mirror_repairs_total";
/// Counter (`mirror`): relays a mirror left because they forged or withheld a change.
const MIRROR_RELAYS_LEFT: &str = "tidings_mirror_relays_left_total";
/// Per mirror, redirects between the mirrored peer and the server its
/// subscription is held at (0: the peer itself).
const MIRROR_HOPS: &str = "tidings_mirror_hops";
/// Per mirror, 1 for the server its subscription is held at (`upstream`),
/// 0 for the ones it was held at before.
const MIRROR_UPSTREAM: &str = "tidings_mirror_upstream";
/// Outcomes of a mirror's notification: the label values of `outcome`.
pub const MIRROR_OUTCOMES: &[&str] =
    &["applied", "unchanged", "stale_rejected", "gap_reread", "reread_failed", "foreign_ignored", "history_lost"];

/// Transports that deliver events.
pub const TRANSPORTS: &[&str] = &["sse", "poll", "ws"];
/// Why the server ends a client.
/// Why the server ends a client: the broker's evictions (`queue_full`,
/// `no_progress`), and a stream connection closed because a write made no
/// progress (`write_stalled`; a client the broker already evicted may be
/// closed this way too).
pub const DROP_REASONS: &[&str] = &["queue_full", "no_progress", "write_stalled"];

mod catalog;
pub use catalog::{CATALOG, Family, Kind, metrics_table};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's own families (`process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, `process_open_fds`, `process_max_fds`:
/// streams are bounded by the open-file limit, ...), as Prometheus' own
/// clients export them, read at each scrape.
static PROCESS: std::sync::LazyLock<metrics_process::Collector> = std::sync::LazyLock::new(metrics_process::Collector::default);

/// Reads the process's families now (before a scrape renders).
pub fn collect_process() {
    PROCESS.collect();
}

const LATENCY_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
const DEPTH_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
const LAG_BUCKETS: &[f64] = &[0.0, 1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0, 1_000_000.0];

/// Installs the process-wide recorder (once; later calls share it) and
/// returns the handle that renders `/metrics`.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(QUEUE_DEPTH.into()), DEPTH_BUCKETS))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(PUBLISH_GROUP_EVENTS.into()), DEPTH_BUCKETS))
                // A histogram, not a summary: buckets add up across processes.
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(CONSUMER_LAG.into()), LAG_BUCKETS))
                .expect("bucket lists are non-empty")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed by an embedding
            // program; then ours only renders what it records itself.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("tidings-metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(5));
                        upkeep.run_upkeep();
                    }
                })
                .expect("spawning the metrics upkeep thread");
            handle
        })
        .clone()
}

fn describe() {
    for family in CATALOG {
        let (name, unit, help) = (family.name, family.unit, family.help);
        match family.kind {
            Kind::Counter => describe_counter!(name, unit, help),
            Kind::Gauge => describe_gauge!(name, unit, help),
            Kind::Histogram => describe_histogram!(name, unit, help),
        }
    }
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    PROCESS.describe();
    PROCESS.collect();

    for transport in TRANSPORTS {
        counter!(EVENTS_DELIVERED, "transport" => *transport).increment(0);
        gauge!(CLIENTS_CONNECTED, "transport" => *transport).increment(0.0);
    }
    for reason in DROP_REASONS {
        counter!(CLIENTS_DROPPED, "reason" => *reason).increment(0);
    }
    for kind in ["unregistered_type", "schema_violation"] {
        counter!(REGISTRY_VIOLATIONS, "kind" => kind).increment(0);
    }
    counter!(LISTENER_RECONNECTS).increment(0);
    counter!(STREAMS_COMPRESSED).increment(0);
    counter!(REPLAYED_EVENTS).increment(0);
    for reason in ["pruned", "replay_limit", "beyond_head", "history_lost"] {
        counter!(REPLAY_GAPS, "reason" => reason).increment(0);
    }
    for reason in ["timeline", "system", "head_behind", "operator"] {
        counter!(EPOCHS_BEGUN, "reason" => reason).increment(0);
    }
    counter!(FILTER_BUDGET_EXCEEDED).increment(0);
    counter!(POLL_REQUESTS).increment(0);
    gauge!(DATABASE_UP).set(1.0);
    gauge!(LISTENER_UP).set(0.0);
    freshness(0.0, 0.0, 0.0);
    for target in ["primary", "replica"] {
        counter!(HISTORY_READS, "target" => target).increment(0);
        counter!(BROKER_READS, "target" => target).increment(0);
    }
    // What the SQL outbox's mover can set a row aside for (PostgreSQL; 0
    // on the embedded store, which has no outbox, so dashboards read alike).
    for code in [
        "malformed_json",
        "invalid_event",
        "invalid_event_name",
        "payload_too_large",
        "reserved_event_type",
        "unregistered_event_type",
        "payload_schema_violation",
    ] {
        counter!(OUTBOX_SET_ASIDE, "code" => code).increment(0);
    }
    for outcome in NOTIFICATION_OUTCOMES {
        counter!(SUBSCRIPTION_NOTIFICATIONS, "outcome" => *outcome).increment(0);
    }
    gauge!(SUBSCRIPTIONS).set(0.0);
    for outcome in PEER_OUTCOMES {
        counter!(PEER_DELIVERIES, "outcome" => *outcome).increment(0);
    }
    counter!(PEER_RETRIES).increment(0);
    counter!(PEER_EVICTIONS).increment(0);
    for outcome in ["ok", "failed"] {
        counter!(TLS_RELOADS, "outcome" => outcome).increment(0);
    }
    for outcome in MIRROR_OUTCOMES {
        counter!(MIRROR_APPLIES, "outcome" => *outcome).increment(0);
    }
    for outcome in ["appended", "duplicate", "history_lost"] {
        counter!(PEER_RECEIVED, "outcome" => outcome).increment(0);
    }
    counter!(EVENTS_PUBLISHED, "type" => "unregistered").increment(0);
    counter!(PUBLISH_IDEMPOTENT_REPLAYS).increment(0);
    counter!(OUTBOX_MOVED).increment(0);
    let _ = histogram!(OUTBOX_DELAY);
    counter!(HTTP_REQUESTS, "route" => "/metrics", "status" => "200").increment(0);
    // Registering a histogram renders it with empty buckets; no fake sample.
    let _ = (histogram!(QUEUE_DEPTH), histogram!(BROKER_LAG), histogram!(DELIVERY_LATENCY), histogram!(CONSUMER_LAG));
    let _ = histogram!(PUBLISH_GROUP_EVENTS);
}

/// Zero-initialises the per-type publish counter for each registered type.
pub fn register_types<'a>(types: impl Iterator<Item = &'a str>) {
    for t in types {
        counter!(EVENTS_PUBLISHED, "type" => t.to_owned()).increment(0);
    }
}

// What happened, one function each: the only way code records a metric
// (tests/api/layers.rs holds that), so the catalog above is every family
// there is, with its labels' bounded values.

/// A stream client connected (`transport`: one of [`TRANSPORTS`]).
pub fn client_connected(transport: &'static str) {
    gauge!(CLIENTS_CONNECTED, "transport" => transport).increment(1.0);
}

/// A stream client went away.
pub fn client_disconnected(transport: &'static str) {
    gauge!(CLIENTS_CONNECTED, "transport" => transport).decrement(1.0);
}

/// The server ended a client (`reason`: one of [`DROP_REASONS`]).
pub fn client_dropped(reason: &'static str) {
    counter!(CLIENTS_DROPPED, "reason" => reason).increment(1);
}

/// A stream was opened compressed (SSE gzip, WebSocket permessage-deflate).
pub fn stream_compressed() {
    counter!(STREAMS_COMPRESSED).increment(1);
}

/// An HTTP request was answered (`route`: its template, or `unmatched`).
pub fn http_request(route: impl Into<metrics::SharedString>, status: u16) {
    counter!(HTTP_REQUESTS, "route" => route.into(), "status" => status.to_string()).increment(1);
}

/// `n` events of `event_type` (a registered name, or `unregistered`) were
/// appended to the log.
pub fn events_published(event_type: &str, n: u64) {
    counter!(EVENTS_PUBLISHED, "type" => event_type.to_owned()).increment(n);
}

/// A publish was answered from its Idempotency-Key, `n` times.
pub fn idempotent_replays(n: u64) {
    counter!(PUBLISH_IDEMPOTENT_REPLAYS).increment(n);
}

/// Warn mode let through an event with a registry problem (`kind`:
/// `unregistered_type`, `schema_violation`).
pub fn registry_violation(kind: &'static str) {
    counter!(REGISTRY_VIOLATIONS, "kind" => kind).increment(1);
}

/// The SQL outbox's mover moved `moved` rows into the log, set aside one
/// per code in `set_aside`, each row `delays_ms` after its call.
pub fn outbox_moved(moved: u64, set_aside: &[&'static str], delays_ms: &[i64]) {
    counter!(OUTBOX_MOVED).increment(moved);
    for code in set_aside {
        counter!(OUTBOX_SET_ASIDE, "code" => *code).increment(1);
    }
    for delay in delays_ms {
        histogram!(OUTBOX_DELAY).record(*delay as f64 / 1000.0);
    }
}

/// A group commit wrote `events` events (`kind`: `publish`, `tree`).
pub fn group_committed(kind: &'static str, events: usize) {
    histogram!(PUBLISH_GROUP_EVENTS, "kind" => kind).record(events as f64);
}

/// A resume could not be served gap-free, for `reason`.
pub fn replay_gap(reason: &'static str) {
    counter!(REPLAY_GAPS, "reason" => reason).increment(1);
}

/// The event log began a new epoch, for `reason`.
pub fn epoch_begun(reason: &'static str) {
    counter!(EPOCHS_BEGUN, "reason" => reason).increment(1);
}

/// `n` events went to clients of `transport` (a poll answer).
pub fn delivered(transport: &'static str, n: u64) {
    counter!(EVENTS_DELIVERED, "transport" => transport).increment(n);
}

/// The handles a delivering session records through on every write,
/// registered once (a lookup in the registry per write was 2.4% of a
/// delivery's CPU).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Frames written to SSE clients.
    pub sse: metrics::Counter,
    /// Frames written to WebSocket clients.
    pub ws: metrics::Counter,
    /// Events sent from history.
    pub replayed: metrics::Counter,
    /// From the append to the write.
    pub latency: metrics::Histogram,
}

/// [`Delivery`]'s handles.
pub fn delivery() -> Delivery {
    Delivery {
        sse: counter!(EVENTS_DELIVERED, "transport" => "sse"),
        ws: counter!(EVENTS_DELIVERED, "transport" => "ws"),
        replayed: counter!(REPLAYED_EVENTS),
        latency: histogram!(DELIVERY_LATENCY),
    }
}

/// The broker's lag histogram (append to fan-out), for one batch.
pub fn broker_lag() -> metrics::Histogram {
    histogram!(BROKER_LAG)
}

/// A client queue held `depth` events at a sweep.
pub fn queue_depth(depth: usize) {
    histogram!(QUEUE_DEPTH).record(depth as f64);
}

/// A poll request arrived.
pub fn poll_request() {
    counter!(POLL_REQUESTS).increment(1);
}

/// A durable consumer was `behind` events behind the head at a sweep.
pub fn consumer_lag(behind: i64) {
    histogram!(CONSUMER_LAG).record(behind.max(0) as f64);
}

/// A payload rule went over `TIDINGS_RULE_BUDGET`.
pub fn rule_budget_exceeded() {
    counter!(FILTER_BUDGET_EXCEEDED).increment(1);
}

/// The LISTEN connection reconnected.
pub fn listener_reconnected() {
    counter!(LISTENER_RECONNECTS).increment(1);
}

/// Whether the store answers and the wake-up listener is up, now.
pub fn store_health(up: bool, listening: bool) {
    gauge!(DATABASE_UP).set(if up { 1.0 } else { 0.0 });
    gauge!(LISTENER_UP).set(if listening { 1.0 } else { 0.0 });
}

/// How far delivery is behind commits (docs/metrics.md, "Freshness"): the
/// age of the oldest committed event the broker has not fanned out, how
/// long the LISTEN session has heard nothing, and the age of the outbox's
/// oldest row, in seconds.
pub fn freshness(broker_behind: f64, listener_silence: f64, outbox_oldest: f64) {
    gauge!(BROKER_BEHIND).set(broker_behind);
    gauge!(LISTENER_SILENCE).set(listener_silence);
    gauge!(OUTBOX_OLDEST).set(outbox_oldest);
}

/// Who answered a read of the log: the primary or a hot standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAt {
    /// The primary.
    Primary,
    /// A hot standby.
    Replica,
}

impl ReadAt {
    fn label(self) -> &'static str {
        match self {
            ReadAt::Primary => "primary",
            ReadAt::Replica => "replica",
        }
    }
}

/// A history read (catch-up, a poll) was answered at `at`.
pub fn history_read(at: ReadAt) {
    counter!(HISTORY_READS, "target" => at.label()).increment(1);
}

/// A read of the log's tail by the broker was answered at `at`.
pub fn broker_read(at: ReadAt) {
    counter!(BROKER_READS, "target" => at.label()).increment(1);
}

/// The standby labelled `replica` (its position in
/// `TIDINGS_REPLICA_URLS`) serves history or not.
pub fn replica_up(replica: &str, up: bool) {
    gauge!(REPLICA_UP, "replica" => replica.to_owned()).set(if up { 1.0 } else { 0.0 });
}

/// Whether the synchronous standby stopped confirming
/// (`TIDINGS_DELIVERY=replicated`).
pub fn replication_stalled(stalled: bool) {
    gauge!(REPLICATION_STALLED).set(if stalled { 1.0 } else { 0.0 });
}

/// The standby labelled `replica` is `lag_ms` behind.
pub fn replica_lag(replica: &str, lag_ms: i64) {
    gauge!(REPLICA_LAG, "replica" => replica.to_owned()).set(lag_ms as f64 / 1000.0);
}

/// The leading engine holds `n` subscriptions (0: it stopped leading).
pub fn subscriptions(n: usize) {
    gauge!(SUBSCRIPTIONS).set(n as f64);
}

/// `n` matching changes came to `outcome` (one of [`NOTIFICATION_OUTCOMES`]).
pub fn notifications(outcome: &'static str, n: u64) {
    counter!(SUBSCRIPTION_NOTIFICATIONS, "outcome" => outcome).increment(n);
}

/// A peer's delivery arrived here (`outcome`: `appended`, `duplicate`).
pub fn peer_received(outcome: &'static str) {
    counter!(PEER_RECEIVED, "outcome" => outcome).increment(1);
}

/// A delivery to a peer came to `outcome` (one of [`PEER_OUTCOMES`]).
pub fn peer_delivery(outcome: &'static str) {
    counter!(PEER_DELIVERIES, "outcome" => outcome).increment(1);
}

/// A delivery attempt to a peer failed and will be retried.
pub fn peer_retry() {
    counter!(PEER_RETRIES).increment(1);
}

/// A remote subscription was ended because its deliveries kept failing.
pub fn peer_evicted() {
    counter!(PEER_EVICTIONS).increment(1);
}

/// The courier's slowest lane to `peer` is `behind` events behind.
pub fn peer_backlog(peer: &str, behind: i64) {
    gauge!(PEER_BACKLOG, "peer" => peer.to_owned()).set(behind as f64);
}

/// A mirror handled a notification or re-read (`outcome`: one of
/// [`MIRROR_OUTCOMES`]).
pub fn mirror_applied(outcome: &'static str) {
    counter!(MIRROR_APPLIES, "outcome" => outcome).increment(1);
}

/// `mirror` re-attached after its relay stopped answering.
pub fn mirror_repaired(mirror: &str) {
    counter!(MIRROR_REPAIRS, "mirror" => mirror.to_owned()).increment(1);
}

/// `mirror` left a relay that forged or withheld a change.
pub fn mirror_left_relay(mirror: &str) {
    counter!(MIRROR_RELAYS_LEFT, "mirror" => mirror.to_owned()).increment(1);
}

/// `mirror`'s subscription is held `hops` redirects from its peer.
pub fn mirror_hops(mirror: &str, hops: u32) {
    gauge!(MIRROR_HOPS, "mirror" => mirror.to_owned()).set(f64::from(hops));
}

/// `mirror`'s subscription is (`held`) or no longer is held at `upstream`.
pub fn mirror_upstream(mirror: &str, upstream: &str, held: bool) {
    gauge!(MIRROR_UPSTREAM, "mirror" => mirror.to_owned(), "upstream" => upstream.to_owned()).set(if held { 1.0 } else { 0.0 });
}

/// The TLS certificate was reloaded (`ok`) or the reload failed.
pub fn tls_reloaded(ok: bool) {
    counter!(TLS_RELOADS, "outcome" => if ok { "ok" } else { "failed" }).increment(1);
}
