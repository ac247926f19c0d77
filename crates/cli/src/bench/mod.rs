//! `tidings bench`: a load generator that measures what a subscriber sees.
//!
//! It holds N SSE connections (or, with `--transport ws`, N authenticated
//! WebSocket devices) with a filter, publishes at R events/s
//! open-loop (every publish is its own task on a fixed schedule, so a slow
//! server cannot lower the offered rate), and measures publish-to-receive
//! latency from a timestamp carried in each payload. With `--server-pid` it
//! also reads the server's CPU time and peak RSS from `/proc`.
//! It is a benchmark, not a test: it reports, it asserts nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use tidings_client::sse as client;

mod deflate_ws;
mod poll;
mod recovery;
mod throughput;

pub use poll::{PollReport, poll_bench};
pub use recovery::{RecoveryReport, listen_loss, storm};
pub use throughput::{AnswerPart, ThroughputReport, publish_throughput, replay_throughput};

/// Options of `tidings bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// SSE connections to hold.
    #[arg(long, default_value_t = 100)]
    pub clients: usize,
    /// Events published per second (open loop).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// How long to publish.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Event type to publish (subscribers filter on it).
    #[arg(long, default_value = "signal.upvote.recorded")]
    pub event_type: String,
    /// Split subscribers into this many shards: client i adds the payload
    /// rule `shard == i % shards`, and event n carries `shard = n % shards`,
    /// so each event matches 1/shards of the clients (1 = every client, no rule).
    #[arg(long, default_value_t = 1)]
    pub shards: u64,
    /// PID of the server, to report its CPU seconds and peak RSS.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// What to measure: `deliver` (subscribers and latency), `publish`
    /// (append throughput) or `replay` (one client reading history).
    #[arg(long, value_enum, default_value = "deliver")]
    pub mode: Mode,
    /// `publish`: events per request (1 = single publishes).
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// `publish`: concurrent publishers.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// `replay`: events to publish first and then read back; `listen-loss`:
    /// events published during the loss.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Generic mode: subscribe to this SSE URL instead of tidings' `/v1/stream`
    /// (any server whose publish endpoint relays a body verbatim, e.g. Nchan).
    #[arg(long, requires = "generic_publish")]
    pub generic_subscribe: Option<String>,
    /// Generic mode: POST each event body here; the body is
    /// `{"sent_us": N}` and subscribers read it back verbatim.
    #[arg(long, requires = "generic_subscribe")]
    pub generic_publish: Option<String>,
    /// `listen-loss`: the PostgreSQL database the servers share.
    #[arg(long)]
    pub database_url: Option<String>,
    /// `listen-loss`: the server to publish on (another process on the same
    /// database); default `--url`.
    #[arg(long)]
    pub publish_url: Option<String>,
    /// `idle`: once every connection is open, publish this many events in
    /// one batch, so each connection has written before it idles.
    #[arg(long, default_value_t = 0)]
    pub warm_events: usize,
    /// `deliver` and `idle`: how subscribers connect to tidings.
    #[arg(long, value_enum, default_value = "sse")]
    pub transport: Transport,
    /// Peer modes: the servers, comma-separated base URLs (source first).
    #[arg(long, default_value = "")]
    pub peer_urls: String,
    /// `peer-delivery`: subscriptions the notifications are spread over.
    #[arg(long, default_value_t = 1)]
    pub subscriptions: usize,
    /// `mirror-converge`: `chain` (A→B→C), `pair` (A⇄B) or `ring` (A→B→C→A).
    #[arg(long, default_value = "chain")]
    pub topology: String,
    /// `mirror-converge`: drop every k-th delivery through a lossy proxy (0: none).
    #[arg(long, default_value_t = 0)]
    pub loss: usize,
    /// `tree`: the process ids of the `--peer-urls` servers (same order),
    /// so the benchmark can kill one relay with SIGKILL.
    #[arg(long, default_value = "")]
    pub peer_pids: String,
    /// Trust this PEM certificate (a test CA, or a self-signed server
    /// certificate) for an `https://` `--url`.
    #[arg(long)]
    pub ca_file: Option<std::path::PathBuf>,
    /// `deliver` and `idle` over SSE: the HTTP version of the subscribers.
    /// `1`: HTTP/1.1, a connection per stream. `2`: HTTP/2 (over `https://`
    /// by ALPN, over `http://` with prior knowledge), with
    /// `--streams-per-connection` streams sharing each connection.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub http_version: u8,
    /// With `--http-version 2`: streams per connection.
    #[arg(long, default_value_t = 100)]
    pub streams_per_connection: usize,
    /// `deliver` over SSE: ask for gzip (`Accept-Encoding: gzip`, which a
    /// server with `TIDINGS_COMPRESSION=on` answers), inflate each stream
    /// as it arrives, and fail a stream sent otherwise. Over WebSocket:
    /// offer `permessage-deflate`, inflate each message, and fail a device
    /// whose server does not take the offer.
    #[arg(long)]
    pub compressed: bool,
    /// `deliver`: order lines added to each payload (`sku`, `name`, `qty`,
    /// `price_cents` each), so an event has the size and shape of a real
    /// one (0: the stamp alone).
    #[arg(long, default_value_t = 0)]
    pub payload_lines: usize,
    /// `deliver` with `--rate 0` and `resume`: create this file once every
    /// subscriber is connected, so a script can start the publisher (or the
    /// fault) only then.
    #[arg(long)]
    pub ready_file: Option<std::path::PathBuf>,
}

