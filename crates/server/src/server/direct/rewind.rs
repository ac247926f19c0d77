//! Every connection hyper serves goes through [`Rewind`]: the bytes the
//! sniff read put back in front, a write deadline, and hyper's own empty
//! refusals rewritten as the API's JSON ones (until a `101`: then the
//! connection carries frames, never looked at).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Response, header};
use bytes::{Buf as _, Bytes};
use http_body_util::BodyExt as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::linger;
use crate::server::HeadRefusal;

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
pub(in crate::server) struct Rewind {
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
pub(in crate::server) struct Refusals {
    malformed: Bytes,
    uri_too_long: Bytes,
    headers_too_large: Bytes,
}

impl Refusals {
    /// Renders the answers `refuse` gives.
    pub(in crate::server) async fn render(refuse: fn(HeadRefusal) -> Response<Body>) -> Self {
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
pub(super) fn count_refusal(status: u16) {
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
    /// their way.
    fn drop(&mut self) {
        if !self.eof {
            linger_after(&self.inner);
        }
    }
}

/// Keeps the socket of `stream` open for [`linger`] on a second descriptor,
/// on a task of its own, while `stream` closes.
pub(super) fn linger_after(stream: &TcpStream) {
    let (Ok(handle), Ok(socket)) = (tokio::runtime::Handle::try_current(), duplicate(stream)) else {
        return;
    };
    handle.spawn(async move {
        if let Ok(stream) = TcpStream::from_std(socket) {
            linger(stream).await;
        }
    });
}

/// A second descriptor of `stream`'s socket.
fn duplicate(stream: &TcpStream) -> io::Result<std::net::TcpStream> {
    Ok(std::net::TcpStream::from(std::os::fd::AsFd::as_fd(stream).try_clone_to_owned()?))
}

/// Applies a write deadline to one poll of a write: a write that makes no
/// progress for `timeout` fails (`stalled` runs meanwhile).
pub(super) fn deadline<T>(
    stalled: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    timeout: Duration,
    cx: &mut Context<'_>,
    polled: Poll<io::Result<T>>,
) -> Poll<io::Result<T>> {
    if polled.is_ready() {
        *stalled = None;
        return polled;
    }
    let sleep = stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
    if sleep.as_mut().poll(cx).is_ready() {
        *stalled = None;
        crate::metrics::client_dropped("write_stalled");
        tracing::debug!(reason = "write_stalled", "closing a connection whose client takes no bytes");
        return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
    }
    Poll::Pending
}

impl Rewind {
    pub(in crate::server) fn new(prefix: Bytes, inner: TcpStream, refusals: Arc<Refusals>, write_timeout: Duration) -> Self {
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
        deadline(&mut self.stalled, self.write_timeout, cx, polled)
    }

    /// The socket, once hyper let go of it after a `101`: what the sniff
    /// read that hyper has not, the stream (a second descriptor of it:
    /// this one closes without lingering), and the write timeout.
    pub(super) fn into_stream(mut self) -> io::Result<(Bytes, TcpStream, Duration)> {
        let stream = TcpStream::from_std(duplicate(&self.inner)?)?;
        self.eof = true;
        Ok((std::mem::take(&mut self.prefix), stream, self.write_timeout))
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
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn pair(prefix: &'static [u8]) -> (Rewind, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let refusals = Arc::new(Refusals::render(|refusal| Response::new(Body::from(format!("{{\"error\":\"{refusal:?}\"}}")))).await);
        (Rewind::new(Bytes::from_static(prefix), server, refusals, Duration::from_secs(5)), peer)
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

    /// The wire table of what hyper writes and what leaves: hyper's own
    /// empty refusals become the API's JSON ones (one write, or a vectored
    /// write in pieces), anything else leaves as it is.
    #[tokio::test]
    async fn writes_leave_by_the_wire_table() {
        let json = |kind: &str| {
            let body = format!("{{\"error\":\"{kind}\"}}");
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
        };
        let cases: Vec<(&str, Vec<&[u8]>, String)> = vec![
            ("hyper's 400", vec![b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"], json("Malformed")),
            ("hyper's 414", vec![b"HTTP/1.1 414 URI Too Long\r\nContent-Length: 0\r\n\r\n"], json("UriTooLong")),
            ("hyper's 431", vec![b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n"], json("HeadersTooLarge")),
            ("hyper's 400 in pieces", vec![b"HTTP/1.1 400 Bad Request\r\n", b"content-length: 0\r\n\r\n"], json("Malformed")),
            (
                "a 400 with a body (the API's own)",
                vec![b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}"],
                "HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}".into(),
            ),
            (
                "an empty 404 (not one hyper makes up)",
                vec![b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"],
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".into(),
            ),
            ("an answer", vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"], "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".into()),
            (
                "a refusal's bytes after a 101",
                vec![b"HTTP/1.1 101 Switching Protocols\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"],
                "HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".into(),
            ),
        ];
        for (what, writes, leaves) in cases {
            let (mut io, mut peer) = pair(b"").await;
            // The pieces of one response go in one vectored write, as
            // hyper writes a head and a body; a 101 is a write of its own.
            let (upgrade, rest): (Vec<&[u8]>, Vec<&[u8]>) = writes.iter().partition(|w| w.starts_with(b"HTTP/1.1 101"));
            for head in upgrade {
                io.write_all(head).await.unwrap();
            }
            let slices: Vec<io::IoSlice<'_>> = rest.iter().map(|w| io::IoSlice::new(w)).collect();
            let total: usize = rest.iter().map(|w| w.len()).sum();
            let mut taken = 0;
            while taken < total {
                let mut left = slices.clone();
                let mut bufs = &mut left[..];
                io::IoSlice::advance_slices(&mut bufs, taken);
                taken += io.write_vectored(bufs).await.unwrap();
            }
            io.shutdown().await.unwrap();
            let mut read = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), peer.read_to_end(&mut read)).await.unwrap().unwrap();
            assert_eq!(String::from_utf8(read).unwrap(), leaves, "{what}");
        }
    }

    /// What the sniff read is read first, then the socket.
    #[tokio::test]
    async fn the_head_read_comes_back_first() {
        let (mut io, mut peer) = pair(b"GET / HTTP/1.1\r\n").await;
        peer.write_all(b"host: x\r\n\r\n").await.unwrap();
        let mut read = vec![0u8; 27];
        io.read_exact(&mut read).await.unwrap();
        assert_eq!(&read[..], b"GET / HTTP/1.1\r\nhost: x\r\n\r\n");
    }
}
