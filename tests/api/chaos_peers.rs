//! The fault campaign's peer (`chaos`, docs/guarantees.md): a server the
//! campaign's processes deliver path-subscription notifications to, a
//! writer of the tree they watch, and the check of what its inbox holds.
//!
//! The receiver is not faulted (the faults are the sender's: its processes,
//! its database, its promotion); a reader of its inbox
//! ([`readers::inbox`]) records each notification by the sender's log id,
//! and the checker holds the inbox to the sender's final log as it holds
//! every other client: nothing skipped, repeated or reordered, and what the
//! sender lost announced (`subscription.history_lost`) before anything
//! after it.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::checker::{self, Seen, Verdict};
use crate::helpers::Backend;
use crate::helpers::federation::Peer;
use crate::helpers::federation::{Server, subscribe_third_party_at};
use crate::readers;

/// The inbox the campaign's notifications go to.
const INBOX: &str = "system/inbox/chaos";

/// The receiving server, its subscription on the campaign's processes,
/// and the reader of its inbox.
pub(crate) struct Receiver {
    server: Server,
    subscription: String,
    /// The hash of the last write, once known: the reader reads to it.
    until: Arc<std::sync::Mutex<Option<String>>>,
    reader: tokio::task::JoinHandle<Vec<Seen>>,
}

impl Receiver {
    /// Starts the receiver, tells the sender (the campaign's processes, one
    /// database and one key) where it is, subscribes to `feeds/*` there for
    /// its inbox (third-party delivery), and starts reading the inbox.
    pub(crate) async fn start(http: &reqwest::Client, sender: &str) -> Self {
        let server = Server::start(Backend::Embedded).await;
        let id: Value = http.get(format!("{sender}/v1/identity")).send().await.unwrap().json().await.unwrap();
        let hash = id["hash"].as_str().expect("the sender's identity").to_owned();
        let peer = json!({"type": "system/peer", "data": {"endpoint": server.base()}});
        let r = http.put(format!("{sender}/v1/tree/system/peer/{}", server.hash)).json(&peer).send().await.unwrap();
        assert!(r.status().is_success(), "the sender learns where the receiver is: {}", r.status());
        let (status, body) = subscribe_third_party_at(&Peer::new(), (http, sender, &hash), &server, "feeds/*", INBOX).await;
        assert_eq!(status, 200, "{body}");
        let subscription = body["result"]["subscription_id"].as_str().unwrap().to_owned();
        let until = Arc::new(std::sync::Mutex::new(None));
        let reader = readers::inbox(server.base().to_owned(), INBOX.to_owned(), until.clone());
        Receiver { server, subscription, until, reader }
    }

    /// Once the last write is known: what the inbox reader saw, read to it
    /// (within 90 s: the courier's backoff may have grown under the faults).
    /// On a timeout, what each sender process says of its peers and lanes
    /// (`/health/deep`) is in the panic.
    pub(crate) async fn read_to(self, last: String, http: &reqwest::Client, senders: &[String]) -> Checked {
        *self.until.lock().unwrap() = Some(last);
        let seen = match tokio::time::timeout(Duration::from_secs(90), self.reader).await {
            Ok(seen) => seen.unwrap(),
            Err(_) => {
                let mut said = Vec::new();
                for base in senders {
                    let deep = http.get(format!("{base}/health/deep")).send().await.map(|r| r.json::<Value>());
                    let deep = match deep {
                        Ok(body) => body.await.map(|d| d.to_string()).unwrap_or_else(|e| e.to_string()),
                        Err(e) => e.to_string(),
                    };
                    said.push(format!("{base}: {deep}"));
                }
                let held = self.server.inbox(INBOX, 0, 0).await.len();
                panic!("the inbox reader did not read to the last write within 90 s (the inbox holds {held}); the senders say {said:#?}")
            }
        };
        Checked { subscription: self.subscription, seen, _server: self.server }
    }
}

/// What the inbox reader saw, to be checked against the sender's final log.
pub(crate) struct Checked {
    subscription: String,
    seen: Vec<Seen>,
    _server: Server,
}

impl Checked {
    /// The checker's verdict on the inbox against the sender's final `log`.
    pub(crate) fn check(&self, log: &[(i64, Value)]) -> Result<Verdict, String> {
        let notifications = readers::notifications_of(log, &self.subscription);
        if notifications.is_empty() {
            return Err("the sender's final log holds no notification of the campaign's subscription".into());
        }
        checker::check(&notifications, &[("inbox".to_owned(), self.seen.clone())])
    }
}

/// One create-only write of `{"n": n}` at `feeds/<name>` to the servers in
/// turn until one answers: `201`, or `409` when an earlier attempt did land
/// (a `503` or no answer is retried). The entity's hash, or `None` when the
/// run ended with the write unanswered.
async fn write(http: &reqwest::Client, bases: &[String], name: &str, n: u64, stop: &AtomicBool) -> Option<String> {
    for attempt in 0u64.. {
        let base = &bases[((n + attempt) % bases.len() as u64) as usize];
        let sent = http
            .put(format!("{base}/v1/tree/feeds/{name}"))
            .header("If-None-Match", "*")
            .json(&json!({"type": "note", "data": {"n": n, "name": name}}))
            .send()
            .await;
        match sent {
            Ok(r) if r.status() == 201 => return r.json::<Value>().await.ok().and_then(|b| b["hash"].as_str().map(str::to_owned)),
            Ok(r) if r.status() == 409 => {
                return r.json::<Value>().await.ok().and_then(|b| b["current_hash"].as_str().map(str::to_owned));
            }
            Ok(r) if r.status() != 503 => panic!("a tree write answered {}", r.status()),
            _ => {
                if stop.load(Ordering::Relaxed) && attempt > 40 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    }
    None
}

/// A writer of the watched tree through the faults: one new entity after
/// another, each written until it lands; how many landed.
pub(crate) fn writer(bases: Arc<Vec<String>>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
        let mut landed = 0;
        for n in 1u64.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if write(&http, &bases, &format!("w{n}"), n, &stop).await.is_some() {
                landed += 1;
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        landed
    })
}

/// The last write, once the faults stopped (within 60 s): its hash.
pub(crate) async fn last_write(http: &reqwest::Client, bases: &[String], seed: u64) -> String {
    crate::helpers::gather(
        Duration::from_secs(60),
        (),
        |_| "the last tree write to land".into(),
        |()| async move {
            match write(http, bases, "last", seed, &AtomicBool::new(true)).await {
                Some(hash) => ControlFlow::Break(hash),
                None => ControlFlow::Continue(()),
            }
        },
    )
    .await
}
