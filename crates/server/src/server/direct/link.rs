//! A stream's socket on the direct path, shared between the stream's task
//! and the broker: while the task waits with everything written (*idle*),
//! the broker may write the stream's next chunk itself, without waking the
//! task (`broker::Sink`, written by `http/sse.rs`). What the socket does not
//! take whole (or a write that fails) is left here for the task, which
//! writes it before anything else, with its deadline, as it writes its own.
//!
//! Who writes is settled by two flags: the task lowers *idle* before it
//! looks at anything when it wakes, and raises it only when it waits again
//! with nothing in hand; the broker writes only while the task is parked in
//! the client's queue and idle, under the queue's lock, which the task
//! takes to unpark before it writes anything of its own. So the two never
//! write at once, and the bytes leave in the order they were queued.
//!
//! A WebSocket's task writes more than its queue's frames (answers, pings,
//! pongs, the close), at any point of its loop, so it cannot rely on the
//! queue's lock: its broker writes are *guarded* ([`Link::write_guarded`]),
//! taking the link's own lock and writing only while *idle* holds under
//! it, and the task lowers *idle* and takes that lock ([`Link::hold`],
//! which waits for a guarded write under way and takes what it left)
//! before each write of its own. Each message is whole in either's writes,
//! so between the two only whole messages interleave. The task raises
//! *idle* only while it waits for its session with nothing in hand.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A direct stream's socket and what its writers share (see the module docs).
#[derive(Debug)]
pub(crate) struct Link {
    pub(super) stream: TcpStream,
    /// The task waits with everything written.
    idle: AtomicBool,
    /// A broker write left something for the task: the rest of a chunk,
    /// or a failure.
    owed: AtomicBool,
    /// That rest, or `None` when the write failed (boxed: it is rare, and
    /// every stream carries the room).
    #[expect(clippy::box_collection, reason = "one pointer of room in every stream, for a rest few ever have")]
    rest: Mutex<Option<Box<Vec<Bytes>>>>,
}

/// What a broker write left the task.
pub(super) enum Owed {
    /// The rest of a chunk, to write before anything else.
    Rest(Vec<Bytes>),
    /// The socket failed: the stream is over.
    Failed,
}

impl Link {
    pub(super) fn new(stream: TcpStream) -> Self {
        Self { stream, idle: AtomicBool::new(false), owed: AtomicBool::new(false), rest: Mutex::new(None) }
    }

    /// Whether the task waits with everything written.
    pub(crate) fn idle(&self) -> bool {
        self.idle.load(Ordering::Acquire)
    }

    /// Whether no broker write left anything for the task.
    pub(crate) fn settled(&self) -> bool {
        !self.owed.load(Ordering::Acquire)
    }

    /// The task's side: it waits with everything written (`true`), or it
    /// runs (`false`, before it looks at anything).
    pub(crate) fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::Release);
    }

    /// What a broker write left the task, if anything.
    pub(super) fn take_owed(&self) -> Option<Owed> {
        if !self.owed.load(Ordering::Acquire) {
            return None;
        }
        let rest = self.rest.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.owed.store(false, Ordering::Release);
        Some(rest.map_or(Owed::Failed, |rest| Owed::Rest(*rest)))
    }

    /// The task's side, before it writes anything of its own (a guarded
    /// link's: see the module docs): the broker writes for it no more, no
    /// write of the broker's is under way, and what one left is handed
    /// over (to write first).
    fn hold(&self) -> Option<Owed> {
        self.idle.store(false, Ordering::Release);
        // A guarded write that saw the task idle finishes first; what it
        // left is taken under the same lock.
        let mut rest = self.rest.lock().unwrap_or_else(|p| p.into_inner());
        if !self.owed.load(Ordering::Acquire) {
            return None;
        }
        self.owed.store(false, Ordering::Release);
        Some(rest.take().map_or(Owed::Failed, |rest| Owed::Rest(*rest)))
    }

    /// The broker's side, for a guarded link: writes `frames` (whole
    /// messages) without waiting, if the task is idle, under the link's
    /// lock. What the socket does not take whole (or a failure) is the
    /// task's, as with [`Link::write_chunk`].
    pub(crate) fn write_guarded(&self, frames: &[Bytes]) -> crate::broker::Wrote {
        use crate::broker::Wrote;
        let mut rest = self.rest.lock().unwrap_or_else(|p| p.into_inner());
        if !self.idle.load(Ordering::Acquire) || self.owed.load(Ordering::Acquire) {
            return Wrote::Declined;
        }
        let left = match super::chunked::try_write(&self.stream, frames, false) {
            Ok(None) => return Wrote::All,
            Ok(Some(left)) => Some(Box::new(left)),
            Err(_) => None,
        };
        *rest = left;
        self.owed.store(true, Ordering::Release);
        self.idle.store(false, Ordering::Release);
        Wrote::Part
    }

    /// The broker's side: writes `frames` as one chunk, without waiting.
    /// Returns whether it went out whole; if not, the rest (or the failure)
    /// is the task's, and the stream is no longer idle.
    pub(crate) fn write_chunk(&self, frames: &[Bytes]) -> bool {
        let left = match super::chunked::try_write(&self.stream, frames, true) {
            Ok(None) => return true,
            Ok(Some(rest)) => Some(Box::new(rest)),
            Err(_) => None,
        };
        self.idle.store(false, Ordering::Release);
        *self.rest.lock().unwrap_or_else(|p| p.into_inner()) = left;
        self.owed.store(true, Ordering::Release);
        false
    }
}

