//! Publishing you can retry ([`Client::publish`], docs/events.md): one
//! `Idempotency-Key` for a publish and all its retries, so an answer lost
//! after the server stored the events stores nothing twice. A lost
//! connection and the answers a server gives while it cannot serve (`503`,
//! `502`, `504`, `408`, `429`, after its `Retry-After`) are retried with
//! jittered backoff, as the JavaScript and Python clients retry them; a
//! refusal is returned at once.

use std::time::Duration;

use serde_json::Value;
use tidings_protocol::event::EventId;
use tidings_protocol::retry::Backoff;

use crate::sse::{describe, said};
use crate::stream::Client;

/// The answers a publish retries under its key.
pub const RETRIED_STATUSES: [u16; 5] = [408, 429, 502, 503, 504];

/// What a publish was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The ids, in order.
    pub ids: Vec<EventId>,
    /// The server had stored the publish before under the same key (a
    /// retry whose first answer was lost) and stored nothing now.
    pub replayed: bool,
}

/// How a publish goes.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    /// The `Idempotency-Key`; a new random one when `None`.
    pub key: Option<String>,
    /// Retries after the first attempt.
    pub retries: u32,
}

impl Default for PublishOptions {
    fn default() -> Self {
        Self { key: None, retries: 5 }
    }
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The server refused it, and would again.
    #[error("{status}: {code} ({message})")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The stable code (`invalid_event_name`, `forbidden`, ...).
        code: String,
        /// The message.
        message: String,
    },
    /// Every attempt failed for a reason worth retrying; publishing again
    /// under `key` still stores the events once.
    #[error("publishing failed after {attempts} attempts: {last}")]
    Exhausted {
        /// How many attempts were made.
        attempts: u32,
        /// The last failure.
        last: String,
        /// The key every attempt carried.
        key: String,
    },
}

impl Client {
    /// Publishes `body` (one event, or `{"events": [...]}`), retrying under
    /// one key; `on_retry` is told each failure before its retry.
    pub async fn publish(&self, body: &Value, options: PublishOptions, mut on_retry: impl FnMut(&str)) -> Result<Published, PublishError> {
        let key = options.key.unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
        let url = format!("{}/v1/events", self.base());
        let mut backoff = Backoff::CLIENT;
        let mut attempt = 0;
        loop {
            let mut request = self.http().post(&url).timeout(Duration::from_secs(30)).header("idempotency-key", &key).json(body);
            if let Some(token) = self.token() {
                request = request.bearer_auth(token);
            }
            // A lost connection or a 503 may have committed or not: the
            // retry carries the same key, so it is stored once either way.
            let failure = match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
                    let after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                    let answer: Value = response.json().await.unwrap_or(Value::Null);
                    if (200..300).contains(&status) {
                        let ids = answer["event_ids"].as_array().into_iter().flatten().filter_map(Value::as_i64).collect();
                        return Ok(Published { ids, replayed });
                    }
                    if !RETRIED_STATUSES.contains(&status) {
                        return Err(PublishError::Refused {
                            status,
                            code: said(&answer, "error", ""),
                            message: said(&answer, "message", ""),
                        });
                    }
                    if let Some(seconds) = after {
                        backoff.at_least(Duration::from_secs(seconds.min(30)));
                    }
                    format!("{status}: {} ({})", said(&answer, "error", ""), said(&answer, "message", ""))
                }
                Err(e) => describe(&e),
            };
            if attempt >= options.retries {
                return Err(PublishError::Exhausted { attempts: attempt + 1, last: failure, key });
            }
            attempt += 1;
            on_retry(&failure);
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
}
