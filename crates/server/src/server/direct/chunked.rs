//! Writing a response on the direct path: its head as bytes, then the
//! body's frames as they come, with chunked encoding straight from the
//! frames (the frames ready at once are one chunk: one vectored write of
//! the chunk size, the shared frame bytes and the CRLF; no copy, no
//! per-connection buffer), tried without waiting; only a write the socket
//! cannot take whole waits, boxed, with its deadline.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Response, header};
use bytes::{Buf as _, Bytes};
use tokio::net::TcpStream;

use super::link::{Link, Owed};
use crate::server::Watch;

/// The response's head as bytes, and its body: the response itself (its
/// header map, some 1.2 KiB) is gone before the first write, so an idle
/// stream's task neither keeps it nor room for it.
pub(super) fn head_of(response: Response<Body>) -> (Vec<u8>, Body, Option<u64>) {
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
/// carries a whole delivery round under load), for the client to close or
/// for `watch`'s token (the connection's kill) to be cancelled;
/// the write is tried at once without waiting (it nearly always completes:
/// the socket buffer has room), and only a write that has to wait becomes
/// a boxed future with its deadline.
pub(super) fn write_response<'a>(
    stream: &'a TcpStream,
    link: Option<&'a Link>,
    head: Vec<u8>,
    body: Body,
    exact: Option<u64>,
    watch: Watch,
    write_timeout: Duration,
) -> impl Future<Output = io::Result<()>> + 'a {
    // A plain function returning a block, which keeps what it is given for
    // its whole life: the head is given as its boxed write, and the end is
    // a boxed write of its own, so a stream's task keeps room for neither
    // (nor for the end's timer).
    let first = Box::pin(write_rest(stream, vec![Bytes::from(head)]));
    let chunked = exact.is_none();
    async move {
        let mut watch = std::pin::pin!(watch);
        tokio::select! {
            biased;
            _ = watch.as_mut() => return Ok(()),
            r = first => r?,
        }
        // The socket's read readiness has not been given the watch's waker
        // yet: the first step polls it.
        watch.raise();
        let mut body = std::pin::pin!(body);
        // Whatever way it ends, the broker writes for this stream no more.
        let _ended = link.map(Ended);
        // Frames gathered behind a rest the broker left: written after it.
        let mut behind: Option<(Vec<Bytes>, bool)> = None;
        loop {
            let step = match behind.take() {
                Some((frames, ended)) => Step::Frames(frames, ended),
                None => std::future::poll_fn(|cx| next_step(cx, stream, link, body.as_mut(), watch.as_mut())).await,
            };
            let (rest, ended) = match step {
                Step::Frames(frames, ended) if frames.is_empty() => (None, ended),
                Step::Frames(frames, ended) => match try_write(stream, &frames, chunked) {
                    Ok(rest) => (rest, ended),
                    Err(_) => return Ok(()),
                },
                Step::Owed(rest, then) => {
                    behind = then;
                    (Some(rest), false)
                }
                Step::End => break,
                Step::Closed => return Ok(()),
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
                    _ = watch.as_mut() => return Ok(()),
                }
                // The watch's own poll above looks at the token only: a
                // wake-up for the socket's read readiness it took (the
                // client closing meanwhile) is handed on to the next step.
                watch.raise();
            }
            if ended {
                break;
            }
        }
        Box::pin(write_end(stream, chunked, watch, write_timeout)).await
    }
}

/// The end, like any write, within the write timeout and the kill.
async fn write_end(stream: &TcpStream, chunked: bool, watch: Pin<&mut Watch>, write_timeout: Duration) -> io::Result<()> {
    let end = async {
        if chunked {
            write_rest(stream, vec![Bytes::from_static(b"0\r\n\r\n")]).await?;
        }
        // The socket may outlive this task for a moment (the broker
        // holds it while it writes): the client sees the end now.
        socket2::SockRef::from(stream).shutdown(std::net::Shutdown::Write)
    };
    tokio::select! {
        biased;
        _ = watch => Ok(()),
        r = tokio::time::timeout(write_timeout, end) => r.unwrap_or(Ok(())),
    }
}

/// Lowers the link's idle flag for good when the stream ends.
struct Ended<'a>(&'a Link);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.set_idle(false);
    }
}

/// What the stream does next.
enum Step {
    /// The rest of a chunk the broker began (see [`Link`]): written before
    /// anything else, then the frames gathered behind it, if any (and
    /// whether the body ended after them).
    Owed(Vec<Bytes>, Option<(Vec<Bytes>, bool)>),
    /// Frames to write (every one that was ready, at most [`MAX_GATHER`]);
    /// `true` when the body ended after them.
    Frames(Vec<Bytes>, bool),
    /// The body ended.
    End,
    /// The client closed its side, the connection failed, or it was
    /// killed.
    Closed,
}