/// Creates `--ready-file`, if one was given.
pub(super) fn mark_ready(args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.ready_file {
        std::fs::write(path, b"ready\n")?;
    }
    Ok(())
}

/// An HTTP/1.1 client that trusts `--ca-file`, keeping `idle` connections
/// per host.
fn http1(args: &BenchArgs, idle: usize) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder().http1_only().pool_max_idle_per_host(idle);
    if let Some(path) = &args.ca_file {
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(path)?)?);
    }
    Ok(builder.build()?)
}

/// The clients SSE subscribers stream over: one HTTP/1.1 client (a
/// connection per stream), or with `--http-version 2` one HTTP/2 client per
/// `--streams-per-connection` streams (each client holds one connection,
/// its streams multiplexed on it).
struct StreamClients(Vec<reqwest::Client>, usize);

impl StreamClients {
    fn new(args: &BenchArgs) -> anyhow::Result<Self> {
        if args.http_version == 1 {
            return Ok(Self(vec![http1(args, 0)?], usize::MAX));
        }
        let per = args.streams_per_connection.max(1);
        let clients = (0..args.clients.div_ceil(per).max(1))
            .map(|_| {
                let mut builder = reqwest::Client::builder().pool_max_idle_per_host(1);
                if args.url.starts_with("http://") {
                    builder = builder.http2_prior_knowledge();
                }
                if let Some(path) = &args.ca_file {
                    builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(path)?)?);
                }
                Ok(builder.build()?)
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self(clients, per))
    }

    /// The client stream `i` goes over.
    fn for_stream(&self, i: usize) -> &reqwest::Client {
        &self.0[(i / self.1).min(self.0.len() - 1)]
    }
}

/// How `deliver` and `idle` subscribers connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// `GET /v1/stream` (EventSource).
    Sse,
    /// `GET /v1/ws`: each client a device of one bench key, authenticated
    /// at the head, taking realtime `stream.event`s (no acks).
    Ws,
}

/// A subscriber of `deliver` and `idle`: what it reads events from.
enum Subscriber {
    Sse(client::SseReader<client::BodyStream>),
    Ws(Box<tidings_client::device::DeviceClient>),
    /// `--transport ws --compressed`.
    WsDeflate(Box<deflate_ws::DeflateDevice>),
}

