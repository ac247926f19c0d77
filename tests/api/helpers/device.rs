//! A WebSocket device for the tests (docs/ref-websocket.md): its key and
//! origin proofs ([`Key`]), and a JSON-RPC client over one connection
//! ([`Client`]) that keeps the notifications it read while waiting for an
//! answer.

use std::collections::VecDeque;
use std::time::Duration;

use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::TestApp;

/// A device's identity: an Ed25519 key and its `system/identity` entity.
pub(crate) struct Key {
    key: SigningKey,
    entity: Value,
}

impl Key {
    pub(crate) fn new() -> Self {
        let (key, entity, _) = crate::helpers::ed25519_identity();
        Key { key, entity }
    }

    /// `origin_proof` for `method` and `body` on the connection with `nonce`.
    pub(crate) fn proof(&self, method: &str, body: &Value, nonce: &str) -> Value {
        let target = tidings_protocol::identity::proof_target(method, body, nonce);
        let signature = base64::engine::general_purpose::STANDARD.encode(self.key.sign(target.as_bytes()).to_bytes());
        json!({"identity": self.entity, "signature": signature})
    }
}

pub(crate) type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A JSON-RPC client over one connection.
pub(crate) struct Client {
    pub(crate) ws: Socket,
    pub(crate) hello: Value,
    pub(crate) nonce: String,
    next_id: u64,
    /// Notifications received while waiting for an answer.
    pub(crate) pending: VecDeque<Value>,
}

impl Client {
    pub(crate) async fn connect(app: &TestApp) -> Self {
        Self::connect_with(app, "").await
    }

    /// Connects with a query string (`?access_token=…`).
    pub(crate) async fn connect_with(app: &TestApp, query: &str) -> Self {
        let url = format!("{}/v1/ws{query}", app.base.replace("http://", "ws://"));
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.expect("the upgrade succeeds");
        let hello = read_json(&mut ws).await;
        let nonce = hello["params"]["nonce"].as_str().unwrap_or_default().to_owned();
        Client { ws, hello, nonce, next_id: 1, pending: VecDeque::new() }
    }

    pub(crate) async fn send(&mut self, value: Value) {
        self.ws.send(Message::text(value.to_string())).await.unwrap();
    }

    /// Sends a request and waits for its answer (result or error).
    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        loop {
            let message = read_json(&mut self.ws).await;
            if message["id"] == id {
                return message;
            }
            self.pending.push_back(message);
        }
    }

    pub(crate) async fn auth(&mut self, key: &Key, body: Value) -> Value {
        let proof = key.proof("stream.auth", &body, &self.nonce);
        self.call("stream.auth", json!({"body": body, "origin_proof": proof})).await
    }

    /// Authenticates; `false` if the server closed the connection instead
    /// (over the stream limit).
    pub(crate) async fn authed_or_closed(&mut self, key: &Key, body: Value) -> bool {
        let proof = key.proof("stream.auth", &body, &self.nonce);
        self.send(json!({"jsonrpc": "2.0", "id": 0, "method": "stream.auth", "params": {"body": body, "origin_proof": proof}})).await;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.ws.next()).await.expect("an answer in time") {
                Some(Ok(Message::Text(text))) => return serde_json::from_str::<Value>(text.as_str()).unwrap()["result"].is_object(),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return false,
                Some(Ok(_)) => {}
            }
        }
    }

    pub(crate) async fn ack(&mut self, key: &Key, seq: i64) -> Value {
        let body = json!({"seq": seq});
        let proof = key.proof("stream.ack", &body, &self.nonce);
        self.call("stream.ack", json!({"body": body, "origin_proof": proof})).await
    }

    /// Notifications received while waiting for answers, not yet read.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The next notification.
    pub(crate) async fn notification(&mut self) -> Value {
        match self.pending.pop_front() {
            Some(n) => n,
            None => read_json(&mut self.ws).await,
        }
    }

    /// Reads until the server closes the connection (within 30 s): the
    /// text frames it sent before.
    pub(crate) async fn frames_until_closed(&mut self) -> Vec<Value> {
        let mut frames: Vec<Value> = self.pending.drain(..).collect();
        let closed = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match self.ws.next().await {
                    Some(Ok(Message::Text(text))) => frames.push(serde_json::from_str(text.as_str()).unwrap()),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the server closes within 30 s; it sent {frames:?}");
        frames
    }

    /// Reads until the server's close frame; its code and reason.
    pub(crate) async fn closed(&mut self) -> (u16, String) {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.ws.next()).await.expect("the server closes") {
                Some(Ok(Message::Close(Some(frame)))) => return (u16::from(frame.code), frame.reason.to_string()),
                Some(Ok(Message::Close(None))) | None => panic!("closed without a close frame"),
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("closed with {e}"),
            }
        }
    }
}

pub(crate) async fn read_json(ws: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("a frame in time").expect("open").unwrap();
        match message {
            Message::Text(text) => return serde_json::from_str(text.as_str()).unwrap(),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}
