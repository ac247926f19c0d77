//! A device that resumes by itself ([`Listener`], docs/websocket.md): it
//! connects, signs `stream.auth`, catches up from its stored cursor with
//! `sync.delta` pages, then takes realtime `stream.event`s; it hands out
//! each seq once (a high-water mark drops what a reconnect sends again)
//! and acknowledges what was taken whenever it goes back to the server
//! for more, and on [`Listener::finish`]. A dropped connection, and the
//! closes the server ends a connection with, are retried with jittered
//! backoff from the cursor; a rejection (a bad key, token or filter, a
//! protocol error) is not, since the same request would meet it again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tidings_protocol::identity::ServerIdentity;
use tidings_protocol::retry::Backoff;
use tidings_protocol::ws::{close, method};

use crate::device::{DeviceClient, DeviceClientError as E, Pushed, ws_url};
use crate::sse::said;

/// Who the device is and what it follows.
#[derive(Debug, Clone)]
pub struct ListenOptions {
    /// The server's address (`http://…` or `ws://…`).
    pub url: String,
    /// A bearer token, sent in the upgrade's `Authorization` header.
    pub token: Option<String>,
    /// The device's id (its cursor is stored under it).
    pub device_id: String,
    /// A filter (`{types, agents, targets, payload}`); `None`: everything.
    pub filter: Option<Value>,
    /// For the first connection only, start after this seq instead of the
    /// stored cursor.
    pub since: Option<i64>,
    /// Events per `sync.delta` page.
    pub page_size: u32,
}

/// What a listener hands out.
#[derive(Debug, Clone, PartialEq)]
pub enum Heard {
    /// One event, once, in seq order.
    Event {
        /// Its seq (its id).
        seq: i64,
        /// Its envelope.
        event: Value,
    },
    /// History a catch-up page could not serve whole (its `gap`).
    Gap(Value),
    /// Another notification of the server (`stream.gap`,
    /// `stream.token_expired`, …) or a refused acknowledgement, as it came.
    Notice(Value),
    /// The connection failed or was ended by the server; the device
    /// reconnects after `wait` from its cursor.
    Reconnecting {
        /// What happened.
        reason: String,
        /// How long until it tries again.
        wait: Duration,
    },
}

/// Why a listener stopped.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The server refused the upgrade (its status, code and message).
    #[error("the server refused the upgrade: {0}")]
    Upgrade(String),
    /// The server rejected this device, and would again.
    #[error("the server rejected this device: {0}")]
    Rejected(E),
}

/// A device following the WebSocket transport, resuming by itself.
#[derive(Debug)]
pub struct Listener {
    key: Arc<ServerIdentity>,
    options: ListenOptions,
    url: String,
    connection: Option<Connection>,
    backoff: Backoff,
    /// The highest seq handed out, and the highest acknowledged.
    high_water: Option<i64>,
    acked: Option<i64>,
    /// A wait owed before the next attempt (announced by `Reconnecting`).
    wait: Option<Duration>,
    done: bool,
}

#[derive(Debug)]
struct Connection {
    client: DeviceClient,
    head: i64,
    /// `Some(since)` while catching up: the next page starts there.
    catching_up: Option<i64>,
    /// Events of the last page not handed out yet.
    page: VecDeque<(i64, Value)>,
    has_more: bool,
}

/// How a step failed: retried, or not.
enum Failed {
    Retry(String),
    Stop(ListenError),
}

impl From<E> for Failed {
    /// Transport failures and the closes the server ends a connection with
    /// are retried; anything else is a rejection.
    fn from(e: E) -> Self {
        match e {
            E::Transport(_) => Failed::Retry(e.to_string()),
            E::Closed { code, .. } if close::reconnects(code) => Failed::Retry(e.to_string()),
            e => Failed::Stop(ListenError::Rejected(e)),
        }
    }
}

impl Listener {
    /// A listener for `key`'s device; nothing is sent until [`Listener::next`].
    pub fn new(key: Arc<ServerIdentity>, options: ListenOptions) -> Self {
        let url = ws_url(&options.url, None);
        Self { key, options, url, connection: None, backoff: Backoff::CLIENT, high_water: None, acked: None, wait: None, done: false }
    }