/// Polls for the kill, the client closing, and the body's next frames.
///
/// The task wakes once per delivery, and the kill and the client's side
/// rarely have news: both are polled with `watch`'s waker, and only when it
/// fired, so a delivery's wake-up reads a flag instead of taking the
/// token's and the socket's locks (see [`Watch`]).
fn next_step(
    cx: &mut Context<'_>,
    stream: &TcpStream,
    link: Option<&Link>,
    mut body: Pin<&mut Body>,
    mut watch: Pin<&mut Watch>,
) -> Poll<Step> {
    if let Some(link) = link {
        // Running: the broker writes for this stream no more until it
        // waits again with nothing in hand, and what it left goes first.
        link.set_idle(false);
        match link.take_owed() {
            Some(Owed::Rest(rest)) => return Poll::Ready(Step::Owed(rest, None)),
            Some(Owed::Failed) => return Poll::Ready(Step::Closed),
            None => {}
        }
    }
    if watch.as_mut().woken(cx) {
        let waker = watch.waker();
        let mut quiet = Context::from_waker(&waker);
        if watch.as_mut().poll_token(&mut quiet).is_ready() {
            return Poll::Ready(Step::Closed);
        }
        // Anything the client sends after its request is read and ignored;
        // the end of its side ends the stream. A client that keeps sending
        // is read a bounded amount per poll (the flag raised and the task
        // woken to go on: the socket stays ready, and says so no more), so
        // it cannot hold the task here.
        let mut reads = 0;
        while stream.poll_read_ready(&mut quiet).is_ready() {
            if reads == 16 {
                watch.raise();
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
    }
    let mut frames = Vec::new();
    let mut ended = false;
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
            Poll::Ready(Some(Err(_)) | None) => {
                ended = true;
                break;
            }
            Poll::Pending => break,
        }
    }
    // A broker write begun before this task lowered its idle flag may have
    // left a rest while the body was polled (the body's first look at the
    // client's queue waits for that write, under the queue's lock): it
    // goes before anything gathered here.
    if let Some(link) = link
        && let Some(owed) = link.take_owed()
    {
        return Poll::Ready(match owed {
            Owed::Rest(rest) => Step::Owed(rest, Some((frames, ended))),
            Owed::Failed => Step::Closed,
        });
    }
    match (frames.is_empty(), ended) {
        (true, true) => Poll::Ready(Step::End),
        (false, _) => Poll::Ready(Step::Frames(frames, ended)),
        (true, false) => {
            if let Some(link) = link {
                link.set_idle(true);
            }
            Poll::Pending
        }
    }
}

/// Most frames gathered into one write.
const MAX_GATHER: usize = 64;

