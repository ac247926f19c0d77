//! Benchmarks between running tidings servers (`--peer-urls`), talking to
//! each only over HTTP as an operator and a subscriber would (`tree` also
//! kills one relay, by the process id whoever started it gave):
//!
//! - `peer-delivery`: notifications per second from one server's courier to
//!   another's inbox, for `--subscriptions` subscriptions;
//! - `mirror-delay`: the delay from a write at A to its apply at C in a
//!   chain of mirrors A→B→C, at `--rate` writes per second;
//! - `mirror-converge`: `--events` writes at the first server of a
//!   `--topology` (chain, pair, ring) of mirrors, with `--loss` dropping
//!   every k-th delivery through a [lossy proxy](super::lossy): settles per
//!   peer and the time until every peer holds the latest bytes;
//! - `tree`: relays mirroring a source with a capacity per prefix: the tree
//!   the redirects form, write-to-leaf delay, and the repair after a relay
//!   is killed.
//!
//! Every run works under paths of its own (`bench-<random>/...`), so runs
//! can follow each other on the same servers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::bench::BenchArgs;
use tidings_protocol::identity::ServerIdentity;
use tidings_protocol::peer::protocol::{Execute, receive_token};

/// One server, as the benchmark reaches it.
#[derive(Debug, Clone)]
struct Node {
    url: String,
    hash: String,
    http: reqwest::Client,
}

impl Node {
    async fn open(http: &reqwest::Client, url: &str) -> anyhow::Result<Node> {
        let id: Value = http.get(format!("{url}/v1/identity")).send().await?.error_for_status()?.json().await?;
        let hash = id["hash"].as_str().ok_or_else(|| anyhow::anyhow!("{url}/v1/identity has no hash"))?.to_owned();
        Ok(Node { url: url.trim_end_matches('/').to_owned(), hash, http: http.clone() })
    }

    async fn knows(&self, hash: &str, endpoint: &str) -> anyhow::Result<()> {
        let peer = json!({"type": "system/peer", "data": {"endpoint": endpoint}});
        self.http.put(format!("{}/v1/tree/system/peer/{hash}", self.url)).json(&peer).send().await?.error_for_status()?;
        Ok(())
    }

    async fn put(&self, path: &str, data: Value) -> anyhow::Result<String> {
        let r = self.http.put(format!("{}/v1/tree/{path}", self.url)).json(&json!({"type": "note", "data": data})).send().await?;
        let body: Value = r.error_for_status()?.json().await?;
        Ok(body["hash"].as_str().unwrap_or_default().to_owned())
    }

    async fn entity_hash(&self, path: &str) -> anyhow::Result<Option<String>> {
        let r = self.http.get(format!("{}/v1/tree/{path}", self.url)).send().await?;
        if r.status() == 404 {
            return Ok(None);
        }
        Ok(Some(tidings_protocol::tree::hash_canonical(&r.error_for_status()?.text().await?)))
    }

    /// Events of `types` with `targets` after `since`, long-polling `wait_ms`.
    async fn poll(&self, types: &str, targets: &str, since: i64, wait_ms: u32) -> anyhow::Result<Vec<Value>> {
        let url = format!("{}/v1/poll?types={types}&targets={targets}&since={since}&limit=1000&wait_ms={wait_ms}", self.url);
        let r: Value = self.http.get(url).send().await?.error_for_status()?.json().await?;
        Ok(r["events"].as_array().cloned().unwrap_or_default())
    }

    async fn mirror(&self, name: &str, upstream: &Node, pattern: &str) -> anyhow::Result<()> {
        let mirror = json!({"type": "system/mirror", "data": {"peer": upstream.hash, "pattern": pattern}});
        self.http.put(format!("{}/v1/tree/system/mirror/{name}", self.url)).json(&mirror).send().await?.error_for_status()?;
        Ok(())
    }

