//! The server loop: accepts connections, serves each on its own task (with
//! hyper, or for event streams on the `direct` path; over TLS with hyper,
//! HTTP/2 or HTTP/1.1 by ALPN; HTTP/2 with prior knowledge, h2c, with
//! hyper too), and owns their lifecycle.
//!
//! Why not `axum::serve`: tidings must be able to close *one* connection by
//! force (a slow SSE client whose socket no longer drains) and to bound a
//! graceful shutdown by a deadline (endless SSE bodies never finish on their
//! own). Each connection gets a [`Connection`] handle in its request
//! extensions whose kill token closes the socket; every kill token is a
//! child of one server-wide token that the shutdown deadline cancels.

#![allow(clippy::disallowed_types, reason = "a transport speaks HTTP")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

mod direct;
mod idle;
pub mod tls;
mod watch;

pub(crate) use direct::{Link, LinkIo};
pub(crate) use watch::Watch;

/// Longest request target (path and query) accepted: room for the longest
/// filter (`TIDINGS_FILTER_MAX_BYTES`, 16 KiB) percent-encoded, and below
/// hyper's own hard limit (64 KiB), so a refusal is always this server's.
pub const MAX_TARGET: usize = 48 * 1024;
/// Longest request head (request line and headers) accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most request headers accepted.
pub const MAX_HEADERS: usize = 100;

/// A request head over the limits above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadRefusal {
    /// The head does not parse as HTTP/1.1: `400`.
    Malformed,
    /// The request target is longer than [`MAX_TARGET`]: `414`.
    UriTooLong,
    /// More than [`MAX_HEADERS`] headers, or a head over [`MAX_HEAD`]: `431`.
    HeadersTooLarge,
}

impl HeadRefusal {
    /// Checks a parsed request head against the limits (the connection
    /// loop checks the first head of a connection while reading it; the
    /// HTTP layer checks the ones hyper reads after it, on a kept-alive
    /// connection).
    pub fn check<B>(request: &Request<B>) -> Option<Self> {
        let target = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
        if target > MAX_TARGET {
            return Some(Self::UriTooLong);
        }
        let headers = request.headers();
        let bytes: usize = target + headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum::<usize>();
        (headers.len() > MAX_HEADERS || bytes > MAX_HEAD).then_some(Self::HeadersTooLarge)
    }
}

/// A handle on the connection a request arrived on.
#[derive(Debug, Clone)]
pub struct Connection {
    kill: CancellationToken,
    peer: SocketAddr,
    secure: bool,
    /// The server's connections: a graceful shutdown waits for each.
    tracker: TaskTracker,
    /// A stream's socket on the direct path, which the broker may write
    /// while the stream waits ([`Link`]).
    link: Option<Arc<Link>>,
}

impl Connection {
    /// Cancelling this token closes the connection at once.
    pub fn kill_token(&self) -> CancellationToken {
        self.kill.clone()
    }

    /// The peer address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The socket of a stream served on the direct path, which the broker
    /// may write while the stream's task waits (see [`Link`]).
    pub(crate) fn link(&self) -> Option<&Arc<Link>> {
        self.link.as_ref()
    }

    /// Whether the request arrived over TLS (this server's own; a proxy's
    /// TLS in front of a plain port is not seen here).
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// Runs `task` past the request's HTTP exchange (a WebSocket after its
    /// upgrade, when hyper's connection is done), tracked as the connection
    /// was: a graceful shutdown waits for it, up to its deadline, as it does
    /// for a stream.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(task);
    }
}

/// Server-loop settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Longest a client may take to send its request headers.
    pub header_timeout: Duration,
    /// Longest a graceful shutdown may take before connections are closed.
    pub shutdown_timeout: Duration,
    /// Whether a `GET` of this path is a stream that takes the direct path
    /// (the HTTP layer says which of its routes are).
    pub direct: fn(&str) -> bool,
    /// A write that makes no progress within this (the slow-client timeout
    /// plus the eviction grace) closes the connection, on the direct path
    /// and on hyper's: a client that takes no bytes holds nothing for
    /// longer, a stream live or replaying (the broker only sees live
    /// queues) or a poll page.
    pub write_timeout: Duration,
    /// The answer to a head over the limits (the HTTP layer's JSON error).
    pub refuse: fn(HeadRefusal) -> axum::response::Response,
    /// Serve HTTPS with this configuration ([`tls::load`]) instead of
    /// plain HTTP.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops
