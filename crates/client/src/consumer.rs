//! A durable consumer (docs/polling.md): [`Consumer::next`] long-polls
//! `GET /v1/poll` under a `consumer_id` and hands out each event of a page
//! in order; a page is acknowledged only by the poll that follows it (its
//! `next_since` as the next `since`), that is, once the caller came back
//! for more after its last event. A worker that stops mid-page gets the
//! page again: at least once, never lost. Transport failures and the
//! answers a server gives while it cannot serve (`5xx`, `408`, `429`) are
//! retried with backoff; a refusal the same poll would meet again is
//! returned.

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::Value;
use tidings_protocol::event::EventId;
use tidings_protocol::retry::Backoff;

use crate::sse::said;
use crate::stream::Client;

/// What a consumer hands out.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivered {
    /// One event, in id order.
    Event {
        /// Its id.
        id: EventId,
        /// Its envelope.
        envelope: Value,
    },
    /// A page's `gap`: what its resume point could not be served whole,
    /// before the page's events.
    Gap(Value),
}

/// Why a consumer stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The server refused the poll, and would again (its status, code and
    /// message).
    #[error("the server refused the poll: {status}: {code} ({message})")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The stable code.
        code: String,
        /// The message.
        message: String,
    },
}

/// A durable consumer of one server.
#[derive(Debug)]
pub struct Consumer {
    client: Client,
    id: String,
    filter: Option<String>,
    /// Where the next poll starts, confirming what came before it; `None`
    /// until the first page (the stored cursor, or the head for a new one).
    since: Option<EventId>,
    page: VecDeque<(EventId, Value)>,
    /// How long a poll waits for a first event.
    pub wait: Duration,
    backoff: Backoff,
}

impl Client {
    /// The durable consumer `id`, with `filter` (JSON) when it is created.
    pub fn consumer(&self, id: &str, filter: Option<String>) -> Consumer {
        Consumer {
            client: self.clone(),
            id: id.to_owned(),
            filter,
            since: None,
            page: VecDeque::new(),
            wait: Duration::from_secs(25),
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(10)),
        }
    }
}

impl Consumer {
    /// The next event (or a page's gap); `Ok(None)` when a poll waited
    /// [`Consumer::wait`] and nothing came.
    pub async fn next(&mut self) -> Result<Option<Delivered>, ConsumerError> {
        if let Some((id, envelope)) = self.page.pop_front() {
            return Ok(Some(Delivered::Event { id, envelope }));
        }
        loop {
            match self.poll().await {
                Ok(page) => {
                    self.backoff.reset();
                    self.since = page["next_since"].as_i64().or(self.since);
                    self.page = page["events"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|e| Some((e["event_id"].as_i64()?, e.clone())))
                        .collect();
                    if let Some(gap) = page.get("gap").filter(|g| !g.is_null()) {
                        return Ok(Some(Delivered::Gap(gap.clone())));
                    }
                    return Ok(self.page.pop_front().map(|(id, envelope)| Delivered::Event { id, envelope }));
                }
                Err(Poll::Final(e)) => return Err(e),
                Err(Poll::Again) => tokio::time::sleep(self.backoff.next_delay()).await,
            }
        }
    }

    async fn poll(&self) -> Result<Value, Poll> {
        let mut query: Vec<(&str, String)> = vec![("consumer_id", self.id.clone()), ("wait_ms", self.wait.as_millis().to_string())];
        if let Some(since) = self.since {
            query.push(("since", since.to_string()));
        }
        if let Some(filter) = &self.filter {
            query.push(("filter", filter.clone()));
        }
        let mut request = self.client.http().get(format!("{}/v1/poll", self.client.base())).query(&query);
        if let Some(token) = self.client.token() {
            request = request.bearer_auth(token);
        }
        // The poll may wait `wait` before it answers.
        let response = request.timeout(self.wait + Duration::from_secs(30)).send().await.map_err(|_| Poll::Again)?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.map_err(|_| Poll::Again)?;
        if (200..300).contains(&status) {
            return Ok(body);
        }
        if status >= 500 || status == 408 || status == 429 {
            return Err(Poll::Again);
        }
        Err(Poll::Final(ConsumerError::Refused { status, code: said(&body, "error", ""), message: said(&body, "message", "") }))
    }
}

/// How a poll failed.
enum Poll {
    /// Worth trying again.
    Again,
    /// Not.
    Final(ConsumerError),
}