    /// Waits until the mirror `name` holds its subscription.
    async fn subscribed(&self, name: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let deep: Value = self.http.get(format!("{}/health/deep", self.url)).send().await?.json().await?;
            let ok = deep["mirrors"].as_array().into_iter().flatten().any(|m| m["name"] == name && m["state"] == "subscribed");
            if ok {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "mirror {name} at {} did not subscribe: {deep}", self.url);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn nodes_arg(args: &BenchArgs, n: usize) -> anyhow::Result<Vec<String>> {
    let urls: Vec<String> = args.peer_urls.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_owned).collect();
    anyhow::ensure!(urls.len() >= n, "--peer-urls needs {n} comma-separated server URLs");
    Ok(urls)
}

fn run_tag() -> String {
    format!("bench-{:08x}", rand::random::<u32>())
}

/// Subscribes `key` on `source` to `pattern`, delivering to `inbox` at
/// `sink` (a token `sink`'s admin mints for `key`, delegated to `source`).
async fn subscribe_remote(key: &ServerIdentity, source: &Node, sink: &Node, pattern: &str, inbox: &str) -> anyhow::Result<()> {
    let mint = json!({"grantee": key.hash(), "grants": [{"handler": "system/inbox", "operations": ["receive"], "resources": [inbox]}]});
    let minted: Value =
        sink.http.post(format!("{}/v1/admin/capabilities", sink.url)).json(&mint).send().await?.error_for_status()?.json().await?;
    let mut included = minted["included"].as_object().cloned().unwrap_or_default();
    let root = minted["hash"].as_str().unwrap_or_default().to_owned();
    let leaf = receive_token(key, &source.hash, inbox, Some(&root), None, &mut included);
    let envelope = Execute::new("system/subscription", "subscribe", key.hash())
        .targets(json!([pattern]))
        .params(
            "system/subscription/request",
            json!({"deliver_to": {"uri": format!("entity://{}/{inbox}", sink.hash)}, "deliver_token": leaf}),
        )
        .signed(key, included);
    let r = source.http.post(format!("{}/v1/execute", source.url)).json(&envelope).send().await?;
    let status = r.status();
    anyhow::ensure!(status == 200, "subscribe at {}: {status} {}", source.url, r.text().await.unwrap_or_default());
    Ok(())
}

/// Result of `peer-delivery`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerDeliveryReport {
    /// Subscriptions the notifications were spread over.
    pub subscriptions: usize,
    /// Notifications delivered.
    pub notifications: usize,
    /// Writes per second at the source (`--concurrency` writers).
    pub writes_per_s: f64,
    /// From the first write until the sink held every notification.
    pub seconds: f64,
    /// `notifications / seconds`.
    pub notifications_per_s: f64,
}

/// `peer-delivery`: `--events` writes at the first server spread over
/// `--subscriptions` subscriptions delivering to the second's inbox.
pub async fn peer_delivery(args: &BenchArgs) -> anyhow::Result<PeerDeliveryReport> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let urls = nodes_arg(args, 2)?;
    let (source, sink) = (Node::open(&http, &urls[0]).await?, Node::open(&http, &urls[1]).await?);
    source.knows(&sink.hash, &sink.url).await?;
    let key = ServerIdentity::from_key(ed25519_dalek::SigningKey::from_bytes(&rand::random()));
    let (tag, k) = (run_tag(), args.subscriptions.max(1));
    let inbox = format!("system/inbox/{tag}");
    for s in 0..k {
        subscribe_remote(&key, &source, &sink, &format!("{tag}/{s}/*"), &inbox).await?;
    }
    let n = args.events as usize;
    let started = Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut writers = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (source, next, tag) = (source.clone(), next.clone(), tag.clone());
        writers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(());
                }
                source.put(&format!("{tag}/{}/x", i % k), json!({"i": i})).await?;
            }
        }));
    }
    for w in writers {
        w.await??;
    }
    let wrote = started.elapsed().as_secs_f64();
    let (mut got, mut since) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(300);
    while got < n {
        anyhow::ensure!(Instant::now() < deadline, "{got} of {n} notifications arrived");
        let events = sink.poll("subscription.notification", &inbox, since, 2_000).await?;
        got += events.len();
        since = events.last().and_then(|e| e["event_id"].as_i64()).unwrap_or(since);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(PeerDeliveryReport {
        subscriptions: k,
        notifications: n,
        writes_per_s: n as f64 / wrote,
        seconds,
        notifications_per_s: n as f64 / seconds,
    })
}

/// Result of `mirror-delay`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MirrorDelayReport {
    /// Writes at A.
    pub writes: usize,
    /// Writes seen applied at C.
    pub applied_at_c: usize,
    /// Write (its answer at A) to the apply at C reaching a stream there, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Worst, ms.
    pub max_ms: f64,
}

