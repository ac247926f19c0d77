//! How tidings paces a retry, in one place: [`Backoff`] (a delay that
//! doubles from its minimum to its maximum, jittered where many retry at
//! once, reset by a success)
//! with a client's setting, sleeps that end early on shutdown, and the
//! wall clock in Unix milliseconds. A leaf: it names no other module, so
//! the server's loops and the terminal commands share it.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// A retry delay that doubles from `min` to `max`, jittered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A client (a terminal command, the Rust client) reconnecting to a
    /// server: 250 ms doubling to 10 s. (The server's own loops are paced
    /// in its `pacing` module.)
    pub const CLIENT: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));

    /// From `min`, doubling to `max`.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max, next: min }
    }

    /// The same, doubling to `max` instead.
    pub const fn up_to(self, max: Duration) -> Self {
        Self::new(self.min, max)
    }

    /// The delay to wait now, jittered (scaled by a random factor in
    /// [0.5, 1), so many retrying at once spread and none waits more than
    /// the maximum); the next is twice it, at most the maximum.
    pub fn next_delay(&mut self) -> Duration {
        self.step().mul_f64(rand::random_range(0.5..1.0))
    }

    /// [`Backoff::next_delay`] without the jitter.
    pub fn step(&mut self) -> Duration {
        let now = self.next;
        self.next = now.saturating_mul(2).min(self.max);
        now
    }

    /// The delay the next retry will wait, before jitter (for a log line).
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// Waits at least `at_least` next (a server's `Retry-After`), even
    /// past the maximum; the one after is back under it.
    pub fn at_least(&mut self, at_least: Duration) {
        self.next = self.next.max(at_least);
    }

    /// After a success: the next retry waits the minimum again.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Sleeps `d`; `true` if `stop` came first.
pub async fn sleep_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// Now, Unix ms.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backoff_doubles_to_its_maximum_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let steps: Vec<u128> = (0..4).map(|_| b.step().as_millis()).collect();
        assert_eq!(steps, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(100));
        b.at_least(Duration::from_secs(3));
        assert_eq!(b.step(), Duration::from_secs(3), "a server's Retry-After wins");
        for _ in 0..100 {
            let d = b.next_delay();
            assert!(d >= Duration::from_millis(175) && d < Duration::from_millis(350), "{d:?}");
        }
    }
}
