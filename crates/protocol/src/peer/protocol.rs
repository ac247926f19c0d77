//! What tidings servers say to each other (docs/ref-subscriptions.md,
//! docs/ref-federation.md), in one place
//! for every caller: the courier's deliveries, the mirrors' subscriptions
//! and `tidings subscribe`.
//! - [`Execute`]: the signed `system/protocol/execute` envelope a peer's
//!   `POST /v1/execute` takes, built one way ([`SignedExecute`]: nothing
//!   else makes one);
//! - [`receive_token`]: the capability a subscriber grants its upstream to
//!   deliver into an inbox;
//! - [`Subscribed::from_answer`]: what a subscribe's answer says (`200`
//!   held, `303` redirected to relays, anything else refused);
//! - [`PeerError`]: why a call to a peer came to no answer, by kinds a
//!   caller can match.

use serde_json::{Map, Value, json};

use super::{MAX_ALTERNATIVES, Subscribed, alternatives};
use crate::identity::ServerIdentity;
use crate::tree::{Entity, generate_id};

/// The entity type of an EXECUTE.
pub const EXECUTE: &str = "system/protocol/execute";
/// Most characters of a peer's refusal message kept ([`PeerError::refused`]).
pub const MAX_MESSAGE: usize = 200;

/// Most epochs of its log a sender lists in a delivery (the newest).
pub const MAX_EPOCHS: usize = 64;

/// A `system/protocol/execute` being built: what it asks (`uri`,
/// `operation`, its targets and params), who asks (`author`), under which
/// capability; [`Execute::signed`] makes the envelope.
#[derive(Debug, Clone)]
pub struct Execute {
    data: Map<String, Value>,
}

impl Execute {
    /// `operation` on `uri`, asked by `author`, with a fresh request id,
    /// no targets and no params.
    pub fn new(uri: &str, operation: &str, author: &str) -> Self {
        let mut data = Map::new();
        data.insert("request_id".into(), json!(generate_id()));
        data.insert("uri".into(), json!(uri));
        data.insert("operation".into(), json!(operation));
        data.insert("resource".into(), json!({"targets": []}));
        data.insert("author".into(), json!(author));
        Self { data }
    }

    /// Its request id, instead of a fresh one (a delivery's id is its
    /// subscription and log id, so a retry is recognised as one).
    pub fn request_id(mut self, id: String) -> Self {
        self.data.insert("request_id".into(), Value::String(id));
        self
    }

    /// The resources it acts on (`resource.targets`).
    pub fn targets(mut self, targets: Value) -> Self {
        self.data.insert("resource".into(), json!({"targets": targets}));
        self
    }

    /// Its parameters: an entity of type `kind` with `data`.
    pub fn params(mut self, kind: &str, data: Value) -> Self {
        self.data.insert("params".into(), json!({"type": kind, "data": data}));
        self
    }

    /// The capability it is asked under (its hash; the chain travels in
    /// `included`).
    pub fn capability(mut self, hash: &str) -> Self {
        self.data.insert("capability".into(), json!(hash));
        self
    }

    /// The sender's log id of a delivery (`receive`).
    pub fn sequence(mut self, sequence: i64) -> Self {
        self.data.insert("sequence".into(), json!(sequence));
        self
    }

    /// The epochs of the sender's log after its first, oldest first, as
    /// `(number, fork, base)`: each lost the ids in `(fork, base]`, so a
    /// receiver whose mark lies there was notified of history that is gone
    /// (docs/ref-subscriptions.md, "When the sender loses history"). Only
    /// the newest [`MAX_EPOCHS`] travel; none, nothing is added.
    pub fn epochs(mut self, epochs: &[(i32, i64, i64)]) -> Self {
        let newest = &epochs[epochs.len().saturating_sub(MAX_EPOCHS)..];
        if !newest.is_empty() {
            let list: Vec<Value> =
                newest.iter().map(|(number, fork, base)| json!({"number": number, "fork": fork, "base": base})).collect();
            self.data.insert("epochs".into(), Value::Array(list));
        }
        self
    }

    /// The envelope `{execute, included}`: `key`'s signature over the
    /// EXECUTE's hash and `key`'s identity join what `included` carries
    /// (capability chains, bundled entities).
    pub fn signed(self, key: &ServerIdentity, mut included: Map<String, Value>) -> SignedExecute {
        let execute = Entity { kind: EXECUTE.into(), data: Value::Object(self.data) };
        key.sign_into(&execute.canonical().1, &mut included);
        SignedExecute(json!({"execute": execute, "included": included}))
    }
}

