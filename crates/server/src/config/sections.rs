//! The sections of [`Settings`](super::Settings), one per subsystem: each
//! subsystem takes its own. Flattened, so every environment variable and
//! flag keeps its name.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::*;
use crate::registry::RegistryMode;

/// What one filter may ask (docs/streams.md, "Filters"), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Filters")]
pub struct FilterSettings {
    /// Longest `filter=` JSON, in bytes.
    #[arg(long, env = "TIDINGS_MAX_FILTER_BYTES", default_value = "16KiB", value_parser = byte_size)]
    pub max_filter_bytes: usize,

    /// Most entries in one filter list (`types`, `agents`, `targets`).
    #[arg(long, env = "TIDINGS_MAX_FILTER_LIST", default_value_t = 256)]
    pub max_filter_list: usize,

    /// Deepest nesting of a payload rule (JsonLogic).
    #[arg(long, env = "TIDINGS_MAX_RULE_DEPTH", default_value_t = 32)]
    pub max_rule_depth: usize,

    /// Most nodes in a payload rule (JsonLogic).
    #[arg(long, env = "TIDINGS_MAX_RULE_NODES", default_value_t = 1024)]
    pub max_rule_nodes: usize,

    /// Most bytes one evaluation of a payload rule may build (strings, arrays), and most loop steps it may
    /// take (one per two bytes of the event, per node of the loop bodies, estimated before it runs);
    /// beyond, the event does not match that client, it is counted (`tidings_filter_budget_exceeded_total`,
    /// logged once per rule), and the client is told once (`system.filter_budget_exceeded {budget}` on SSE,
    /// `stream.filter_budget_exceeded` on WebSocket). Loops (`map`, `filter`, `reduce`, `all`, `some`,
    /// `none`) may not nest.
    #[arg(long, env = "TIDINGS_RULE_BUDGET", default_value = "1MiB", value_parser = byte_size)]
    pub rule_budget: usize,
}

impl FilterSettings {
    /// The limits every filter is checked against.
    pub fn limits(&self) -> crate::filter::FilterLimits {
        crate::filter::FilterLimits {
            max_bytes: self.max_filter_bytes,
            max_list: self.max_filter_list,
            rule: crate::filter::RuleLimits { max_depth: self.max_rule_depth, max_nodes: self.max_rule_nodes, budget: self.rule_budget },
        }
    }
}

/// Long-polls and durable consumers (docs/polling.md), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Polls and durable consumers")]
pub struct PollSettings {
    /// Durable consumers silent this long are collected (resuming one without `since` then answers `410`).
    #[arg(long, env = "TIDINGS_CONSUMER_TTL", default_value = "7d", value_parser = duration)]
    pub consumer_ttl: Duration,

    /// Most events one poll returns (`limit` is capped here).
    #[arg(long, env = "TIDINGS_POLL_MAX_LIMIT", default_value_t = 1000)]
    pub poll_max_limit: usize,

    /// Most bytes of events one poll (or `sync.delta` page) returns, at least one event (`has_more` past
    /// it).
    #[arg(long, env = "TIDINGS_POLL_MAX_BYTES", default_value = "4MiB", value_parser = byte_size)]
    pub poll_max_bytes: usize,

    /// Longest a poll may wait (`wait_ms` is capped here).
    #[arg(long, env = "TIDINGS_POLL_MAX_WAIT", default_value = "60s", value_parser = duration)]
    pub poll_max_wait: Duration,

    /// Most rows one poll scans before answering `has_more` with its scan position.
    #[arg(long, env = "TIDINGS_POLL_MAX_SCAN", default_value_t = 100_000)]
    pub poll_max_scan: usize,

    /// Durable consumers one identity keeps; a new one beyond is `429 too_many_consumers` (its existing
    /// ones poll on).
    #[arg(long, env = "TIDINGS_MAX_CONSUMERS_PER_IDENTITY", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_consumers_per_identity: u32,
}

