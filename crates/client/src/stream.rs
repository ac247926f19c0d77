//! A stream that resumes by itself: [`Client::stream`] yields every
//! matching event once, in id order, across any disconnect (a restart, a
//! slow-client drop, a lost connection), reconnecting with
//! `Last-Event-ID` and backoff (docs/streams.md). What the stream could not
//! serve whole comes as [`Item::Gap`]; a refusal the same request would
//! meet again ends it with [`StreamError`]. The token travels as a header,
//! never in the URL.
//!
//! Every answer of the server is checked before it moves the position: an
//! event whose id is not above the last one taken is dropped (nothing is
//! repeated, whatever a proxy or a server replays), and an event without
//! an id or with a body that is not JSON is not an event.

use std::time::Duration;

use futures_util::Stream;
use serde_json::Value;
use tidings_protocol::event::{EventId, names};
use tidings_protocol::retry::Backoff;

use crate::sse::{self, BodyStream, OpenError, SseReader};

/// A client of one tidings server.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<Token>,
}

/// A bearer token, or where fresh ones come from.
#[derive(Clone)]
enum Token {
    Fixed(String),
    Source(std::sync::Arc<dyn Fn() -> String + Send + Sync>),
}

impl std::fmt::Debug for Token {
    /// Never the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Token::Fixed(_) => "Token(fixed)",
            Token::Source(_) => "Token(source)",
        })
    }
}

/// What a stream asks for (docs/streams.md): a filter, or the lists that
/// make one, and where it starts.
#[derive(Debug, Clone, Default)]
pub struct StreamQuery {
    /// A whole filter, as JSON (`filter=`).
    pub filter: Option<String>,
    /// Event-type globs, comma-separated (`types=`).
    pub types: Option<String>,
    /// Agents, comma-separated (`agents=`).
    pub agents: Option<String>,
    /// Targets, comma-separated (`targets=`).
    pub targets: Option<String>,
    /// Start after this id; `None`: live from now.
    pub since: Option<EventId>,
}

/// What a stream yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// The stream is open (first, or again after `Ended` or
    /// `Reconnecting`), as `EventSource`'s `open`: events follow.
    Open,
    /// One event, once, in id order.
    Event {
        /// Its id.
        id: EventId,
        /// Its envelope.
        envelope: Value,
    },
    /// History the stream could not serve whole (`system.replay_gap`): what
    /// was missed, and where delivery goes on.
    Gap(Value),
    /// Any other notice (`system.client_dropped_slow`,
    /// `system.token_expired`, `system.filter_budget_exceeded`): its name
    /// and data. The stream goes on.
    Notice {
        /// The notice's name.
        name: String,
        /// Its data.
        data: Value,
    },
    /// The server ended the stream (a restart, a slow-client drop); it
    /// resumes after `wait` from the last event it yielded.
    Ended {
        /// How long until it resumes (the server's `retry:`, at most 10 s).
        wait: Duration,
    },
    /// The connection could not be opened, or failed; the stream tries
    /// again after `wait` from the last event it yielded.
    Reconnecting {
        /// What happened, in words a person reads (never the URL).
        reason: String,
        /// How long until the next attempt.
        wait: Duration,
    },
}

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The server refused the stream, and would again (a `4xx` other than
    /// `408` and `429`: a bad filter, a token not valid).
    #[error("the server refused the stream: {0}")]
    Refused(OpenError),
    /// The server's address is not a URL.
    #[error("not a URL: {0}")]
    Url(String),
}

impl Client {
    /// A client of the server at `base` (`http://127.0.0.1:8080`).
    pub fn new(base: &str) -> Self {
        Self { http: reqwest::Client::new(), base: base.trim_end_matches('/').to_owned(), token: None }
    }

