//! What tidings servers, clients and tools must agree on, and nothing that
//! runs a server: a client built on this crate cannot drift from the
//! server it talks to, because both read the same definitions.
//!
//! - [`event`]: event names, agents, visibility, and the versioned envelope
//!   a subscriber receives;
//! - [`glob`]: the event-type and path patterns filters and subscriptions
//!   are written in;
//! - [`tree`]: paths, entities, content hashes (RFC 8785 canonical JSON),
//!   and [`tree::capability`], the signed grants checked at every EXECUTE;
//! - [`identity`]: a server's (or a device's) ed25519 key and identity
//!   entity, and [`identity::proof_target`], what a device's origin proof
//!   signs;
//! - [`peer`]: what a `system/peer` entity must be, what a capacity
//!   redirect offers, and in [`peer::protocol`] what servers say to each
//!   other: the one builder of signed EXECUTEs and `PeerError` (calling a
//!   peer is `tidings-outbound`'s);
//! - [`retry`]: how every retrying loop paces itself (`Backoff`);
//! - [`trace`]: the W3C trace context an event is published in;
//! - [`ws`]: the WebSocket device protocol's method names, JSON-RPC error
//!   codes and close codes.
//!
//! The server library (`tidings-server`) names this crate wherever it
//! uses it (`tidings_protocol::event::EventId`): a path that leaves the
//! server says so.

pub mod event;
pub mod glob;
pub mod identity;
pub mod peer;
pub mod retry;
pub mod trace;
pub mod tree;
pub mod wire;
pub mod ws;