/// `mirror-delay`: B mirrors A, C mirrors B; `--events` writes at A at
/// `--rate` per second; the delay until each is applied at C.
pub async fn mirror_delay(args: &BenchArgs) -> anyhow::Result<MirrorDelayReport> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let urls = nodes_arg(args, 3)?;
    let (a, b, c) = (Node::open(&http, &urls[0]).await?, Node::open(&http, &urls[1]).await?, Node::open(&http, &urls[2]).await?);
    let tag = run_tag();
    for (up, down) in [(&a, &b), (&b, &c)] {
        down.knows(&up.hash, &up.url).await?;
        up.knows(&down.hash, &down.url).await?;
        down.mirror(&tag, up, &format!("{tag}/**")).await?;
        down.subscribed(&tag).await?;
    }
    let path = format!("{tag}/x");
    let stream_url = format!("{}/v1/stream?types=tree.created,tree.updated&targets=tree:{path}", c.url);
    let mut stream = tidings_client::sse::connect(&http, &stream_url, None).await?;
    let sent = std::sync::Arc::new(tokio::sync::Mutex::new(HashMap::<String, Instant>::new()));
    let n = args.events as usize;
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(1.0));
    let writer = {
        let (a, sent, path) = (a.clone(), sent.clone(), path.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            for i in 0..n {
                tick.tick().await;
                let hash = a.put(&path, json!({"i": i})).await?;
                sent.lock().await.insert(hash, Instant::now());
            }
            anyhow::Ok(())
        })
    };
    let mut delays = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs_f64(n as f64 / args.rate.max(1.0) + 60.0);
    while delays.len() < n && Instant::now() < deadline {
        let Ok(Some(event)) = tokio::time::timeout(Duration::from_secs(10), stream.next_event()).await else { break };
        if event.event.is_some() {
            continue;
        }
        let Ok(envelope) = serde_json::from_str::<Value>(&event.data) else { continue };
        let at = Instant::now();
        let Some(hash) = envelope["payload"]["hash"].as_str() else { continue };
        // The write's answer and the apply can race: wait for the answer.
        for _ in 0..100 {
            if let Some(t) = sent.lock().await.get(hash) {
                delays.push(at.saturating_duration_since(*t).as_secs_f64() * 1000.0);
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    writer.await??;
    delays.sort_by(f64::total_cmp);
    let pct = |p: f64| super::bench::nearest_rank(&delays, p).unwrap_or(f64::NAN);
    Ok(MirrorDelayReport { writes: n, applied_at_c: delays.len(), p50_ms: pct(0.5), p99_ms: pct(0.99), max_ms: pct(1.0) })
}

/// Result of `mirror-converge`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConvergeReport {
    /// `chain`, `pair` or `ring`.
    pub topology: String,
    /// Every k-th delivery dropped (0: none).
    pub loss_every: usize,
    /// External writes at the first server.
    pub writes: usize,
    /// `tree.*` changes settled on the path, per server.
    pub settles: Vec<usize>,
    /// From the first write until every server held the latest bytes.
    pub converge_ms: f64,
    /// Deliveries the proxies dropped.
    pub dropped: usize,
}

/// `mirror-converge`: see the module documentation.
pub async fn mirror_converge(args: &BenchArgs) -> anyhow::Result<ConvergeReport> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let links: &[(usize, usize)] = match args.topology.as_str() {
        "chain" => &[(0, 1), (1, 2)],
        "pair" => &[(0, 1), (1, 0)],
        "ring" => &[(0, 1), (1, 2), (2, 0)],
        other => anyhow::bail!("--topology is chain, pair or ring, not {other}"),
    };
    let count = if args.topology == "pair" { 2 } else { 3 };
    let urls = nodes_arg(args, count)?;
    let mut nodes = Vec::new();
    for url in &urls[..count] {
        nodes.push(Node::open(&http, url).await?);
    }
    let tag = run_tag();
    let mut proxies = Vec::new();
    for &(up, down) in links {
        let (u, d) = (&nodes[up], &nodes[down]);
        d.knows(&u.hash, &u.url).await?;
        let endpoint = if args.loss > 0 {
            let proxy = super::lossy::start(d.url.clone(), args.loss).await?;
            let base = proxy.base.clone();
            proxies.push(proxy);
            base
        } else {
            d.url.clone()
        };
        u.knows(&d.hash, &endpoint).await?;
        d.mirror(&format!("{tag}-from-{up}"), u, &format!("{tag}/**")).await?;
    }
    for &(up, down) in links {
        nodes[down].subscribed(&format!("{tag}-from-{up}")).await?;
    }
    let path = format!("{tag}/x");
    let n = args.events as usize;
    let started = Instant::now();
    let mut latest = String::new();
    for i in 0..n {
        latest = nodes[0].put(&path, json!({"i": i})).await?;
    }
    converge(&nodes.iter().collect::<Vec<_>>(), &path, &latest).await?;
    let converge_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut settles = Vec::new();
    for node in &nodes {
        let (mut total, mut since) = (0, 0);
        loop {
            let page = node.poll("tree.created,tree.updated,tree.deleted", &format!("tree:{path}"), since, 0).await?;
            total += page.len();
            match page.last().and_then(|e| e["event_id"].as_i64()) {
                Some(last) if page.len() == 1000 => since = last,
                _ => break,
            }
        }
        settles.push(total);
    }
    let dropped = proxies.iter().map(super::lossy::LossyProxy::dropped).sum();
    Ok(ConvergeReport { topology: args.topology.clone(), loss_every: args.loss, writes: n, settles, converge_ms, dropped })
}

