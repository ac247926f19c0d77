//! The catalog of the families tidings exports: each one's name, type,
//! unit, labels and help, which `super::describe` registers and
//! [`metrics_table`] turns into the book's table (`docs/metrics.md`).

use metrics::Unit;

use super::{
    BROKER_BEHIND, BROKER_LAG, BROKER_READS, BUILD_INFO, CLIENTS_CONNECTED, CLIENTS_DROPPED, CONSUMER_LAG, DATABASE_UP, DELIVERY_LATENCY,
    EPOCHS_BEGUN, EVENTS_DELIVERED, EVENTS_PUBLISHED, FILTER_BUDGET_EXCEEDED, HISTORY_READS, HTTP_REQUESTS, LISTENER_RECONNECTS,
    LISTENER_SILENCE, LISTENER_UP, MIRROR_APPLIES, MIRROR_HOPS, MIRROR_RELAYS_LEFT, MIRROR_REPAIRS, MIRROR_UPSTREAM, OUTBOX_DELAY,
    OUTBOX_MOVED, OUTBOX_OLDEST, OUTBOX_SET_ASIDE, PEER_BACKLOG, PEER_DELIVERIES, PEER_EVICTIONS, PEER_RECEIVED, PEER_RETRIES,
    POLL_REQUESTS, PUBLISH_GROUP_EVENTS, PUBLISH_IDEMPOTENT_REPLAYS, QUEUE_DEPTH, REGISTRY_VIOLATIONS, REPLAY_GAPS, REPLAYED_EVENTS,
    REPLICA_LAG, REPLICA_UP, REPLICATION_STALLED, STREAMS_COMPRESSED, SUBSCRIPTION_NOTIFICATIONS, SUBSCRIPTIONS, TLS_RELOADS,
};

/// A family's type, as Prometheus has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

/// One family of the catalog: its name, type and unit, its labels (as the
/// book's table describes them) and what it counts (its `# HELP`).
#[derive(Debug)]
pub struct Family {
    /// The family's name.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its unit.
    pub unit: Unit,
    /// Its labels and their values, in the book's words (empty: none).
    pub labels: &'static str,
    /// What it counts.
    pub help: &'static str,
}