/// Writes `frames` without waiting, in one vectored write when the socket
/// takes it all (with chunked encoding, one chunk holding them all: each is
/// a whole SSE event, so the stream reads the same). Returns what is left
/// when the socket would block.
pub(super) fn try_write(stream: &TcpStream, frames: &[Bytes], chunked: bool) -> io::Result<Option<Vec<Bytes>>> {
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
pub(super) fn consume(pieces: &mut Vec<Bytes>, mut n: usize) {
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
#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests start the tasks they drive")]
pub(super) mod tests {
    use tokio::io::AsyncReadExt as _;
    use tokio_util::sync::CancellationToken;

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

    /// The wire table of a response on the direct path: what the handler
    /// answers, and what the client reads (the date aside).
    #[tokio::test]
    async fn responses_leave_by_the_wire_table() {
        let frames = |frames: &[&'static str]| {
            let frames: Vec<Result<Bytes, std::convert::Infallible>> =
                frames.iter().map(|f| Ok(Bytes::from_static(f.as_bytes()))).collect();
            Body::from_stream(futures_util::stream::iter(frames))
        };
        let events =
            Response::builder().header("content-type", "text/event-stream").body(frames(&["id: 1\ndata: a\n\n", "id: 2\ndata: b\n\n"]));
        let refusal = Response::builder().status(403).header("content-type", "application/json").body(Body::from("{\"error\":1}"));
        let framed = Response::builder()
            .header("connection", "keep-alive")
            .header("transfer-encoding", "gzip")
            .header("date", "yesterday")
            .header("x-a", "1")
            .body(frames(&["x"]));
        let empty_frames = Response::builder().body(frames(&["", "ab", ""]));
        let nothing = Response::builder().body(Body::empty());
        let cases: Vec<(&str, Response<Body>, &str)> = vec![
            (
                "a stream: chunked, the frames ready at once in one chunk, then the last chunk",
                events.unwrap(),
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ndate: D\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
                 1e\r\nid: 1\ndata: a\n\nid: 2\ndata: b\n\n\r\n0\r\n\r\n",
            ),
            (
                "an answer of known length: its bytes as they are",
                refusal.unwrap(),
                "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ndate: D\r\ncontent-length: 11\r\nconnection: close\r\n\r\n{\"error\":1}",
            ),
            (
                "the framing headers are the writer's own, whatever the handler set",
                framed.unwrap(),
                "HTTP/1.1 200 OK\r\nx-a: 1\r\ndate: D\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n1\r\nx\r\n0\r\n\r\n",
            ),
            (
                "empty frames make no chunk (an empty chunk would end the body)",
                empty_frames.unwrap(),
                "HTTP/1.1 200 OK\r\ndate: D\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n2\r\nab\r\n0\r\n\r\n",
            ),
            ("an empty body", nothing.unwrap(), "HTTP/1.1 200 OK\r\ndate: D\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"),
        ];
        let date = regex::Regex::new("date: [^\r]*\r\n").unwrap();
        for (what, response, leaves) in cases {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let (head, body, exact) = head_of(response);
            let watch = Watch::new(CancellationToken::new());
            write_response(&server, None, head, body, exact, watch, Duration::from_secs(5)).await.unwrap();
            let mut read = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut read)).await.unwrap().unwrap();
            let read = String::from_utf8(read).unwrap();
            assert_eq!(date.replace(&read, "date: D\r\n"), leaves, "{what}");
        }
    }

    /// A stream whose body has nothing more to say ends when its client
    /// closes its side, when the client has sent far more than one poll
    /// reads before closing (all of it already there: the socket says
    /// ready once, and the watch must look again by itself), and when it
    /// is killed; a stream whose client just keeps sending goes on.
    #[tokio::test]
    async fn a_waiting_stream_ends_when_its_client_closes_or_it_is_killed() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = || Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::convert::Infallible>>());
        for (what, sent, close, kill) in [
            ("the client closes", 0, true, false),
            ("the client sends 64 KiB, then closes", 64 << 10, true, false),
            ("the connection is killed", 0, false, true),
            ("the client sends 64 KiB and stays", 64 << 10, false, false),
        ] {
            let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            client.write_all(&vec![b'x'; sent]).await.unwrap();
            if close {
                client.shutdown().await.unwrap();
            }
            let token = CancellationToken::new();
            if kill {
                token.cancel();
            }
            let (head, body, exact) = head_of(Response::builder().body(silent()).unwrap());
            let written = write_response(&server, None, head, body, exact, Watch::new(token), Duration::from_secs(5));
            let ended = tokio::time::timeout(Duration::from_secs(2), written).await;
            assert_eq!(ended.is_ok(), close || kill, "{what}");
        }
    }

    /// A server's socket and its client's, with buffers of 64 KiB on both
    /// sides (set, so the kernel does not grow them).
    pub(in crate::server::direct) async fn small_buffers() -> (TcpStream, TcpStream) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(64 << 10).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(1).unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(64 << 10).unwrap();
        let server = socket.connect(listener.local_addr().unwrap()).await.unwrap();
        (server, listener.accept().await.unwrap().0)
    }

    /// Writes a response with `body` on `link`'s socket, as a stream on the
    /// direct path does, on a task of its own.
    fn serve_linked(link: &std::sync::Arc<Link>, body: Body) -> tokio::task::JoinHandle<io::Result<()>> {
        let link = link.clone();
        let (head, body, exact) = head_of(Response::builder().body(body).unwrap());
        tokio::spawn(async move {
            let watch = Watch::new(CancellationToken::new());
            write_response(&link.stream, Some(&link), head, body, exact, watch, Duration::from_secs(30)).await
        })
    }

    /// A client that closes its side while a write waits for it (its
    /// buffers full), then takes the rest: the stream, idle after that
    /// write, still sees the close and ends (the close's wake-up came
    /// during the waiting write, and is not lost there).
    #[tokio::test]
    async fn a_client_that_closes_during_a_waiting_write_ends_the_stream() {
        use futures_util::StreamExt as _;
        use tokio::io::AsyncWriteExt as _;
        const BIG: usize = 4 << 20;
        // The frame cannot be taken whole, and its write waits.
        let (server, mut client) = small_buffers().await;
        // One frame larger than both sockets' buffers can hold, then nothing.
        let frame = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(Bytes::from(vec![b'a'; BIG]))]);
        let body = Body::from_stream(frame.chain(futures_util::stream::pending()));
        let (head, body, exact) = head_of(Response::builder().body(body).unwrap());
        let written = tokio::spawn(async move {
            let watch = Watch::new(CancellationToken::new());
            write_response(&server, None, head, body, exact, watch, Duration::from_secs(60)).await
        });
        // The frame's first bytes are here: its write has begun, and cannot
        // end before the client reads on.
        let mut read = Vec::with_capacity(BIG + 1024);
        while !read.ends_with(b"aaaa") {
            let mut buf = [0u8; 1024];
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "the stream ended early");
            read.extend_from_slice(&buf[..n]);
        }
        client.shutdown().await.unwrap();
        let rest = tokio::time::timeout(Duration::from_secs(30), client.read_to_end(&mut read)).await;
        assert!(rest.is_ok(), "the stream did not end after its client closed");
        let body_at = read.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        assert_eq!(read[body_at..].iter().filter(|b| **b == b'a').count(), BIG, "the frame arrived whole");
        written.await.unwrap().unwrap();
    }

    /// The broker writes to a waiting stream's socket itself, and when the
    /// socket does not take a chunk whole, the stream's task writes the
    /// rest before anything of its own: the client reads every chunk
    /// whole, in order, whatever the broker and the task wrote.
    #[tokio::test]
    async fn a_broker_write_that_the_socket_does_not_take_whole_is_finished_by_the_task_first() {
        use std::sync::Arc;
        let (server, mut client) = small_buffers().await;
        let link = Arc::new(Link::new(server));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let frames =
            futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (Ok::<_, std::convert::Infallible>(f), rx)) });
        let task = serve_linked(&link, Body::from_stream(frames));
        let idle = || async {
            tokio::time::timeout(Duration::from_secs(10), async {
                while !link.idle() {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("the stream waits")
        };
        let mut expected = Vec::new();
        let chunk = |data: &[u8], expected: &mut Vec<u8>| {
            expected.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
            expected.extend_from_slice(data);
            expected.extend_from_slice(b"\r\n");
        };
        tx.send(Bytes::from_static(b"first")).unwrap();
        chunk(b"first", &mut expected);
        idle().await;
        // The broker's chunks, until one does not fit (the client reads
        // nothing yet): no further broker write while the rest is owed.
        let mut n = 0u8;
        loop {
            let frame = Bytes::from(vec![b'a' + n % 26; 50_000]);
            chunk(&frame, &mut expected);
            n += 1;
            if !link.write_chunk(&[frame]) {
                break;
            }
            assert!(n < 100, "the socket's buffers never filled");
        }
        assert!(!link.idle() && !link.settled());
        // The task's own next frame goes after the rest.
        tx.send(Bytes::from_static(b"last")).unwrap();
        chunk(b"last", &mut expected);
        drop(tx);
        expected.extend_from_slice(b"0\r\n\r\n");
        let mut read = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), client.read_to_end(&mut read)).await.unwrap().unwrap();
        let body_at = read.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        assert!(read[body_at..] == expected[..], "the client read every chunk whole and in order");
        task.await.unwrap().unwrap();
        assert!(link.settled());
    }

    /// A broker write that the socket takes only in part while the
    /// stream's task, woken, is polling its body: the rest still goes
    /// before the frame that poll gathered.
    #[tokio::test]
    async fn a_rest_left_while_the_task_polls_goes_before_what_it_gathered() {
        use std::sync::{Arc, Mutex};
        let (server, mut client) = small_buffers().await;
        let link = Arc::new(Link::new(server));
        let expected = Arc::new(Mutex::new(Vec::new()));
        let chunk = |data: &[u8], expected: &mut Vec<u8>| {
            expected.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
            expected.extend_from_slice(data);
            expected.extend_from_slice(b"\r\n");
        };
        // A body that, asked for its next frame, first lets "the broker"
        // write chunks until one is taken only in part, as a flush that
        // began before the task woke would.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(Bytes, bool)>();
        let frames = futures_util::stream::unfold((rx, link.clone(), expected.clone()), move |(mut rx, link, expected)| async move {
            let (frame, broker_first) = rx.recv().await?;
            if broker_first {
                for n in 0u8.. {
                    let big = Bytes::from(vec![b'a' + n % 26; 50_000]);
                    chunk(&big, &mut expected.lock().unwrap());
                    if !link.write_chunk(&[big]) {
                        break;
                    }
                    assert!(n < 100, "the socket's buffers never filled");
                }
            }
            chunk(&frame, &mut expected.lock().unwrap());
            Some((Ok::<_, std::convert::Infallible>(frame), (rx, link, expected)))
        });
        let task = serve_linked(&link, Body::from_stream(frames));
        tx.send((Bytes::from_static(b"first"), false)).unwrap();
        // Written, and the task waits: only then does the broker write.
        tokio::time::timeout(Duration::from_secs(10), async {
            while !link.idle() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the stream waits");
        tx.send((Bytes::from_static(b"mine"), true)).unwrap();
        drop(tx);
        let mut read = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), client.read_to_end(&mut read)).await.unwrap().unwrap();
        task.await.unwrap().unwrap();
        let mut expected = expected.lock().unwrap().clone();
        expected.extend_from_slice(b"0\r\n\r\n");
        let body_at = read.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        assert!(read[body_at..] == expected[..], "the rest went first, every chunk whole and in order");
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