/// How long history and what remembers it are kept (docs/operations.md),
/// flattened into [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "History")]
pub struct HistorySettings {
    /// Prune history: `off`, an age (`30d`), a count of events (`1000000`), or both (`30d,1000000`).
    #[arg(long, env = "TIDINGS_RETENTION", default_value = "off", value_parser = retention)]
    pub retention: Retention,

    /// How long a publish's `Idempotency-Key` is remembered: a retry within it with the same key stores
    /// nothing and is answered the original ids (docs/events.md).
    #[arg(long, env = "TIDINGS_IDEMPOTENCY_WINDOW", default_value = "24h", value_parser = duration)]
    pub idempotency_window: Duration,

    /// How long rows of the SQL outbox set aside (never delivered) are kept for an operator to read
    /// (`tidings.outbox`, `error_code`; PostgreSQL).
    #[arg(long, env = "TIDINGS_OUTBOX_SET_ASIDE_RETENTION", default_value = "7d", value_parser = duration)]
    pub outbox_set_aside_retention: Duration,

    /// How often retention runs (and expired idempotency keys and set-aside outbox rows are pruned).
    #[arg(long, env = "TIDINGS_RETENTION_INTERVAL", default_value = "1m", value_parser = duration)]
    pub retention_interval: Duration,
}

/// PostgreSQL's settings (DATABASE_URL set: the pool, hot standbys,
/// replicated delivery), flattened into [`Settings`] under the same
/// environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "PostgreSQL")]
pub struct PostgresSettings {
    /// Most pooled PostgreSQL connections.
    #[arg(long, env = "TIDINGS_DB_POOL", default_value_t = 16)]
    pub db_pool: usize,

    /// Comma list of hot standbys of the PostgreSQL primary: history (stream and WebSocket catch-up,
    /// `sync.delta`, polls, consumers) is read there as far as a standby holds it, the rest on the primary
    /// (docs/scaling.md).
    #[arg(long, env = "TIDINGS_REPLICA_URLS", value_delimiter = ',', num_args = 0..)]
    pub replica_urls: Vec<String>,

    /// `replica`: the broker's tail reads go to the standbys too, up to the notified head, waiting up to
    /// 100 ms for one to replay a notified commit (docs/scaling.md).
    #[arg(long, env = "TIDINGS_BROKER_READS", value_enum, default_value = "primary")]
    pub broker_reads: BrokerReads,

    /// `replicated` (PostgreSQL with synchronous replication): nothing is shown or answered `201` before
    /// the synchronous standby has it; `503 replication_unavailable` while it does not confirm within
    /// `TIDINGS_DB_TIMEOUT` (docs/failover.md).
    #[arg(long, env = "TIDINGS_DELIVERY", value_enum, default_value = "committed")]
    pub delivery: Delivery,

    /// A standby behind the primary for longer than this (time since it replayed a commit, while it lacks
    /// the primary's head) is skipped until it catches up.
    #[arg(long, env = "TIDINGS_REPLICA_MAX_LAG", default_value = "5s", value_parser = duration)]
    pub replica_max_lag: Duration,

    /// Longest wait for a database connection before `503`.
    #[arg(long, env = "TIDINGS_DB_TIMEOUT", default_value = "2s", value_parser = duration)]
    pub db_timeout: Duration,
}

/// Federation's settings (path subscriptions, peers,
/// the courier and the mirrors; docs/ref-federation.md), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Path subscriptions and peers")]
pub struct FederationSettings {
    /// Tree subscriptions per pattern before a subscribe is redirected (`303`); `0`: no limit.
    #[arg(long, env = "TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", default_value_t = 0)]
    pub max_subscribers_per_prefix: u64,

    /// Tree subscriptions this server keeps, at most 100000; beyond, a new one is refused
    /// (`too_many_subscriptions`; renewals still pass).
    #[arg(long, env = "TIDINGS_MAX_SUBSCRIPTIONS", default_value_t = 100_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub max_subscriptions: usize,

    /// Tree subscriptions one subscriber identity keeps; beyond, `429 too_many_subscriptions_for_identity`
    /// (renewals still pass).
    #[arg(long, env = "TIDINGS_MAX_SUBSCRIPTIONS_PER_IDENTITY", default_value_t = 100, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub max_subscriptions_per_identity: usize,

