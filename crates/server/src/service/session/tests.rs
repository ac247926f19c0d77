//! The session's own unit tests (its behaviour is tested end to end,
//! through every transport, in the integration tests).

use super::*;

/// A session lives as long as its subscriber: its size is what every idle
/// stream carries, so it may not grow unnoticed.
#[test]
fn a_session_stays_small() {
    let size = std::mem::size_of::<Session>();
    assert!(size <= 224, "a session takes {size} bytes");
}

/// A stream waits in its session's [`Session::next`] for its whole life,
/// so that wait's size is carried by every idle stream too (it kept room
/// for a page's read, 304 bytes in a test build, where it is 96 now).
#[test]
fn a_session_s_wait_stays_small() {
    let size = crate::testing::returned_size(&|session: &'static mut Session| session.next());
    assert!(size <= 128, "a session's wait takes {size} bytes");
}
