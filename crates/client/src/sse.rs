//! A small Server-Sent Events client: the frame parser (per the WHATWG
//! event-stream rules tidings relies on: `id`, `event`, `data`, `retry`,
//! comments) and a reader over an HTTP response. Used by `tidings bench`,
//! the CLI and the integration tests.

use std::collections::VecDeque;

use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// `id:` of the frame, if any.
    pub id: Option<String>,
    /// `event:` name; `None` means the default `message`.
    pub event: Option<String>,
    /// `data:` lines joined by `\n`.
    pub data: String,
}

/// Incremental parser.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    current: SseEvent,
    has_data: bool,
    /// The last `retry:` value seen, in ms.
    pub retry_ms: Option<u64>,
    /// Comment lines seen (heartbeats).
    pub comments: u64,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    ///
    /// Line by line, not byte by byte, and allocating only the values it
    /// keeps: a load generator that parsed slowly would measure itself
    /// (and the bigger a server's frames, the more), not the server.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(n) = bytes.iter().position(|&b| b == b'\n') {
            let (line, rest) = bytes.split_at(n);
            bytes = &rest[1..];
            if self.line.is_empty() {
                self.line_done(strip_cr(line), &mut out);
            } else {
                // The line began in an earlier chunk; its buffer is kept
                // (cleared) for the next one.
                let mut whole = std::mem::take(&mut self.line);
                whole.extend_from_slice(line);
                self.line_done(strip_cr(&whole), &mut out);
                whole.clear();
                self.line = whole;
            }
        }
        self.line.extend_from_slice(bytes);
        out
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_data {
                out.push(std::mem::take(&mut self.current));
            } else {
                self.current = SseEvent::default();
            }
            self.has_data = false;
            return;
        }
        if line[0] == b':' {
            self.comments += 1;
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => (&line[..i], line[i + 1..].strip_prefix(b" ").unwrap_or(&line[i + 1..])),
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"id" => self.current.id = Some(value.into_owned()),
            b"event" => self.current.event = Some(value.into_owned()),
            b"data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(&value);
                self.has_data = true;
            }
            b"retry" => self.retry_ms = value.parse().ok(),
            _ => {}
        }
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Events read from a streaming HTTP response.
pub struct SseReader<S> {
    body: S,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
}

impl<S> std::fmt::Debug for SseReader<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseReader").field("pending", &self.pending.len()).finish_non_exhaustive()
    }
}

impl<S, E> SseReader<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    /// Wraps a body stream.
    pub fn new(body: S) -> Self {
        Self { body, parser: SseParser::default(), pending: VecDeque::new() }
    }

    /// The next event; `None` when the stream ended (or failed).
    pub async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.pending.extend(self.parser.feed(&chunk)),
                _ => return None,
            }
        }
    }

    /// The parser (retry and heartbeat counts).
    pub fn parser(&self) -> &SseParser {
        &self.parser
    }
}

/// A response body as a stream of chunks.
pub type BodyStream = std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// Why [`open`] could not open a stream.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The server answered with an error: its status, stable code and message.
    #[error("{status}: {code} ({message})")]
    Answered {
        /// The HTTP status.
        status: u16,
        /// The stable code (`unauthorized`, `invalid_filter`, `too_many_streams`…).
        code: String,
        /// The server's message.
        message: String,
    },
    /// No answer: the connection failed (what happened, without the URL).
    #[error("{0}")]
    Network(String),
}

impl OpenError {
    /// A refusal the same request would meet again (a `4xx` other than
    /// `408` and `429`): not worth retrying.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Answered { status, .. } if (400..500).contains(status) && *status != 408 && *status != 429)
    }
}

/// A field of a server's answer, as a person may be shown it: at most
/// 500 characters, and no control character (a hostile server's answer
/// reaches a terminal); `fallback` when the field is not a string.
pub fn said(answer: &serde_json::Value, field: &str, fallback: &str) -> String {
    answer[field].as_str().unwrap_or(fallback).chars().take(500).flat_map(char::escape_default).collect()
}

/// What went wrong with a request, in words a terminal user reads: the
/// innermost cause (`Connection refused (os error 111)`), never the URL,
/// which may carry a token.
pub fn describe(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let what = if e.is_timeout() { "timed out".to_owned() } else { cause.to_string() };
    if e.is_connect() { format!("cannot connect: {what}") } else { what }
}

/// Opens `url` as an event stream with `token` as a bearer header (never
/// in the URL), sending `Last-Event-ID` when given. A refusal carries the
/// server's code and message.
pub async fn open(
    http: &reqwest::Client,
    url: &str,
    last_event_id: Option<i64>,
    token: Option<&str>,
) -> Result<SseReader<BodyStream>, OpenError> {
    let mut request = http.get(url).header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id.to_string());
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| OpenError::Network(describe(&e)))?;
    let status = response.status();
    if !status.is_success() {
        // The answer's body is read within bounds (64 KiB, 10 s): a server
        // says its code in a few hundred bytes.
        let mut body = Vec::new();
        let mut chunks = response.bytes_stream();
        let read = async {
            while body.len() < 64 * 1024 {
                match chunks.next().await {
                    Some(Ok(chunk)) => body.extend_from_slice(&chunk),
                    _ => break,
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        return Err(OpenError::Answered {
            status: status.as_u16(),
            code: said(&answer, "error", "error"),
            message: said(&answer, "message", status.canonical_reason().unwrap_or("")),
        });
    }
    Ok(SseReader::new(Box::pin(response.bytes_stream())))
}

/// Opens `url` as an event stream, sending `Last-Event-ID` when given.
pub async fn connect(http: &reqwest::Client, url: &str, last_event_id: Option<i64>) -> reqwest::Result<SseReader<BodyStream>> {
    let mut request = http.get(url).header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id.to_string());
    }
    let response = request.send().await?.error_for_status()?;
    Ok(SseReader::new(Box::pin(response.bytes_stream())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_frames_split_anywhere() {
        let text = b"retry: 2000\n\n:\n\nid: 1\ndata: {\"a\":1}\n\nevent: system.x\ndata: y\n\n";
        for split in 0..text.len() {
            let mut p = SseParser::default();
            let mut events = p.feed(&text[..split]);
            events.extend(p.feed(&text[split..]));
            assert_eq!(p.retry_ms, Some(2000));
            assert_eq!(p.comments, 1);
            assert_eq!(events.len(), 2);
            assert_eq!(events[0].id.as_deref(), Some("1"));
            assert_eq!(events[0].data, "{\"a\":1}");
            assert_eq!(events[1].event.as_deref(), Some("system.x"));
        }
    }

    #[test]
    fn takes_crlf_lines_multiline_data_and_fields_without_a_value() {
        let text = b"id: 7\r\ndata: a\r\ndata:b\r\nevent\r\n\r\ndata\n\n";
        for split in 0..text.len() {
            let mut p = SseParser::default();
            let mut events = p.feed(&text[..split]);
            events.extend(p.feed(&text[split..]));
            assert_eq!(events.len(), 2, "split at {split}");
            assert_eq!(events[0], SseEvent { id: Some("7".into()), event: Some(String::new()), data: "a\nb".into() });
            assert_eq!(events[1].data, "");
        }
    }
}
