//! The command-line clients: `tidings tail` follows a stream in the terminal
//! and resumes with its last id after any disconnect; `tidings listen` does
//! the same over the WebSocket transport as a device with a key and a
//! server-side cursor; `tidings publish` sends one event; `tidings registry
//! check` validates a registry directory.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use tidings_client::sse::{self as client, SseEvent};
use tidings_protocol::retry::Backoff;
use tidings_server::registry::{Registry, RegistryMode};

/// What `tail` and `listen` follow, and how they print it.
#[derive(Debug, Clone, Args)]
pub struct FollowArgs {
    /// Server base URL.
    #[arg(long, env = "TIDINGS_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Filter as JSON (`{"types":[...],"payload":{...}}`).
    #[arg(long, conflicts_with = "types")]
    pub filter: Option<String>,
    /// Comma list of type globs.
    #[arg(long)]
    pub types: Option<String>,
    /// Comma list of agent ids (events caused by one of them).
    #[arg(long, conflicts_with = "filter")]
    pub agents: Option<String>,
    /// Comma list of target globs (events whose `ref` matches one).
    #[arg(long, conflicts_with = "filter")]
    pub targets: Option<String>,
    /// Print each envelope as one JSON line instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Bearer token.
    #[arg(long, env = "TIDINGS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Stop after this many events (default: follow forever).
    #[arg(long)]
    pub count: Option<u64>,
}

/// `tidings tail`.
#[derive(Debug, Clone, Args)]
pub struct TailArgs {
    /// What to follow.
    #[command(flatten)]
    pub follow: FollowArgs,
    /// Start after this event id (default: live only).
    #[arg(long)]
    pub since: Option<i64>,
}

/// `tidings listen`.
#[derive(Debug, Clone, Args)]
pub struct ListenArgs {
    /// What to follow.
    #[command(flatten)]
    pub follow: FollowArgs,
    /// The device's Ed25519 key (PKCS#8 PEM), created on first use.
    #[arg(long, env = "TIDINGS_DEVICE_KEY", default_value = "tidings-device.key")]
    pub key: PathBuf,
    /// The device id: the server keeps one cursor per (key, device).
    #[arg(long, default_value = "cli")]
    pub device: String,
    /// Catch up from this seq for this run only; the stored cursor is not
    /// set to it (acks still move it forward).
    #[arg(long)]
    pub since: Option<i64>,
}

/// `tidings publish`.
#[derive(Debug, Clone, Args)]
pub struct PublishArgs {
    /// The event type.
    pub event_type: String,
    /// Payload JSON object.
    #[arg(long, default_value = "{}")]
    pub payload: String,
    /// The reference the event is about.
    #[arg(long = "ref")]
    pub reference: Option<String>,
    /// Agent id.
    #[arg(long)]
    pub agent: Option<String>,
    /// Server base URL.
    #[arg(long, env = "TIDINGS_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Bearer token.
    #[arg(long, env = "TIDINGS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The publish's Idempotency-Key (default: a new random one). Its
    /// retries carry it, so a retry after a lost answer stores nothing twice.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Retries after a `503` or a lost connection, with backoff (never
    /// after a refusal).
    #[arg(long, default_value_t = 5)]
    pub retries: u32,
}

/// `tidings registry ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum RegistryCommand {
    /// Validate a registry directory: names, schemas, aliases.
    Check {
        /// The directory.
        #[arg(long, env = "TIDINGS_REGISTRY", default_value = "./registry")]
        registry: PathBuf,
    },
}

fn summary(e: &Value) -> String {
    let mut line = format!("#{:<8} {}", e["event_id"], e["event_type"].as_str().unwrap_or("?"));
    if let Some(r) = e["ref"].as_str() {
        line.push_str(&format!("  ref={r}"));
    }
    if let Some(a) = e["agent"]["id"].as_str() {
        line.push_str(&format!("  agent={a}"));
    }
    if e["payload"].as_object().is_some_and(|p| !p.is_empty()) {
        line.push_str(&format!("  {}", e["payload"]));
    }
    line
}

