//! tidings-server: the tidings server as a library. tidings is an
//! event-stream broker. Producers publish events; browsers, agents and
//! services receive exactly the events their filter asks for, live over
//! Server-Sent Events, and resume after any disconnect with nothing lost and
//! nothing repeated.
//!
//! How a request travels, from the request to the socket:
//!
//! ```text
//! POST /v1/events ─► http::events ─► service::publish ─► store::EventLog::append ──(commit, NOTIFY)──┐
//!                                                                                                     ▼
//!          store::postgres LISTEN task / embedded in-process wake-up ─► broker::Broker::run
//!                                                                        │ read rows after the high-water mark,
//!                                                                        │ parse each event once, match filters,
//!                                                                        ▼ try_send the shared envelope
//!                         service::session: register ─► replay from the store ─► live queue ─► typed items
//!                                                                        │
//! GET /v1/stream ─► http::sse: items as SSE frames ─► server::direct (chunked, vectored) ─► socket
//! GET /v1/poll   ─► http::poll ─► service::poll (a bounded session) ─► JSON answer
//! POST /mcp      ─► http::mcp (rmcp, stateless) ─► the same services as the routes above ─► tool results
//! ```
//!
//! Layers, each importing only those below it (`tests/api/layers.rs` holds
//! that):
//! - transports: [`http`] (router, one file per transport, the one error
//!   mapping) and [`server`] (the connection loop);
//! - services: [`service`] (publish, subscriber sessions, polls and durable
//!   consumers, the tree, limits), with no HTTP type in them;
//! - core: [`broker`] (live clients, fan-out, eviction), [`store`] (four
//!   traits by concern, PostgreSQL and embedded), [`federation`] (path
//!   subscriptions, the EXECUTE dispatch, and the supervisor running the
//!   notification engine, the courier and the mirrors side by side; the
//!   transports reach it through `service::execute`),
//!   [`auth`] (tokens and grants), [`registry`] (event types and payload
//!   schemas);
//! - vocabulary, pure: [`filter`], [`refusal`] (what a refusal is),
//!   [`json`] (strict decoding of what clients and peers send), [`report`]
//!   (errors logged with their causes);
//! - from the `tidings-protocol` crate, which clients build on too and
//!   which this crate names wherever it uses it: `event` (names,
//!   envelope), `glob`, `tree` (paths, entities, hashes, capabilities),
//!   `identity` (keys, proofs), `peer` (peers, and what servers say to
//!   each other), `ws` (the WebSocket device protocol), `retry` (the one
//!   backoff); calling peers is the `tidings-outbound` crate's;
//! - edges: [`app`] (the composition root), [`config`], [`metrics`],
//!   [`pacing`] (the server's retry policies), [`keyfile`].
//!
//! Not the server, and not in this crate (the workspace's compiler keeps
//! it so): the binary users run (the workspace root, `src/main.rs`), the
//! Rust client (`crates/client`), the terminal commands and load generators
//! (`crates/cli`), and the JavaScript and Python clients (`clients/js`,
//! `clients/python`).

pub mod app;
pub mod auth;
pub mod broker;
pub mod config;
pub mod federation;
pub mod filter;
pub mod http;
pub mod json;
pub mod keyfile;
pub mod metrics;
pub mod pacing;
pub mod refusal;
pub mod registry;
pub mod report;
pub mod server;
pub mod service;
pub mod store;
pub mod telemetry;
#[cfg(test)]
mod testing;