    /// Peers written into the tree at start-up: `sha256:<hash>=http://host:port,...` (identity hash, base
    /// URL).
    #[arg(long, env = "TIDINGS_PEERS", default_value = "", value_parser = peers)]
    pub peers: Peers,

    /// Hosts this server may call (peers, relays, mirrors' upstreams): address ranges (`10.0.0.0/8`), host
    /// names, `*.domain`, `loopback`, `*`; link-local and metadata addresses only when a range inside them
    /// is listed.
    #[arg(long, env = "TIDINGS_PEER_ALLOW", default_value = "loopback", value_parser = peer_allow)]
    pub peer_allow: tidings_outbound::PeerAllow,

    /// Tree changes the subscription engine reads per step.
    #[arg(long, env = "TIDINGS_ENGINE_BATCH", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub engine_batch: u32,

    /// The engine commits its cursor at least this often while it only scans.
    #[arg(long, env = "TIDINGS_ENGINE_IDLE_COMMIT", default_value = "1s", value_parser = duration)]
    pub engine_idle_commit: Duration,

    /// How often a process that does not run the engine tries to take it over (bounds a takeover).
    #[arg(long, env = "TIDINGS_ENGINE_LEAD_RETRY", default_value = "1s", value_parser = duration)]
    pub engine_lead_retry: Duration,

    /// Attempts to deliver one notification to a peer (backoff 250 ms doubling to 30 s, jittered) before it
    /// is given up with a chain-error marker.
    #[arg(long, env = "TIDINGS_PEER_DELIVERY_ATTEMPTS", default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub peer_delivery_attempts: u32,

    /// A remote subscription whose delivery attempts have all failed this long is ended at its next failed
    /// attempt, freeing its capacity slot (`0s`: never).
    #[arg(long, env = "TIDINGS_PEER_EVICT_AFTER", default_value = "1h", value_parser = duration)]
    pub peer_evict_after: Duration,

    /// Time allowed for one request to a peer (a delivery attempt, a mirror's subscribe or re-read).
    #[arg(long, env = "TIDINGS_PEER_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub peer_timeout: Duration,

    /// Lifetime of the deliver token a mirror subscribes with; the subscription is renewed at half of it.
    #[arg(long, env = "TIDINGS_MIRROR_TOKEN_TTL", default_value = "1d", value_parser = duration)]
    pub mirror_token_ttl: Duration,

    /// How often a mirror re-reads the paths it knows that were not notified meanwhile (it catches a lost
    /// last notification).
    #[arg(long, env = "TIDINGS_MIRROR_RECONCILE", default_value = "1m", value_parser = duration)]
    pub mirror_reconcile: Duration,

    /// How long a relay a mirror is attached through may stay unreachable before the mirror attaches
    /// elsewhere (probed every quarter of it, at most every 10 s).
    #[arg(long, env = "TIDINGS_MIRROR_REPAIR_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub mirror_repair_timeout: Duration,
}

/// The HTTP door: where tidings listens, TLS, CORS, the URL peers reach it at, and the bounds on a request (docs/security.md), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "HTTP")]
pub struct HttpSettings {
    /// HTTP listen address (any address needs authentication on).
    #[arg(long, env = "TIDINGS_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// PEM certificate chain; with `TIDINGS_TLS_KEY_FILE`, serve HTTPS (HTTP/2 and HTTP/1.1 by ALPN).
    #[arg(long, env = "TIDINGS_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<std::path::PathBuf>,

    /// PEM private key of the certificate (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "TIDINGS_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<std::path::PathBuf>,

    /// The URL peers reach this server at, advertised as `endpoint` by `GET /v1/identity` (unset: `http://`
    /// and the bound address).
    #[arg(long, env = "TIDINGS_PUBLIC_URL", default_value = "")]
    pub public_url: String,

