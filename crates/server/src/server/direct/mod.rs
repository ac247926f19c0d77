//! The direct path for event streams: a connection whose first request is a
//! `GET` of a route the HTTP layer marks as a stream ([`ServeOptions::direct`](super::ServeOptions))
//! is answered without hyper's connection machinery.
//!
//! Why: a stream is one long response, and hyper keeps an 8 KiB read buffer
//! and an 8 KiB write buffer per connection for as long as it lives, which
//! is most of what an idle stream costs. Here the request head is read into
//! a small buffer that is freed once parsed, the request goes through the
//! same router (middleware, auth, handlers), and the response is written
//! with chunked encoding straight from the body's frames (the frames ready
//! at once are one chunk, one vectored write of the chunk size, the shared
//! frame bytes and the CRLF: no copy, no per-connection buffer), tried
//! without waiting; only a write the socket cannot take whole waits, in a
//! boxed future with its deadline. After the stream ends the connection
//! is closed; clients reconnect anyway.
//!
//! Every other first request (and HTTP/1.0, and anything that does not
//! parse) is handed to hyper with its head, read whole here, put back in
//! front ([`Rewind`]). A head over the limits (`MAX_TARGET`, `MAX_HEAD`,
//! `MAX_HEADERS`) is answered here with the HTTP layer's JSON refusal.
//!
//! Three parts: `head` reads and sorts the first request's head,
//! `chunked` writes a stream's response, `rewind` carries every connection
//! hyper serves; `link` shares a stream's socket with the broker, which
//! writes to it while the stream's task waits. Each has its byte-level tests: a table of what arrives and
//! what must leave.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::Connection;

mod chunked;
mod head;
mod link;
mod rewind;

pub(crate) use link::{Link, LinkIo};

pub(super) use head::{First, sniff};
pub(super) use rewind::{Refusals, Rewind};

/// Answers a refused head and closes, reading (and dropping) what the
/// client still sends for a moment so the answer is not lost to a reset.
pub(super) async fn refuse(stream: TcpStream, response: Response<Body>, kill: &CancellationToken, write_timeout: Duration) {
    rewind::count_refusal(response.status().as_u16());
    let (head, body, exact) = chunked::head_of(response);
    let watch = super::Watch::new(kill.clone());
    if chunked::write_response(&stream, None, head, body, exact, watch, write_timeout).await.is_err() {
        return;
    }
    linger(stream).await;
}

/// Most bytes a closing connection reads and discards, and for how long
/// (see [`linger`]).
const LINGER_BYTES: usize = 8 << 20;
const LINGER_TIME: Duration = Duration::from_secs(2);

/// A lingering close: a connection closed while the client is still
/// sending (a refusal written before its body was read: `413`, `408`, a
/// WebSocket's 1009 before the rest of the frame) would be reset by the
/// kernel, and a reset can destroy the answer before the client reads it.
/// So the server ends its side (FIN), then reads and discards what still
/// comes, at most [`LINGER_BYTES`] for at most [`LINGER_TIME`], and only
/// then closes.
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left -= n.min(left),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

/// Serves one stream request on `stream`, then closes it.
///
/// A plain function returning a block, which keeps only what it is
/// given (an async function, or a block that takes the request, would keep
/// room for the request, the connection and the router for the stream's
/// whole life), and the request's handling is boxed (the request, its box
/// and the handler's future are freed once it answered): the stream's task
/// is sized for what writing the response keeps, for as long as the stream
/// lives.
pub(super) fn serve(
    stream: TcpStream,
    request: Box<Request<Body>>,
    connection: Connection,
    router: Router,
    write_timeout: Duration,
) -> impl Future<Output = ()> {
    let kill = connection.kill_token();
    // The handler may let the broker write to the socket (see [`Link`]).
    let link = Arc::new(Link::new(stream));
    let answer = Box::pin(answer(request, connection, link.clone(), router));
    async move {
        let (head, body, exact) = answer.await;
        // The stream's task wakes once per delivery: the kill token (and the
        // client's side) are watched at the cost of a flag's load a wake-up
        // (see [`super::Watch`]).
        let _ = chunked::write_response(&link.stream, Some(&link), head, body, exact, super::Watch::new(kill), write_timeout).await;
    }
}

/// The response to a stream request, as its head's bytes and its body.
async fn answer(
    mut request: Box<Request<Body>>,
    mut connection: Connection,
    link: Arc<Link>,
    router: Router,
) -> (Vec<u8>, Body, Option<u64>) {
    connection.link = Some(link);
    request.extensions_mut().insert(connection);
    let response = match router.oneshot(*request).await {
        Ok(r) => r,
        Err(e) => match e {},
    };
    chunked::head_of(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's task lives as long as the stream and is sized for its
    /// future's largest state: what an idle stream carries, so it may not
    /// grow unnoticed (it kept room for the request, the connection, the
    /// router and the end's timer: 808 bytes in a test build, where it is
    /// 488 now).
    #[test]
    fn a_stream_s_task_stays_small() {
        let serve = |(stream, request, connection, router): (TcpStream, Box<Request<Body>>, Connection, Router)| {
            serve(stream, request, connection, router, Duration::from_secs(1))
        };
        let size = crate::testing::returned_size(&serve);
        assert!(size <= 512, "a stream's task takes {size} bytes");
    }
}