/// A WebSocket's connection over a guarded [`Link`] (taken from hyper's
/// upgrade by [`LinkIo::of_upgraded`]): the bytes hyper read past the
/// handshake first; every write of the task's own held first (see the
/// module docs), a broker write's rest written before it, under the write
/// deadline hyper's connections have; a lingering close, as hyper's.
#[derive(Debug)]
pub(crate) struct LinkIo {
    link: Arc<Link>,
    /// Read past the handshake, not handed out yet.
    read_ahead: Bytes,
    /// A broker write's rest, being written (boxed: rare).
    #[expect(clippy::box_collection, reason = "one pointer of room in every connection, for a rest few ever have")]
    rest: Option<Box<Vec<Bytes>>>,
    write_timeout: Duration,
    /// Running while a write waits for the socket.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The client ended its side: closing needs no lingering.
    eof: bool,
}

impl LinkIo {
    /// The connection behind hyper's `upgraded`, when it is a plain TCP
    /// connection of this server's; `upgraded` back otherwise (TLS).
    pub(crate) fn of_upgraded(upgraded: Upgraded) -> Result<io::Result<Self>, Upgraded> {
        let parts = upgraded.downcast::<TokioIo<super::Rewind>>()?;
        Ok(parts.io.into_inner().into_stream().map(|(unread, stream, write_timeout)| {
            // What hyper read past the request goes before what it did not;
            // copied, as the view of it would keep hyper's whole read
            // buffer (8 KiB) for the connection's life.
            let read_ahead = match (parts.read_buf.is_empty(), unread.is_empty()) {
                (true, true) => Bytes::new(),
                _ => [&parts.read_buf[..], &unread[..]].concat().into(),
            };
            Self::new(stream, read_ahead, write_timeout)
        }))
    }

    fn new(stream: TcpStream, read_ahead: Bytes, write_timeout: Duration) -> Self {
        Self { link: Arc::new(Link::new(stream)), read_ahead, rest: None, write_timeout, stalled: None, eof: false }
    }

    /// The link the broker writes to.
    pub(crate) fn link(&self) -> &Arc<Link> {
        &self.link
    }

    /// Takes the socket from the broker (see [`Link::hold`]).
    fn hold(&mut self) -> io::Result<()> {
        match self.link.hold() {
            None => Ok(()),
            Some(Owed::Rest(rest)) => {
                self.rest = Some(Box::new(rest));
                Ok(())
            }
            Some(Owed::Failed) => Err(io::ErrorKind::BrokenPipe.into()),
        }
    }