    /// The next thing heard; `None` once stopped.
    pub async fn next(&mut self) -> Option<Result<Heard, ListenError>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(wait) = self.wait.take() {
                tokio::time::sleep(wait).await;
            }
            match self.step().await {
                Ok(Some(heard)) => return Some(Ok(heard)),
                Ok(None) => {}
                Err(Failed::Retry(reason)) => {
                    self.connection = None;
                    // Jittered: reconnecting devices spread out after a restart.
                    let wait = self.backoff.next_delay();
                    self.wait = Some(wait);
                    return Some(Ok(Heard::Reconnecting { reason, wait }));
                }
                Err(Failed::Stop(e)) => {
                    self.done = true;
                    self.connection = None;
                    return Some(Err(e));
                }
            }
        }
    }

    /// Acknowledges what was handed out, and closes.
    pub async fn finish(mut self) {
        let _ = self.ack_taken().await;
    }

    /// One step: connect, hand out a buffered event, page, or read a push.
    async fn step(&mut self) -> Result<Option<Heard>, Failed> {
        if self.connection.is_none() {
            self.connection = Some(self.open().await?);
        }
        let high_water = self.high_water;
        let Some(connection) = self.connection.as_mut() else { return Ok(None) };
        while let Some((seq, event)) = connection.page.pop_front() {
            if high_water.is_none_or(|hw| seq > hw) {
                return Ok(Some(self.handed(seq, event)));
            }
        }
        if let Some(since) = connection.catching_up {
            // Realtime starts once a page reaches the head.
            if !connection.has_more && since >= connection.head {
                connection.catching_up = None;
                return Ok(None);
            }
            self.ack_taken().await?;
            let Some(connection) = self.connection.as_mut() else { return Ok(None) };
            let params = json!({"device_id": self.options.device_id, "since": since, "limit": self.options.page_size});
            let page = connection.client.call(method::DELTA, params).await?;
            connection.page = page["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|item| Some((item["seq"].as_i64()?, item["event"].clone())))
                .collect();
            connection.has_more = page["has_more"].as_bool().unwrap_or(false);
            let next = page["next_since"].as_i64().unwrap_or(since);
            // A page that does not move on ends the catch-up: never a loop.
            connection.catching_up = Some(if next > since { next } else { connection.head.max(since) });
            if next <= since {
                connection.has_more = false;
            }
            return Ok(page.get("gap").cloned().map(Heard::Gap));
        }
        self.ack_taken().await?;
        let Some(connection) = self.connection.as_mut() else { return Ok(None) };
        match connection.client.next().await? {
            Pushed::Event { seq, event } if high_water.is_none_or(|hw| seq > hw) => Ok(Some(self.handed(seq, event))),
            Pushed::Event { .. } => Ok(None),
            Pushed::Answer(answer) => Ok(answer.get("error").map(|_| Heard::Notice(answer.clone()))),
            Pushed::Notice(notice) => Ok(Some(Heard::Notice(notice))),
        }
    }

    fn handed(&mut self, seq: i64, event: Value) -> Heard {
        self.high_water = Some(seq);
        self.backoff.reset();
        Heard::Event { seq, event }
    }

    /// Sends `stream.ack` for the high-water mark if it moved.
    async fn ack_taken(&mut self) -> Result<(), Failed> {
        let (Some(hw), Some(connection)) = (self.high_water, self.connection.as_mut()) else { return Ok(()) };
        if self.acked.is_some_and(|acked| acked >= hw) {
            return Ok(());
        }
        connection.client.ack(&self.key, hw).await?;
        self.acked = Some(hw);
        Ok(())
    }

    /// Connects and authenticates. What was handed out goes along as the
    /// cursor: a device whose acks never landed has no stored cursor, and
    /// would otherwise start at the head, past what was published while it
    /// was away (a stored cursor still wins). Catch-up starts at the stored
    /// cursor (or the first `since`), not at the high-water mark: what is
    /// sent again is dropped by the mark.
    async fn open(&mut self) -> Result<Connection, Failed> {
        let mut client = match DeviceClient::connect_as(&self.url, self.options.token.as_deref()).await {
            Ok(client) => client,
            Err(E::Transport(tokio_tungstenite::tungstenite::Error::Http(response))) => {
                // The server's stable code and message, when it gave them;
                // bounded, and no control character reaches a terminal.
                let answer: Value = response.body().as_deref().and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default();
                let status = response.status().as_u16();
                let refused = format!("{status}: {} ({})", said(&answer, "error", ""), said(&answer, "message", ""));
                return Err(if (500..600).contains(&status) || status == 429 {
                    Failed::Retry(format!("the server refused the upgrade: {refused}"))
                } else {
                    Failed::Stop(ListenError::Upgrade(refused))
                });
            }
            Err(e) => return Err(e.into()),
        };
        let answer = match client.auth(&self.key, auth_body(&self.options.device_id, self.options.filter.as_ref(), self.high_water)).await {
            Ok(answer) => answer,
            // An error frame is a rejection even though a close follows.
            Err(e @ E::Refused { .. }) => return Err(Failed::Stop(ListenError::Rejected(e))),
            Err(e) => return Err(e.into()),
        };
        let head = answer["head_seq"].as_i64().unwrap_or(0);
        let cursor = answer["cursor"].as_i64().unwrap_or(0);
        self.acked = self.acked.max(Some(cursor));
        let since = self.options.since.take().unwrap_or(cursor);
        let catching_up = (since < head || cursor < head).then_some(since);
        Ok(Connection { client, head, catching_up, page: VecDeque::new(), has_more: true })
    }
}

/// `stream.auth`'s body: the device, the cursor it has handed out up to,
/// and its filter.
pub fn auth_body(device: &str, filter: Option<&Value>, high_water: Option<i64>) -> Value {
    let mut body = json!({"device_id": device});
    if let Some(hw) = high_water {
        body["cursor"] = json!(hw);
    }
    if let Some(f) = filter {
        body["filter"] = f.clone();
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconnect_carries_what_was_handed_out_as_the_cursor() {
        let filter = json!({"types": ["a.*"]});
        assert_eq!(auth_body("d", None, None), json!({"device_id": "d"}), "a first connection starts where the server says");
        assert_eq!(auth_body("d", Some(&filter), Some(41)), json!({"device_id": "d", "cursor": 41, "filter": filter}));
    }
}