/// accepting, lets open connections finish (streams end themselves on the
/// same token) and closes what is left at the deadline.
pub async fn serve(listener: TcpListener, router: Router, options: ServeOptions, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    let force = CancellationToken::new();
    let refusals = Arc::new(direct::Refusals::render(options.refuse).await);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead
                    // of spinning (50 ms: long enough to let descriptors
                    // free up, short enough not to be noticed); the listener
                    // itself is still fine.
                    tracing::warn!(error = %crate::report::chain(&e), "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let connection =
            Connection { kill: force.child_token(), peer, secure: options.tls.is_some(), tracker: tracker.clone(), link: None };
        let task =
            serve_connection(stream, connection, router.clone(), options.clone(), refusals.clone(), shutdown.clone(), tracker.clone());
        tracker.spawn(task);
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(options.shutdown_timeout, tracker.wait()).await.is_err() {
        tracing::warn!(open = tracker.len(), "shutdown deadline reached; closing the remaining connections");
        force.cancel();
        tracker.wait().await;
    }
}

async fn serve_connection(
    mut stream: tokio::net::TcpStream,
    connection: Connection,
    router: Router,
    options: ServeOptions,
    refusals: Arc<direct::Refusals>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let header_timeout = options.header_timeout;
    if let Some(tls) = options.tls.clone() {
        let io = direct::Rewind::new(bytes::Bytes::new(), stream, refusals, options.write_timeout);
        return Box::pin(serve_tls(io, tls, connection, router, header_timeout, options.write_timeout, shutdown)).await;
    }
    let first = tokio::select! {
        first = tokio::time::timeout(header_timeout, direct::sniff(&mut stream, options.direct)) => first.unwrap_or(direct::First::Gone),
        _ = connection.kill.cancelled() => return,
    };
    match first {
        direct::First::Gone => {}
        // A stream goes on in a task of its own, sized for the stream alone:
        // this one (2.7 KiB, whatever its largest state) ends here. Spawned
        // on the same tracker, before this task ends, so a shutdown waits
        // for it.
        direct::First::Stream(request) => {
            tracker.spawn(direct::serve(stream, request, connection, router, options.write_timeout));
        }
        // The refusal (a response and its write, 4.6 KiB) and hyper's
        // connection are boxed: a connection's task is sized for its largest
        // state for as long as it lives.
        direct::First::Refused(refusal) => {
            Box::pin(direct::refuse(stream, (options.refuse)(refusal), &connection.kill, options.write_timeout)).await
        }
        direct::First::Other(read) => {
            let io = direct::Rewind::new(read, stream, refusals, options.write_timeout);
            Box::pin(serve_h1(TokioIo::new(io), connection, router, header_timeout, shutdown)).await
        }
        // h2c with prior knowledge (what a proxy in front of tidings speaks
        // when it talks HTTP/2 without TLS): always on, it costs HTTP/1.1
        // clients nothing.
        direct::First::H2c(read) => {
            let io = direct::Rewind::new(read, stream, refusals, options.write_timeout);
            Box::pin(serve_h2(TokioIo::new(io), connection, router, header_timeout, options.write_timeout, shutdown)).await
        }
    }
}

/// Serves a TLS connection with hyper: HTTP/2 when the client offered it
/// (ALPN), else HTTP/1.1 (with upgrades: a WebSocket works on the TLS port).
/// The write deadline is kept below TLS ([`direct::Rewind`]).
async fn serve_tls(
    io: direct::Rewind,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    connection: Connection,
    router: Router,
    header_timeout: Duration,
    write_timeout: Duration,
    shutdown: CancellationToken,
) {
    let accept = tokio_rustls::TlsAcceptor::from(tls).accept(io);
    let stream = tokio::select! {
        accepted = tokio::time::timeout(header_timeout, accept) => match accepted {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(error = %crate::report::chain(&e), "TLS handshake failed");
                return;
            }
            Err(_) => return,
        },
        _ = connection.kill.cancelled() => return,
    };
    // The protocol is what ALPN settled: no bytes are read to guess it
    // (a guess that waits for bytes would be a phase without a deadline).
    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        serve_h2(TokioIo::new(stream), connection, router, header_timeout, write_timeout, shutdown).await;
    } else {
        serve_h1(TokioIo::new(stream), connection, router, header_timeout, shutdown).await;
    }
}

