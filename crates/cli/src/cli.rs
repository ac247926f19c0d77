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

/// Follows a stream: a thin user of [`tidings_client::Client::stream`],
/// which resumes after the last id it yielded.
pub async fn tail(tail: TailArgs) -> anyhow::Result<()> {
    use futures_util::StreamExt as _;
    use tidings_client::{Item, StreamQuery};
    let args = &tail.follow;
    let mut client = tidings_client::Client::new(&args.url);
    if let Some(token) = &args.token {
        // The token travels as a header, never in the URL (which proxies
        // log and errors quote).
        client = client.with_token(token.clone());
    }
    let query = StreamQuery {
        filter: args.filter.clone(),
        types: args.types.clone(),
        agents: args.agents.clone(),
        targets: args.targets.clone(),
        since: tail.since,
    };
    let mut printed = 0u64;
    // On a terminal, a spinner says what it waits for; to a pipe or a log,
    // a line per attempt does (a spinner draws nothing there).
    let terminal = std::io::stderr().is_terminal();
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_draw_target(if terminal { indicatif::ProgressDrawTarget::stderr() } else { indicatif::ProgressDrawTarget::hidden() });
    spinner.set_message(format!("connecting to {}", args.url));
    spinner.enable_steady_tick(Duration::from_millis(120));
    let mut stream = std::pin::pin!(client.stream(query));
    let mut last = tail.since;
    while let Some(item) = stream.next().await {
        match item.map_err(|e| {
            spinner.finish_and_clear();
            anyhow::anyhow!(e)
        })? {
            Item::Open => spinner.finish_and_clear(),
            Item::Event { id, envelope } => {
                last = Some(id);
                let mut out = std::io::stdout().lock();
                if args.json {
                    writeln!(out, "{envelope}")?;
                } else {
                    writeln!(out, "{}", summary(&envelope))?;
                }
                printed += 1;
                if args.count.is_some_and(|c| printed >= c) {
                    return Ok(());
                }
            }
            Item::Gap(data) => eprintln!("{}: {data}", tidings_protocol::event::names::SYSTEM_REPLAY_GAP),
            Item::Notice { name, data } => eprintln!("{name}: {data}"),
            Item::Ended { .. } => {
                eprintln!("stream ended; resuming after {}", last.map_or("the live head".to_owned(), |l| l.to_string()));
            }
            Item::Reconnecting { reason, wait } => {
                let line = format!("{reason}; retrying in {}", seconds(wait));
                if terminal {
                    spinner.enable_steady_tick(Duration::from_millis(120));
                    spinner.set_message(line);
                } else {
                    eprintln!("tidings tail: {line}");
                }
            }
        }
    }
    Ok(())
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
    let mut client = tidings_client::Client::new(&args.url);
    if let Some(token) = &args.token {
        client = client.with_token(token.clone());
    }
    let options = tidings_client::publish::PublishOptions { key: args.idempotency_key.clone(), retries: args.retries };
    let published = client
        .publish(&body, options, |failure| eprintln!("tidings publish: {failure}; retrying with the same Idempotency-Key"))
        .await
        .map_err(anyhow::Error::new)?;
    println!("{}", published.ids.first().map_or_else(|| "null".to_owned(), ToString::to_string));
    Ok(())
}

/// Validates a registry directory (the directory itself, never the built-in copy).
pub fn registry_check(dir: &std::path::Path) -> anyhow::Result<()> {
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let registry = Registry::load(dir, RegistryMode::Strict).with_context(|| format!("{} is not a valid registry", dir.display()))?;
    println!("{}: {} event types, all valid", dir.display(), registry.len());
    Ok(())
}

/// Follows the WebSocket transport as a device: a thin user of
/// [`tidings_client::listen::Listener`], which catches up from the stored
/// cursor, takes realtime events, hands out each seq once and acks what
/// was taken; a dropped connection is retried, a rejection is not.
pub async fn listen(args: ListenArgs) -> anyhow::Result<()> {
    use tidings_client::listen::{Heard, ListenOptions, Listener};
    let key = std::sync::Arc::new(tidings_server::keyfile::open(&args.key)?);
    let follow = &args.follow;
    let options = ListenOptions {
        url: follow.url.clone(),
        token: follow.token.clone(),
        device_id: args.device.clone(),
        filter: follow_filter(follow)?,
        since: args.since,
        page_size: 500,
    };
    let mut listener = Listener::new(key, options);
    let mut printed = 0u64;
    while let Some(heard) = listener.next().await {
        match heard? {
            Heard::Event { event, .. } => {
                let mut out = std::io::stdout().lock();
                if follow.json {
                    writeln!(out, "{event}")?;
                } else {
                    writeln!(out, "{}", summary(&event))?;
                }
                out.flush()?;
                printed += 1;
                if follow.count.is_some_and(|c| printed >= c) {
                    listener.finish().await;
                    return Ok(());
                }
            }
            Heard::Gap(gap) => eprintln!("replay gap: {gap}"),
            Heard::Notice(notice) => match notice.get("error") {
                Some(error) => eprintln!("ack refused: {error}"),
                None => eprintln!("{}: {}", notice["method"].as_str().unwrap_or("notice"), notice["params"]),
            },
            Heard::Reconnecting { reason, wait } => eprintln!("{reason}; reconnecting in {} ms", wait.as_millis()),
        }
    }
    Ok(())
}
