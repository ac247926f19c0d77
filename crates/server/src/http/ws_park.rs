//! A WebSocket the broker writes while its device waits live, as it writes
//! a parked SSE stream (`broker::Sink`, docs/architecture.md): what
//! [`super::ws`] reads and writes through ([`WsIo`]), the broker's side of
//! it ([`Sink`]), and the `stream.event` messages both write, each built
//! once per event, header and all, and shared by every connection.
//!
//! A connection over plain TCP is taken out of hyper's upgrade
//! ([`LinkIo`]); its task holds the socket before each write of its own
//! and lets go of it only while it waits for its session with nothing in
//! hand ([`next_item`]), and the broker writes whole messages only in
//! between (`server::Link`'s guarded writes), so the two never cut into
//! each other's messages, and a notice the session hands the task goes out
//! before the events behind it. A TLS
//! connection stays hyper's, and its task writes everything, as before.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

use crate::broker::{Frame, FrameData, Wrote};
use crate::filter::Filter;
use crate::server::{Link, LinkIo};
use crate::service::session::{Item, Session, record_delivery};
use tidings_protocol::event::EventId;

/// A WebSocket's connection: one the broker can write to, or hyper's.
pub(super) enum WsIo {
    Linked(LinkIo),
    Upgraded(TokioIo<Upgraded>),
}

impl WsIo {
    /// The connection behind hyper's upgrade; `None` if it cannot be taken
    /// (the connection failed).
    pub(super) fn of(upgraded: Upgraded) -> Option<Self> {
        match LinkIo::of_upgraded(upgraded) {
            Ok(linked) => linked.ok().map(Self::Linked),
            Err(upgraded) => Some(Self::Upgraded(TokioIo::new(upgraded))),
        }
    }

    /// The link the broker may write to, if any.
    pub(super) fn link(&self) -> Option<&Arc<Link>> {
        match self {
            Self::Linked(io) => Some(io.link()),
            Self::Upgraded(_) => None,
        }
    }
}

