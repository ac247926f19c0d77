//! `tidings subscribe`: a path subscription (docs/ref-subscriptions.md)
//! from the terminal. It signs with a key file (created on first use),
//! subscribes at the source for notifications delivered to an inbox of its
//! own at whichever server accepts, following capacity redirects to relays
//! as a mirror does ([`tidings_outbound::follow_redirects`],
//! docs/ref-federation.md, "Relays"), then prints each notification as it
//! arrives there over SSE. It renews the subscription where it is held at
//! half the deliver token's lifetime, and when that server stops answering
//! it starts again at the source, which redirects it anew. Notifications
//! are best-effort across such a move (docs/ref-federation.md, "Repair"):
//! re-read the paths to reconcile.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use serde_json::{Map, Value, json};

use tidings_client::sse as client;
use tidings_outbound::Attached;
use tidings_protocol::identity::ServerIdentity;
use tidings_protocol::peer::Subscribed;
use tidings_protocol::peer::protocol::{Execute, PeerError, receive_token};
use tidings_protocol::retry::Backoff;

/// `tidings subscribe`.
#[derive(Debug, Clone, Args)]
pub struct SubscribeArgs {
    /// The path pattern (`feeds/**`).
    pub pattern: String,
    /// The server holding the entities (the source).
    #[arg(long, env = "TIDINGS_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The subscriber's Ed25519 key (PKCS#8 PEM), created on first use.
    #[arg(long, env = "TIDINGS_DEVICE_KEY", default_value = "tidings-device.key")]
    pub key: PathBuf,
    /// The inbox the notifications go to at the server that accepts
    /// (default `system/inbox/cli-<12 hex of the key's hash>`).
    #[arg(long)]
    pub inbox: Option<String>,
    /// Bundle each changed entity with its notification.
    #[arg(long)]
    pub include_payload: bool,
    /// Print each notification envelope as one JSON line.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many notifications (default: follow forever).
    #[arg(long)]
    pub count: Option<u64>,
    /// Lifetime of the deliver token; the subscription is renewed at half of it.
    #[arg(long, default_value = "1h", value_parser = tidings_server::config::duration)]
    pub token_ttl: Duration,
}

/// Time allowed for one request (not the stream).
const TIMEOUT: Duration = Duration::from_secs(10);
/// Failed reconnects to the server holding the subscription before
/// starting again at the source.
const RECONNECTS: u32 = 3;
/// A stream quiet this long (three default heartbeats) is checked: kept if
/// its server answers `GET /v1/identity`, else reconnected.
const IDLE: Duration = Duration::from_secs(45);

/// Runs `tidings subscribe` until `--count` notifications were printed.
pub async fn subscribe(args: SubscribeArgs) -> anyhow::Result<()> {
    let key = tidings_server::keyfile::open(&args.key)?;
    let api = reqwest::Client::builder().timeout(TIMEOUT).redirect(reqwest::redirect::Policy::none()).build()?;
    let stream = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let base = args.url.trim_end_matches('/').to_owned();
    let identity: Value = api.get(format!("{base}/v1/identity")).send().await?.error_for_status()?.json().await?;
    let source = identity["hash"].as_str().context("the server's /v1/identity has no hash")?.to_owned();
    let inbox = args.inbox.clone().unwrap_or_else(|| format!("system/inbox/cli-{}", &key.hash()["sha256:".len()..][..12]));
    let session = Session {
        args: &args,
        key: &key,
        api,
        inbox,
        endpoints: Mutex::new(HashMap::from([(source.clone(), base)])),
        heads: Mutex::default(),
    };
    let (mut from, mut printed, mut backoff) = (source.clone(), 0u64, Backoff::CLIENT.up_to(Duration::from_secs(30)));
    // Where the last stream stopped: renewed at the same server, it goes
    // on from there (nothing that arrived meanwhile is skipped).
    let mut resume: Option<(String, Option<i64>)> = None;
    loop {
        let attached = tidings_outbound::follow_redirects(&from, key.hash(), &[], &session).await;
        let (a, since) = match attached {
            Ok(a) => {
                let head = session.head(&a.upstream);
                let since = match resume.take() {
                    Some((at, Some(since))) if at == a.upstream => Some(since),
                    _ => head,
                };
                (a, since)
            }
            Err(why) => {
                let wait = backoff.next_delay();
                eprintln!("{why}; trying again at the source in {} ms", wait.as_millis());
                tokio::time::sleep(wait).await;
                from = source.clone();
                continue;
            }
        };
        backoff.reset();
        let endpoint = session.endpoint(&a.upstream).unwrap_or_default();
        eprintln!("subscribed at {} ({endpoint}) after {} redirect(s): subscription {}", a.upstream, a.hops, a.id);
        match session.follow(&stream, &a, &endpoint, since, &mut printed).await? {
            Followed::Done => return Ok(()),
            Followed::Renew(since) => {
                resume = Some((a.upstream.clone(), since));
                from = a.upstream;
            }
            Followed::Lost(why, since) => {
                eprintln!("{why}; starting again at the source");
                resume = Some((a.upstream, since));
                from = source.clone();
            }
        }
    }
}

/// How following one server's inbox ended.
enum Followed {
    /// `--count` reached.
    Done,
    /// Time to renew the subscription there; the last id printed.
    Renew(Option<i64>),
    /// The server stopped answering; the last id printed.
    Lost(String, Option<i64>),
}

