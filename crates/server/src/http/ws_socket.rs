//! One WebSocket connection's frames (RFC 6455, the server's side), from
//! the handshake's answer to the close: what [`super::ws`] reads and writes.
//!
//! The framing is tungstenite's: [`FrameHeader`] parses and formats every
//! header, and [`derive_accept_key`] answers the handshake. The buffers are
//! ours, because an idle device should cost next to nothing: tungstenite's
//! stream keeps its read buffer and its write buffer at their largest size
//! for the life of the connection (about 900 bytes per idle device once it
//! has sent its `stream.auth` and had its answer), and a delivery is copied
//! into the write buffer frame by frame. Here:
//! - bytes are read into the stack and kept only while a frame is not
//!   whole, so between messages a connection holds no read buffer at all;
//! - a delivery's frames leave in one vectored write of the event messages
//!   every connection shares, header and all
//!   ([`crate::broker::Frame::rendered`], [`super::ws_park`]): nothing is
//!   copied, and nothing is kept once written.
//!
//! What a client may send is bounded: a frame's length is checked against
//! the message limit from its header, before any of its payload is read.
//!
//! With `TIDINGS_COMPRESSION=on`, a client that offers `permessage-deflate`
//! (RFC 7692) gets it with no context takeover either way: each event's
//! message is compressed once and shared ([`super::compress`]), and a
//! compressed message from the client is inflated alone, into at most the
//! message limit.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::extract::FromRequestParts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header, request::Parts};
use bytes::Bytes;
use hyper::upgrade::OnUpgrade;
use tokio::io::{AsyncRead, AsyncWriteExt as _, ReadBuf};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};

use super::compress::Offer;
use super::error::ApiError;
use super::ws_park::WsIo;

/// The longest frame header (a masked frame with a 64-bit length).
const MAX_HEADER: usize = 14;

/// What a first read takes at most, on the stack.
const FIRST_READ: usize = 512;

/// A WebSocket upgrade request (HTTP/1.1): the `Sec-WebSocket-Accept` to
/// answer with and hyper's handle on the connection it becomes.
pub(super) struct Upgrade {
    accept: HeaderValue,
    on_upgrade: OnUpgrade,
    /// The client's `permessage-deflate` offer the server takes, if any.
    deflate: Option<Offer>,
}

/// The request is not a WebSocket upgrade: `426 upgrade_required`.
#[derive(Debug)]
pub(super) struct NotUpgrade;

impl axum::response::IntoResponse for NotUpgrade {
    fn into_response(self) -> axum::response::Response {
        let refusal = ApiError::new(StatusCode::UPGRADE_REQUIRED, "upgrade_required", "GET /v1/ws is a WebSocket upgrade");
        let mut response = refusal.into_response();
        response.headers_mut().insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        response
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = NotUpgrade;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, NotUpgrade> {
        if parts.method != Method::GET || !is_upgrade(&parts.headers) {
            return Err(NotUpgrade);
        }
        let key = parts.headers.get(header::SEC_WEBSOCKET_KEY).ok_or(NotUpgrade)?;
        let accept = HeaderValue::from_str(&derive_accept_key(key.as_bytes())).map_err(|_| NotUpgrade)?;
        let on_upgrade = parts.extensions.remove::<OnUpgrade>().ok_or(NotUpgrade)?;
        Ok(Self { accept, on_upgrade, deflate: Offer::of(&parts.headers) })
    }
}

/// `Connection: upgrade`, `Upgrade: websocket`, version 13 (RFC 6455 §4.2.1).
fn is_upgrade(headers: &HeaderMap) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token))))
    };
    has_token(header::CONNECTION, "upgrade")
        && has_token(header::UPGRADE, "websocket")
        && headers.get(header::SEC_WEBSOCKET_VERSION).is_some_and(|v| v == "13")
}

impl Upgrade {
    /// The `101` to answer with; with `compression`, taking the client's
    /// `permessage-deflate` offer if it made one the server can take.
    pub(super) fn response(&self, compression: bool) -> axum::response::Response {
        let mut response = axum::response::Response::new(axum::body::Body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = response.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::SEC_WEBSOCKET_ACCEPT, self.accept.clone());
        if let Some(offer) = self.deflate.filter(|_| compression) {
            h.insert(header::SEC_WEBSOCKET_EXTENSIONS, offer.answer());
        }
        response
    }