/// A signed EXECUTE envelope, `{execute, included}`, as a peer's
/// `POST /v1/execute` takes it. [`Execute::signed`] is the only way to make
/// one, so whatever sends a `SignedExecute` (the courier, the mirrors,
/// `tidings subscribe`, the peer benches) sends what the one builder made;
/// it reads as JSON ([`Deref`](std::ops::Deref)) and serializes as it.
///
/// ```
/// use tidings_protocol::identity::ServerIdentity;
/// use tidings_protocol::peer::protocol::{Execute, SignedExecute};
///
/// let key = ServerIdentity::from_key(ed25519_dalek::SigningKey::from_bytes(&[7; 32]));
/// let signed: SignedExecute = Execute::new("system/subscription", "subscribe", key.hash()).signed(&key, Default::default());
/// assert_eq!(signed["execute"]["type"], "system/protocol/execute");
/// ```
///
/// Nothing else makes one: not from a JSON value,
///
/// ```compile_fail
/// let forged = tidings_protocol::peer::protocol::SignedExecute(serde_json::json!({}));
/// ```
///
/// nor by parsing.
///
/// ```compile_fail
/// let forged: tidings_protocol::peer::protocol::SignedExecute = serde_json::from_str("{}").unwrap();
/// ```
#[derive(Debug, Clone, serde::Serialize)]
#[serde(transparent)]
pub struct SignedExecute(Value);

impl SignedExecute {
    /// The envelope as JSON, to inspect or change (a changed one is a
    /// `Value`, no longer a `SignedExecute`).
    pub fn into_value(self) -> Value {
        self.0
    }
}

impl std::ops::Deref for SignedExecute {
    type Target = Value;

    fn deref(&self) -> &Value {
        &self.0
    }
}

/// The token by which `key` lets `grantee` `receive` into `inbox` (a
/// path at `key`'s server), under `parent` (the token it extends) and until
/// `expires_at` (Unix ms) when given. The token and `key`'s signature over
/// it go into `included`; returns its hash.
pub fn receive_token(
    key: &ServerIdentity,
    grantee: &str,
    inbox: &str,
    parent: Option<&str>,
    expires_at: Option<i64>,
    included: &mut Map<String, Value>,
) -> String {
    let mut data = json!({
        "granter": key.hash(),
        "grantee": grantee,
        "grants": [{"handler": "system/inbox", "operations": ["receive"], "resources": [inbox]}],
    });
    if let Some(parent) = parent {
        data["parent"] = json!(parent);
    }
    if let Some(expires_at) = expires_at {
        data["expires_at"] = json!(expires_at);
    }
    let token = Entity { kind: "system/capability/token".into(), data };
    let (_, hash) = token.canonical();
    key.sign_into(&hash, included);
    included.insert(hash.clone(), serde_json::to_value(&token).unwrap_or_default());
    hash
}

impl Subscribed {
    /// What the answer to a subscribe says: `200` with its id, held there;
    /// `303`, the relays offered (at most [`MAX_ALTERNATIVES`], each a
    /// valid identity and endpoint); anything else refused.
    pub fn from_answer(status: u16, body: &Value) -> Self {
        match status {
            200 => match body["result"]["subscription_id"].as_str() {
                Some(id) => Subscribed::Held(id.to_owned()),
                None => Subscribed::Failed(PeerError::Unexpected(body.to_string())),
            },
            303 => Subscribed::Redirected(alternatives(body, MAX_ALTERNATIVES)),
            _ => Subscribed::Failed(PeerError::refused(status, body)),
        }
    }
}

/// Why a call to a peer came to no answer, or to a refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// `TIDINGS_PEER_ALLOW` does not let this server call that host:
    /// nothing was called.
    #[error("{0}")]
    NotAllowed(String),
    /// What should be a peer's URL is not one.
    #[error("{0}")]
    BadUrl(String),
    /// This server cannot call out at all (its client could not be built).
    #[error("this server has no working client for calls to peers")]
    NoClient,
    /// The peer is not known here, or its entity names no endpoint.
    #[error("{0}")]
    Unknown(String),
    /// The call came to no answer: no connection, a timeout, an answer cut
    /// short or over the bound on an answer's size.
    #[error("{0}")]
    Unreachable(String),
    /// The endpoint does not answer `GET /v1/identity` as the peer it is
    /// said to be.
    #[error("its relay_endpoint does not answer GET /v1/identity with that identity")]
    Unproven,
    /// The peer answered with a refusal: its status, error code and message.
    #[error("{status} {code}{}", if .message.is_empty() { String::new() } else { format!(": {}", .message) })]
    Refused {
        /// The HTTP status.
        status: u16,
        /// Its error code (`refused` when it gave none).
        code: String,
        /// Its message, if any.
        message: String,
    },
    /// The peer answered what the protocol does not allow there.
    #[error("unexpected answer {0}")]
    Unexpected(String),
    /// Capacity redirects led nowhere: a loop, or no alternative accepted.
    #[error("{0}")]
    Redirects(String),
    /// This server's own store failed while preparing the call.
    #[error("{0}")]
    Store(String),
}

