//! tidings: an event-stream broker. Producers publish events; browsers,
//! agents and services receive exactly the events their filter asks for,
//! live over Server-Sent Events, and resume after any disconnect with nothing
//! lost and nothing repeated.
//!
//! How a request travels:
//!
//! ```text
//! POST /v1/events ─► http::events ─► store::EventLog::append ──(commit, NOTIFY)──┐
//!                                                                                 ▼
//!          store::postgres LISTEN task / embedded in-process wake-up ─► broker::Broker::run
//!                                                                                 │ read rows after the high-water mark,
//!                                                                                 │ build each frame once, match filters,
//!                                                                                 ▼ try_send into 256-slot queues
//! GET /v1/stream ─► http::sse: register ─► replay from store ─► live queue ─► coalesced writes ─► server (hyper)
//! ```
//!
//! Modules, from the vocabulary up:
//! - [`event`]: names, envelope, frames (pure);
//! - [`filter`]: the subscription filter and its globs (pure);
//! - [`registry`]: event types and payload schemas;
//! - [`store`]: the event log trait, PostgreSQL and embedded implementations;
//! - [`broker`]: live clients, fan-out, eviction;
//! - [`http`]: router and transports; [`server`]: the connection loop;
//! - [`metrics`]: the Prometheus catalog; [`config`]: settings;
//! - [`app`]: the composition root; [`client`]: an SSE client for the CLI,
//!   the bench tool and the tests; [`bench`]: the load generator;
//!   [`cli`]: `tail`, `publish`, `registry check`; [`auth`]: tokens and grants;
//! - [`tree`]: paths, entities, hashes, capabilities (pure); [`identity`]:
//!   the server's key; [`subscription`]: path subscriptions, the EXECUTE
//!   dispatch and the notification engine.

pub mod app;
pub mod auth;
pub mod bench;
pub mod broker;
pub mod cli;
pub mod client;
pub mod config;
pub mod event;
pub mod filter;
pub mod glob;
pub mod http;
pub mod identity;
pub mod metrics;
pub mod refusal;
pub mod registry;
pub mod server;
pub mod service;
pub mod store;
pub mod subscription;
pub mod tree;