    /// The connection, once the `101` went out; `None` if it never did.
    /// `compression` as given to [`Upgrade::response`].
    pub(super) async fn socket(self, max_message: usize, compression: bool) -> Option<Socket<WsIo>> {
        let upgraded = self.on_upgrade.await.ok()?;
        let mut socket = Socket::new(WsIo::of(upgraded)?, max_message);
        socket.deflate = compression && self.deflate.is_some();
        Some(socket)
    }
}

/// A message from the client.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Incoming {
    Text(String),
    /// A binary message (this protocol has none), at its first frame.
    Binary,
    /// Its payload, to send back in the pong.
    Ping(Vec<u8>),
    Pong,
    /// The client's close, with its code if it gave one.
    Close(Option<u16>),
}

/// Why reading stopped.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    #[error("a message over the limit")]
    TooBig,
    #[error("a text message that is not UTF-8")]
    Utf8,
    #[error("a protocol error: {0}")]
    Protocol(&'static str),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl ReadError {
    /// The close it calls for: its code and reason.
    pub(super) fn close(&self) -> (u16, &'static str) {
        use tidings_protocol::ws::close;
        match self {
            Self::TooBig => (close::TOO_BIG, "message_too_big"),
            Self::Utf8 => (close::INVALID, "invalid_utf8"),
            Self::Protocol(_) => (close::PROTOCOL, "protocol_error"),
            Self::Io(_) => (close::INTERNAL, "read_failed"),
        }
    }
}

/// The server's side of one WebSocket connection over `io`.
pub(super) struct Socket<Io> {
    io: Io,
    /// Bytes of frames not read whole yet: empty, and unallocated, between
    /// frames.
    input: Vec<u8>,
    /// The text of a fragmented message so far.
    partial: Option<Vec<u8>>,
    /// That message is compressed (its first frame set RSV1).
    partial_compressed: bool,
    /// `permessage-deflate` was negotiated.
    deflate: bool,
    max_message: usize,
    /// A write failed: a frame may have been cut short, so nothing more
    /// is written (a close frame would land inside it).
    broken: bool,
}

impl<Io: AsyncRead + tokio::io::AsyncWrite + Unpin> Socket<Io> {
    pub(super) fn new(io: Io, max_message: usize) -> Self {
        Self { io, input: Vec::new(), partial: None, partial_compressed: false, deflate: false, max_message, broken: false }
    }

    /// Whether `permessage-deflate` was negotiated: events go out compressed.
    pub(super) fn deflates(&self) -> bool {
        self.deflate
    }