impl PeerError {
    /// The refusal a peer answered with `status` and `body` (`{error:
    /// {code, message}}`), as this server keeps and shows it: a code that
    /// looks like one (`[a-z0-9_]`, at most 64 bytes) or `refused`, and at
    /// most [`MAX_MESSAGE`] characters of the message with no control
    /// characters. A peer's answer is hostile: it may be 16 MiB of anything.
    pub fn refused(status: u16, body: &Value) -> Self {
        let code = body["error"]["code"]
            .as_str()
            .filter(|c| !c.is_empty() && c.len() <= 64 && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        let message = body["error"]["message"].as_str().unwrap_or_default();
        PeerError::Refused {
            status,
            code: code.unwrap_or("refused").to_owned(),
            message: message.chars().filter(|c| !c.is_control()).take(MAX_MESSAGE).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::capability::{Included, verify_signed};

    fn key() -> ServerIdentity {
        ServerIdentity::from_key(ed25519_dalek::SigningKey::from_bytes(&[7; 32]))
    }

    #[test]
    fn an_execute_is_signed_over_its_hash_by_its_author() {
        let key = key();
        let envelope = Execute::new("system/subscription", "subscribe", key.hash())
            .targets(json!(["feeds/**"]))
            .params("system/subscription/request", json!({"include_payload": true}))
            .capability("sha256:cap")
            .signed(&key, Map::new());
        let execute: Entity = serde_json::from_value(envelope["execute"].clone()).unwrap();
        assert_eq!(execute.kind, EXECUTE);
        assert_eq!(execute.data["resource"], json!({"targets": ["feeds/**"]}));
        assert_eq!(execute.data["params"]["type"], "system/subscription/request");
        assert_eq!((execute.data["author"].as_str(), execute.data["capability"].as_str()), (Some(key.hash()), Some("sha256:cap")));
        let included: Included = serde_json::from_value(envelope["included"].clone()).unwrap();
        assert_eq!(verify_signed(&included, &execute.canonical().1, key.hash()), Ok(()));
        // Two builds are two requests.
        let again = Execute::new("system/subscription", "subscribe", key.hash()).signed(&key, Map::new());
        assert_ne!(again["execute"]["data"]["request_id"], envelope["execute"]["data"]["request_id"]);
    }

    #[test]
    fn a_receive_token_is_signed_and_carried() {
        let key = key();
        let mut included = Map::new();
        let hash = receive_token(&key, "sha256:peer", "system/inbox/x", Some("sha256:root"), Some(5), &mut included);
        let token = &included[&hash];
        assert_eq!(token["data"]["grantee"], "sha256:peer");
        assert_eq!((token["data"]["parent"].as_str(), token["data"]["expires_at"].as_i64()), (Some("sha256:root"), Some(5)));
        let included: Included = included.into_iter().collect();
        assert_eq!(verify_signed(&included, &hash, key.hash()), Ok(()));
    }

    #[test]
    fn a_subscribe_answer_is_held_redirected_or_refused() {
        let held = Subscribed::from_answer(200, &json!({"result": {"subscription_id": "s1"}}));
        assert_eq!(held, Subscribed::Held("s1".into()));
        assert!(matches!(Subscribed::from_answer(200, &json!({})), Subscribed::Failed(PeerError::Unexpected(_))));
        let relay = format!("sha256:{}", "a".repeat(64));
        let offered = json!({"result": {"data": {"alternatives": [
            {"peer": relay, "endpoint": "http://127.0.0.1:1"}, {"peer": "not-a-hash", "endpoint": "http://127.0.0.1:2"}]}}});
        assert_eq!(Subscribed::from_answer(303, &offered), Subscribed::Redirected(vec![(relay, "http://127.0.0.1:1".into())]));
        let refused = Subscribed::from_answer(403, &json!({"error": {"code": "forbidden", "message": "no"}}));
        let Subscribed::Failed(why) = refused else { panic!("{refused:?}") };
        assert_eq!(why.to_string(), "403 forbidden: no");
        assert_eq!(PeerError::refused(500, &json!(null)).to_string(), "500 refused");
        // What a hostile peer answers is kept bounded and printable.
        let hostile = json!({"error": {"code": "Not A Code\n", "message": format!("a\u{1b}[31m\r\n{}", "x".repeat(1 << 20))}});
        let PeerError::Refused { code, message, .. } = PeerError::refused(503, &hostile) else { panic!() };
        assert_eq!(code, "refused");
        assert_eq!(message.chars().count(), MAX_MESSAGE);
        assert!(message.starts_with("a[31mxx") && !message.chars().any(char::is_control), "{message:?}");
    }
}
