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
//! front ([`Rewind`]). A head over the limits ([`MAX_TARGET`], [`MAX_HEAD`],
//! [`MAX_HEADERS`]) is answered here with the HTTP layer's JSON refusal.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, Version, header};
use bytes::{Buf as _, Bytes};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::Connection;

use super::{HeadRefusal, MAX_HEAD, MAX_HEADERS, MAX_TARGET};

/// What sniffing the first request found.
pub(super) enum First {
    /// A stream request, already parsed.
    Stream(Box<Request<Body>>),
    /// Anything else, its head read whole: hand the connection to hyper
    /// with these bytes first.
    Other(Bytes),
    /// The HTTP/2 connection preface (h2c with prior knowledge, as proxies
    /// speak it): hand the connection to hyper's HTTP/2 with these bytes
    /// first.
    H2c(Bytes),
    /// A head over the limits: answer this refusal and close.
    Refused(HeadRefusal),
    /// The client went away (or sent nothing in time).
    Gone,
}

/// Reads the first request's whole head (any method: the caller bounds
/// this by the header deadline, so the deadline holds for the whole head
/// however slowly it trickles in, and hyper then finds it complete);
/// `direct` says which paths stream.
pub(super) async fn sniff(stream: &mut TcpStream, direct: fn(&str) -> bool) -> First {
    let mut head = Vec::with_capacity(1024);
    loop {
        // Straight into the head's spare room: nothing but the head lives
        // across this await, so every connection's task stays small (it is
        // sized for its largest state, for as long as the connection lives).
        if head.len() == head.capacity() {
            head.reserve(1024);
        }
        match stream.read_buf(&mut head).await {
            Ok(0) | Err(_) => return First::Gone,
            Ok(_) => {}
        }
        if let Some(first) = parse_head(head.as_slice(), direct) {
            return match first {
                Parsed::Other => First::Other(head.into()),
                Parsed::H2c => First::H2c(head.into()),
                Parsed::Done(first) => first,
            };
        }
    }
}

/// What a head read so far comes to.
enum Parsed {
    /// Hand the head to hyper.
    Other,
    /// The HTTP/2 preface: hand the connection to hyper's HTTP/2.
    H2c,
    Done(First),
}

/// What an HTTP/2 client with prior knowledge sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Parses `head` (on the stack of a plain function: the header array is
/// 3 KiB); `None` while it is incomplete.
fn parse_head(head: &[u8], direct: fn(&str) -> bool) -> Option<Parsed> {
    if head.starts_with(H2_PREFACE) {
        return Some(Parsed::H2c);
    }
    if H2_PREFACE.starts_with(head) {
        return None;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(len)) => {
            let target = request.path.unwrap_or("");
            if target.len() > MAX_TARGET {
                return Some(Parsed::Done(First::Refused(HeadRefusal::UriTooLong)));
            }
            let path = target.split_once('?').map_or(target, |(p, _)| p);
            // Only an HTTP/1.1 GET of a stream route with nothing behind it
            // (no pipelined request) takes the direct path; hyper serves
            // everything else.
            if request.method != Some("GET") || request.version != Some(1) || len != head.len() || !direct(path) {
                return Some(Parsed::Other);
            }
            Some(build(&request).map_or(Parsed::Other, |r| Parsed::Done(First::Stream(Box::new(r)))))
        }
        Err(httparse::Error::TooManyHeaders) => Some(Parsed::Done(First::Refused(HeadRefusal::HeadersTooLarge))),
        // Anything that does not parse: hyper answers it.
        Err(_) => Some(Parsed::Other),
        Ok(httparse::Status::Partial) if head.len() > MAX_HEAD => {
            // Over the limit: the request line itself, or the headers.
            let line = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
            Some(Parsed::Done(First::Refused(if line > MAX_TARGET { HeadRefusal::UriTooLong } else { HeadRefusal::HeadersTooLarge })))
        }
        Ok(httparse::Status::Partial) => None,
    }
}

fn build(parsed: &httparse::Request<'_, '_>) -> Option<Request<Body>> {
    let mut request = Request::builder().method(Method::GET).uri(parsed.path?).version(Version::HTTP_11).body(Body::empty()).ok()?;
    let headers = request.headers_mut();
    for h in parsed.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
        headers.append(name, HeaderValue::from_bytes(h.value).ok()?);
    }
    // A stream request carries no body; one that announces a body is not
    // what this path serves.
    if headers.contains_key(axum::http::header::CONTENT_LENGTH) || headers.contains_key(axum::http::header::TRANSFER_ENCODING) {
        return None;
    }
    Some(request)
}

