//! `GET /v1/ws`: the WebSocket JSON-RPC transport for devices and CLIs
//! behind NAT (docs/ref-websocket.md). This file frames and drives one
//! connection: the `stream.hello` it speaks first, `stream.auth`,
//! `sync.delta` and `stream.ack` requests, `stream.event` notifications and
//! the close codes.
//! What they decide (proofs, the device cursor, catch-up pages) is
//! [`crate::service::device`]; delivery is a
//! [`Session`](crate::service::session::Session), as for SSE.
//!
//! Frames: [`super::ws_socket`], tungstenite's frame headers over buffers
//! of ours. The upgrade runs through the same router, middleware and caller
//! extraction as every route; an idle connection keeps no read or write
//! buffer, a delivery's frames leave in one vectored write, and each
//! event's `stream.event` message is built once and shared by every
//! connection it goes to ([`crate::broker::Frame::rendered`]); while a
//! live device waits, the broker writes those messages itself
//! ([`super::ws_park`]). An idle connection costs about what an idle SSE
//! stream does (docs/benchmarks.md).
//!
//! Order (docs/ref-websocket.md, "Ordering"; none of it reversed): hello
//! before reading anything; at auth the live subscription is registered
//! before the head is read; realtime frames start only once catch-up was
//! answered up to at least that head (at once when the device's cursor is the
//! head). While a device catches up no live subscription is held, so nothing
//! can overflow or be dropped: when its last `sync.delta` page reaches the
//! head, delivery goes live after exactly that page's end (history first,
//! then live, as a resumed SSE stream does).

use std::pin::Pin;
use std::sync::Arc;
use tidings_protocol::wire;
use tidings_protocol::ws::{close, method, rpc};

use axum::Extension;
use axum::extract::State;
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use super::ws_park::{self, WsIo};
use super::ws_socket::{Incoming, NotUpgrade, Socket, Upgrade};
use crate::auth::Identity;
use crate::config::Compression;
use crate::filter::Filter;
use crate::server::Connection;
use crate::service::device::{self, DeviceError};
use crate::service::error::Refusal;
use crate::service::limits::StreamPermit;
use crate::service::session::{End, Item, Session, Start, record_delivery};
use tidings_protocol::event::EventId;

/// The profiles `stream.hello` announces.
const PROFILES: [&str; 2] = ["x_tidings.stream.v1", "x_tidings.inbox.v1"];

