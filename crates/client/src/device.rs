//! The device side of the WebSocket transport (`GET /v1/ws`,
//! docs/ref-websocket.md): one JSON-RPC connection that reads
//! `stream.hello`, signs `stream.auth` and `stream.ack` with the device's
//! Ed25519 key over the connection's nonce, pages `sync.delta`, and hands
//! out what the server pushes. Used by `tidings listen` and the bench's
//! WebSocket mode.

use std::collections::VecDeque;
use tidings_protocol::ws::method;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use tidings_protocol::identity::ServerIdentity;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Why a connection or a call failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceClientError {
    /// The server answered a request with a JSON-RPC error.
    #[error("{code}: {message}")]
    Refused {
        /// `error.data.code`, the stable code (`proof_invalid`, `unauthorized`, …).
        code: String,
        /// `error.message`.
        message: String,
    },
    /// The server closed the connection.
    #[error("closed by the server ({code} {reason})")]
    Closed {
        /// The close code (1000 when none was given).
        code: u16,
        /// The close reason.
        reason: String,
    },
    /// The connection failed (refused, reset, not a WebSocket).
    #[error(transparent)]
    Transport(#[from] tokio_tungstenite::tungstenite::Error),
    /// A frame the client does not understand.
    #[error("unexpected frame: {0}")]
    Unexpected(String),
}

/// What the server pushed.
#[derive(Debug)]
pub enum Pushed {
    /// `stream.event {seq, event}`.
    Event {
        /// The event's seq (its id).
        seq: i64,
        /// The envelope.
        event: Value,
    },
    /// The answer to a request sent with [`DeviceClient::send`].
    Answer(Value),
    /// Another notification (`stream.gap`, …).
    Notice(Value),
}

/// One connection.
pub struct DeviceClient {
    ws: Socket,
    /// The `stream.hello` params.
    pub hello: Value,
    nonce: String,
    next_id: u64,
    /// Frames read while waiting for an answer.
    pending: VecDeque<Value>,
}

impl std::fmt::Debug for DeviceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceClient").field("hello", &self.hello).finish_non_exhaustive()
    }
}

/// `url` (`http://…` or `ws://…`, a server base) as the WebSocket URL of
/// `/v1/ws`, with `access_token` when given.
pub fn ws_url(base: &str, token: Option<&str>) -> String {
    let base = base.trim_end_matches('/');
    let base = base.strip_prefix("http").map_or_else(|| base.to_owned(), |rest| format!("ws{rest}"));
    let url = format!("{base}/v1/ws");
    match (token, reqwest::Url::parse(&url)) {
        (Some(t), Ok(mut url)) => {
            url.query_pairs_mut().append_pair("access_token", t);
            url.into()
        }
        _ => url,
    }
}

impl DeviceClient {
    /// Connects and reads `stream.hello`.
    pub async fn connect(url: &str) -> Result<Self, DeviceClientError> {
        Self::connect_as(url, None).await
    }