/// Answers a refused head and closes, reading (and dropping) what the
/// client still sends for a moment so the answer is not lost to a reset.
pub(super) async fn refuse(mut stream: TcpStream, response: Response<Body>, kill: &CancellationToken, write_timeout: Duration) {
    count_refusal(response.status().as_u16());
    let (head, body, exact) = head_of(response);
    if write_response(&mut stream, head, body, exact, kill, write_timeout).await.is_err() {
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
pub(super) async fn serve(
    mut stream: TcpStream,
    mut request: Box<Request<Body>>,
    connection: Connection,
    router: Router,
    write_timeout: Duration,
) {
    let kill = connection.kill_token();
    request.extensions_mut().insert(connection);
    // Boxed, like the request: the handler's future is gone once it
    // answered, and an idle stream's task keeps no room for either.
    let response = match Box::pin(router.oneshot(*request)).await {
        Ok(r) => r,
        Err(e) => match e {},
    };
    let (head, body, exact) = head_of(response);
    let _ = tokio::select! {
        r = write_response(&mut stream, head, body, exact, &kill, write_timeout) => r,
        _ = kill.cancelled() => Ok(()),
    };
}

/// The response's head as bytes, and its body: the response itself (its
/// header map, some 1.2 KiB) is gone before the first write, so an idle
/// stream's task neither keeps it nor room for it.
fn head_of(response: Response<Body>) -> (Vec<u8>, Body, Option<u64>) {
    let (parts, body) = response.into_parts();
    let exact = http_body::Body::size_hint(&body).exact();
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(parts.status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        // The framing headers are this writer's own (written once below).
        if [header::CONTENT_LENGTH, header::TRANSFER_ENCODING, header::CONNECTION, header::DATE].contains(name) {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"date: ");
    head.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
    head.extend_from_slice(b"\r\n");
    match exact {
        Some(len) => head.extend_from_slice(format!("content-length: {len}\r\nconnection: close\r\n\r\n").as_bytes()),
        None => head.extend_from_slice(b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"),
    }
    (head, body, exact)
}

/// Writes the response: the head, then the body's frames as they come.
///
/// A stream spends its life waiting here, and its task is sized for the
/// largest state of this function for as long as it lives, so the loop
/// keeps almost nothing across its wait: one poll function waits for the
/// body's next frames (gathering every frame already ready, so one write
/// carries a whole delivery round under load) or for the client to close;
/// the write is tried at once without waiting (it nearly always completes:
/// the socket buffer has room), and only a write that has to wait becomes
/// a boxed future with its deadline.
#[expect(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice for its whole life (see the body)")]
fn write_response<'a>(
    stream: &'a mut TcpStream,
    head: Vec<u8>,
    body: Body,
    exact: Option<u64>,
    kill: &'a CancellationToken,
    write_timeout: Duration,
) -> impl Future<Output = io::Result<()>> + 'a {
    // A plain function returning a block: an async function keeps its
    // arguments twice (as given and as bound), for its whole life.
    async move {
        stream.write_all(&head).await?;
        drop(head);
        let chunked = exact.is_none();
        let mut body = std::pin::pin!(body);
        loop {
            let (frames, ended) = match std::future::poll_fn(|cx| next_step(cx, stream, body.as_mut())).await {
                Step::Frames(frames, ended) => (frames, ended),
                Step::End => break,
                Step::Closed => return Ok(()),
            };
            let rest = match try_write(stream, &frames, chunked) {
                Ok(rest) => rest,
                Err(_) => return Ok(()),
            };
            if let Some(rest) = rest {
                // Boxed: a waiting write is rare, and its state and timer
                // would otherwise take room in every stream's task.
                tokio::select! {
                    r = Box::pin(tokio::time::timeout(write_timeout, write_rest(stream, rest))) => match r {
                        Ok(r) => r?,
                        Err(_) => {
                            // The client took no bytes for the slow-client
                            // timeout (its socket buffer is full, so no
                            // notice can reach it): close; it resumes from
                            // its Last-Event-ID, and its frames are freed.
                            crate::metrics::client_dropped("write_stalled");
                            tracing::debug!(reason = "write_stalled", "closing a stream whose client takes no bytes");
                            return Ok(());
                        }
                    },
                    _ = kill.cancelled() => return Ok(()),
                }
            }
            if ended {
                break;
            }
        }
        if chunked {
            stream.write_all(b"0\r\n\r\n").await?;
        }
        stream.shutdown().await
    }
}

/// What the stream does next.
enum Step {
    /// Frames to write (every one that was ready, at most [`MAX_GATHER`]);
    /// `true` when the body ended after them.
    Frames(Vec<Bytes>, bool),
    /// The body ended.
    End,
    /// The client closed its side (or the connection failed).
    Closed,
}

/// Polls for the client closing and for the body's next frames.
fn next_step(cx: &mut Context<'_>, stream: &TcpStream, mut body: Pin<&mut Body>) -> Poll<Step> {
    // Anything the client sends after its request is read and ignored; the
    // end of its side ends the stream. A client that keeps sending is read
    // a bounded amount per poll (and the task woken to go on), so it
    // cannot hold the task here.
    let mut reads = 0;
    while stream.poll_read_ready(cx).is_ready() {
        if reads == 16 {
            cx.waker().wake_by_ref();
            break;
        }
        reads += 1;
        let mut scratch = [0u8; 64];
        match stream.try_read(&mut scratch) {
            Ok(0) => return Poll::Ready(Step::Closed),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Poll::Ready(Step::Closed),
        }
    }
    let mut frames = Vec::new();
    while frames.len() < MAX_GATHER {
        match http_body::Body::poll_frame(body.as_mut(), cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // Trailers: none are sent.
                if let Ok(data) = frame.into_data()
                    && !data.is_empty()
                {
                    frames.push(data);
                }
            }
            Poll::Ready(Some(Err(_)) | None) if frames.is_empty() => return Poll::Ready(Step::End),
            Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(Step::Frames(frames, true)),
            Poll::Pending => break,
        }
    }
    if frames.is_empty() { Poll::Pending } else { Poll::Ready(Step::Frames(frames, false)) }
}

/// Most frames gathered into one write.
const MAX_GATHER: usize = 64;

/// Writes `frames` without waiting, in one vectored write when the socket
/// takes it all (with chunked encoding, one chunk holding them all: each is
/// a whole SSE event, so the stream reads the same). Returns what is left
/// when the socket would block.
fn try_write(stream: &TcpStream, frames: &[Bytes], chunked: bool) -> io::Result<Option<Vec<Bytes>>> {
    use std::io::IoSlice;
    let total: usize = frames.iter().map(Bytes::len).sum();
    let mut size = [0u8; 18];
    let len = if chunked { hex_size(total, &mut size) } else { 0 };
    let mut slices = Vec::with_capacity(frames.len() + 2);
    if chunked {
        slices.push(IoSlice::new(&size[..len]));
    }
    slices.extend(frames.iter().map(|f| IoSlice::new(f)));
    if chunked {
        slices.push(IoSlice::new(b"\r\n"));
    }
    let mut written = 0;
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        match stream.try_write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                written += n;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    if bufs.is_empty() {
        return Ok(None);
    }
    // What is left, as owned pieces: the chunk size, the frames, the CRLF.
    let mut rest = Vec::with_capacity(frames.len() + 2);
    if chunked {
        rest.push(Bytes::copy_from_slice(&size[..len]));
    }
    rest.extend(frames.iter().cloned());
    if chunked {
        rest.push(Bytes::from_static(b"\r\n"));
    }
    consume(&mut rest, written);
    Ok(Some(rest))
}

/// Drops the first `n` bytes of `pieces`.
fn consume(pieces: &mut Vec<Bytes>, mut n: usize) {
    pieces.retain_mut(|piece| {
        let k = n.min(piece.len());
        piece.advance(k);
        n -= k;
        !piece.is_empty()
    });
}

/// Writes `rest` once the socket takes it.
async fn write_rest(stream: &TcpStream, mut rest: Vec<Bytes>) -> io::Result<()> {
    use std::io::IoSlice;
    while !rest.is_empty() {
        stream.writable().await?;
        let slices: Vec<IoSlice<'_>> = rest.iter().map(|b| IoSlice::new(b)).collect();
        let n = match stream.try_write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        drop(slices);
        consume(&mut rest, n);
    }
    Ok(())
}

/// Writes `n` in hex followed by CRLF into `out`; returns the length.
fn hex_size(n: usize, out: &mut [u8; 18]) -> usize {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = DIGITS[v & 0xf];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    let len = digits.len() - i;
    out[..len].copy_from_slice(&digits[i..]);
    out[len..len + 2].copy_from_slice(b"\r\n");
    len + 2
}

/// A connection with bytes already read put back in front, for hyper; a
/// write deadline (a write that makes no progress for the write timeout
/// fails, and hyper closes the connection: a client that takes no bytes of
/// a poll page holds it no longer than a stream's); hyper's own refusals
/// (the empty `400`, `414` and `431` it answers to a head it cannot parse,
/// on any request of a kept-alive connection) written as the API's JSON
/// refusals instead, so every refusal has the one shape. Once a `101` went
/// out (a WebSocket), writes go through as they are, never looked at: they
/// are frames (written vectored already, `http::ws_socket`), and a frame's
/// payload, say a pong echoing the client's ping, may read like a refusal.
pub(super) struct Rewind {
    prefix: Bytes,
    inner: TcpStream,
    refusals: Arc<Refusals>,
    /// Bytes taken but not yet written: a rewritten refusal.
    pending: Bytes,
    write_timeout: Duration,
    /// Running while a write waits for the socket.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A `101` was written: the connection speaks another protocol now.
    upgraded: bool,
    /// The client ended its side (a read found the end): closing needs no
    /// lingering.
    eof: bool,
}

/// The API's answers to the heads hyper refuses by itself, rendered once.
#[derive(Debug)]
pub(super) struct Refusals {
    malformed: Bytes,
    uri_too_long: Bytes,
    headers_too_large: Bytes,
}

impl Refusals {
    /// Renders the answers `refuse` gives.
    pub(super) async fn render(refuse: fn(HeadRefusal) -> Response<Body>) -> Self {
        Self {
            malformed: render(refuse(HeadRefusal::Malformed)).await,
            uri_too_long: render(refuse(HeadRefusal::UriTooLong)).await,
            headers_too_large: render(refuse(HeadRefusal::HeadersTooLarge)).await,
        }
    }

    /// The JSON answer replacing `written`, if it is one of hyper's own
    /// refusals: a whole response head, status 400/414/431, no body (the
    /// HTTP layer's answers always have one).
    fn replacing(&self, written: &[u8]) -> Option<Bytes> {
        let rest = written.strip_prefix(b"HTTP/1.1 ")?;
        let (answer, status) = match rest.get(..4)? {
            b"400 " => (&self.malformed, 400),
            b"414 " => (&self.uri_too_long, 414),
            b"431 " => (&self.headers_too_large, 431),
            _ => return None,
        };
        let head_end = written.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let empty = written[..head_end].to_ascii_lowercase().windows(19).any(|w| w == b"\r\ncontent-length: 0");
        if head_end != written.len() || !empty {
            return None;
        }
        count_refusal(status);
        Some(answer.clone())
    }
}

/// Counts a refusal no route saw, under the route `unmatched`.
fn count_refusal(status: u16) {
    crate::metrics::http_request("unmatched", status);
}

/// A whole response as bytes (its body is a small JSON error).
async fn render(response: Response<Body>) -> Bytes {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(format!("HTTP/1.1 {} {}\r\n", parts.status.as_str(), parts.status.canonical_reason().unwrap_or("")).as_bytes());
    for (name, value) in &parts.headers {
        if [header::CONTENT_LENGTH, header::CONNECTION].contains(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(&body);
    out.into()
}

impl Drop for Rewind {
    /// Closes with [`linger`] unless the client already ended its side:
    /// whether it is still sending (a body after a refusal, the rest of an
    /// oversized frame) cannot be known here, its bytes may still be on
    /// their way. A second descriptor of the socket keeps it open for the
    /// lingering task while this one closes.
    fn drop(&mut self) {
        if self.eof {
            return;
        }
        let (Ok(handle), Ok(fd)) = (tokio::runtime::Handle::try_current(), std::os::fd::AsFd::as_fd(&self.inner).try_clone_to_owned())
        else {
            return;
        };
        let socket = std::net::TcpStream::from(fd);
        handle.spawn(async move {
            if let Ok(stream) = TcpStream::from_std(socket) {
                linger(stream).await;
            }
        });
    }
}

impl Rewind {
    pub(super) fn new(prefix: Bytes, inner: TcpStream, refusals: Arc<Refusals>, write_timeout: Duration) -> Self {
        Self { prefix, inner, refusals, pending: Bytes::new(), write_timeout, stalled: None, upgraded: false, eof: false }
    }

    /// Whether `first`, the start of a write, may be a refusal to rewrite;
    /// notes the upgrade when it is the start of a `101` response.
    fn may_refuse(&mut self, first: &[u8]) -> bool {
        if self.upgraded {
            return false;
        }
        if first.starts_with(b"HTTP/1.1 101") {
            self.upgraded = true;
            return false;
        }
        first.starts_with(b"HTTP/1.1 4")
    }

    /// Applies the write deadline to one poll of a write.
    fn deadline<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.write_timeout;
        let sleep = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if sleep.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            crate::metrics::client_dropped("write_stalled");
            tracing::debug!(reason = "write_stalled", "closing a connection whose client takes no bytes");
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        Poll::Pending
    }

    /// Writes what is pending, and frees it once written.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            return Poll::Ready(Ok(()));
        }
        while !self.pending.is_empty() {
            let polled = Pin::new(&mut self.inner).poll_write(cx, &self.pending);
            let n = std::task::ready!(self.deadline(cx, polled))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.advance(n);
        }
        self.pending = Bytes::new();
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Rewind {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if self.prefix.is_empty() {
                // Free the head now: a consumed `Bytes` still holds its
                // allocation, for as long as the connection (a WebSocket
                // after its upgrade) lives.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() == before && buf.remaining() > 0 {
            self.eof = true;
        }
        polled
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.drain(cx))?;
        if self.may_refuse(buf)
            && let Some(answer) = self.refusals.replacing(buf)
        {
            // Taken whole; written by this and the next polls (hyper
            // flushes, then shuts the connection down, after a refusal).
            self.pending = answer;
            let _ = self.drain(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.deadline(cx, polled)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        // A refusal head is one small write; only a write that starts like
        // one is looked at whole.
        let first = bufs.iter().find(|b| !b.is_empty());
        if first.is_some_and(|b| self.may_refuse(b)) {
            let whole: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            return self.poll_write(cx, &whole);
        }
        std::task::ready!(self.drain(cx))?;
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.deadline(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write the socket cannot take whole leaves the rest, to the byte,
    /// for the waiting write: the client reads exactly the chunks sent.
    #[tokio::test]
    async fn a_write_that_would_block_leaves_exactly_the_rest() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let frames: Vec<Bytes> = (0..64u8).map(|i| Bytes::from(vec![b'a' + i % 26; 7_001 + i as usize])).collect();
        let mut expected = Vec::new();
        let mut rests = 0;
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            peer.read_to_end(&mut got).await.unwrap();
            got
        });
        // Rounds of 64 frames (450 KiB) until one does not fit in the
        // socket's buffers, which the client is not reading yet.
        for _ in 0..64 {
            let total: usize = frames.iter().map(Bytes::len).sum();
            expected.extend_from_slice(format!("{total:x}\r\n").as_bytes());
            frames.iter().for_each(|f| expected.extend_from_slice(f));
            expected.extend_from_slice(b"\r\n");
            if let Some(rest) = try_write(&server, &frames, true).unwrap() {
                rests += 1;
                write_rest(&server, rest).await.unwrap();
            }
        }
        assert!(rests > 0, "the socket's buffers filled at least once");
        drop(server);
        assert_eq!(reader.await.unwrap(), expected);
    }

    /// hyper's own empty refusal is written as the API's JSON one, but not
    /// once the connection was upgraded: then the same bytes are a frame's
    /// payload (a pong echoing the client's ping) and go out as they are.
    #[tokio::test]
    async fn after_a_101_writes_go_out_as_they_are() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let refusals = Arc::new(Refusals::render(|_| Response::new(Body::from("{\"error\":{}}"))).await);
        let mut io = Rewind::new(Bytes::new(), server, refusals, Duration::from_secs(5));
        let refusal = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        let mut read = async |n: usize| {
            let mut got = vec![0u8; n];
            peer.read_exact(&mut got).await.unwrap();
            got
        };
        io.write_all(refusal).await.unwrap();
        io.flush().await.unwrap();
        let json = io.refusals.malformed.clone();
        assert_eq!(read(json.len()).await, json, "before an upgrade hyper's refusal is rewritten");
        let head = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n";
        io.write_all(head).await.unwrap();
        assert_eq!(io.write_vectored(&[io::IoSlice::new(refusal)]).await.unwrap(), refusal.len());
        io.write_all(refusal).await.unwrap();
        io.flush().await.unwrap();
        let mut want = head.to_vec();
        want.extend_from_slice(refusal);
        want.extend_from_slice(refusal);
        assert_eq!(read(want.len()).await, want, "after the 101 nothing is rewritten");
    }

    #[test]
    fn chunk_sizes_in_hex() {
        let mut out = [0u8; 18];
        for (n, want) in
            [(0, "0\r\n"), (9, "9\r\n"), (10, "a\r\n"), (255, "ff\r\n"), (4096, "1000\r\n"), (usize::MAX, "ffffffffffffffff\r\n")]
        {
            let len = hex_size(n, &mut out);
            assert_eq!(std::str::from_utf8(&out[..len]).unwrap(), want);
        }
    }
}