    /// Sends `token` as a bearer header on every request.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(Token::Fixed(token.into()));
        self
    }

    /// Asks `source` for the token before every request and reconnection
    /// (a token refreshed before it expires), and once more, at once, when
    /// the server answers `401`: a stream whose token expired
    /// (`system.token_expired`) goes on from its last event under a fresh one.
    pub fn with_token_source(mut self, source: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.token = Some(Token::Source(std::sync::Arc::new(source)));
        self
    }

    /// Uses `http` for every request (timeouts, proxies, TLS roots).
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// The server's address.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub(crate) fn token(&self) -> Option<String> {
        match &self.token {
            None => None,
            Some(Token::Fixed(token)) => Some(token.clone()),
            Some(Token::Source(source)) => Some(source()),
        }
    }

    fn refreshes(&self) -> bool {
        matches!(self.token, Some(Token::Source(_)))
    }

    /// The events `query` asks for, resuming after any disconnect. Backoff
    /// runs from 500 ms to 10 s (or the server's `retry:`, at most 10 s)
    /// and starts again once a connection opens.
    pub fn stream(&self, query: StreamQuery) -> impl Stream<Item = Result<Item, StreamError>> + Send + 'static {
        let state = State {
            client: self.clone(),
            url: self.stream_url(&query),
            last: query.since,
            reader: None,
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(10)),
            wait: None,
            done: false,
            refreshed: false,
        };
        futures_util::stream::unfold(state, |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        })
    }

    fn stream_url(&self, query: &StreamQuery) -> Result<reqwest::Url, StreamError> {
        let mut url = reqwest::Url::parse(&format!("{}/v1/stream", self.base)).map_err(|e| StreamError::Url(e.to_string()))?;
        for (name, value) in [("filter", &query.filter), ("types", &query.types), ("agents", &query.agents), ("targets", &query.targets)] {
            if let Some(value) = value {
                url.query_pairs_mut().append_pair(name, value);
            }
        }
        Ok(url)
    }
}

/// Where a stream stands between two items.
struct State {
    client: Client,
    url: Result<reqwest::Url, StreamError>,
    /// The last id yielded (or the start).
    last: Option<EventId>,
    reader: Option<SseReader<BodyStream>>,
    backoff: Backoff,
    /// A wait owed before the next attempt (announced by `Reconnecting`).
    wait: Option<Duration>,
    done: bool,
    /// A `401` was already met with a fresh token since the last open.
    refreshed: bool,
}

impl State {
    async fn next(&mut self) -> Option<Result<Item, StreamError>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(wait) = self.wait.take() {
                tokio::time::sleep(wait).await;
            }
            let Some(reader) = self.reader.as_mut() else {
                let url = match &self.url {
                    Ok(url) => url.as_str().to_owned(),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(StreamError::Url(e.to_string())));
                    }
                };
                match sse::open(&self.client.http, &url, self.last, self.client.token().as_deref()).await {
                    Ok(reader) => {
                        self.backoff.reset();
                        self.refreshed = false;
                        self.reader = Some(reader);
                        return Some(Ok(Item::Open));
                    }
                    Err(OpenError::Answered { status: 401, .. }) if self.client.refreshes() && !self.refreshed => {
                        // Once, at once, under a fresh token.
                        self.refreshed = true;
                        continue;
                    }
                    Err(e) if e.is_final() => {
                        self.done = true;
                        return Some(Err(StreamError::Refused(e)));
                    }
                    Err(e) => {
                        let wait = self.backoff.next_delay();
                        self.wait = Some(wait);
                        return Some(Ok(Item::Reconnecting { reason: e.to_string(), wait }));
                    }
                }
            };
            let Some(event) = reader.next_event().await else {
                // Ended (a restart, a drop): resume after the last id, at
                // the server's `retry:` if it gave one.
                let wait = reader.parser().retry_ms.map_or(self.backoff.peek(), Duration::from_millis).min(Duration::from_secs(10));
                self.reader = None;
                self.wait = Some(wait);
                return Some(Ok(Item::Ended { wait }));
            };
            let data = serde_json::from_str::<Value>(&event.data);
            match event.event.as_deref() {
                None => {
                    let (Some(id), Ok(envelope)) = (event.id.as_deref().and_then(|i| i.parse::<EventId>().ok()), data) else { continue };
                    if self.last.is_some_and(|last| id <= last) {
                        continue;
                    }
                    self.last = Some(id);
                    return Some(Ok(Item::Event { id, envelope }));
                }
                Some(names::SYSTEM_REPLAY_GAP) => return Some(Ok(Item::Gap(data.unwrap_or(Value::Null)))),
                Some(name) => return Some(Ok(Item::Notice { name: name.to_owned(), data: data.unwrap_or(Value::String(event.data)) })),
            }
        }
    }
}