struct Session<'a> {
    args: &'a SubscribeArgs,
    key: &'a ServerIdentity,
    api: reqwest::Client,
    inbox: String,
    /// Where each server met is, by identity hash (proven for relays).
    endpoints: Mutex<HashMap<String, String>>,
    /// The log heads read just before subscribing at each server.
    heads: Mutex<HashMap<String, i64>>,
}

impl Session<'_> {
    fn endpoint(&self, server: &str) -> Option<String> {
        self.endpoints.lock().ok()?.get(server).cloned()
    }

    /// The log head read just before subscribing at `server`: where its
    /// notifications start (older ones in the inbox are from earlier runs).
    fn head(&self, server: &str) -> Option<i64> {
        self.heads.lock().ok()?.remove(server)
    }
}

impl tidings_outbound::Subscriber for Session<'_> {
    async fn prove(&self, peer: &str, endpoint: &str) -> bool {
        let proven = tidings_outbound::proves(&self.api, peer, endpoint, TIMEOUT).await;
        if proven && let Ok(mut endpoints) = self.endpoints.lock() {
            endpoints.insert(peer.to_owned(), endpoint.to_owned());
        }
        proven
    }

    /// One signed subscribe at `at`, delivering to this session's inbox
    /// there with a deliver token granted to `at`.
    async fn subscribe_at(&self, at: &str) -> Subscribed {
        let Some(endpoint) = self.endpoint(at) else {
            return Subscribed::Failed(PeerError::Unknown(format!("{at} has no known endpoint")));
        };
        match self.api.get(format!("{endpoint}/health/deep")).send().await {
            Ok(r) => {
                if let Some(head) = r.json::<Value>().await.ok().and_then(|d| d["head_event_id"].as_i64())
                    && let Ok(mut heads) = self.heads.lock()
                {
                    heads.insert(at.to_owned(), head);
                }
            }
            Err(e) => return Subscribed::Failed(tidings_outbound::unreachable(e)),
        }
        let key = self.key;
        let mut included = Map::new();
        let expires_at = chrono::Utc::now().timestamp_millis() + self.args.token_ttl.as_millis() as i64;
        let token = receive_token(key, at, &self.inbox, None, Some(expires_at), &mut included);
        let envelope = Execute::new("system/subscription", "subscribe", key.hash()).targets(json!([self.args.pattern])).params(
            "system/subscription/request",
            json!({"deliver_to": {"uri": self.inbox}, "deliver_token": token, "include_payload": self.args.include_payload}),
        );
        let sent = self.api.post(format!("{endpoint}/v1/execute")).json(&envelope.signed(key, included)).send().await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => return Subscribed::Failed(tidings_outbound::unreachable(e)),
        };
        let status = response.status().as_u16();
        Subscribed::from_answer(status, &tidings_outbound::read_json(response).await)
    }
}

impl Session<'_> {
    /// Prints the inbox's notifications at `endpoint` after `since`,
    /// resuming with the last id after a dropped stream.
    async fn follow(
        &self,
        http: &reqwest::Client,
        attached: &Attached,
        endpoint: &str,
        mut since: Option<i64>,
        printed: &mut u64,
    ) -> anyhow::Result<Followed> {
        let renew_at = tokio::time::Instant::now() + (self.args.token_ttl / 2).max(Duration::from_secs(1));
        let url = format!("{endpoint}/v1/stream?types=subscription.notification&targets={}", self.inbox);
        let mut failures = 0;
        loop {
            let connected = tokio::select! {
                _ = tokio::time::sleep_until(renew_at) => return Ok(Followed::Renew(since)),
                c = client::connect(http, &url, since) => c,
            };
            let mut reader = match connected {
                Ok(r) => r,
                Err(e) => {
                    failures += 1;
                    if failures >= RECONNECTS {
                        return Ok(Followed::Lost(format!("{} does not answer: {e}", attached.upstream), since));
                    }
                    tokio::time::sleep(Duration::from_millis(250 << failures)).await;
                    continue;
                }
            };
            loop {
                let next = tokio::select! {
                    _ = tokio::time::sleep_until(renew_at) => return Ok(Followed::Renew(since)),
                    next = tokio::time::timeout(IDLE, reader.next_event()) => next,
                };
                let event = match next {
                    Ok(Some(event)) => event,
                    Ok(None) => break,
                    // Quiet: a stream that carries nothing for a while is
                    // kept if its server still answers.
                    Err(_) if tidings_outbound::proves(&self.api, &attached.upstream, endpoint, TIMEOUT).await => continue,
                    Err(_) => break,
                };
                failures = 0;
                if event.event.is_some() {
                    continue;
                }
                let Ok(envelope) = serde_json::from_str::<Value>(&event.data) else { continue };
                if let Some(id) = envelope["event_id"].as_i64() {
                    since = Some(id);
                }
                let data = &envelope["payload"]["data"];
                if self.args.json {
                    println!("{envelope}");
                } else {
                    println!(
                        "#{:<8} {:<8} {} {}",
                        envelope["event_id"],
                        data["event"].as_str().unwrap_or("?"),
                        data["uri"].as_str().unwrap_or("?"),
                        data["hash"].as_str().unwrap_or("")
                    );
                }
                *printed += 1;
                if self.args.count.is_some_and(|c| *printed >= c) {
                    return Ok(Followed::Done);
                }
            }
            // The stream ended (or went silent with its server): again
            // after a pause, and elsewhere after a few in a row.
            failures += 1;
            if failures >= RECONNECTS {
                return Ok(Followed::Lost(format!("{} keeps ending the stream", attached.upstream), since));
            }
            tokio::time::sleep(Duration::from_millis(250 << failures)).await;
        }
    }
}