/// Result of `tree`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TreeReport {
    /// Servers mirroring the source.
    pub relays: usize,
    /// Servers per level below the source (the first: its direct subscribers).
    pub per_level: Vec<usize>,
    /// Levels below the source.
    pub depth: usize,
    /// Writes at the source for the delay.
    pub writes: usize,
    /// Servers at the deepest level, where the delay is measured.
    pub leaves: usize,
    /// Write at the source to its change at a leaf, over every leaf.
    pub leaf_p50_ms: f64,
    /// 99th percentile of the same.
    pub leaf_p99_ms: f64,
    /// Changes seen at the leaves, of `writes × leaves`.
    pub leaf_changes: usize,
    /// The level of the relay killed, and how many it served.
    pub killed_level: usize,
    /// Servers attached to the relay killed.
    pub orphans: usize,
    /// From the SIGKILL until every orphan held a subscription elsewhere.
    pub reattach_ms: f64,
    /// From the SIGKILL until every surviving server held the source's
    /// latest bytes (writes go on until the orphans re-attached).
    pub repaired_ms: f64,
    /// Servers per level after the repair.
    pub per_level_after: Vec<usize>,
}

impl Node {
    /// The mirror `name`'s entry in `/health/deep`.
    async fn mirror_state(&self, name: &str) -> anyhow::Result<Value> {
        let deep: Value = self.http.get(format!("{}/health/deep", self.url)).send().await?.json().await?;
        Ok(deep["mirrors"].as_array().into_iter().flatten().find(|m| m["name"] == name).cloned().unwrap_or(Value::Null))
    }
}

/// Servers per level of `states` (a mirror's level is its hops plus one).
fn levels(states: &[Value]) -> Vec<usize> {
    let mut per_level = Vec::new();
    for s in states {
        let level = s["hops"].as_u64().unwrap_or(0) as usize;
        if per_level.len() <= level {
            per_level.resize(level + 1, 0);
        }
        per_level[level] += 1;
    }
    per_level
}

