//! tidings-cli: the tools around the server, in one binary with it but not
//! part of it. It owns:
//! - the terminal commands: [`cli`] (`tail`, `publish`, `listen`,
//!   `registry check`), [`subscribe`] (a path subscription that follows
//!   capacity redirects), [`token`] (mints a bearer token with the
//!   server's HS256 secret) and [`health`] (the container's health check);
//! - the load generators behind `tidings bench`: [`bench`] (its arguments,
//!   modes and the delivery, poll, publish, replay and recovery runs),
//!   [`peers`] (between servers), [`scale`] (the reconnect storm of
//!   `bench-scale`), [`sqlpublish`] (publishing from SQL), and [`lossy`], an
//!   HTTP proxy that drops every n-th answer, for the peer benches and the
//!   tests.
//!
//! They talk to a server over HTTP and WebSocket through `tidings-client`,
//! like any other client, and sign and read what servers say to each other
//! with `tidings-protocol`; the server crate names none of this. The server
//! library is read for three things: `registry check` validates a registry
//! with the loader the server runs, and `token` mints with the claims the
//! server verifies, so neither can disagree with the server; and
//! durations are read with the server's parser.

pub mod bench;
pub mod cli;
pub mod health;
pub mod lossy;
pub mod peers;
pub mod scale;
pub mod sqlpublish;
pub mod subscribe;
pub mod token;
