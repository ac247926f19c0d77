//! tidings-client: a Rust client for tidings, speaking to a server over its
//! public protocol like any other client. It owns:
//! - [`sse`]: the Server-Sent Events frame parser and a reader over an HTTP
//!   response, for streams that resume by `Last-Event-ID`;
//! - [`stream`]: [`Client`] and its stream that resumes by itself
//!   ([`Client::stream`]: every event once, in order, across any
//!   disconnect, with gaps surfaced);
//! - [`publish`]: [`Client::publish`], retried under one `Idempotency-Key`,
//!   saying whether the server had it already;
//! - [`consumer`]: [`Client::consumer`], a durable consumer that
//!   acknowledges a page only once the caller came back after its last
//!   event;
//! - [`listen`]: [`listen::Listener`], a device that resumes by itself
//!   (catch-up from its cursor, realtime, each seq once, acks, reconnects);
//! - [`device`]: the device side of the WebSocket transport
//!   (docs/ref-websocket.md): `stream.hello`, signed `stream.auth` and
//!   `stream.ack`, `sync.delta` pages and pushed events.
//!
//! It is built on `tidings-protocol` alone (identities, and what a device's
//! origin proof signs), so a program using it compiles no server.
//! The CLI (`tidings-cli`), the load generators and the integration tests
//! use it; the server never does.

pub mod consumer;
pub mod device;
pub mod listen;
pub mod publish;
pub mod sse;
pub mod stream;

pub use stream::{Client, Item, StreamError, StreamQuery};
