//! The WebSocket device protocol (docs/ref-websocket.md): JSON-RPC 2.0 in
//! text frames, the server speaking first. Its method names, the JSON-RPC
//! error codes a refusal carries (beside its stable `data.code`), and the
//! close codes, in one place for the server, the Rust client and the
//! terminal commands, so none of them spells one by hand.

/// Defines each constant and `$table`, every one of them by name: the one
/// list the JavaScript and Python clients' constants are generated from
/// (`tests/api/ws_protocol.rs` fails when they drift).
macro_rules! catalog {
    ($(#[doc = $table_doc:expr])* $table:ident: $ty:ty { $($(#[doc = $doc:expr])* $name:ident = $value:expr;)* }) => {
        $($(#[doc = $doc])* pub const $name: $ty = $value;)*
        $(#[doc = $table_doc])*
        pub const $table: &[(&str, $ty)] = &[$((stringify!($name), $name)),*];
    };
}

/// The methods, by who sends them.
pub mod method {
    catalog! {
        /// Every method, by name: what the clients in other languages are generated from.
        ALL: &str {
            /// Server → client, first: `{server_did, head_seq, profiles, nonce}`.
            HELLO = "stream.hello";
            /// Client → server, once: `{body: {device_id, cursor?, filter?}, origin_proof}`.
            AUTH = "stream.auth";
            /// Client → server: a page of history, `{device_id, since, limit?}`.
            DELTA = "sync.delta";
            /// Client → server: `{body: {seq}, origin_proof}` moves the stored cursor.
            ACK = "stream.ack";
            /// Client → server: `{token}`, a fresh token for the same `sub`.
            REAUTH = "stream.reauth";
            /// Server → client: `{seq, event}`, one event.
            EVENT = "stream.event";
            /// Server → client: what could not be served whole (or was lost in a
            /// failover): the same fields as a stream's `gap`.
            GAP = "stream.gap";
            /// Server → client: `{last_seq, reauth_by_ms}`, live delivery stopped
            /// until a `stream.reauth`.
            TOKEN_EXPIRED = "stream.token_expired";
            /// Server → client: `{budget}`, the filter's payload rule ran out of
            /// its budget on an event (which was not delivered).
            FILTER_BUDGET_EXCEEDED = "stream.filter_budget_exceeded";
        }
    }
}

/// The JSON-RPC `error.code` of a refusal (its `error.data.code` says
/// which one, stably).
pub mod rpc {
    catalog! {
        /// Every code, by name.
        ALL: i64 {
            /// The request is not one this protocol takes here.
            INVALID_REQUEST = -32600;
            /// JSON-RPC's own "method not found". tidings closes with
            /// [`close::PROTOCOL`](super::close::PROTOCOL) instead, but a
            /// client takes it as final too.
            METHOD_NOT_FOUND = -32601;
            /// A parameter is malformed or over a limit.
            INVALID_PARAMS = -32602;
            /// The server failed.
            INTERNAL = -32603;
            /// No valid token (or none in time): `unauthorized`, `auth_timeout`,
            /// `token_expired`.
            UNAUTHENTICATED = -32001;
            /// Valid, but not allowed: `proof_not_owner`, `reauth_other_identity`.
            FORBIDDEN = -32003;
            /// What was named does not exist (any more).
            NOT_FOUND = -32004;
            /// It changed meanwhile.
            CONFLICT = -32009;
            /// Over a limit for now, or the store is unavailable: try again later.
            TRY_LATER = -32013;
        }
    }

    /// Whether a client stops on a refusal with `code` instead of retrying
    /// it: the same request would meet it again (malformed, unknown, no
    /// valid token, not allowed). Any other code is retried with backoff.
    pub fn is_final(code: i64) -> bool {
        matches!(code, INVALID_REQUEST | METHOD_NOT_FOUND | INVALID_PARAMS | UNAUTHENTICATED | FORBIDDEN)
    }
}

/// The close codes (RFC 6455's, as this protocol uses them).
pub mod close {
    catalog! {
        /// Every close code, by name.
        ALL: u16 {
            /// Normal closure (also after a failed handshake's error frame).
            NORMAL = 1000;
            /// The server shuts down.
            GOING_AWAY = 1001;
            /// A protocol error (a method before `stream.auth`, say).
            PROTOCOL = 1002;
            /// A binary frame.
            UNSUPPORTED = 1003;
            /// The connection ended without a close frame (never sent; seen by a
            /// client).
            ABNORMAL = 1006;
            /// Invalid UTF-8 or JSON.
            INVALID = 1007;
            /// No successful `stream.auth` in time.
            POLICY = 1008;
            /// A message over the server's size limit.
            TOO_BIG = 1009;
            /// The server failed.
            INTERNAL = 1011;
            /// The server restarts.
            RESTART = 1012;
            /// Try again later: a slow consumer, or a stream limit.
            TRY_LATER = 1013;
        }
    }

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
    use super::{close, rpc};

    #[test]
    fn a_client_stops_on_a_refusal_it_would_meet_again_and_retries_the_rest() {
        let finals: Vec<i64> = rpc::ALL.iter().map(|(_, code)| *code).filter(|c| rpc::is_final(*c)).collect();
        assert_eq!(finals, [-32600, -32601, -32602, -32001, -32003]);
        assert!(!rpc::is_final(rpc::TRY_LATER) && !rpc::is_final(rpc::INTERNAL));
        assert_eq!(close::ALL.len(), 11, "every close code is in the catalog");
    }

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
