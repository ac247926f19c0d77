//! The WebSocket device protocol (docs/ref-websocket.md): JSON-RPC 2.0 in
//! text frames, the server speaking first. Its method names, the JSON-RPC
//! error codes a refusal carries (beside its stable `data.code`), and the
//! close codes, in one place for the server, the Rust client and the
//! terminal commands, so none of them spells one by hand.

/// The methods, by who sends them.
pub mod method {
    /// Server → client, first: `{server_did, head_seq, profiles, nonce}`.
    pub const HELLO: &str = "stream.hello";
    /// Client → server, once: `{body: {device_id, cursor?, filter?}, origin_proof}`.
    pub const AUTH: &str = "stream.auth";
    /// Client → server: a page of history, `{device_id, since, limit?}`.
    pub const DELTA: &str = "sync.delta";
    /// Client → server: `{body: {seq}, origin_proof}` moves the stored cursor.
    pub const ACK: &str = "stream.ack";
    /// Client → server: `{token}`, a fresh token for the same `sub`.
    pub const REAUTH: &str = "stream.reauth";
    /// Server → client: `{seq, event}`, one event.
    pub const EVENT: &str = "stream.event";
    /// Server → client: what could not be served whole (or was lost in a
    /// failover): the same fields as a stream's `gap`.
    pub const GAP: &str = "stream.gap";
    /// Server → client: `{last_seq, reauth_by_ms}`, live delivery stopped
    /// until a `stream.reauth`.
    pub const TOKEN_EXPIRED: &str = "stream.token_expired";
    /// Server → client: `{budget}`, the filter's payload rule ran out of
    /// its budget on an event (which was not delivered).
    pub const FILTER_BUDGET_EXCEEDED: &str = "stream.filter_budget_exceeded";
}

/// The JSON-RPC `error.code` of a refusal (its `error.data.code` says
/// which one, stably).
pub mod rpc {
    /// The request is not one this protocol takes here.
    pub const INVALID_REQUEST: i64 = -32600;
    /// A parameter is malformed or over a limit.
    pub const INVALID_PARAMS: i64 = -32602;
    /// The server failed.
    pub const INTERNAL: i64 = -32603;
    /// No valid token (or none in time): `unauthorized`, `auth_timeout`,
    /// `token_expired`.
    pub const UNAUTHENTICATED: i64 = -32001;
    /// Valid, but not allowed: `proof_not_owner`, `reauth_other_identity`.
    pub const FORBIDDEN: i64 = -32003;
    /// What was named does not exist (any more).
    pub const NOT_FOUND: i64 = -32004;
    /// It changed meanwhile.
    pub const CONFLICT: i64 = -32009;
    /// Over a limit for now, or the store is unavailable: try again later.
    pub const TRY_LATER: i64 = -32013;
}

/// The close codes (RFC 6455's, as this protocol uses them).
pub mod close {
    /// Normal closure (also after a failed handshake's error frame).
    pub const NORMAL: u16 = 1000;
    /// The server shuts down.
    pub const GOING_AWAY: u16 = 1001;
    /// A protocol error (a method before `stream.auth`, say).
    pub const PROTOCOL: u16 = 1002;
    /// A binary frame.
    pub const UNSUPPORTED: u16 = 1003;
    /// The connection ended without a close frame (never sent; seen by a
    /// client).
    pub const ABNORMAL: u16 = 1006;
    /// Invalid UTF-8 or JSON.
    pub const INVALID: u16 = 1007;
    /// No successful `stream.auth` in time.
    pub const POLICY: u16 = 1008;
    /// A message over the server's size limit.
    pub const TOO_BIG: u16 = 1009;
    /// The server failed.
    pub const INTERNAL: u16 = 1011;
    /// The server restarts.
    pub const RESTART: u16 = 1012;
    /// Try again later: a slow consumer, or a stream limit.
    pub const TRY_LATER: u16 = 1013;

    /// Whether a client reconnects (with backoff, from its cursor) after a
    /// close with `code`: the server ended the connection, not the
    /// client's request. Any other code is a refusal the same request would
    /// meet again.
    pub fn reconnects(code: u16) -> bool {
        matches!(code, NORMAL | GOING_AWAY | ABNORMAL | INTERNAL | RESTART | TRY_LATER)
    }
}

#[cfg(test)]
mod tests {
    use super::close;

    #[test]
    fn a_client_reconnects_after_what_the_server_ended_not_after_a_refusal() {
        for code in [close::NORMAL, close::GOING_AWAY, close::ABNORMAL, close::INTERNAL, close::RESTART, close::TRY_LATER] {
            assert!(close::reconnects(code), "{code}");
        }
        for code in [close::PROTOCOL, close::UNSUPPORTED, close::INVALID, close::POLICY, close::TOO_BIG, 4000] {
            assert!(!close::reconnects(code), "{code}");
        }
    }
}