/// Follows a stream, reconnecting with the last id it printed.
pub async fn tail(tail: TailArgs) -> anyhow::Result<()> {
    let args = &tail.follow;
    let http = reqwest::Client::new();
    let mut query = vec![];
    for (name, value) in [("filter", &args.filter), ("types", &args.types), ("agents", &args.agents), ("targets", &args.targets)] {
        if let Some(value) = value {
            query.push((name, value.clone()));
        }
    }
    let mut url = reqwest::Url::parse(&format!("{}/v1/stream", args.url.trim_end_matches('/'))).context("--url")?;
    url.query_pairs_mut().extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
    let mut last = tail.since;
    let mut printed = 0u64;
    // As before the one backoff: 500 ms doubling to 10 s.
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    // On a terminal, a spinner says what it waits for; to a pipe or a log,
    // a line per attempt does (a spinner draws nothing there).
    let terminal = std::io::stderr().is_terminal();
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_draw_target(if terminal { indicatif::ProgressDrawTarget::stderr() } else { indicatif::ProgressDrawTarget::hidden() });
    loop {
        spinner.set_message(format!("connecting to {}", args.url));
        spinner.enable_steady_tick(Duration::from_millis(120));
        // The token travels as a header, never in the URL (which proxies
        // log and errors quote).
        let mut reader = match client::open(&http, url.as_str(), last, args.token.as_deref()).await {
            Ok(reader) => reader,
            Err(e) if e.is_final() => {
                spinner.finish_and_clear();
                anyhow::bail!("the server refused the stream: {e}");
            }
            Err(e) => {
                let wait = backoff.next_delay();
                let line = format!("{e}; retrying in {}", seconds(wait));
                if terminal {
                    spinner.set_message(line);
                } else {
                    eprintln!("tidings tail: {line}");
                }
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        spinner.finish_and_clear();
        backoff.reset();
        while let Some(SseEvent { id, event, data }) = reader.next_event().await {
            match event.as_deref() {
                None => {
                    if let Some(id) = id.as_deref().and_then(|i| i.parse().ok()) {
                        last = Some(id);
                    }
                    let mut out = std::io::stdout().lock();
                    if args.json {
                        writeln!(out, "{data}")?;
                    } else {
                        let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                        writeln!(out, "{}", summary(&v))?;
                    }
                    printed += 1;
                    if args.count.is_some_and(|c| printed >= c) {
                        return Ok(());
                    }
                }
                Some(name) => eprintln!("{name}: {data}"),
            }
        }
        // The stream ended (server restart, slow-client drop): resume after the last id.
        eprintln!("stream ended; resuming after {}", last.map_or("the live head".to_owned(), |l| l.to_string()));
        let wait = reader.parser().retry_ms.map_or(backoff.peek(), Duration::from_millis).min(Duration::from_secs(10));
        tokio::time::sleep(wait).await;
    }
}

/// A delay as a person reads it: `0.5 s`, `10 s`.
fn seconds(wait: Duration) -> String {
    let s = wait.as_secs_f64();
    if s < 10.0 { format!("{s:.1} s") } else { format!("{s:.0} s") }
}

/// The filter `listen` sends: `--filter`, or one built from the lists.
fn follow_filter(follow: &FollowArgs) -> anyhow::Result<Option<Value>> {
    if let Some(f) = &follow.filter {
        return Ok(Some(serde_json::from_str::<Value>(f).context("--filter is not valid JSON")?));
    }
    let list = |s: &String| s.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect::<Vec<_>>();
    let mut filter = serde_json::Map::new();
    for (name, value) in [("types", &follow.types), ("agents", &follow.agents), ("targets", &follow.targets)] {
        if let Some(value) = value {
            filter.insert(name.to_owned(), json!(list(value)));
        }
    }
    Ok((!filter.is_empty()).then_some(Value::Object(filter)))
}

/// Publishes one event and prints its id.
pub async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let payload: Value = serde_json::from_str(&args.payload).context("--payload is not valid JSON")?;
    let mut body = json!({"event_type": args.event_type, "payload": payload});
    if let Some(r) = args.reference {
        body["ref"] = json!(r);
    }
    if let Some(a) = args.agent {
        body["agent"] = json!({"id": a});
    }
    let key = args.idempotency_key.clone().unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let url = format!("{}/v1/events", args.url.trim_end_matches('/'));
    let mut backoff = Backoff::CLIENT;
    let mut attempt = 0;
    loop {
        let mut request = http.post(&url).header("idempotency-key", &key).json(&body);
        if let Some(t) = &args.token {
            request = request.bearer_auth(t);
        }
        // A lost connection or a 503 may have committed or not: the retry
        // carries the same key, so it is stored once either way.
        let failure = match request.send().await {
            Ok(response) if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                let after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                if let Some(seconds) = after {
                    backoff.at_least(Duration::from_secs(seconds.min(30)));
                }
                format!("503: {}", response.text().await.unwrap_or_default())
            }
            Ok(response) => {
                let status = response.status();
                let answer: Value = response.json().await.unwrap_or(Value::Null);
                if !status.is_success() {
                    anyhow::bail!(
                        "{status}: {} ({})",
                        answer["error"].as_str().unwrap_or("error"),
                        answer["message"].as_str().unwrap_or("")
                    );
                }
                println!("{}", answer["event_ids"][0]);
                return Ok(());
            }
            Err(e) => format!("{e}"),
        };
        if attempt >= args.retries {
            anyhow::bail!("publishing failed after {} attempts: {failure}", attempt + 1);
        }
        attempt += 1;
        eprintln!("tidings publish: {failure}; retrying with the same Idempotency-Key");
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Validates a registry directory (the directory itself, never the built-in copy).
pub fn registry_check(dir: &std::path::Path) -> anyhow::Result<()> {
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let registry = Registry::load(dir, RegistryMode::Strict).with_context(|| format!("{} is not a valid registry", dir.display()))?;
    println!("{}: {} event types, all valid", dir.display(), registry.len());
    Ok(())
}

/// Why a `listen` connection ended.
enum Ended {
    /// Printed `--count` events.
    Done,
    /// Dropped: reconnect with backoff, carrying the cursor.
    Retry(String),
}

/// Follows the WebSocket transport as a device: catches up from its cursor
/// with `sync.delta`, then takes realtime events; prints each seq once (a
/// high-water mark drops what a reconnect sends again) and acks what it
/// printed. A dropped connection is retried with backoff and jitter; a
/// rejection (bad key, bad token, bad filter, a protocol error) is not,
/// since the same request would be rejected again.
pub async fn listen(args: ListenArgs) -> anyhow::Result<()> {
    let key = tidings_server::keyfile::open(&args.key)?;
    let follow = &args.follow;
    let filter = follow_filter(follow)?;
    let url = tidings_client::device::ws_url(&follow.url, None);
    let mut state = Listening { printed: 0, high_water: None, since: args.since };
    let mut backoff = Backoff::CLIENT;
    loop {
        let reason = match state.connect(&args, &key, &url, filter.as_ref()).await {
            Ok(Ended::Done) => return Ok(()),
            Ok(Ended::Retry(reason)) => reason,
            Err(e) => return Err(e),
        };
        if state.printed > 0 {
            backoff.reset();
        }
        // Jittered: reconnecting devices spread out after a restart.
        let wait = backoff.next_delay();
        eprintln!("{reason}; reconnecting in {} ms", wait.as_millis());
        tokio::time::sleep(wait).await;
    }
}

/// `stream.auth`'s body. What was printed goes along as the cursor: a
/// device whose acks never landed has no stored cursor, and would otherwise
/// start at the head, past what was published while it was away (a stored
/// cursor still wins).
fn auth_body(device: &str, filter: Option<&Value>, high_water: Option<i64>) -> Value {
    let mut body = json!({"device_id": device});
    if let Some(hw) = high_water {
        body["cursor"] = json!(hw);
    }
    if let Some(f) = filter {
        body["filter"] = f.clone();
    }
    body
}

struct Listening {
    printed: u64,
    /// The highest seq printed.
    high_water: Option<i64>,
    /// `--since`, for the first connection only.
    since: Option<i64>,
}

impl Listening {
    async fn connect(
        &mut self,
        args: &ListenArgs,
        key: &tidings_protocol::identity::ServerIdentity,
        url: &str,
        filter: Option<&Value>,
    ) -> anyhow::Result<Ended> {
        use tidings_client::device::{DeviceClient, DeviceClientError as E, Pushed};
        // Transport failures and the server's "going away / try later"
        // closes are retried; anything else is a rejection.
        let retry = |e: E| -> anyhow::Result<Ended> {
            match e {
                E::Transport(_) => Ok(Ended::Retry(e.to_string())),
                E::Closed { code, .. } if tidings_protocol::ws::close::reconnects(code) => Ok(Ended::Retry(e.to_string())),
                e => Err(anyhow::anyhow!("the server rejected this device: {e}")),
            }
        };
        let mut client = match DeviceClient::connect_as(url, args.follow.token.as_deref()).await {
            Ok(c) => c,
            Err(E::Transport(tokio_tungstenite::tungstenite::Error::Http(response))) => {
                // The server's stable code and message, when it gave them.
                let answer: Value = response.body().as_deref().and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default();
                // Bounded, and no control character reaches the terminal.
                let text =
                    |field: &str| answer[field].as_str().unwrap_or("").chars().take(500).flat_map(char::escape_default).collect::<String>();
                anyhow::bail!("the server refused the upgrade: {}: {} ({})", response.status().as_u16(), text("error"), text("message"))
            }
            Err(e) => return retry(e),
        };
        let answer = match client.auth(key, auth_body(&args.device, filter, self.high_water)).await {
            Ok(a) => a,
            // An error frame is a rejection even though a close follows.
            Err(e @ E::Refused { .. }) => anyhow::bail!("the server rejected this device: {e}"),
            Err(e) => return retry(e),
        };
        let head = answer["head_seq"].as_i64().unwrap_or(0);
        let cursor = answer["cursor"].as_i64().unwrap_or(0);
        // Catch up from the stored cursor (or this run's --since), not from
        // what was printed: an ack that did not land is re-sent and dropped
        // by the high-water mark.
        let mut since = self.since.take().unwrap_or(cursor);
        // Realtime starts once a page reaches the head: page whenever the
        // device's cursor is behind it.
        if since < head || cursor < head {
            loop {
                let page = match client
                    .call(tidings_protocol::ws::method::DELTA, json!({"device_id": args.device, "since": since, "limit": 500}))
                    .await
                {
                    Ok(p) => p,
                    Err(e @ E::Refused { .. }) => anyhow::bail!("the server rejected catch-up: {e}"),
                    Err(e) => return retry(e),
                };
                if let Some(gap) = page.get("gap") {
                    eprintln!("replay gap: {gap}");
                }
                for item in page["items"].as_array().into_iter().flatten() {
                    if let Some(seq) = item["seq"].as_i64()
                        && self.print(args, seq, &item["event"])?
                    {
                        let _ = client.ack(key, seq).await;
                        return Ok(Ended::Done);
                    }
                }
                if let Some(hw) = self.high_water
                    && let Err(e) = client.ack(key, hw).await
                {
                    return retry(e);
                }
                since = page["next_since"].as_i64().unwrap_or(since);
                if !page["has_more"].as_bool().unwrap_or(false) && since >= head {
                    break;
                }
            }
        }
        loop {
            match client.next().await {
                Ok(Pushed::Event { seq, event }) => {
                    let done = self.print(args, seq, &event)?;
                    if let Err(e) = client.ack(key, seq).await {
                        return retry(e);
                    }
                    if done {
                        return Ok(Ended::Done);
                    }
                }
                Ok(Pushed::Answer(answer)) => {
                    if let Some(error) = answer.get("error") {
                        eprintln!("ack refused: {error}");
                    }
                }
                Ok(Pushed::Notice(notice)) => eprintln!("{}: {}", notice["method"].as_str().unwrap_or("notice"), notice["params"]),
                Err(e) => return retry(e),
            }
        }
    }

    /// Prints the event unless it is at or below the high-water mark;
    /// `true` once `--count` events are printed.
    fn print(&mut self, args: &ListenArgs, seq: i64, event: &Value) -> anyhow::Result<bool> {
        let args = &args.follow;
        if self.high_water.is_some_and(|hw| seq <= hw) {
            return Ok(false);
        }
        self.high_water = Some(seq);
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{event}")?;
        } else {
            writeln!(out, "{}", summary(event))?;
        }
        out.flush()?;
        self.printed += 1;
        Ok(args.count.is_some_and(|c| self.printed >= c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconnect_carries_what_was_printed_as_the_cursor() {
        let filter = json!({"types": ["a.*"]});
        assert_eq!(auth_body("d", None, None), json!({"device_id": "d"}), "a first connection starts where the server says");
        assert_eq!(auth_body("d", Some(&filter), Some(41)), json!({"device_id": "d", "cursor": 41, "filter": filter}));
    }
}