impl Subscriber {
    /// Client `i`'s connection with `filter` (tidings' JSON filter) or, in
    /// generic mode, to the generic URL.
    async fn open(
        args: &BenchArgs,
        http: &reqwest::Client,
        key: &tidings_protocol::identity::ServerIdentity,
        i: usize,
        filter: &Value,
        wire: &Arc<AtomicU64>,
    ) -> anyhow::Result<Self> {
        if let Some(url) = &args.generic_subscribe {
            return Ok(Self::Sse(open_sse(http, url, false, wire).await?));
        }
        match args.transport {
            Transport::Sse => {
                let url = format!("{}/v1/stream?filter={}", args.url, urlencode(&filter.to_string()));
                Ok(Self::Sse(open_sse(http, &url, args.compressed, wire).await?))
            }
            Transport::Ws if args.compressed => {
                let mut device = deflate_ws::DeflateDevice::connect(&args.url, wire).await?;
                device.auth(key, json!({"device_id": format!("bench-{i}"), "filter": filter})).await?;
                Ok(Self::WsDeflate(Box::new(device)))
            }
            Transport::Ws => {
                let mut device = tidings_client::device::DeviceClient::connect(&tidings_client::device::ws_url(&args.url, None)).await?;
                device.auth(key, json!({"device_id": format!("bench-{i}"), "filter": filter})).await?;
                Ok(Self::Ws(Box::new(device)))
            }
        }
    }

    /// The publish stamp (`sent_us`) of the next event: in a tidings
    /// envelope's payload, or a generic server's body itself; `Some(None)`
    /// for an event without one, `None` once the stream ended.
    async fn next(&mut self) -> Option<Option<u64>> {
        match self {
            Self::Sse(reader) => loop {
                let event = reader.next_event().await?;
                if event.event.is_none() {
                    // Read without building the whole document: skipping
                    // the rest costs no allocation, so an envelope's size
                    // does not tax the load generator.
                    let stamp = serde_json::from_str::<Stamped>(&event.data).ok();
                    return Some(stamp.and_then(|s| s.sent_us.or(s.payload.and_then(|p| p.sent_us))));
                }
            },
            Self::Ws(device) => loop {
                // The same way: `stream.event` notifications only.
                if let Some(stamp) = event_stamp(&device.next_text().await.ok()?) {
                    return Some(stamp);
                }
            },
            Self::WsDeflate(device) => loop {
                if let Some(stamp) = event_stamp(&device.next_text().await.ok()?) {
                    return Some(stamp);
                }
            },
        }
    }
}

/// A WebSocket message's publish stamp if it is a `stream.event`
/// (`Some(None)` for one without a stamp).
fn event_stamp(text: &str) -> Option<Option<u64>> {
    let pushed = serde_json::from_str::<Pushed>(text).ok()?;
    (pushed.method.as_deref() == Some(tidings_protocol::ws::method::EVENT))
        .then(|| pushed.params.and_then(|p| p.event).and_then(|e| e.payload).and_then(|p| p.sent_us))
}

/// An SSE stream whose body bytes, as they arrive, are counted in `wire`;
/// with `compressed`, asked for gzip and inflated (a stream that does not
/// inflate ends).
async fn open_sse(
    http: &reqwest::Client,
    url: &str,
    compressed: bool,
    wire: &Arc<AtomicU64>,
) -> anyhow::Result<client::SseReader<client::BodyStream>> {
    use futures_util::StreamExt as _;
    use std::io::Write as _;
    let mut request = http.get(url).header("accept", "text/event-stream");
    if compressed {
        request = request.header("accept-encoding", "gzip");
    }
    let response = request.send().await?.error_for_status()?;
    let gzip = response.headers().get("content-encoding").is_some_and(|v| v == "gzip");
    anyhow::ensure!(gzip == compressed, "asked for gzip: {compressed}; sent gzip: {gzip}");
    let mut inflate = gzip.then(|| flate2::write::GzDecoder::new(Vec::new()));
    let wire = wire.clone();
    let body = response.bytes_stream().scan((), move |(), chunk| {
        let out = match chunk {
            Ok(chunk) => {
                wire.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                match inflate.as_mut() {
                    None => Some(Ok(chunk)),
                    Some(decoder) => match decoder.write_all(&chunk).and_then(|()| decoder.flush()) {
                        Ok(()) => Some(Ok(bytes::Bytes::from(std::mem::take(decoder.get_mut())))),
                        Err(_) => None,
                    },
                }
            }
            Err(e) => Some(Err(e)),
        };
        std::future::ready(out)
    });
    Ok(client::SseReader::new(Box::pin(body)))
}