/// Serves an HTTP/2 connection (negotiated by ALPN, or the prior-knowledge
/// preface) with hyper. Each request gets a kill token of its own, a child
/// of the connection's: the broker ending one slow stream resets that
/// stream, not the others sharing the connection. The connection has a
/// deadline whenever it has no stream open: the preface and a first whole
/// request within `header_timeout` of the connection, and the next one
/// within `header_timeout` of the last stream's end (a client that sends a
/// preface, or half a HEADERS frame, and nothing more holds nothing).
/// A stream whose chunk hyper holds for longer than `write_timeout` (the
/// client grants it no flow-control window) closes the connection, as a
/// plain connection whose client takes no bytes is closed.
async fn serve_h2<I>(
    io: I,
    connection: Connection,
    router: Router,
    header_timeout: Duration,
    write_timeout: Duration,
    shutdown: CancellationToken,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let kill = connection.kill.clone();
    let streams = Arc::new(idle::Streams::default());
    let open = streams.clone();
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        let mut connection = connection.clone();
        connection.kill = connection.kill.child_token();
        request.extensions_mut().insert(connection);
        let router = router.clone();
        let guard = open.opened();
        async move {
            let response = router.oneshot(request.map(Body::new)).await.map_err(|e: Infallible| match e {})?;
            Ok::<_, Infallible>(response.map(|body| Body::new(idle::Tracked::new(body, guard))))
        }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder.timer(TokioTimer::new());
    let conn = pin!(builder.serve_connection(io, service));
    let idle = streams.idle_for(header_timeout);
    let stalled = async {
        streams.stalled_for(write_timeout).await;
        crate::metrics::client_dropped("write_stalled");
        tracing::debug!(reason = "write_stalled", "closing an HTTP/2 connection whose client grants a stream no window");
    };
    tokio::select! {
        _ = drive(conn, |c| c.graceful_shutdown(), &shutdown, &kill, idle, header_timeout) => {}
        _ = stalled => {}
    }
}

/// Drives a hyper connection until it ends: on `shutdown` it shuts down
/// gracefully (requests in flight finish; streams end on the same token),
/// on `kill` it is dropped at once. When `idle` resolves (an HTTP/2
/// connection with no stream for too long) it shuts down gracefully too,
/// and is dropped if that takes longer than `grace`.
async fn drive<F, E>(
    mut conn: std::pin::Pin<&mut F>,
    graceful: fn(std::pin::Pin<&mut F>),
    shutdown: &CancellationToken,
    kill: &CancellationToken,
    idle: impl Future<Output = ()>,
    grace: Duration,
) where
    F: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut draining = false;
    let mut idle = pin!(idle);
    let mut idled = false;
    // Armed when `idle` resolves; never polled before.
    let deadline = tokio::time::sleep(grace);
    let mut deadline = pin!(deadline);
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            _ = shutdown.cancelled(), if !draining => {
                graceful(conn.as_mut());
                draining = true;
            }
            _ = idle.as_mut(), if !idled => {
                idled = true;
                if !draining {
                    graceful(conn.as_mut());
                    draining = true;
                }
                deadline.as_mut().reset(tokio::time::Instant::now() + grace);
            }
            _ = deadline.as_mut(), if idled => break,
            _ = kill.cancelled() => break,
        }
    }
}

