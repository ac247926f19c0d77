//! The WebSocket connection's own unit tests (its behaviour on the wire is
//! tested end to end, in the integration tests).

use super::*;

/// A device's task lives as long as its connection and is sized for its
/// largest state: what an idle device carries, so it may not grow
/// unnoticed (1,464 bytes in a test build before its rare writes were
/// boxed and its upgrade's wait chained before its run, 952 after).
#[test]
fn a_device_s_task_stays_small() {
    let task = |(ws, app, pending): (Upgrade, AppState, Box<Pending>)| connection_task(ws, app, None, pending, 1, false);
    let size = crate::testing::returned_size(&task);
    assert!(size <= 1024, "a device's task takes {size} bytes");
}