/// Every family tidings exports, in the book's order (`docs/metrics.md`
/// shows [`metrics_table`] of it).
pub const CATALOG: &[Family] = &[
    Family { name: BUILD_INFO, kind: Kind::Gauge, unit: Unit::Count, labels: "`version`", help: "Always 1: which tidings runs." },
    Family {
        name: EVENTS_PUBLISHED,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`type`",
        help: "Events appended (unregistered types as `unregistered`).",
    },
    Family {
        name: PUBLISH_IDEMPOTENT_REPLAYS,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "",
        help: "Publishes answered from their `Idempotency-Key` (same body as before: the original ids, nothing stored).",
    },
    Family {
        name: OUTBOX_MOVED,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "",
        help: "Rows of the SQL outbox (`tidings.publish`) moved into the log, or answered by their key.",
    },
    Family {
        name: OUTBOX_SET_ASIDE,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`code`",
        help: "Rows of the SQL outbox set aside, never delivered.",
    },
    Family {
        name: OUTBOX_DELAY,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: "",
        help: "From a `tidings.publish` call to its move into the log.",
    },
    Family {
        name: PUBLISH_GROUP_EVENTS,
        kind: Kind::Histogram,
        unit: Unit::Count,
        labels: "`kind` (`publish`, `tree`)",
        help: "Events per group commit of publishes or of tree writes, for groups of two requests or more.",
    },
    Family {
        name: EVENTS_DELIVERED,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`transport` (`sse`, `poll`, `ws`)",
        help: "Event frames written to clients.",
    },
    Family {
        name: CLIENTS_CONNECTED,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: "`transport` (`sse`, `poll`, `ws`)",
        help: "Connected streaming clients.",
    },
    Family {
        name: CLIENTS_DROPPED,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`reason` (`queue_full`, `no_progress`: evicted by the broker; `write_stalled`: a write (a stream's, a poll page's, any answer's) made no progress for the slow-client timeout plus the grace)",
        help: "Clients ended as slow.",
    },
    Family {
        name: STREAMS_COMPRESSED,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "",
        help: "Streams opened compressed: SSE streams sent gzip, WebSockets with `permessage-deflate` (`TIDINGS_COMPRESSION=on`).",
    },
    Family {
        name: QUEUE_DEPTH,
        kind: Kind::Histogram,
        unit: Unit::Count,
        labels: "",
        help: "Depth of non-empty client queues, sampled about once a second.",
    },
    Family { name: BROKER_LAG, kind: Kind::Histogram, unit: Unit::Seconds, labels: "", help: "Commit to fan-out." },
    Family {
        name: DELIVERY_LATENCY,
        kind: Kind::Histogram,
        unit: Unit::Seconds,
        labels: "",
        help: "Commit to the frame being written: sampled, one live write in 16 on each worker thread.",
    },
    Family { name: LISTENER_RECONNECTS, kind: Kind::Counter, unit: Unit::Count, labels: "", help: "LISTEN reconnects." },
    Family { name: REPLAYED_EVENTS, kind: Kind::Counter, unit: Unit::Count, labels: "", help: "Events sent from history." },
    Family {
        name: REPLAY_GAPS,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`reason` (`pruned`, `replay_limit`, `beyond_head`, `history_lost`)",
        help: "Resumes announced as gaps.",
    },
    Family {
        name: EPOCHS_BEGUN,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`reason` (`timeline`, `system`, `head_behind`, `operator`)",
        help: "Epochs the event log began: the store may have lost history after the fork (see \"History that survives failover\").",
    },
    Family {
        name: REPLICATION_STALLED,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: "(none)",
        help: "1 while the synchronous standby does not confirm (`TIDINGS_DELIVERY=replicated` only): publishes are refused and nothing new is shown.",
    },
    Family {
        name: HISTORY_READS,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`target` (`primary`, `replica`)",
        help: "History reads (catch-up, polls, `sync.delta`) on PostgreSQL, by the server that answered them (a read a standby answered in part counts once for each).",
    },
    Family {
        name: BROKER_READS,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`target` (`primary`, `replica`)",
        help: "The broker's tail reads on PostgreSQL with standbys, by the server that answered them.",
    },
    Family {
        name: REPLICA_UP,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: "`replica` (its position in `TIDINGS_REPLICA_URLS`, from 0: no addresses on the public `/metrics`)",
        help: "1 while a hot standby serves history.",
    },
    Family {
        name: REPLICA_LAG,
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        labels: "`replica`",
        help: "Time since a standby that lacks the primary's head replayed a commit; 0 when it holds the head.",
    },
    Family {
        name: FILTER_BUDGET_EXCEEDED,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "",
        help: "Payload-rule evaluations stopped by `TIDINGS_RULE_BUDGET` (the event did not match that client).",
    },
    Family { name: POLL_REQUESTS, kind: Kind::Counter, unit: Unit::Count, labels: "", help: "Poll requests." },
    Family {
        name: CONSUMER_LAG,
        kind: Kind::Histogram,
        unit: Unit::Count,
        labels: "",
        help: "Durable consumers' distance behind the head, sampled by each expiry sweep.",
    },
    Family {
        name: SUBSCRIPTION_NOTIFICATIONS,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`outcome` (`delivered`, `rate_limited`, `max_events_reached`, `max_duration_reached`, `deliver_token_expired`)",
        help: "Tree changes a path subscription matched, and what became of each.",
    },
    Family {
        name: SUBSCRIPTIONS,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: "",
        help: "Path subscriptions in the leading engine's index (0 on the other processes).",
    },
    Family {
        name: PEER_DELIVERIES,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`outcome` (`delivered`, `duplicate`, `refused`, `given_up`)",
        help: "Notifications carried to peers' inboxes.",
    },
    Family {
        name: PEER_RETRIES,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "",
        help: "Delivery attempts to peers that failed and were retried.",
    },
    Family {
        name: PEER_BACKLOG,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: "`peer`",
        help: "Log events the slowest lane to that peer is behind the head (sampled every 5 s).",
    },
    Family {
        name: TLS_RELOADS,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`outcome` (`ok`, `failed`)",
        help: "TLS certificate reloads on `SIGHUP` (a failed one keeps the certificate in use).",
    },
    Family {
        name: PEER_EVICTIONS,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "",
        help: "Remote subscriptions ended because their deliveries kept failing for `TIDINGS_PEER_EVICT_AFTER`.",
    },
    Family {
        name: PEER_RECEIVED,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`outcome` (`appended`, `duplicate`, `history_lost`: appended after a notice that the sender lost history it had delivered)",
        help: "Deliveries received from peers.",
    },
    Family {
        name: MIRROR_APPLIES,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`outcome` (`applied`, `unchanged`, `stale_rejected`, `gap_reread`, `reread_failed`, `foreign_ignored`: delivered to the mirror's inbox by another server than its current upstream; `history_lost`: the upstream lost history it had notified, and every known path is read again; `forged_refused`, `rollback_refused`, `unsigned_reread`: see \"Signed changes\")",
        help: "Notifications (and reconciliation re-reads) a mirror handled.",
    },
    Family {
        name: MIRROR_RELAYS_LEFT,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`mirror`",
        help: "Relays the mirror left because they forged or withheld a change.",
    },
    Family {
        name: MIRROR_REPAIRS,
        kind: Kind::Counter,
        unit: Unit::Count,
        labels: "`mirror`",
        help: "Re-attachments after the mirror's relay stopped answering (a series once a mirror repaired).",
    },
    Family {
        name: MIRROR_UPSTREAM,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: "`mirror`, `upstream`",
        help: "1 for the server holding the mirror's subscription (the peer or a relay), 0 for the ones that held it before.",
    },
    Family {
        name: MIRROR_HOPS,
        kind: Kind::Gauge,
        unit: Unit::Count,
        labels: "`mirror`",
        help: "Redirects between the mirrored peer and the server holding the mirror's subscription (0: the peer itself).",
    },
    Family { name: REGISTRY_VIOLATIONS, kind: Kind::Counter, unit: Unit::Count, labels: "`kind`", help: "Warn-mode acceptances." },
    Family { name: HTTP_REQUESTS, kind: Kind::Counter, unit: Unit::Count, labels: "`route`, `status`", help: "Requests." },
    Family { name: DATABASE_UP, kind: Kind::Gauge, unit: Unit::Count, labels: "", help: "1 while the store answers (probed every 5 s)." },
    Family { name: LISTENER_UP, kind: Kind::Gauge, unit: Unit::Count, labels: "", help: "1 while the LISTEN connection is up." },
    Family {
        name: BROKER_BEHIND,
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        labels: "",
        help: "Age of the oldest committed event the broker has not fanned out (0 when it holds the head); measured every 5 s.",
    },
    Family {
        name: LISTENER_SILENCE,
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        labels: "",
        help: "Time since the LISTEN session last heard a notification or connected (PostgreSQL; 0 on the embedded store).",
    },
    Family {
        name: OUTBOX_OLDEST,
        kind: Kind::Gauge,
        unit: Unit::Seconds,
        labels: "",
        help: "Age of the oldest row waiting in the SQL outbox (PostgreSQL; 0 when it is empty).",
    },
];

/// The process's own families the book's table lists (`metrics-process`
/// exports them, with a few more), with what they say.
const PROCESS_FAMILIES: &[(&str, Kind, &str)] = &[
    ("process_cpu_seconds_total", Kind::Counter, "CPU time, user and system."),
    ("process_resident_memory_bytes", Kind::Gauge, "Resident memory."),
    ("process_open_fds", Kind::Gauge, "Open file descriptors: every stream holds one."),
    ("process_max_fds", Kind::Gauge, "The open-file limit, which bounds the streams a process can hold."),
];

/// The metrics table of `docs/metrics.md`, made from [`CATALOG`] (and the
/// process's families): `tests/api/docs.rs` compares them.
pub fn metrics_table() -> String {
    let kind = |k: Kind| match k {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
    };
    let mut table = String::from("| family | type | labels | meaning |\n|---|---|---|---|\n");
    let (first, rest) = CATALOG.split_first().expect("the catalog has families");
    let rows = std::iter::once((first.name, first.kind, first.labels, first.help))
        .chain(PROCESS_FAMILIES.iter().map(|&(name, k, help)| (name, k, "", help)))
        .chain(rest.iter().map(|f| (f.name, f.kind, f.labels, f.help)));
    for (name, k, labels, help) in rows {
        let labels = if labels.is_empty() { String::new() } else { format!(" {labels} ") };
        table.push_str(&format!("| `{name}` | {} |{labels}| {help} |\n", kind(k)));
    }
    table
}
