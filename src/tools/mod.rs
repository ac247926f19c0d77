//! The tools around the server, in one binary with it but not part of it:
//! the load generator (`tidings bench`), the terminal commands (`tail`,
//! `publish`, `registry check`, `listen`, `subscribe`) and the SSE and WebSocket clients
//! they (and the tests) share. They talk to a server over HTTP like any
//! other client; nothing in the server imports this tree (a test holds
//! that), so the library's server modules are the server.

pub mod bench;
pub mod cli;
pub mod client;
pub mod device;
pub mod lossy;
pub mod peers;
pub mod scale;
pub mod sqlpublish;
pub mod subscribe;