    /// Holds the socket and writes what a broker write left.
    fn poll_settle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.hold()?;
        while let Some(rest) = self.rest.as_deref_mut() {
            let slices: Vec<IoSlice<'_>> = rest.iter().map(|b| IoSlice::new(b)).collect();
            let n = std::task::ready!(poll_try_write(&self.link.stream, &mut self.stalled, self.write_timeout, cx, &slices))?;
            drop(slices);
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let Some(rest) = self.rest.as_deref_mut() else { break };
            super::chunked::consume(rest, n);
            if rest.is_empty() {
                self.rest = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// One poll of a write of `bufs` to `stream`, under the write deadline.
fn poll_try_write(
    stream: &TcpStream,
    stalled: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    timeout: Duration,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    loop {
        let ready = stream.poll_write_ready(cx);
        std::task::ready!(super::rewind::deadline(stalled, timeout, cx, ready))?;
        match stream.try_write_vectored(bufs) {
            Ok(n) => return Poll::Ready(Ok(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
}

impl AsyncRead for LinkIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.read_ahead.is_empty() {
            let n = this.read_ahead.len().min(buf.remaining());
            buf.put_slice(&this.read_ahead.split_to(n));
            if this.read_ahead.is_empty() {
                this.read_ahead = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        loop {
            std::task::ready!(this.link.stream.poll_read_ready(cx))?;
            // Into the room as it is, not zeroed first: a reader may offer
            // the room of a whole message, and a client trickling it byte
            // by byte would otherwise pay for a zeroing per read.
            let room = buf.remaining();
            match this.link.stream.try_read_buf(buf) {
                Ok(n) => {
                    this.eof |= n == 0 && room > 0;
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for LinkIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_settle(cx))?;
        poll_try_write(&this.link.stream, &mut this.stalled, this.write_timeout, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_settle(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_settle(cx))?;
        Poll::Ready(socket2::SockRef::from(&this.link.stream).shutdown(std::net::Shutdown::Write))
    }
}

impl Drop for LinkIo {
    /// Nothing more is written for the connection; it closes lingering,
    /// as hyper's do (`super::Rewind`), unless the client ended its side.
    /// (A broker write under way may still finish: no close frame follows
    /// on the paths that end here without one.)
    fn drop(&mut self) {
        self.link.set_idle(false);
        if !self.eof {
            super::rewind::linger_after(&self.link.stream);
        }
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests start the tasks they drive")]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::broker::Wrote;

    /// A WebSocket's own writes and the broker's guarded ones never cut
    /// into each other: the bytes read past the handshake come first; the
    /// broker writes nothing while the task holds the socket, and writes
    /// once it lets go; a message the socket does not take whole is
    /// finished by the task before its own next one, and no broker write
    /// goes in between. The client reads every message whole, in order.
    #[tokio::test]
    async fn guarded_writes_and_the_task_s_own_never_cut_into_each_other() {
        let (server, mut client) = super::super::chunked::tests::small_buffers().await;
        let mut io = LinkIo::new(server, Bytes::from_static(b"ahead"), Duration::from_secs(30));
        let link = io.link().clone();
        client.write_all(b"then").await.unwrap();
        let mut read = [0u8; 16];
        let n = io.read(&mut read).await.unwrap();
        assert_eq!(&read[..n], b"ahead", "what hyper read first");
        let n = io.read(&mut read).await.unwrap();
        assert_eq!(&read[..n], b"then");

        let mut expected = Vec::new();
        io.write_all(b"task-1").await.unwrap();
        io.flush().await.unwrap();
        expected.extend_from_slice(b"task-1");
        assert_eq!(link.write_guarded(&[Bytes::from_static(b"x")]), Wrote::Declined, "the task holds the socket until it lets go");
        // The task waits for its session with nothing in hand.
        link.set_idle(true);
        let mut n = 0u8;
        loop {
            let message = Bytes::from(vec![b'a' + n % 26; 50_000]);
            expected.extend_from_slice(&message);
            n += 1;
            match link.write_guarded(&[message]) {
                Wrote::All => assert!(n < 100, "the socket's buffers never filled"),
                Wrote::Part => break,
                Wrote::Declined => panic!("an idle link declined"),
            }
        }
        assert_eq!(link.write_guarded(&[Bytes::from_static(b"x")]), Wrote::Declined, "nothing more while a rest is owed");
        let reader = tokio::spawn(async move {
            let mut read = Vec::new();
            client.read_to_end(&mut read).await.map(|_| read)
        });
        io.write_all(b"task-2").await.unwrap();
        expected.extend_from_slice(b"task-2");
        io.shutdown().await.unwrap();
        assert!(link.settled());
        let read = tokio::time::timeout(Duration::from_secs(30), reader).await.unwrap().unwrap().unwrap();
        assert!(read == expected, "every message whole and in order ({} bytes read, {} expected)", read.len(), expected.len());
    }
}