/// Close codes (RFC 6455, as docs/ref-websocket.md, "Close codes", uses them).
/// Opens a WebSocket: JSON-RPC 2.0 text frames; the server speaks first.
#[utoipa::path(
    get,
    path = "/v1/ws",
    tag = "streams",
    responses(
        (status = 101, description = "Switching protocols: JSON-RPC 2.0 text frames. The server sends `stream.hello {server_did, head_seq, profiles, nonce}`; the client sends `stream.auth {body: {device_id, cursor?, filter?}, origin_proof}` once, then `sync.delta {device_id, since, limit?}` pages and `stream.ack {body: {seq}, origin_proof}`; the server pushes `stream.event {seq, event}`. Errors carry `data.code` (`proof_invalid`, `proof_not_owner`, `invalid_device_id`, `invalid_seq`, `invalid_filter`, `invalid_request`, `unauthorized`, `auth_timeout`, `token_expired`, `reauth_other_identity`). When the token expires the server stops live delivery and sends `stream.token_expired {last_seq, reauth_by_ms}`; `stream.reauth {token}` with a fresh token for the same `sub` (within TIDINGS_REAUTH_GRACE) resumes it, else an error frame and close 1000. Close codes: a client's close answered with its own code, 1000 normal (also after a failed handshake), 1001 shutdown, 1002 protocol error, 1003 binary frame, 1007 invalid UTF-8 or JSON, 1008 no successful `stream.auth` within TIDINGS_WS_AUTH_TIMEOUT (after an error frame with `data.code` `auth_timeout`), 1009 message over TIDINGS_WS_MAX_MESSAGE, 1011 internal error, 1013 try again later (`slow_consumer`, stream limits)"),
        (status = 426, description = "`upgrade_required`: not a WebSocket upgrade request", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
#[expect(clippy::disallowed_methods, reason = "an upgraded WebSocket is served on a task of its own, owned by its connection's kill token")]
pub(crate) async fn upgrade(
    State(app): State<AppState>,
    caller: Result<Caller, ApiError>,
    connection: Option<Extension<Connection>>,
    ws: Result<Upgrade, NotUpgrade>,
) -> Response {
    let ws = match ws {
        Ok(ws) => ws,
        Err(refusal) => return refusal.into_response(),
    };
    let max_message = app.settings().ws.ws_max_message;
    // A refused token is answered on the socket (one error frame, then
    // close 1000), as the protocol says, rather than as an HTTP refusal.
    let caller = caller.map(|c| c.0).map_err(|_| "unauthorized");
    let permit = caller.as_ref().ok().map(|c| app.core().limits().acquire_stream(c).map_err(|e| e.code()));
    let kill = connection.as_ref().map(|c| c.0.kill_token());
    let compression = app.settings().streams.compression == Compression::On;
    let response = ws.response(compression);
    let pending = Box::new(Pending { caller, permit });
    let task = connection_task(ws, app, kill, pending, max_message, compression);
    // On the server's tracker, as a stream is: a graceful shutdown waits
    // for the session's close (1001) to go out.
    match connection {
        Some(Extension(connection)) => connection.spawn(task),
        None => drop(tokio::spawn(task)),
    }
    response
}

/// The connection's task: its `101` going out (boxed), then [`Ws::run`],
/// chained, not nested: a task keeps its largest state for its whole life,
/// and this one keeps neither the upgrade nor what [`Ws`] is made of.
fn connection_task(
    ws: Upgrade,
    app: AppState,
    kill: Option<CancellationToken>,
    pending: Box<Pending>,
    max_message: usize,
    compression: bool,
) -> impl Future<Output = ()> + Send {
    use futures_util::FutureExt as _;
    Box::pin(ws.socket(max_message, compression)).then(move |socket| {
        let ws = socket.map(|socket| {
            if socket.deflates() {
                crate::metrics::stream_compressed();
            }
            let nonce = tidings_protocol::tree::generate_id();
            Ws { socket, app, nonce, awaiting_pong: false, device: None, kill, pending: Some(pending) }
        });
        futures_util::future::OptionFuture::from(ws.map(Ws::run)).map(drop)
    })
}

/// What a connection holds until `stream.auth`: the caller and its place in
/// the stream limits, or why there is none. Boxed and gone once the device
/// authenticated, so an open connection carries no room for it.
struct Pending {
    caller: Result<Identity, &'static str>,
    permit: Option<Result<StreamPermit, &'static str>>,
}

/// An authenticated device.
struct Device {
    owner: String,
    device_id: String,
    caller: Identity,
    filter_json: Option<String>,
    filter: Arc<Filter>,
    /// The head read at auth: realtime starts once catch-up reached it.
    head: EventId,
    /// The highest seq the device has from this connection or its cursor:
    /// realtime frames at or below it are not sent again.
    delivered: EventId,
    /// Live delivery, once realtime started.
    session: Option<Session>,
    /// What the broker writes for that session, if it does.
    sink: Option<Arc<ws_park::Sink>>,
    /// Held while the device is connected.
    _permit: StreamPermit,
    /// Its token expired and it was told (`stream.token_expired`): the
    /// connection closes at this time (Unix ms) unless `stream.reauth`
    /// brings a fresh token for the same `sub`.
    reauth_by: Option<i64>,
    /// Whether it was live when its token expired (else it was catching
    /// up with `sync.delta`, and goes on doing so after a reauth).
    live_at_expiry: bool,
}

impl Device {
    /// Live delivery stops: its session is gone (the broker writes no more
    /// for it), and what the broker wrote counts as delivered. Returns
    /// whether it was live.
    fn stop_live(&mut self) -> bool {
        let live = self.session.take().is_some();
        if let Some(sink) = self.sink.take() {
            self.delivered = self.delivered.max(sink.had());
        }
        live
    }
}

/// One connection.
struct Ws {
    socket: Socket<WsIo>,
    app: AppState,
    nonce: String,
    awaiting_pong: bool,
    device: Option<Box<Device>>,
    /// Closes the socket itself: what the broker's eviction uses on a
    /// device that stopped reading, whose writes can no longer finish.
    kill: Option<CancellationToken>,
    /// Until auth (see [`Pending`]); taken by [`Ws::run`] at once.
    pending: Option<Box<Pending>>,
}

/// The deadline key of a connection that has not authenticated (any
/// other is a Unix time in ms).
const UNAUTHENTICATED: i64 = -1;

/// A Unix time in ms as the runtime's instant.
fn instant_at(unix_ms: i64) -> tokio::time::Instant {
    let left = unix_ms.saturating_sub(chrono::Utc::now().timestamp_millis());
    tokio::time::Instant::now() + std::time::Duration::from_millis(u64::try_from(left).unwrap_or(0))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// What handling one message leads to.
enum Next {
    Go,
    Close(u16, &'static str),
}

impl Ws {
    /// The connection, start to end. A plain function returning one block:
    /// an `async fn` keeps its arguments twice (as captures and as locals),
    /// and this future is what every open connection carries.
    #[expect(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice for its whole life")]
    fn run(mut self) -> impl Future<Output = ()> + Send {
        async move {
            // A temporary, written as text and freed once written: a local
            // of this block would live as long as the connection.
            let hello = json!({"jsonrpc": "2.0", "method": method::HELLO, "params": wire::Hello {
                server_did: self.app.core().identity().hash().to_string(),
                head_seq: self.app.core().broker().position(),
                profiles: PROFILES.iter().map(|p| (*p).to_owned()).collect(),
                nonce: self.nonce.clone(),
            }})
            .to_string();
            // The writes before the loop and after it, and the rare ones
            // in it (a ping, a deadline), are boxed: this future is what
            // every open connection carries, sized for its largest state.
            let socket = &mut self.socket;
            if Box::pin(async move { socket.send_text(hello.as_bytes()).await }).await.is_err() {
                return;
            }
            // Until auth, when the device takes it.
            let mut pending = self.pending.take();
            match pending.as_deref() {
                Some(Pending { caller: Err(code), .. }) => {
                    let code = *code;
                    let _ = Box::pin(self.send_error(&Value::Null, rpc::UNAUTHENTICATED, code, "the token is missing or not valid")).await;
                    return Box::pin(self.close(close::NORMAL, code)).await;
                }
                Some(Pending { permit: Some(Err(code)), .. }) => return Box::pin(self.close(close::TRY_LATER, code)).await,
                _ => {}
            }
            // Watched for the connection's life, each at the cost of a
            // flag's load per wake-up (a device wakes once per delivery).
            let mut shutdown = std::pin::pin!(crate::server::Watch::new(self.app.core().shutdown_token()));
            let mut kill = std::pin::pin!(crate::server::Watch::new(self.kill.clone().unwrap_or_default()));
            let mut ping = tokio::time::interval(self.app.settings().streams.heartbeat);
            ping.tick().await;
            // One deadline at a time, boxed so a connection without one
            // carries no timer: until the device authenticates,
            // TIDINGS_WS_AUTH_TIMEOUT (an unauthenticated socket holds a
            // place in the stream limits); then its token's expiry; then,
            // once told, the grace for `stream.reauth`.
            let mut timer: Option<(i64, Pin<Box<tokio::time::Sleep>>)> =
                Some((UNAUTHENTICATED, Box::pin(tokio::time::sleep(self.app.settings().ws.ws_auth_timeout))));
            let link = self.socket.link().cloned();
            loop {
                let want = match self.device.as_deref() {
                    None => Some(UNAUTHENTICATED),
                    Some(dev) => dev.reauth_by.or(dev.caller.expires_at.map(|at| at.saturating_mul(1000))),
                };
                if want != timer.as_ref().map(|(at, _)| *at) {
                    timer = want.map(|at| (at, Box::pin(tokio::time::sleep_until(instant_at(at)))));
                }
                let next = tokio::select! {
                    _ = shutdown.as_mut() => Next::Close(close::GOING_AWAY, "shutdown"),
                    _ = kill.as_mut() => return,
                    _ = async { if let Some((_, t)) = timer.as_mut() { t.await } }, if timer.is_some() => {
                        timer = None;
                        Box::pin(self.on_deadline()).await
                    }
                    message = std::future::poll_fn(|cx| self.socket.poll_recv(cx)) => match message {
                        None => return,
                        // Boxed: handling a request (auth, catch-up, acks: store
                        // round trips) is the largest state of a connection, and
                        // an idle one should not carry its room.
                        Some(Ok(message)) => {
                            // What a request brings goes before the events that come
                            // while it is handled, as when this task wrote them all.
                            link.iter().for_each(|l| l.set_idle(false));
                            Box::pin(self.on_message(message, &mut pending)).await
                        }
                        Some(Err(e)) => Next::Close(e.close().0, e.close().1),
                    },
                    // Boxed too: writing a delivery is a large state that an
                    // idle connection would otherwise carry.
                    item = ws_park::next_item(self.device.as_mut().and_then(|d| d.session.as_mut()), link.as_deref()) => match item {
                        Some(item) => Box::pin(self.on_item(item)).await,
                        // A broker write's rest goes out before anything else.
                        None if self.socket.settle().await.is_err() => return,
                        None => Next::Go,
                    },
                    _ = ping.tick() => {
                        if self.awaiting_pong {
                            // No pong within a heartbeat interval: the peer is gone.
                            return;
                        }
                        self.awaiting_pong = true;
                        if Box::pin(self.socket.send_ping()).await.is_err() { return; }
                        Next::Go
                    }
                };
                if let Next::Close(code, reason) = next {
                    return Box::pin(self.close(code, reason)).await;
                }
            }
        }
    }

    /// A session as SSE streams have it, evicted the same way, but without
    /// heartbeats: the connection pings on its own timer, and a session's
    /// heartbeat timer would cost every idle device a timer that does
    /// nothing.
    ///
    /// On a connection the broker can write to, with a [`ws_park::Sink`]
    /// (returned too) for a device that has every event up to `floor`.
    fn session_options(
        &self,
        filter: &Arc<Filter>,
        expires_at: Option<i64>,
        floor: EventId,
    ) -> (crate::service::session::SessionOptions, Option<Arc<ws_park::Sink>>) {
        let mut options = self.app.core().session_options("ws");
        options.kill = self.kill.clone();
        options.heartbeat = None;
        options.expires_at = expires_at;
        let sink = ws_park::Sink::of(self.socket.link(), self.socket.deflates(), filter, expires_at, floor);
        options.sink = sink.clone().map(|s| s as Arc<dyn crate::broker::Sink>);
        (options, sink)
    }

    async fn close(&mut self, code: u16, reason: &'static str) {
        let _ = self.socket.send_close(code, reason).await;
    }

    async fn send_json(&mut self, value: &Value) -> std::io::Result<()> {
        self.socket.send_text(value.to_string().as_bytes()).await
    }

    async fn send_error(&mut self, id: &Value, code: i64, data_code: &str, message: &str) -> std::io::Result<()> {
        let frame = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": {"code": data_code}}});
        self.send_json(&frame).await
    }

    /// A typed refusal as a JSON-RPC error.
    async fn send_refusal(&mut self, id: &Value, refusal: &(dyn Refusal + Sync)) -> Next {
        let (code, data_code, message) = (super::error::rpc_code(refusal.kind()), refusal.code(), refusal.message());
        match self.send_error(id, code, data_code, &message).await {
            Ok(()) => Next::Go,
            Err(_) => Next::Close(close::INTERNAL, "write_failed"),
        }
    }

    async fn on_message(&mut self, message: Incoming, pending: &mut Option<Box<Pending>>) -> Next {
        let text = match message {
            Incoming::Text(text) => text,
            Incoming::Binary => return Next::Close(close::UNSUPPORTED, "text_frames_only"),
            Incoming::Pong => {
                self.awaiting_pong = false;
                return Next::Go;
            }
            Incoming::Ping(payload) => {
                return match self.socket.send_pong(&payload).await {
                    Ok(()) => Next::Go,
                    Err(_) => Next::Close(close::INTERNAL, "write_failed"),
                };
            }
            // Answered with the client's own code (RFC 6455 §5.5.1).
            Incoming::Close(code) => return Next::Close(code.unwrap_or(close::NORMAL), "closed"),
        };
        // Strict: a key given twice is as unreadable as broken JSON.
        let Ok(request) = crate::json::strict_value(text.as_bytes()) else { return Next::Close(close::INVALID, "invalid_json") };
        let (Some(method), true) = (request["method"].as_str(), request["jsonrpc"] == "2.0") else {
            return Next::Close(close::PROTOCOL, "not_jsonrpc");
        };
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let params = request.get("params").cloned().unwrap_or(Value::Null);
        match method {
            method::AUTH => self.auth(&id, params, pending).await,
            method::DELTA if self.device.is_none() => Next::Close(close::PROTOCOL, "delta_before_auth"),
            method::ACK if self.device.is_none() => Next::Close(close::PROTOCOL, "ack_before_auth"),
            method::REAUTH if self.device.is_none() => Next::Close(close::PROTOCOL, "reauth_before_auth"),
            method::REAUTH => self.reauth(&id, &params).await,
            _ if self.device.as_deref().is_some_and(|d| d.reauth_by.is_some()) => {
                match self
                    .send_error(&id, rpc::UNAUTHENTICATED, "token_expired", "the token expired: send stream.reauth with a fresh token")
                    .await
                {
                    Ok(()) => Next::Go,
                    Err(_) => Next::Close(close::INTERNAL, "write_failed"),
                }
            }
            method::DELTA => self.delta(&id, &params).await,
            method::ACK => self.ack(&id, params).await,
            _ => Next::Close(close::PROTOCOL, "unknown_method"),
        }
    }

    async fn auth(&mut self, id: &Value, params: Value, pending: &mut Option<Box<Pending>>) -> Next {
        let Some(Pending { caller: Ok(identity), .. }) = pending.as_deref().filter(|_| self.device.is_none()) else {
            return match self.send_error(id, rpc::INVALID_REQUEST, "invalid_request", "stream.auth is sent once per connection").await {
                Ok(()) => Next::Go,
                Err(_) => Next::Close(close::INTERNAL, "write_failed"),
            };
        };
        let body = params.get("body").cloned().unwrap_or(Value::Null);
        let owner = match device::verify(method::AUTH, &body, &self.nonce, params.get("origin_proof")) {
            Ok(owner) => owner,
            Err(e) => {
                let _ = self.send_refusal(id, &e).await;
                return Next::Close(close::NORMAL, "proof_invalid");
            }
        };
        let device_id = body["device_id"].as_str().unwrap_or("").to_owned();
        if let Err(e) = device::check_device_id(&device_id) {
            return self.send_refusal(id, &e).await;
        }
        let given = match body.get("cursor") {
            None | Some(Value::Null) => None,
            Some(v) => match crate::json::as_uint(v).and_then(|c| EventId::try_from(c).ok()) {
                Some(c) => Some(c),
                None => return self.send_refusal(id, &DeviceError::InvalidSeq).await,
            },
        };
        let core = self.app.core().clone();
        let filter_json = body.get("filter").filter(|f| !f.is_null()).map(Value::to_string);
        let filter = match &filter_json {
            Some(json) => match Filter::from_json(json, core.filter_limits()) {
                Ok(f) => f,
                Err(e) => return self.send_refusal(id, &e).await,
            },
            None => Filter::any(),
        };
        let filter = Arc::new(identity.restrict(filter));
        // Register first, then read the head: the session's position is
        // the head as of its registration.
        let (options, sink) = self.session_options(&filter, identity.expires_at, 0);
        let session = match Session::open(&core, filter.clone(), Start::Now, options).await {
            Ok(s) => s,
            Err(e) => return self.send_refusal(id, &e).await,
        };
        // The authoritative head is the store's, read after registering:
        // the broker's position may not have seen the latest commits yet
        // (PostgreSQL wakes it by LISTEN), and the session delivers
        // everything after that position, so what lies between the two
        // arrives live and is skipped below up to the device's cursor.
        let head = match core.store().head().await {
            Ok(h) => h.max(session.cursor()),
            Err(e) => return self.send_refusal(id, &e).await,
        };
        let (cursor, told) = match device::resume_point(&core, &owner, &device_id, given, head).await {
            Ok(c) => c,
            Err(e) => return self.send_refusal(id, &e).await,
        };
        // At the head: realtime right away, on the session registered above.
        // Behind: the device catches up with sync.delta first.
        let session = (cursor >= head).then_some(session);
        sink.iter().for_each(|s| s.raise(cursor));
        // Taken only now: an auth refused above can be sent again.
        let Some(Pending { caller: Ok(caller), permit: Some(Ok(permit)) }) = pending.take().map(|p| *p) else {
            return Next::Close(close::INTERNAL, "no_permit");
        };
        self.device = Some(Box::new(Device {
            owner,
            device_id,
            caller,
            filter_json,
            filter,
            head,
            delivered: cursor,
            sink: sink.filter(|_| session.is_some()),
            session,
            _permit: permit,
            reauth_by: None,
            live_at_expiry: false,
        }));
        let next = self.answer(id, json!(wire::AuthAnswer { head_seq: head, cursor })).await;
        match told {
            // The store lost history this device may have been shown past
            // its stored cursor: said once, right after the answer.
            Some(gap) if matches!(next, Next::Go) => {
                let notice = json!({"jsonrpc": "2.0", "method": method::GAP, "params": gap.to_json()});
                match self.send_json(&notice).await {
                    Ok(()) => Next::Go,
                    Err(_) => Next::Close(close::INTERNAL, "write_failed"),
                }
            }
            _ => next,
        }
    }

    async fn delta(&mut self, id: &Value, params: &Value) -> Next {
        let Some(dev) = self.device.as_deref() else { return Next::Close(close::PROTOCOL, "delta_before_auth") };
        if dev.caller.expires_at.is_some_and(|at| at * 1000 <= now_ms()) {
            // Past the token's life, before its timer said so: nothing more under it.
            return self.on_deadline().await;
        }
        if params["device_id"].as_str() != Some(dev.device_id.as_str()) {
            let e = DeviceError::InvalidDeviceId;
            return self.send_refusal(id, &e).await;
        }
        let Some(since) = crate::json::as_uint(&params["since"]).and_then(|s| EventId::try_from(s).ok()) else {
            return self.send_refusal(id, &DeviceError::InvalidSeq).await;
        };
        let limit = params.get("limit").and_then(crate::json::as_uint);
        let core = self.app.core().clone();
        let page = match device::delta(&core, &dev.caller, dev.filter_json.clone(), since, limit).await {
            Ok(page) => page,
            Err(e) => return self.send_refusal(id, &e).await,
        };
        let mut out = Vec::with_capacity(128 + page.events.iter().map(|f| f.envelope.len() + 32).sum::<usize>());
        out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        out.extend_from_slice(id.to_string().as_bytes());
        out.extend_from_slice(b",\"result\":{\"items\":[");
        for (i, frame) in page.events.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(format!("{{\"seq\":{},\"event\":", frame.id).as_bytes());
            out.extend_from_slice(&frame.envelope);
            out.push(b'}');
        }
        out.extend_from_slice(format!("],\"next_since\":{},\"has_more\":{}", page.next_since, page.has_more).as_bytes());
        if let Some(gap) = page.gap {
            let gap = gap.to_json();
            out.extend_from_slice(format!(",\"gap\":{gap}").as_bytes());
        }
        out.extend_from_slice(b"}}");
        if self.socket.send_text(&out).await.is_err() {
            return Next::Close(close::INTERNAL, "write_failed");
        }
        // Caught up to at least the head of the auth: realtime from exactly
        // where this answer ends.
        let Some(dev) = self.device.as_deref_mut() else { return Next::Go };
        dev.delivered = dev.delivered.max(page.next_since);
        if dev.session.is_none() && !page.has_more && page.next_since >= dev.head {
            let (filter, expires_at, delivered) = (dev.filter.clone(), dev.caller.expires_at, dev.delivered);
            let (options, sink) = self.session_options(&filter, expires_at, delivered);
            let Some(dev) = self.device.as_deref_mut() else { return Next::Go };
            match Session::open(&core, filter, Start::After(page.next_since), options).await {
                Ok(session) => (dev.session, dev.sink) = (Some(session), sink),
                Err(e) => return self.send_refusal(&Value::Null, &e).await,
            }
        }
        Next::Go
    }

    async fn ack(&mut self, id: &Value, params: Value) -> Next {
        let Some(dev) = self.device.as_deref() else { return Next::Close(close::PROTOCOL, "ack_before_auth") };
        let (owner, device_id) = (dev.owner.clone(), dev.device_id.clone());
        let body = params.get("body").cloned().unwrap_or(Value::Null);
        let signer = match device::verify(method::ACK, &body, &self.nonce, params.get("origin_proof")) {
            Ok(signer) => signer,
            Err(e) => return self.send_refusal(id, &e).await,
        };
        if signer != owner {
            return self.send_refusal(id, &DeviceError::NotOwner).await;
        }
        let Some(seq) = crate::json::as_uint(&body["seq"]).and_then(|s| EventId::try_from(s).ok()) else {
            return self.send_refusal(id, &DeviceError::InvalidSeq).await;
        };
        let core = self.app.core().clone();
        match device::ack(&core, &owner, &device_id, seq).await {
            Ok(cursor) => self.answer(id, json!(wire::AckAnswer { cursor })).await,
            Err(e) => self.send_refusal(id, &e).await,
        }
    }

    /// The connection's deadline passed: before auth, it closes (1008);
    /// at the token's expiry, live delivery stops and the device is told
    /// (`stream.token_expired`), with `TIDINGS_REAUTH_GRACE` to send
    /// `stream.reauth`; after that, it closes (1000).
    async fn on_deadline(&mut self) -> Next {
        let grace = self.app.settings().ws.reauth_grace;
        let Some(dev) = self.device.as_deref_mut() else {
            let _ = self.send_error(&Value::Null, rpc::UNAUTHENTICATED, "auth_timeout", "stream.auth was not sent in time").await;
            return Next::Close(close::POLICY, "auth_timeout");
        };
        if dev.reauth_by.is_some() {
            let _ = self
                .send_error(&Value::Null, rpc::UNAUTHENTICATED, "token_expired", "the token expired and no fresh one came in time")
                .await;
            return Next::Close(close::NORMAL, "token_expired");
        }
        dev.live_at_expiry = dev.stop_live();
        let by = now_ms().saturating_add(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX));
        dev.reauth_by = Some(by);
        let notice = json!({"jsonrpc": "2.0", "method": method::TOKEN_EXPIRED, "params": wire::DeviceTokenExpired { last_seq: dev.delivered, reauth_by_ms: by }});
        match self.send_json(&notice).await {
            Ok(()) => Next::Go,
            Err(_) => Next::Close(close::INTERNAL, "write_failed"),
        }
    }

    /// `stream.reauth {token}`: a fresh token for the same `sub` extends
    /// the connection (its grants and visibility take over); live delivery
    /// goes on from where it stopped.
    async fn reauth(&mut self, id: &Value, params: &Value) -> Next {
        let crate::auth::AuthMode::Jwt(verifier) = self.app.auth() else {
            return match self
                .send_error(id, rpc::INVALID_REQUEST, "invalid_request", "authentication is off: there is no token to renew")
                .await
            {
                Ok(()) => Next::Go,
                Err(_) => Next::Close(close::INTERNAL, "write_failed"),
            };
        };
        let identity = match verifier.verify(params["token"].as_str().unwrap_or("")) {
            Ok(identity) => identity,
            Err(e) => return self.send_refusal(id, &e).await,
        };
        let Some(dev) = self.device.as_deref_mut() else { return Next::Close(close::PROTOCOL, "reauth_before_auth") };
        if identity.sub != dev.caller.sub {
            return match self.send_error(id, rpc::FORBIDDEN, "reauth_other_identity", "stream.reauth takes a token for the same sub").await
            {
                Ok(()) => Next::Go,
                Err(_) => Next::Close(close::INTERNAL, "write_failed"),
            };
        }
        let filter = match &dev.filter_json {
            Some(json) => match Filter::from_json(json, self.app.core().filter_limits()) {
                Ok(f) => f,
                Err(e) => return self.send_refusal(id, &e).await,
            },
            None => Filter::any(),
        };
        dev.filter = Arc::new(identity.restrict(filter));
        dev.caller = identity;
        // Live delivery (going on, or stopped at the expiry) restarts
        // under the new token: its filter and its expiry.
        let live = if dev.reauth_by.take().is_some() { dev.live_at_expiry } else { dev.stop_live() };
        let (expires_at, delivered, filter) = (dev.caller.expires_at, dev.delivered, dev.filter.clone());
        if live {
            // Live again from the last event sent (what came meanwhile is
            // read from the log first).
            let core = self.app.core().clone();
            let (options, sink) = self.session_options(&filter, expires_at, delivered);
            let Some(dev) = self.device.as_deref_mut() else { return Next::Go };
            match Session::open(&core, filter, Start::After(delivered), options).await {
                Ok(session) => (dev.session, dev.sink) = (Some(session), sink),
                Err(e) => return self.send_refusal(id, &e).await,
            }
        }
        self.answer(id, json!({"expires_at": expires_at})).await
    }

    async fn answer(&mut self, id: &Value, result: Value) -> Next {
        match self.send_json(&json!({"jsonrpc": "2.0", "id": id, "result": result})).await {
            Ok(()) => Next::Go,
            Err(_) => Next::Close(close::INTERNAL, "write_failed"),
        }
    }

    async fn on_item(&mut self, item: Item) -> Next {
        match item {
            Item::Events { .. } if self.device.as_deref().is_some_and(|d| d.caller.expires_at.is_some_and(|at| at * 1000 <= now_ms())) => {
                // Nothing is sent under a token past its life.
                self.on_deadline().await
            }
            Item::Expired { .. } => self.on_deadline().await,
            Item::Events { frames, replayed } => {
                let floor = self.device.as_ref().map_or(0, |d| d.delivered);
                // Each event's `stream.event` message is built once and
                // shared (compressed once, with permessage-deflate); the
                // delivery leaves in one vectored write.
                let deflate = self.socket.deflates();
                let messages: Vec<Bytes> = frames.iter().filter(|f| f.id > floor).map(|f| ws_park::message(f, deflate)).collect();
                if self.socket.send_framed(&messages).await.is_err() {
                    return Next::Close(close::INTERNAL, "write_failed");
                }
                if let (Some(dev), Some(last)) = (self.device.as_deref_mut(), frames.last()) {
                    dev.delivered = dev.delivered.max(last.id);
                }
                record_delivery("ws", &frames, replayed);
                Next::Go
            }
            Item::Gap(gap) => {
                let notice = json!({"jsonrpc": "2.0", "method": method::GAP, "params": gap.to_json()});
                match self.send_json(&notice).await {
                    Ok(()) => Next::Go,
                    Err(_) => Next::Close(close::INTERNAL, "write_failed"),
                }
            }
            Item::FilterBudgetExceeded { budget } => {
                let budget = wire::FilterBudgetExceeded { budget: u64::try_from(budget).unwrap_or(u64::MAX) };
                let notice = json!({"jsonrpc": "2.0", "method": method::FILTER_BUDGET_EXCEEDED, "params": budget});
                match self.send_json(&notice).await {
                    Ok(()) => Next::Go,
                    Err(_) => Next::Close(close::INTERNAL, "write_failed"),
                }
            }
            Item::CaughtUp | Item::ScanLimit | Item::Heartbeat => Next::Go,
            Item::Dropped(_) => Next::Close(close::TRY_LATER, "slow_consumer"),
            Item::End(End::Shutdown) => Next::Close(close::GOING_AWAY, "shutdown"),
            Item::End(End::Failed) => Next::Close(close::INTERNAL, "store_unavailable"),
            Item::End(End::Over) => Next::Close(close::NORMAL, "over"),
        }
    }
}

#[cfg(test)]
mod tests;
