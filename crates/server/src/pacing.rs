//! How the server's own retrying loops pace themselves: one
//! [`Backoff`](tidings_protocol::retry::Backoff) setting per loop, here so a
//! reader finds every one of them in one place (the type, and a client's
//! pacing, are the protocol crate's).

use std::time::Duration;

use tidings_protocol::retry::Backoff;

/// This server's own store (the broker's reads, the subscription
/// supervisor's lead): 50 ms doubling to 2 s.
pub const STORE: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
/// The PostgreSQL LISTEN connection (and the synchronous standby's gate):
/// 50 ms doubling to 5 s.
pub const LISTEN: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
/// A delivery to a peer (the courier): 250 ms doubling to 30 s.
pub const DELIVERY: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
/// A mirror subscribing at its peer: 500 ms doubling to 30 s.
pub const MIRROR: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