    /// Comma list of allowed origins, or `*` (without credentials); any other `Origin` is refused (`403
    /// origin_refused`); unset: no CORS.
    #[arg(long, env = "TIDINGS_CORS_ORIGINS", default_value = "")]
    pub cors_origins: String,

    /// Largest request body.
    #[arg(long, env = "TIDINGS_MAX_BODY", default_value = "1MiB", value_parser = byte_size)]
    pub max_body: usize,

    /// Longest a client may take to send a request head (a deadline from the connection, not per byte: a
    /// slowloris guard); also the TLS handshake's deadline, and how long an HTTP/2 connection may stay with
    /// no stream open (from the connection or its last stream's end) before it is shut down.
    #[arg(long, env = "TIDINGS_HEADER_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub header_timeout: Duration,

    /// Longest a client may take to send a request body (`408 body_timeout`, connection closed).
    #[arg(long, env = "TIDINGS_BODY_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub body_timeout: Duration,
}

/// Who may call: bearer tokens and the keys that check them (docs/security.md), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Authentication")]
pub struct AuthSettings {
    /// `jwt` or `off`; unset: `jwt` with a key, else `off` (loopback only).
    #[arg(long, env = "TIDINGS_AUTH", value_enum)]
    pub auth: Option<AuthSetting>,

    /// Shared secret for HS256 tokens.
    #[arg(long, env = "TIDINGS_JWT_HS256_SECRET", hide_env_values = true, value_parser = secret)]
    pub jwt_hs256_secret: Option<Secret>,

    /// PEM Ed25519 (EdDSA) or RSA (RS256) public key.
    #[arg(long, env = "TIDINGS_JWT_PUBLIC_KEY_FILE")]
    pub jwt_public_key_file: Option<PathBuf>,

    /// Required `aud` claim of a token, if set.
    #[arg(long, env = "TIDINGS_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// Required `iss` claim of a token, if set.
    #[arg(long, env = "TIDINGS_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
}

/// What a publish may carry and how publishes are committed: the registry, payload and batch bounds, the group commit, the rate (docs/events.md), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Publishing")]
pub struct PublishSettings {
    /// Event-type registry directory (built-in copy when absent).
    #[arg(long, env = "TIDINGS_REGISTRY", default_value = "./registry")]
    pub registry: PathBuf,

    /// `strict` refuses unregistered types and schema violations; `warn` accepts, logs, counts.
    #[arg(long, env = "TIDINGS_REGISTRY_MODE", value_enum, default_value = "warn")]
    pub registry_mode: RegistryMode,

    /// Largest event payload (serialised).
    #[arg(long, env = "TIDINGS_MAX_PAYLOAD", default_value = "64KiB", value_parser = byte_size)]
    pub max_payload: usize,

    /// Most events in one publish.
    #[arg(long, env = "TIDINGS_MAX_BATCH", default_value_t = 10_000)]
    pub max_batch: usize,

    /// Most events one group commit of concurrent publishes (or tree writes) writes together.
    #[arg(long, env = "TIDINGS_PUBLISH_GROUP_EVENTS", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub publish_group_events: u32,

    /// How long a group commit waits for more publishes (or tree writes) once it has one (0: it takes only
    /// what queued while the last commit was in flight).
    #[arg(long, env = "TIDINGS_PUBLISH_GROUP_DELAY", default_value = "0ms", value_parser = duration)]
    pub publish_group_delay: Duration,

    /// Events per second one identity may publish (`0`: no limit).
    #[arg(long, env = "TIDINGS_PUBLISH_RATE", default_value_t = 0)]
    pub publish_rate: u32,
}

/// Streams and the broker: queues, slow clients, heartbeats, replay, and how many streams may be open (docs/streams.md), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Streams and the broker")]
pub struct StreamSettings {
    /// Per-client queue length, in events.
    #[arg(long, env = "TIDINGS_CLIENT_QUEUE", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub client_queue: u32,

    /// A client with events waiting that takes none for this long is dropped.
    #[arg(long, env = "TIDINGS_SLOW_CLIENT_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub slow_client_timeout: Duration,

