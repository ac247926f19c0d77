//! Waiting on a cancellation token from a task that wakes for other reasons
//! many times a second, at the price of a few atomic operations a wake-up.
//!
//! A stream's task selects on its connection's kill token while it waits
//! for its next delivery, and is woken once per delivery. The token's own
//! future ([`CancellationToken::cancelled`]) takes the token's lock to read
//! its state and polls its `Notified` again on every one of those polls,
//! so every event written to every client paid for a token that almost
//! never fires (about 1% of the server's time under fan-out, in
//! `scripts/profile`). A [`Watch`] polls the token's future with a waker of
//! its own, which raises a flag before it wakes the task: between two
//! wake-ups of the token, a poll reads the flag and nothing else.
//!
//! The same flag can watch another rare source: a stream on the direct
//! path gives the watch's waker to its socket's read readiness (the client
//! closing), which otherwise took the socket's lock on every wake-up too
//! (`server/direct/chunked.rs`); one allocation watches both.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

pin_project_lite::pin_project! {
    /// Resolves once its token is cancelled (see the module docs).
    pub(crate) struct Watch {
        #[pin]
        wait: WaitForCancellationFutureOwned,
        flag: Arc<Flag>,
        polled: bool,
    }
}

/// Raised by the token's wake-up; holds the task to wake.
#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Watch {
    /// Watches `token`.
    pub(crate) fn new(token: CancellationToken) -> Self {
        Self { wait: token.cancelled_owned(), flag: Arc::default(), polled: false }
    }

    /// Registers the polling task to be woken by the watch's waker, and
    /// answers whether that waker fired since this last answered `true`
    /// (always `true` the first time). Only then has anything watched with
    /// [`Self::poll_token`] or [`Self::waker`] something new to say.
    pub(crate) fn woken(self: Pin<&mut Self>, cx: &Context<'_>) -> bool {
        let this = self.project();
        // Before the flag is read: a wake-up after the read wakes this task.
        this.flag.task.register(cx.waker());
        if *this.polled && !this.flag.woken.load(Ordering::Acquire) {
            return false;
        }
        *this.polled = true;
        // Lowered before the sources are polled again: a wake-up during
        // their polls raises it again and wakes the task.
        this.flag.woken.store(false, Ordering::Relaxed);
        true
    }

    /// The watch's waker: it raises the flag and wakes the task that
    /// polled last. Another rare source (a socket's read readiness) can be
    /// given it, and is then polled only when [`Self::woken`] says so.
    pub(crate) fn waker(&self) -> Waker {
        Waker::from(self.flag.clone())
    }

    /// Raises the flag as a wake-up would: the next [`Self::woken`]
    /// answers `true` (for a source left ready on purpose).
    pub(crate) fn raise(&self) {
        self.flag.woken.store(true, Ordering::Release);
    }

    /// Polls the token with `cx`, which must be [`Self::waker`]'s.
    pub(crate) fn poll_token(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.project().wait.poll(cx)
    }
}

impl Future for Watch {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if !self.as_mut().woken(cx) {
            return Poll::Pending;
        }
        // The token's future checks its state first, so a cancellation
        // between the flag's store and this poll is seen here.
        let waker = self.waker();
        self.poll_token(&mut Context::from_waker(&waker))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Pending while the token stands, however often it is polled; the
    /// cancellation wakes the task that polled it last, and resolves it;
    /// a token cancelled before the first poll resolves at once.
    #[test]
    fn a_watch_resolves_when_its_token_is_cancelled_and_wakes_its_task() {
        let token = CancellationToken::new();
        let mut watch = Box::pin(Watch::new(token.child_token()));
        let first = Arc::new(Count(AtomicUsize::new(0)));
        let second = Arc::new(Count(AtomicUsize::new(0)));
        for _ in 0..3 {
            assert!(watch.as_mut().poll(&mut Context::from_waker(&Waker::from(first.clone()))).is_pending());
        }
        assert!(watch.as_mut().poll(&mut Context::from_waker(&Waker::from(second.clone()))).is_pending());
        token.cancel();
        assert_eq!(first.0.load(Ordering::SeqCst), 0, "only the last task polling is woken");
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        assert!(watch.as_mut().poll(&mut Context::from_waker(&Waker::from(second.clone()))).is_ready());

        let cancelled = CancellationToken::new();
        cancelled.cancel();
        let mut watch = Box::pin(Watch::new(cancelled));
        assert!(watch.as_mut().poll(&mut Context::from_waker(&Waker::from(first.clone()))).is_ready());
    }
}