    /// Connects with `token` as a bearer header of the upgrade (never in
    /// the URL, which proxies log and errors quote) and reads `stream.hello`.
    pub async fn connect_as(url: &str, token: Option<&str>) -> Result<Self, DeviceClientError> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let mut request = url.into_client_request()?;
        if let Some(token) = token {
            let value =
                format!("Bearer {token}").parse().map_err(|_| DeviceClientError::Unexpected("the token is not a header value".into()))?;
            request.headers_mut().insert("authorization", value);
        }
        // Small buffers, as the server has: a bench opens thousands.
        let config = WebSocketConfig::default().read_buffer_size(4096).write_buffer_size(0);
        let (ws, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), true).await?;
        let mut client = DeviceClient { ws, hello: Value::Null, nonce: String::new(), next_id: 1, pending: VecDeque::new() };
        let hello = client.read().await?;
        if hello["method"] != method::HELLO {
            return Err(DeviceClientError::Unexpected(hello.to_string()));
        }
        client.hello = hello["params"].clone();
        client.nonce = client.hello["nonce"].as_str().unwrap_or_default().to_owned();
        Ok(client)
    }

    /// `origin_proof` by `key` for `method` and `body` on this connection.
    pub fn proof(&self, key: &ServerIdentity, method: &str, body: &Value) -> Value {
        let target = tidings_protocol::identity::proof_target(method, body, &self.nonce);
        json!({"identity": key.entity(), "signature": key.signature(&target)})
    }

    /// Sends a request; its answer comes as [`Pushed::Answer`]. Returns its id.
    pub async fn send(&mut self, method: &str, params: Value) -> Result<u64, DeviceClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.ws.send(Message::text(request.to_string())).await?;
        Ok(id)
    }

    /// Sends a request and waits for its result; what is pushed meanwhile
    /// waits for [`next`](Self::next).
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, DeviceClientError> {
        let id = self.send(method, params).await?;
        loop {
            let frame = self.read().await?;
            // An error without an id is about the connection (a refused
            // token): it answers whatever was asked.
            if frame["id"] == id || (frame["id"].is_null() && frame.get("error").is_some()) {
                return result_of(frame);
            }
            self.pending.push_back(frame);
        }
    }

    /// `stream.auth` with `body` (`{device_id, cursor?, filter?}`), signed by `key`.
    pub async fn auth(&mut self, key: &ServerIdentity, body: Value) -> Result<Value, DeviceClientError> {
        let proof = self.proof(key, method::AUTH, &body);
        self.call(method::AUTH, json!({"body": body, "origin_proof": proof})).await
    }

    /// Sends `stream.ack {seq}` signed by `key`, without waiting for the answer.
    pub async fn ack(&mut self, key: &ServerIdentity, seq: i64) -> Result<u64, DeviceClientError> {
        let body = json!({"seq": seq});
        let proof = self.proof(key, method::ACK, &body);
        self.send(method::ACK, json!({"body": body, "origin_proof": proof})).await
    }

    /// The next thing the server pushed.
    pub async fn next(&mut self) -> Result<Pushed, DeviceClientError> {
        let frame = match self.pending.pop_front() {
            Some(f) => f,
            None => self.read().await?,
        };
        if frame.get("id").is_some() {
            return Ok(Pushed::Answer(frame));
        }
        if frame["method"] == method::EVENT {
            let Some(seq) = frame["params"]["seq"].as_i64() else { return Err(DeviceClientError::Unexpected(frame.to_string())) };
            let mut frame = frame;
            return Ok(Pushed::Event { seq, event: frame["params"]["event"].take() });
        }
        Ok(Pushed::Notice(frame))
    }

    /// The next text frame as it came, unparsed: for a reader that wants
    /// one field of it (the load generator). Frames read ahead while
    /// waiting for an answer come first.
    pub async fn next_text(&mut self) -> Result<String, DeviceClientError> {
        match self.pending.pop_front() {
            Some(frame) => Ok(frame.to_string()),
            None => self.read_text().await,
        }
    }

    /// The next text frame as JSON.
    async fn read(&mut self) -> Result<Value, DeviceClientError> {
        let text = self.read_text().await?;
        serde_json::from_str(&text).map_err(|_| DeviceClientError::Unexpected(text))
    }

    /// The next text frame; pings are answered as frames are read.
    async fn read_text(&mut self) -> Result<String, DeviceClientError> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Text(text))) => return Ok(text.as_str().to_owned()),
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame.map_or((1000, String::new()), |f| (u16::from(f.code), f.reason.to_string()));
                    return Err(DeviceClientError::Closed { code, reason });
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Err(DeviceClientError::Closed { code: 1006, reason: "connection lost".to_owned() }),
            }
        }
    }
}

/// A JSON-RPC answer's result, or its error.
fn result_of(mut frame: Value) -> Result<Value, DeviceClientError> {
    if let Some(error) = frame.get("error") {
        return Err(DeviceClientError::Refused {
            code: error["data"]["code"].as_str().unwrap_or("error").to_owned(),
            message: error["message"].as_str().unwrap_or("").to_owned(),
        });
    }
    Ok(frame["result"].take())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_websocket_url_of_a_base() {
        assert_eq!(ws_url("http://127.0.0.1:8080/", None), "ws://127.0.0.1:8080/v1/ws");
        assert_eq!(ws_url("https://h", Some("a.b+c")), "wss://h/v1/ws?access_token=a.b%2Bc");
        assert_eq!(ws_url("ws://h", None), "ws://h/v1/ws");
    }
}