/// Serves an HTTP/1.1 connection with hyper (with upgrades: a WebSocket
/// works on it). hyper's head deadline runs whenever the connection waits
/// for a request head, from its first byte on.
async fn serve_h1<I>(io: I, connection: Connection, router: Router, header_timeout: Duration, shutdown: CancellationToken)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let kill = connection.kill.clone();
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(connection.clone());
        let router = router.clone();
        async move { router.oneshot(request.map(Body::new)).await.map_err(|e: Infallible| match e {}) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // hyper's own limits stay above this server's (its buffer holds up to
    // ~400 KiB of head, twice the headers), so the heads it reads after the
    // first on a kept-alive connection are refused by the HTTP layer with
    // its JSON answer ([`HeadRefusal::check`]); only a head past hyper's
    // hard limits gets hyper's empty `431`.
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(true).max_headers(2 * MAX_HEADERS);
    // Upgrades (WebSocket) hand the connection to the handler after a 101.
    let conn = pin!(builder.serve_connection(io, service).with_upgrades());
    drive(conn, |c| c.graceful_shutdown(), &shutdown, &kill, std::future::pending(), header_timeout).await;
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests start the tasks they drive")]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::Extension;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// Plain HTTP, every request through hyper, with `shutdown_timeout`.
    fn options(shutdown_timeout: Duration) -> ServeOptions {
        ServeOptions {
            header_timeout: Duration::from_secs(5),
            shutdown_timeout,
            direct: |_| false,
            write_timeout: Duration::from_secs(5),
            refuse: |_| axum::response::Response::new(axum::body::Body::empty()),
            tls: None,
        }
    }

    /// A task a request hands to its connection (a WebSocket after its
    /// upgrade) is waited for by a graceful shutdown, as a stream is.
    #[tokio::test]
    async fn a_shutdown_waits_for_what_a_connection_spawned() {
        let release = Arc::new(tokio::sync::Notify::new());
        let done = Arc::new(AtomicBool::new(false));
        let (r, d) = (release.clone(), done.clone());
        let router = Router::new().route(
            "/spawn",
            axum::routing::get(move |Extension(connection): Extension<Connection>| async move {
                connection.spawn(async move {
                    r.notified().await;
                    d.store(true, Ordering::SeqCst);
                });
                "spawned"
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let options = options(Duration::from_secs(60));
        let mut server = tokio::spawn(serve(listener, router, options, shutdown.clone()));
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client.write_all(b"GET /spawn HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_string(&mut answer)).await.unwrap().unwrap();
        assert!(answer.ends_with("spawned"), "{answer}");
        shutdown.cancel();
        // The connection is done; what it spawned is not, so neither is the
        // shutdown (a bounded look: it must not end meanwhile).
        assert!(tokio::time::timeout(Duration::from_millis(300), &mut server).await.is_err(), "the shutdown did not wait");
        release.notify_one();
        tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    /// A connection upgraded on hyper's path is taken back from hyper whole
    /// (the broker can then write to it, `Link`): the socket itself, with
    /// the bytes the client sent right behind its request first, and
    /// everything written after the `101` reaching the client.
    #[tokio::test]
    async fn an_upgraded_connection_is_taken_from_hyper_whole() {
        use tokio::io::AsyncReadExt as _;
        let router = Router::new().route(
            "/up",
            axum::routing::get(|mut request: axum::extract::Request| async move {
                let upgrade = request.extensions_mut().remove::<hyper::upgrade::OnUpgrade>().expect("an upgrade");
                tokio::spawn(async move {
                    let upgraded = upgrade.await.expect("upgraded");
                    let mut io = LinkIo::of_upgraded(upgraded).expect("a plain connection of this server's").expect("taken");
                    let mut read = Vec::new();
                    while read.len() < b"early,late".len() {
                        let mut chunk = [0u8; 64];
                        let n = io.read(&mut chunk).await.expect("read");
                        assert!(n > 0, "the client closed early");
                        read.extend_from_slice(&chunk[..n]);
                    }
                    io.write_all(&[b"echo:", &read[..]].concat()).await.expect("written");
                    io.shutdown().await.expect("shut");
                });
                axum::response::Response::builder()
                    .status(101)
                    .header("connection", "upgrade")
                    .header("upgrade", "test")
                    .body(axum::body::Body::empty())
                    .unwrap()
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let options = options(Duration::from_secs(5));
        let server = tokio::spawn(serve(listener, router, options, shutdown.clone()));
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The first bytes of the new protocol right behind the request.
        client.write_all(b"GET /up HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: test\r\n\r\nearly,").await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut byte)).await.unwrap().unwrap();
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
        client.write_all(b"late").await.unwrap();
        let mut rest = String::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_string(&mut rest)).await.unwrap().unwrap();
        assert_eq!(rest, "echo:early,late");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), server).await.unwrap().unwrap();
    }
}