impl AsyncRead for WsIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Linked(io) => Pin::new(io).poll_read(cx, buf),
            Self::Upgraded(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WsIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Linked(io) => Pin::new(io).poll_write(cx, buf),
            Self::Upgraded(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Linked(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Upgraded(io) => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Linked(io) => io.is_write_vectored(),
            Self::Upgraded(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Linked(io) => Pin::new(io).poll_flush(cx),
            Self::Upgraded(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Linked(io) => Pin::new(io).poll_shutdown(cx),
            Self::Upgraded(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

/// The next item of a device's live `session` (never, for a device that
/// is not live); `None` when a broker write left a rest to write first.
///
/// On a `link`, the task holds the socket while it looks at its session,
/// and lets the broker write only once it found nothing: a write the broker
/// began meanwhile has finished by then (the queue's lock), and a rest it
/// left is seen here. The queue wakes the task for such a rest, through
/// the waker this poll left.
pub(super) async fn next_item(session: Option<&mut Session>, link: Option<&Link>) -> Option<Item> {
    let Some(session) = session else { return std::future::pending().await };
    let mut next = std::pin::pin!(session.next());
    std::future::poll_fn(|cx| {
        let Some(link) = link else { return next.as_mut().poll(cx).map(Some) };
        link.set_idle(false);
        if let Poll::Ready(item) = next.as_mut().poll(cx) {
            return Poll::Ready(Some(item));
        }
        if !link.settled() {
            return Poll::Ready(None);
        }
        link.set_idle(true);
        Poll::Pending
    })
    .await
}

/// A device's live delivery, written by the broker while its connection's
/// task waits (see the module docs).
#[derive(Debug)]
pub(super) struct Sink {
    link: Arc<Link>,
    filter: Arc<Filter>,
    expires_at: Option<i64>,
    /// `permessage-deflate` was negotiated.
    deflate: bool,
    /// The device has every event up to here: its cursor when delivery
    /// went live, then the last event written. Such events are not sent
    /// again.
    had: AtomicI64,
}

impl Sink {
    /// The sink of a session on a connection over `link` (`deflate`: with
    /// `permessage-deflate`) for a device that has every event
    /// up to `floor`, if the broker can write to it: a plain TCP
    /// connection, whose frames need no span of their own.
    pub(super) fn of(
        link: Option<&Arc<Link>>,
        deflate: bool,
        filter: &Arc<Filter>,
        expires_at: Option<i64>,
        floor: EventId,
    ) -> Option<Arc<Self>> {
        let link = link.filter(|_| crate::telemetry::tracer().is_none())?;
        let (link, filter) = (link.clone(), filter.clone());
        Some(Arc::new(Self { link, filter, expires_at, deflate, had: AtomicI64::new(floor) }))
    }

    /// The device has every event up to `id` (its cursor, known once its
    /// session was opened: the broker writes nothing before the session is
    /// first polled).
    pub(super) fn raise(&self, id: EventId) {
        self.had.fetch_max(id, Ordering::AcqRel);
    }

    /// Every event up to here the device has: the last one the broker
    /// wrote, or the floor it was given. Final once the session it was
    /// given to is gone (the broker writes no more for it).
    pub(super) fn had(&self) -> EventId {
        self.had.load(Ordering::Acquire)
    }
}

impl crate::broker::Sink for Sink {
    fn idle(&self) -> bool {
        self.link.idle()
    }

    fn settled(&self) -> bool {
        self.link.settled()
    }

    fn write(&self, frames: &[Frame]) -> Wrote {
        if super::sse::task_must_write(&self.filter, self.expires_at) {
            return Wrote::Declined;
        }
        let had = self.had();
        let messages: Vec<Bytes> = frames.iter().filter(|f| f.id > had).map(|f| message(f, self.deflate)).collect();
        let wrote = if messages.is_empty() { Wrote::All } else { self.link.write_guarded(&messages) };
        if wrote != Wrote::Declined {
            if let Some(last) = frames.last() {
                self.raise(last.id);
            }
            if messages.len() == frames.len() {
                record_delivery("ws", frames, false);
            } else {
                record_delivery("ws", &frames.iter().filter(|f| f.id > had).cloned().collect::<Vec<_>>(), false);
            }
        }
        wrote
    }
}

/// The event's `stream.event` message as a connection writes it: one text
/// frame, compressed when `deflate` (each built once per event, shared).
pub(super) fn message(frame: &Frame, deflate: bool) -> Bytes {
    if deflate { frame.rendered_compressed(event_message, compressed_message) } else { frame.rendered(event_message) }
}

/// `stream.event {seq, event}` around the envelope, as one text frame.
fn event_message(frame: &FrameData) -> Bytes {
    let mut text = Vec::with_capacity(frame.envelope.len() + 64);
    text.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"stream.event\",\"params\":{\"seq\":");
    text.extend_from_slice(itoa::Buffer::new().format(frame.id).as_bytes());
    text.extend_from_slice(b",\"event\":");
    text.extend_from_slice(&frame.envelope);
    text.extend_from_slice(b"}}");
    text_frame(&text, false)
}

/// A text frame of [`event_message`]'s, its payload compressed alone
/// (`permessage-deflate`, RSV1 set).
fn compressed_message(frame: &[u8]) -> Bytes {
    text_frame(&super::compress::message(payload_of(frame)), true)
}

/// `payload` as one final, unmasked text frame (RSV1 set when `compressed`:
/// a `permessage-deflate` payload).
pub(super) fn text_frame(payload: &[u8], compressed: bool) -> Bytes {
    let header = FrameHeader { is_final: true, rsv1: compressed, rsv2: false, rsv3: false, opcode: OpCode::Data(Data::Text), mask: None };
    let mut out = Vec::with_capacity(MAX_HEADER + payload.len());
    header.format(payload.len() as u64, &mut out).expect("a Vec takes every write");
    out.extend_from_slice(payload);
    out.into()
}

/// The longest header of a server's frame (unmasked, a 64-bit length).
const MAX_HEADER: usize = 10;

/// The payload of a frame [`text_frame`] built.
pub(super) fn payload_of(frame: &[u8]) -> &[u8] {
    let at = match frame.get(1).map(|b| b & 0x7f) {
        Some(126) => 4,
        Some(127) => 10,
        _ => 2,
    };
    frame.get(at..).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event's message reads back as the client reads it: one final
    /// text frame, unmasked, of every length class; compressed, RSV1 set
    /// and inflating to the same text.
    #[test]
    fn an_event_message_is_one_text_frame_plain_or_compressed() {
        for size in [10, 200, 70_000] {
            let envelope = Bytes::from(format!("\"{}\"", "e".repeat(size)));
            let frame = Frame::new(7, envelope.clone(), 0);
            let expected = format!(
                r#"{{"jsonrpc":"2.0","method":"stream.event","params":{{"seq":7,"event":{}}}}}"#,
                "\"".to_owned() + &"e".repeat(size) + "\""
            );
            for deflate in [false, true] {
                let wire = message(&frame, deflate);
                let mut cursor = io::Cursor::new(&wire[..]);
                let (header, len) = FrameHeader::parse(&mut cursor).unwrap().unwrap();
                assert_eq!((header.opcode, header.is_final, header.mask, header.rsv1), (OpCode::Data(Data::Text), true, None, deflate));
                let payload = &wire[cursor.position() as usize..];
                assert_eq!(payload.len() as u64, len, "size {size}: the frame is whole");
                assert_eq!(super::payload_of(&wire), payload);
                let text = if deflate { super::super::compress::inflate_message(payload, 1 << 20).unwrap() } else { payload.to_vec() };
                assert_eq!(String::from_utf8(text).unwrap(), expected, "size {size}, deflate {deflate}");
            }
        }
    }
}