/// The publish stamp of a delivered event, every other field skipped.
#[derive(serde::Deserialize)]
struct Stamped {
    sent_us: Option<u64>,
    payload: Option<Stamp>,
}

#[derive(serde::Deserialize)]
struct Stamp {
    sent_us: Option<u64>,
}

/// A WebSocket notification, down to the event's stamp.
#[derive(serde::Deserialize)]
struct Pushed {
    method: Option<String>,
    params: Option<PushedParams>,
}

#[derive(serde::Deserialize)]
struct PushedParams {
    event: Option<Stamped>,
}

/// What `tidings bench` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// N subscribers, R events/s, publish-to-receive latency.
    Deliver,
    /// Append throughput, closed loop.
    Publish,
    /// Tree-write throughput, closed loop: `--concurrency` writers each
    /// `PUT` one entity at a time, over 100 paths of their own.
    TreeWrite,
    /// One client resuming far behind.
    Replay,
    /// PostgreSQL: kill every LISTEN session of `--database-url`, publish
    /// `--events` on `--publish-url` at once, and time until the `--clients`
    /// subscribers of `--url` have them all.
    ListenLoss,
    /// `--clients` clients reconnect at the same moment with a Last-Event-ID
    /// 10 events back: connections accepted per second, time until all caught up.
    Storm,
    /// `--clients` idle SSE connections: the server's resident memory per
    /// connection (needs `--server-pid`).
    Idle,
    /// `--clients` long-pollers (durable consumers) while `--rate` events/s
    /// are published: delivery latency and poll round trips; then one
    /// consumer `--events` behind reads them all in pages of 1,000.
    Poll,
    /// `--peer-urls source,sink`: notifications per second from the
    /// source's courier to the sink's inbox over `--subscriptions`.
    PeerDelivery,
    /// `--peer-urls a,b,c`: B mirrors A, C mirrors B; write-to-apply delay
    /// at C for `--events` writes at `--rate`.
    MirrorDelay,
    /// `--peer-urls`: `--events` writes through a `--topology` of mirrors,
    /// optionally lossy (`--loss k`): settles per peer, time to converge.
    MirrorConverge,
    /// `--peer-urls source,relay,...` (servers started with a capacity per
    /// prefix) and `--peer-pids`: every relay mirrors the source, the tree
    /// that capacity redirects form, write-to-leaf delay for `--events` at
    /// `--rate`, then the time from killing a relay to full repair.
    Tree,
    /// `--clients` SSE subscribers on `--url` that, when it goes away,
    /// resume on `--peer-urls`: see [`super::scale`].
    Resume,
    /// PostgreSQL: `--concurrency` HTTP publishers, then as many sessions
    /// calling `tidings.publish` on `--database-url`: see [`super::sqlpublish`].
    SqlPublish,
}

/// Result of `idle`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IdleReport {
    /// Connections held.
    pub connections: usize,
    /// Server RSS before connecting, KiB.
    pub rss_before_kib: u64,
    /// Server RSS with every connection open, KiB.
    pub rss_after_kib: u64,
    /// (after - before) / connections, KiB.
    pub kib_per_connection: f64,
}

fn proc_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// `idle`: see [`Mode::Idle`].
pub async fn idle(args: &BenchArgs) -> anyhow::Result<IdleReport> {
    let pid = args.server_pid.ok_or_else(|| anyhow::anyhow!("--server-pid is required"))?;
    let before = proc_rss_kib(pid).ok_or_else(|| anyhow::anyhow!("cannot read the RSS of {pid}"))?;
    let http = http1(args, 0)?;
    let streams = StreamClients::new(args)?;
    let key = tidings_protocol::identity::ServerIdentity::from_key(ed25519_dalek::SigningKey::from_bytes(&rand::random()));
    let filter = json!({"types": [args.event_type]});
    let mut held = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        held.push(Subscriber::open(args, streams.for_stream(i), &key, i, &filter, &Arc::default()).await?);
    }
    if args.warm_events > 0 {
        let events: Vec<Value> = (0..args.warm_events).map(|_| json!({"event_type": args.event_type, "payload": {}})).collect();
        http.post(format!("{}/v1/events", args.url)).json(&json!({"events": events})).send().await?.error_for_status()?;
    }
    // Let the server settle (buffers allocated, heartbeat timers armed,
    // warm-up events written).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = proc_rss_kib(pid).ok_or_else(|| anyhow::anyhow!("cannot read the RSS of {pid}"))?;
    drop(held);
    Ok(IdleReport {
        connections: args.clients,
        rss_before_kib: before,
        rss_after_kib: after,
        kib_per_connection: after.saturating_sub(before) as f64 / args.clients as f64,
    })
}