    /// An evicted client's connection is closed by force if still open after this.
    #[arg(long, env = "TIDINGS_EVICTION_GRACE", default_value = "5s", value_parser = duration)]
    pub eviction_grace: Duration,

    /// Rows per store read (broker and replay).
    #[arg(long, env = "TIDINGS_READ_BATCH", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub read_batch: u32,

    /// SSE comment heartbeat; WebSocket ping interval.
    #[arg(long, env = "TIDINGS_HEARTBEAT", default_value = "15s", value_parser = duration)]
    pub heartbeat: Duration,

    /// `on`: SSE streams go gzip-compressed to clients that accept it, and a WebSocket that offers
    /// `permessage-deflate` gets it; each event is compressed once and shared by every connection
    /// (docs/streams.md#compression).
    #[arg(long, env = "TIDINGS_COMPRESSION", default_value = "off", value_enum)]
    pub compression: Compression,

    /// Reconnect delay sent as `retry:` (shutdown sends 1x to 5x of it, jittered).
    #[arg(long, env = "TIDINGS_SSE_RETRY", default_value = "2s", value_parser = duration)]
    pub sse_retry: Duration,

    /// Most events one resume may replay; an older resume point gets `system.replay_gap`.
    #[arg(long, env = "TIDINGS_MAX_REPLAY", default_value_t = 1_000_000)]
    pub max_replay: u64,

    /// Concurrent streams in total (waiting long-polls and not yet authenticated WebSockets count); beyond,
    /// `503` with `Retry-After`.
    #[arg(long, env = "TIDINGS_MAX_STREAMS", default_value_t = 50_000)]
    pub max_streams: usize,

    /// Concurrent streams per identity when authentication is on; beyond, `429`.
    #[arg(long, env = "TIDINGS_MAX_STREAMS_PER_IDENTITY", default_value_t = 1_000)]
    pub max_streams_per_identity: usize,
}

/// WebSocket devices: message size, authentication and re-authentication (docs/websocket.md), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "WebSocket")]
pub struct WebSocketSettings {
    /// Largest WebSocket message a client may send (beyond: close 1009).
    #[arg(long, env = "TIDINGS_WS_MAX_MESSAGE", default_value = "64KiB", value_parser = byte_size)]
    pub ws_max_message: usize,

    /// A WebSocket without a successful `stream.auth` this long gets an `auth_timeout` error frame and
    /// close 1008.
    #[arg(long, env = "TIDINGS_WS_AUTH_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub ws_auth_timeout: Duration,

    /// After a WebSocket's token expires (`stream.token_expired`), how long it has to send `stream.reauth
    /// {token}` before an error frame and close 1000.
    #[arg(long, env = "TIDINGS_REAUTH_GRACE", default_value = "30s", value_parser = duration)]
    pub reauth_grace: Duration,
}

/// Start, health and stop: the health probe, the drain after SIGTERM and the shutdown deadline (docs/deploy.md), flattened into
/// [`Settings`] under the same environment names.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Start, health and stop")]
pub struct LifecycleSettings {
    /// How often the store and the LISTEN connection are probed for the health gauges.
    #[arg(long, env = "TIDINGS_HEALTH_PROBE_INTERVAL", default_value = "5s", value_parser = duration)]
    pub health_probe_interval: Duration,

    /// After SIGTERM, how long the process serves as usual while `/health/ready` answers `503` (for load
    /// balancers to notice).
    #[arg(long, env = "TIDINGS_DRAIN_DELAY", default_value = "5s", value_parser = duration)]
    pub drain_delay: Duration,

    /// Then, the window over which its open streams are ended, spread evenly, each with a jittered retry,
    /// before the graceful shutdown (`TIDINGS_SHUTDOWN_TIMEOUT`); it ends as soon as no stream is left, so
    /// an idle process exits right after the delay.
    #[arg(long, env = "TIDINGS_DRAIN", default_value = "10s", value_parser = duration)]
    pub drain: Duration,

    /// Graceful shutdown deadline; connections still open are closed.
    #[arg(long, env = "TIDINGS_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub shutdown_timeout: Duration,
}
