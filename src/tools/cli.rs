//! The command-line clients: `tidings tail` follows a stream in the terminal
//! and resumes with its last id after any disconnect; `tidings publish`
//! sends one event; `tidings registry check` validates a registry directory.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{self, SseEvent};
use crate::registry::{Registry, RegistryMode};

/// `tidings tail`.
#[derive(Debug, Clone, Args)]
pub struct TailArgs {
    /// Server base URL.
    #[arg(long, env = "TIDINGS_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Filter as JSON (`{"types":[...],"payload":{...}}`).
    #[arg(long, conflicts_with = "types")]
    pub filter: Option<String>,
    /// Comma list of type globs.
    #[arg(long)]
    pub types: Option<String>,
    /// Start after this event id (default: live only).
    #[arg(long)]
    pub since: Option<i64>,
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
pub async fn tail(args: TailArgs) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let mut query = vec![];
    if let Some(f) = &args.filter {
        query.push(("filter", f.clone()));
    }
    if let Some(t) = &args.types {
        query.push(("types", t.clone()));
    }
    if let Some(t) = &args.token {
        query.push(("access_token", t.clone()));
    }
    let mut url = reqwest::Url::parse(&format!("{}/v1/stream", args.url.trim_end_matches('/'))).context("--url")?;
    url.query_pairs_mut().extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
    let mut last = args.since;
    let mut printed = 0u64;
    let mut backoff = Duration::from_millis(500);
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    loop {
        spinner.set_message(format!("connecting to {}", args.url));
        spinner.enable_steady_tick(Duration::from_millis(120));
        let mut reader = match client::connect(&http, url.as_str(), last).await {
            Ok(reader) => reader,
            Err(e) => {
                if e.status().is_some_and(|s| s.is_client_error()) {
                    spinner.finish_and_clear();
                    anyhow::bail!("the server refused the stream: {e}");
                }
                spinner.set_message(format!("{e}; retrying in {backoff:?}"));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        spinner.finish_and_clear();
        backoff = Duration::from_millis(500);
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
        let wait = reader.parser().retry_ms.map_or(backoff, Duration::from_millis).min(Duration::from_secs(10));
        tokio::time::sleep(wait).await;
    }
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
    let mut request = reqwest::Client::new().post(format!("{}/v1/events", args.url.trim_end_matches('/'))).json(&body);
    if let Some(t) = &args.token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.context("sending the event")?;
    let status = response.status();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        anyhow::bail!("{status}: {} ({})", answer["error"].as_str().unwrap_or("error"), answer["message"].as_str().unwrap_or(""));
    }
    println!("{}", answer["event_ids"][0]);
    Ok(())
}

/// Validates a registry directory (the directory itself, never the built-in copy).
pub fn registry_check(dir: &std::path::Path) -> anyhow::Result<()> {
    anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
    let registry = Registry::load(dir, RegistryMode::Strict).with_context(|| format!("{} is not a valid registry", dir.display()))?;
    println!("{}: {} event types, all valid", dir.display(), registry.len());
    Ok(())
}