/// The nearest-rank `p` quantile of `sorted` (ascending); `None` if empty.
pub(super) fn nearest_rank(sorted: &[f64], p: f64) -> Option<f64> {
    sorted.get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied()
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0
}

pub(super) async fn head(http: &reqwest::Client, url: &str) -> anyhow::Result<i64> {
    let v: Value = http.get(format!("{url}/health/deep")).send().await?.json().await?;
    v["head_event_id"].as_i64().ok_or_else(|| anyhow::anyhow!("no head_event_id in /health/deep"))
}

/// What one run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    /// Subscribers that connected.
    pub subscribers_ready: usize,
    /// Publishes answered 201.
    pub publishes_accepted: u64,
    /// Events received in total.
    pub delivered: u64,
    /// Deliveries owed: each subscriber's share of the accepted events.
    pub expected: u64,
    /// Subscribers that received every accepted event.
    pub subscribers_complete: usize,
    /// Latency percentiles, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 95th percentile, ms.
    pub p95_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Maximum, ms.
    pub max_ms: f64,
    /// Server CPU seconds during the run, when `--server-pid` was given.
    pub server_cpu_s: Option<f64>,
    /// Server peak RSS in KiB, when `--server-pid` was given.
    pub server_peak_rss_kib: Option<u64>,
    /// SSE: body bytes received while publishing (heartbeats included),
    /// per event delivered; compressed bytes with `--compressed`.
    pub wire_bytes_per_delivery: Option<f64>,
}