/// `tree`: see [`super::bench::Mode::Tree`].
pub async fn tree(args: &BenchArgs) -> anyhow::Result<TreeReport> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let urls = nodes_arg(args, 3)?;
    let pids: Vec<u32> = args.peer_pids.split(',').filter(|p| !p.is_empty()).map(str::parse).collect::<Result<_, _>>()?;
    anyhow::ensure!(pids.len() == urls.len(), "--peer-pids gives one process id per --peer-urls server");
    let mut nodes = Vec::new();
    for url in &urls {
        nodes.push(Node::open(&http, url).await?);
    }
    let (source, relays) = (nodes[0].clone(), nodes[1..].to_vec());
    let tag = run_tag();
    // One after the other, each attached before the next asks: the tree
    // capacity redirects make.
    for relay in &relays {
        relay.knows(&source.hash, &source.url).await?;
        relay.mirror(&tag, &source, &format!("{tag}/**")).await?;
        relay.subscribed(&tag).await?;
    }
    let mut states = Vec::new();
    for relay in &relays {
        states.push(relay.mirror_state(&tag).await?);
    }
    let per_level = levels(&states);
    let deepest = per_level.len() - 1;
    let leaves: Vec<&Node> =
        relays.iter().zip(&states).filter(|(_, s)| s["hops"].as_u64() == Some(deepest as u64)).map(|(r, _)| r).collect();

    // Write-to-leaf delay: a stream of the path's changes at every leaf.
    let path = format!("{tag}/x");
    let n = args.events as usize;
    let done = tokio_util::sync::CancellationToken::new();
    let mut watchers = Vec::new();
    for leaf in &leaves {
        let url = format!("{}/v1/stream?types=tree.created,tree.updated&targets=tree:{path}", leaf.url);
        let mut stream = tidings_client::sse::connect(&http, &url, None).await?;
        let done = done.clone();
        watchers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let event = tokio::select! {
                    _ = done.cancelled() => break,
                    event = stream.next_event() => event,
                };
                let Some(event) = event else { break };
                let at = Instant::now();
                if let Some(hash) =
                    serde_json::from_str::<Value>(&event.data).ok().and_then(|e| e["payload"]["hash"].as_str().map(str::to_owned))
                {
                    seen.push((hash, at));
                }
            }
            seen
        }));
    }
    let mut sent = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate.max(1.0)));
    let mut latest = String::new();
    for i in 0..n {
        tick.tick().await;
        let at = Instant::now();
        latest = source.put(&path, json!({"i": i})).await?;
        sent.insert(latest.clone(), at);
    }
    converge(&leaves, &path, &latest).await?;
    done.cancel();
    let mut delays = Vec::new();
    for watcher in watchers {
        for (hash, at) in watcher.await? {
            if let Some(t) = sent.get(&hash) {
                delays.push(at.saturating_duration_since(*t).as_secs_f64() * 1000.0);
            }
        }
    }
    delays.sort_by(f64::total_cmp);
    let pct = |p: f64| super::bench::nearest_rank(&delays, p).unwrap_or(f64::NAN);
    let (leaf_p50_ms, leaf_p99_ms) = (pct(0.5), pct(0.99));

    // Repair: the relay serving the most is killed while writes go on.
    let served = |r: &Node| states.iter().filter(|s| s["upstream"] == r.hash.as_str()).count();
    let victim = (0..relays.len()).max_by_key(|&i| (served(&relays[i]), std::cmp::Reverse(i))).unwrap_or(0);
    let orphans: Vec<&Node> =
        relays.iter().zip(&states).filter(|(_, s)| s["upstream"] == relays[victim].hash.as_str()).map(|(r, _)| r).collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (source, path, stop, rate) = (source.clone(), path.clone(), stop.clone(), args.rate.max(1.0));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            let mut i = 0;
            while !stop.is_cancelled() {
                tick.tick().await;
                source.put(&path, json!({"after": i})).await?;
                i += 1;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Instant::now();
    let status = tokio::process::Command::new("kill").args(["-KILL", &pids[victim + 1].to_string()]).status().await?;
    anyhow::ensure!(status.success(), "could not kill the relay");
    let deadline = killed + Duration::from_secs(300);
    for orphan in &orphans {
        loop {
            let s = orphan.mirror_state(&tag).await?;
            if s["state"] == "subscribed" && s["upstream"] != relays[victim].hash.as_str() && s["repairs"].as_u64() >= Some(1) {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "{} did not re-attach: {s}", orphan.url);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let reattach_ms = killed.elapsed().as_secs_f64() * 1000.0;
    stop.cancel();
    writer.await??;
    let latest = source.entity_hash(&path).await?.unwrap_or_default();
    let survivors: Vec<&Node> = relays.iter().enumerate().filter(|(i, _)| *i != victim).map(|(_, r)| r).collect();
    converge(&survivors, &path, &latest).await?;
    let repaired_ms = killed.elapsed().as_secs_f64() * 1000.0;
    let mut after = Vec::new();
    for s in &survivors {
        after.push(s.mirror_state(&tag).await?);
    }
    Ok(TreeReport {
        relays: relays.len(),
        depth: per_level.len(),
        per_level,
        writes: n,
        leaves: leaves.len(),
        leaf_p50_ms,
        leaf_p99_ms,
        leaf_changes: delays.len(),
        killed_level: states[victim]["hops"].as_u64().unwrap_or(0) as usize + 1,
        orphans: orphans.len(),
        reattach_ms,
        repaired_ms,
        per_level_after: levels(&after),
    })
}

/// Waits until every one of `nodes` holds `hash` at `path`.
async fn converge(nodes: &[&Node], path: &str, hash: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    for node in nodes {
        while node.entity_hash(path).await?.as_deref() != Some(hash) {
            anyhow::ensure!(Instant::now() < deadline, "{} did not converge", node.url);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}