    /// The next message; `None` once the client closed the connection.
    pub(super) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Incoming, ReadError>>> {
        loop {
            match self.parse() {
                Ok(Some(message)) => return Poll::Ready(Some(Ok(message))),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
            let read = if self.input.is_empty() {
                // Nothing kept between frames: a read that finds nothing
                // (the idle case) costs no allocation.
                let mut chunk = [0u8; FIRST_READ];
                let mut buf = ReadBuf::new(&mut chunk);
                match ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf)) {
                    Ok(()) => {
                        self.input.extend_from_slice(buf.filled());
                        buf.filled().len()
                    }
                    Err(e) => return Poll::Ready(Some(Err(e.into()))),
                }
            } else {
                // Into the room `parse` reserved for the rest of the frame.
                match ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.input)) {
                    Ok(n) => n,
                    Err(e) => return Poll::Ready(Some(Err(e.into()))),
                }
            };
            if read == 0 {
                return Poll::Ready(None);
            }
        }
    }

    /// A message from the frames read so far, if they make one; otherwise
    /// room reserved for the rest of the frame under way.
    fn parse(&mut self) -> Result<Option<Incoming>, ReadError> {
        use ReadError::Protocol;
        while !self.input.is_empty() {
            let mut cursor = io::Cursor::new(self.input.as_slice());
            let Some((header, len)) = FrameHeader::parse(&mut cursor).map_err(|_| Protocol("malformed frame header"))? else {
                self.input.reserve(MAX_HEADER);
                return Ok(None);
            };
            let start = usize::try_from(cursor.position()).expect("a header is 14 bytes at most");
            let Some(mask) = header.mask else { return Err(Protocol("a client frame must be masked")) };
            // RSV1 marks a compressed message, on its first frame only.
            let first_data = matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary));
            if header.rsv2 || header.rsv3 || (header.rsv1 && !(self.deflate && first_data)) {
                return Err(Protocol("reserved bits set"));
            }
            let so_far = self.partial.as_ref().map_or(0, Vec::len) as u64;
            match header.opcode {
                OpCode::Control(Control::Reserved(_)) | OpCode::Data(Data::Reserved(_)) => return Err(Protocol("reserved opcode")),
                OpCode::Control(_) if !header.is_final || len > 125 => {
                    return Err(Protocol("a control frame fragmented or over 125 bytes"));
                }
                OpCode::Data(_) if len.saturating_add(so_far) > self.max_message as u64 => return Err(ReadError::TooBig),
                _ => {}
            }
            // At most the message limit (or 125), checked above.
            let end = start + usize::try_from(len).map_err(|_| ReadError::TooBig)?;
            if self.input.len() < end {
                self.input.reserve(end - self.input.len());
                return Ok(None);
            }
            let mut payload = std::mem::take(&mut self.input);
            if payload.len() > end {
                self.input = payload.split_off(end);
            }
            payload.drain(..start);
            unmask(&mut payload, mask);
            let max_message = self.max_message;
            let text = |bytes: Vec<u8>, compressed: bool| {
                let bytes = if compressed {
                    super::compress::inflate_message(&bytes, max_message).map_err(|e| match e {
                        super::compress::InflateError::TooBig => ReadError::TooBig,
                        super::compress::InflateError::Corrupt => Protocol("a compressed message that does not inflate"),
                    })?
                } else {
                    bytes
                };
                String::from_utf8(bytes).map(|t| Some(Incoming::Text(t))).map_err(|_| ReadError::Utf8)
            };
            match (header.opcode, self.partial.as_mut()) {
                (OpCode::Control(Control::Ping), _) => return Ok(Some(Incoming::Ping(payload))),
                (OpCode::Control(Control::Pong), _) => return Ok(Some(Incoming::Pong)),
                (OpCode::Control(Control::Close), _) => return close_code(&payload).map(|code| Some(Incoming::Close(code))),
                (OpCode::Data(Data::Binary), None) => return Ok(Some(Incoming::Binary)),
                (OpCode::Data(Data::Text), None) if header.is_final => return text(payload, header.rsv1),
                (OpCode::Data(Data::Text), None) => {
                    self.partial = Some(payload);
                    self.partial_compressed = header.rsv1;
                }
                (OpCode::Data(Data::Continue), Some(partial)) => {
                    partial.extend_from_slice(&payload);
                    if header.is_final {
                        return text(self.partial.take().unwrap_or_default(), self.partial_compressed);
                    }
                }
                (OpCode::Data(Data::Continue), None) => return Err(Protocol("a continuation outside a message")),
                _ => return Err(Protocol("a new message inside a fragmented one")),
            }
        }
        Ok(None)
    }

    /// Sends whole frames ([`super::ws_park::text_frame`]s), in one vectored write when the
    /// socket takes it whole.
    pub(super) async fn send_framed(&mut self, frames: &[Bytes]) -> io::Result<()> {
        if self.broken {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let written = self.write_all(frames.iter().map(|f| IoSlice::new(f)).collect()).await;
        self.broken = written.is_err();
        written
    }

    /// Sends one text frame.
    pub(super) async fn send_text(&mut self, text: &[u8]) -> io::Result<()> {
        self.send(OpCode::Data(Data::Text), &[text], false).await
    }

    /// Sends a ping.
    pub(super) async fn send_ping(&mut self) -> io::Result<()> {
        self.send(OpCode::Control(Control::Ping), &[[0u8; 0]], false).await
    }

    /// Answers a ping with its payload.
    pub(super) async fn send_pong(&mut self, payload: &[u8]) -> io::Result<()> {
        self.send(OpCode::Control(Control::Pong), &[payload], false).await
    }

    /// Sends a close frame with `code` and `reason` (at most 123 bytes).
    pub(super) async fn send_close(&mut self, code: u16, reason: &str) -> io::Result<()> {
        let mut payload = Vec::with_capacity(2 + reason.len());
        payload.extend_from_slice(&code.to_be_bytes());
        payload.extend_from_slice(&reason.as_bytes()[..reason.len().min(123)]);
        self.send(OpCode::Control(Control::Close), &[&payload], false).await?;
        self.io.shutdown().await
    }

    /// One frame of `opcode` per payload, their headers side by side in one
    /// buffer, all in as few writes as the socket allows, then a flush (TLS
    /// keeps what it encrypted until then). After a failed write nothing
    /// more is written.
    async fn send(&mut self, opcode: OpCode, payloads: &[impl AsRef<[u8]> + Sync], compressed: bool) -> io::Result<()> {
        if self.broken {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let written = self.write_frames(opcode, payloads, compressed).await;
        self.broken = written.is_err();
        written
    }

    async fn write_frames(&mut self, opcode: OpCode, payloads: &[impl AsRef<[u8]> + Sync], compressed: bool) -> io::Result<()> {
        let frame = FrameHeader { is_final: true, rsv1: compressed, rsv2: false, rsv3: false, opcode, mask: None };
        let mut heads = Vec::with_capacity(payloads.len() * 4);
        for payload in payloads {
            frame.format(payload.as_ref().len() as u64, &mut heads).map_err(io::Error::other)?;
        }
        let mut slices = Vec::with_capacity(payloads.len() * 2);
        let mut from = 0;
        for payload in payloads {
            let payload = payload.as_ref();
            let to = from + frame.len(payload.len() as u64);
            slices.push(IoSlice::new(&heads[from..to]));
            slices.push(IoSlice::new(payload));
            from = to;
        }
        self.write_all(slices).await
    }

    async fn write_all(&mut self, mut slices: Vec<IoSlice<'_>>) -> io::Result<()> {
        let mut rest = slices.as_mut_slice();
        while !rest.is_empty() {
            let n = self.io.write_vectored(rest).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        self.io.flush().await
    }
}

impl Socket<WsIo> {
    /// The link the broker may write to, if any ([`WsIo::link`]).
    pub(super) fn link(&self) -> Option<&std::sync::Arc<crate::server::Link>> {
        self.io.link()
    }

    /// Writes what a broker write left, if anything.
    pub(super) async fn settle(&mut self) -> io::Result<()> {
        if self.broken {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let settled = self.io.flush().await;
        self.broken = settled.is_err();
        settled
    }
}

/// The code of a client's close frame (RFC 6455 §5.5.1, §7.4): none, or
/// one a peer may send followed by a UTF-8 reason.
fn close_code(payload: &[u8]) -> Result<Option<u16>, ReadError> {
    let [hi, lo, reason @ ..] = payload else {
        return if payload.is_empty() { Ok(None) } else { Err(ReadError::Protocol("a close frame of one byte")) };
    };
    let code = u16::from_be_bytes([*hi, *lo]);
    if !CloseCode::from(code).is_allowed() {
        return Err(ReadError::Protocol("a close code no peer may send"));
    }
    std::str::from_utf8(reason).map_err(|_| ReadError::Utf8)?;
    Ok(Some(code))
}

/// Undoes a client's mask (RFC 6455 §5.3).
fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    for (i, byte) in payload.iter_mut().enumerate() {
        *byte ^= mask[i & 3];
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests start the tasks they drive")]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt as _;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;

    /// A client's frame: masked, as RFC 6455 requires.
    fn client_frame(opcode: OpCode, is_final: bool, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let header = FrameHeader { is_final, rsv1: false, rsv2: false, rsv3: false, opcode, mask: Some(mask) };
        let mut out = Vec::new();
        header.format(payload.len() as u64, &mut out).unwrap();
        let mut body = payload.to_vec();
        unmask(&mut body, mask);
        out.extend_from_slice(&body);
        out
    }

    /// A connection that takes `room` bytes, fails the next write (a
    /// write deadline passing, say), then takes everything.
    struct FailsOnce {
        taken: Vec<u8>,
        room: usize,
        failed: bool,
    }

    impl AsyncRead for FailsOnce {
        fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut tokio::io::ReadBuf<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl tokio::io::AsyncWrite for FailsOnce {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            if self.room == 0 && !self.failed {
                self.failed = true;
                return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
            }
            let n = if self.failed { buf.len() } else { buf.len().min(self.room) };
            self.room -= n.min(self.room);
            self.taken.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Once a write failed part-way through a frame, nothing more goes out:
    /// a close frame would land inside the cut frame.
    #[tokio::test]
    async fn after_a_failed_write_nothing_more_is_written() {
        let mut socket = Socket::new(FailsOnce { taken: Vec::new(), room: 50, failed: false }, 1000);
        assert!(socket.send_text(&[b'x'; 100]).await.is_err());
        assert_eq!(socket.io.taken.len(), 50, "the frame was cut short");
        assert!(socket.send_close(1011, "write_failed").await.is_err());
        assert!(socket.send_text(b"more").await.is_err());
        assert_eq!(socket.io.taken.len(), 50, "nothing followed the cut frame");
    }

    fn socket() -> (Socket<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
        let (server, client) = tokio::io::duplex(1 << 20);
        (Socket::new(server, 1000), client)
    }

    async fn recv(socket: &mut Socket<tokio::io::DuplexStream>) -> Option<Result<Incoming, ReadError>> {
        std::future::poll_fn(|cx| socket.poll_recv(cx)).await
    }

    /// Messages come whole whatever the reads cut them into: fragments
    /// joined, a ping between fragments answered in order, several frames
    /// in one read; and between messages nothing is kept.
    #[tokio::test]
    async fn messages_come_whole_however_they_are_cut_and_nothing_is_kept_between_them() {
        let (mut socket, mut client) = socket();
        let mut wire = client_frame(OpCode::Data(Data::Text), false, b"{\"a\":");
        wire.extend(client_frame(OpCode::Control(Control::Ping), true, b"p"));
        wire.extend(client_frame(OpCode::Data(Data::Continue), true, "1}é".as_bytes()));
        wire.extend(client_frame(OpCode::Data(Data::Text), true, &[b'x'; 300]));
        wire.extend(client_frame(OpCode::Control(Control::Pong), true, b""));
        // One byte at a time, then the rest at once.
        let writer = tokio::spawn(async move {
            for byte in &wire[..9] {
                client.write_all(&[*byte]).await.unwrap();
                tokio::task::yield_now().await;
            }
            client.write_all(&wire[9..]).await.unwrap();
            client
        });
        assert_eq!(recv(&mut socket).await.unwrap().unwrap(), Incoming::Ping(b"p".to_vec()));
        assert_eq!(recv(&mut socket).await.unwrap().unwrap(), Incoming::Text("{\"a\":1}é".to_owned()));
        assert_eq!(recv(&mut socket).await.unwrap().unwrap(), Incoming::Text("x".repeat(300)));
        assert_eq!(recv(&mut socket).await.unwrap().unwrap(), Incoming::Pong);
        assert_eq!((socket.input.capacity(), socket.partial.is_none()), (0, true), "nothing kept between messages");
        drop(writer.await.unwrap());
        assert!(recv(&mut socket).await.is_none(), "the end of the connection");
    }

    /// What a client may not send: each is refused before its payload is
    /// read or kept.
    #[tokio::test]
    async fn what_a_client_may_not_send_is_refused() {
        let unmasked = {
            let mut out = Vec::new();
            let header = FrameHeader { opcode: OpCode::Data(Data::Text), ..FrameHeader::default() };
            header.format(2, &mut out).unwrap();
            out.extend_from_slice(b"hi");
            out
        };
        let mut rsv = client_frame(OpCode::Data(Data::Text), true, b"hi");
        rsv[0] |= 0x40;
        // The header of a frame over the limit, without its payload.
        let mut too_big = client_frame(OpCode::Data(Data::Text), true, &[b'x'; 1001]);
        too_big.truncate(8);
        let mut fragments_too_big = client_frame(OpCode::Data(Data::Text), false, &[b'x'; 600]);
        fragments_too_big.extend(client_frame(OpCode::Data(Data::Continue), true, &[b'x'; 401]));
        // Each as the close code the connection answers it with.
        let kind = |e: &ReadError| match e {
            ReadError::Protocol(_) => 1002,
            ReadError::TooBig => 1009,
            ReadError::Utf8 => 1007,
            ReadError::Io(_) => 1011,
        };
        let cases = [
            (unmasked, 1002),
            (rsv, 1002),
            (client_frame(OpCode::Control(Control::Ping), false, b""), 1002),
            (client_frame(OpCode::Control(Control::Ping), true, &[0; 126]), 1002),
            (client_frame(OpCode::Data(Data::Continue), true, b"x"), 1002),
            (client_frame(OpCode::Data(Data::Reserved(3)), true, b"x"), 1002),
            (too_big, 1009),
            (fragments_too_big, 1009),
            (client_frame(OpCode::Data(Data::Text), true, &[0xff, 0xfe]), 1007),
            // Closes: one byte, codes no peer may send, a reason that is not UTF-8.
            (client_frame(OpCode::Control(Control::Close), true, &[0x03]), 1002),
            (client_frame(OpCode::Control(Control::Close), true, &1005u16.to_be_bytes()), 1002),
            (client_frame(OpCode::Control(Control::Close), true, &999u16.to_be_bytes()), 1002),
            (client_frame(OpCode::Control(Control::Close), true, &[0x0f, 0xa0, 0xff]), 1007),
        ];
        for (i, (wire, expected)) in cases.into_iter().enumerate() {
            let (mut socket, mut client) = socket();
            client.write_all(&wire).await.unwrap();
            let got = recv(&mut socket).await.unwrap();
            assert_eq!(got.as_ref().err().map(kind), Some(expected), "case {i}: {got:?}");
        }
        let (mut socket, mut client) = socket();
        client.write_all(&client_frame(OpCode::Data(Data::Binary), false, b"\x00")).await.unwrap();
        assert_eq!(recv(&mut socket).await.unwrap().unwrap(), Incoming::Binary, "a binary message, at its first frame");
        // A close without a code, and one with a code and a reason.
        for (payload, code) in [(&b""[..], None), (&b"\x0f\xa0bye"[..], Some(4000))] {
            let (mut closing, mut client) = self::socket();
            client.write_all(&client_frame(OpCode::Control(Control::Close), true, payload)).await.unwrap();
            assert_eq!(recv(&mut closing).await.unwrap().unwrap(), Incoming::Close(code));
        }
    }

    /// A client's frame with RSV1 (a compressed message's first frame).
    fn compressed_frame(opcode: OpCode, is_final: bool, payload: &[u8]) -> Vec<u8> {
        let mut frame = client_frame(opcode, is_final, payload);
        frame[0] |= 0x40;
        frame
    }

    /// With `permessage-deflate`: a compressed message (whole, or in
    /// fragments with RSV1 on the first) is inflated alone; one that would
    /// inflate past the limit is refused as too big, junk as a protocol
    /// error, and so is RSV1 where it may not be (a continuation, a
    /// control frame, a connection that did not negotiate it).
    #[tokio::test]
    async fn compressed_messages_are_inflated_alone_within_the_limit() {
        let text = br#"{"jsonrpc":"2.0","id":1,"method":"sync.delta","params":{"device_id":"d","since":0}}"#;
        let packed = crate::http::compress::message(text);
        let (mut socket, mut client) = socket();
        socket.deflate = true;
        let mut wire = compressed_frame(OpCode::Data(Data::Text), true, &packed);
        let (head, tail) = packed.split_at(packed.len() / 2);
        wire.extend(compressed_frame(OpCode::Data(Data::Text), false, head));
        wire.extend(client_frame(OpCode::Data(Data::Continue), true, tail));
        wire.extend(client_frame(OpCode::Data(Data::Text), true, b"plain"));
        client.write_all(&wire).await.unwrap();
        for expected in [&text[..], &text[..], b"plain"] {
            assert_eq!(recv(&mut socket).await.unwrap().unwrap(), Incoming::Text(String::from_utf8(expected.to_vec()).unwrap()));
        }

        let bomb = crate::http::compress::message(&[b'a'; 100_000]);
        assert!(bomb.len() < 1000, "the bomb is under the limit as sent");
        let cases = [
            (compressed_frame(OpCode::Data(Data::Text), true, &bomb), true, 1009),
            (compressed_frame(OpCode::Data(Data::Text), true, &[0xff; 20]), true, 1002),
            (compressed_frame(OpCode::Control(Control::Ping), true, b""), true, 1002),
            (
                [client_frame(OpCode::Data(Data::Text), false, b"a"), compressed_frame(OpCode::Data(Data::Continue), true, b"b")].concat(),
                true,
                1002,
            ),
            (compressed_frame(OpCode::Data(Data::Text), true, &packed), false, 1002),
        ];
        for (i, (wire, deflate, expected)) in cases.into_iter().enumerate() {
            let (mut socket, mut client) = self::socket();
            socket.deflate = deflate;
            client.write_all(&wire).await.unwrap();
            let got = recv(&mut socket).await.unwrap();
            // As the close code the connection answers it with.
            let kind = match &got {
                Err(ReadError::TooBig) => 1009,
                Err(ReadError::Protocol(_)) => 1002,
                _ => 0,
            };
            assert_eq!(kind, expected, "case {i}: {got:?}");
        }

        // Sent compressed: RSV1 set, the payload inflating to the text.
        let (mut socket, mut client) = self::socket();
        socket.deflate = true;
        socket.send_framed(&[super::super::ws_park::text_frame(&crate::http::compress::message(text), true)]).await.unwrap();
        drop(socket);
        let mut wire = Vec::new();
        client.read_to_end(&mut wire).await.unwrap();
        let mut cursor = io::Cursor::new(wire.as_slice());
        let (header, len) = FrameHeader::parse(&mut cursor).unwrap().unwrap();
        assert!(header.rsv1 && header.is_final);
        let at = cursor.position() as usize;
        let inflated = crate::http::compress::inflate_message(&wire[at..at + len as usize], 1000).unwrap();
        assert_eq!(inflated, text);
    }

    /// A delivery's frames, as the client reads them: one unmasked text
    /// frame each, of every length class, then a close with its code.
    #[tokio::test]
    async fn frames_sent_read_back_as_a_client_reads_them() {
        let (mut socket, mut client) = socket();
        let texts = [b"{}".to_vec(), vec![b'y'; 126], vec![b'z'; 70_000]];
        socket.send_framed(&texts.iter().map(|t| super::super::ws_park::text_frame(t, false)).collect::<Vec<_>>()).await.unwrap();
        socket.send_close(1013, "slow_consumer").await.unwrap();
        let mut wire = Vec::new();
        client.read_to_end(&mut wire).await.unwrap();
        let mut cursor = io::Cursor::new(wire.as_slice());
        let mut frames = Vec::new();
        while let Some((header, len)) = FrameHeader::parse(&mut cursor).unwrap() {
            let at = cursor.position() as usize;
            let payload = &wire[at..at + len as usize];
            cursor.set_position((at + len as usize) as u64);
            assert_eq!(header.mask, None, "server frames are not masked");
            frames.push(Frame::from_payload(header, payload.to_vec().into()));
        }
        assert_eq!(frames.len(), 4);
        for (frame, text) in frames.iter().zip(&texts) {
            assert_eq!((frame.header().opcode, frame.header().is_final, frame.payload()), (OpCode::Data(Data::Text), true, &text[..]));
        }
        assert_eq!(frames[3].header().opcode, OpCode::Control(Control::Close));
        assert_eq!(frames[3].payload(), b"\x03\xf5slow_consumer");
    }
}