pub(super) fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn proc_peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// Runs one bench and returns its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<BenchReport> {
    let http = http1(&args, 256)?;
    let streams = StreamClients::new(&args)?;
    let received: Arc<Vec<AtomicU64>> = Arc::new((0..args.clients).map(|_| AtomicU64::new(0)).collect());
    let latencies = Arc::new(Mutex::new(Vec::<u64>::new()));
    let wire = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let done = tokio_util::sync::CancellationToken::new();
    let key = tidings_protocol::identity::ServerIdentity::from_key(ed25519_dalek::SigningKey::from_bytes(&rand::random()));
    for i in 0..args.clients {
        let shards = args.shards.max(1);
        let filter = if shards > 1 {
            json!({"types": [args.event_type], "payload": {"==": [{"var": "shard"}, i as u64 % shards]}})
        } else {
            json!({"types": [args.event_type]})
        };
        let mut subscriber = Subscriber::open(&args, streams.for_stream(i), &key, i, &filter, &wire).await?;
        let received = received.clone();
        let latencies = latencies.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut local = Vec::new();
            loop {
                let stamp = tokio::select! {
                    _ = done.cancelled() => break,
                    e = subscriber.next() => match e { Some(e) => e, None => break },
                };
                let now = now_us();
                if let Some(sent) = stamp {
                    local.push(now.saturating_sub(sent));
                    received[i].fetch_add(1, Ordering::Relaxed);
                }
                if local.len() >= 1024 {
                    latencies.lock().await.append(&mut local);
                }
            }
            latencies.lock().await.append(&mut local);
        }));
    }
    let cpu_before = args.server_pid.and_then(proc_cpu_seconds);
    let wire_before = wire.load(Ordering::Relaxed);

    let shards = args.shards.max(1);
    let per_shard =
        if args.rate > 0.0 { publish_at_rate(&args, &http, shards).await } else { await_publisher(&args, &http, shards).await? };
    let accepted: u64 = per_shard.iter().sum();
    let owed = |i: usize| per_shard[i % shards as usize];
    // Let the last deliveries land: wait until every subscriber has them, or 5 s.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && received.iter().enumerate().any(|(i, r)| r.load(Ordering::Relaxed) < owed(i)) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu_after = args.server_pid.and_then(proc_cpu_seconds);
    let wire_bytes = wire.load(Ordering::Relaxed) - wire_before;
    done.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let mut lat = std::mem::take(&mut *latencies.lock().await);
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return f64::NAN;
        }
        lat[((lat.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0
    };
    let delivered: u64 = received.iter().map(|r| r.load(Ordering::Relaxed)).sum();
    Ok(BenchReport {
        subscribers_ready: args.clients,
        publishes_accepted: accepted,
        delivered,
        expected: (0..args.clients).map(owed).sum(),
        subscribers_complete: received.iter().enumerate().filter(|(i, r)| r.load(Ordering::Relaxed) >= owed(*i)).count(),
        p50_ms: pct(0.50),
        p90_ms: pct(0.90),
        p95_ms: pct(0.95),
        p99_ms: pct(0.99),
        max_ms: pct(1.0),
        server_cpu_s: cpu_before.zip(cpu_after).map(|(a, b)| b - a),
        server_peak_rss_kib: args.server_pid.and_then(proc_peak_rss_kib),
        wire_bytes_per_delivery: ((args.transport == Transport::Sse || args.compressed) && delivered > 0)
            .then(|| wire_bytes as f64 / delivered as f64),
    })
}

/// `deliver`: publishes `--rate` events/s for `--duration`, open loop, and
/// returns the publishes accepted per shard.
async fn publish_at_rate(args: &BenchArgs, http: &reqwest::Client, shards: u64) -> Vec<u64> {
    let accepted: Arc<Vec<AtomicU64>> = Arc::new((0..shards).map(|_| AtomicU64::new(0)).collect());
    let total = (args.rate * args.duration.as_secs_f64()).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let start = tokio::time::Instant::now();
    let mut publishes = Vec::with_capacity(total as usize);
    for n in 0..total {
        tokio::time::sleep_until(start + interval.mul_f64(n as f64)).await;
        let http = http.clone();
        let generic = args.generic_publish.clone();
        let url = generic.clone().unwrap_or_else(|| format!("{}/v1/events", args.url));
        let accepted = accepted.clone();
        let event_type = args.event_type.clone();
        let lines = order_lines(n, args.payload_lines);
        publishes.push(tokio::spawn(async move {
            let shard = n % shards;
            let body = if generic.is_some() {
                json!({"sent_us": now_us(), "shard": shard})
            } else if lines.is_empty() {
                json!({"event_type": event_type, "payload": {"sent_us": now_us(), "weight": 1, "shard": shard}})
            } else {
                json!({"event_type": event_type, "payload": {"sent_us": now_us(), "weight": 1, "shard": shard, "lines": lines}})
            };
            if let Ok(r) = http.post(url).json(&body).send().await
                && r.status().is_success()
            {
                accepted[shard as usize].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for p in publishes {
        let _ = p.await;
    }
    accepted.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

/// `--payload-lines`: `count` order lines of event `n`, each different.
fn order_lines(n: u64, count: usize) -> Vec<Value> {
    (0..count as u64)
        .map(|k| {
            let item = (n * 7 + k * 13) % 997;
            json!({"sku": format!("SKU-{item:05}"), "name": format!("Widget model {item}"), "qty": 1 + (n + k) % 9, "price_cents": 199 + item * 37})
        })
        .collect()
}

/// `deliver` with `--rate 0`: the subscribers of this process are one part
/// of a run whose events another process publishes (`scripts/bench-scale`
/// with `PROCESSES`). Marks the run ready, then waits until the log's head
/// has advanced by `--events` (or `--duration` ran out); every event
/// appended meanwhile is owed to every subscriber.
async fn await_publisher(args: &BenchArgs, http: &reqwest::Client, shards: u64) -> anyhow::Result<Vec<u64>> {
    anyhow::ensure!(shards == 1, "--rate 0 takes no --shards");
    let start = head(http, &args.url).await?;
    mark_ready(args)?;
    let deadline = Instant::now() + args.duration;
    let mut now = start;
    while now - start < args.events as i64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        now = head(http, &args.url).await?;
    }
    Ok(vec![u64::try_from(now - start).unwrap_or(0)])
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
