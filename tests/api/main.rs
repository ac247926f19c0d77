//! Integration tests: one binary, a real server on a random port, a real
//! PostgreSQL database (fresh per test) or a fresh embedded data directory.
//! Tests that hold on every store run on both (`both_stores!`).

mod helpers;

mod attacks;
mod audit;
mod browser;
mod chaos;
mod chaos_peers;
mod checker;
mod cli;
mod delivery;
mod deploy;
mod docs;
mod durability;
mod epoch_lag;
mod epochs;
mod exhaustion;
mod failover;
mod filters;
mod freshness;
mod idempotency;
mod identity;
mod js_client;
mod layers;
mod logs;
mod mcp;
mod metrics;
mod mirrors;
mod nginx;
mod openapi;
mod ordering;
mod otel;
mod outbox;
mod outbox_trace;
mod peer_epochs;
mod peers;
mod poll;
mod postgres;
mod publish;
mod python_client;
mod readers;
mod relays;
mod replicas;
mod rolling;
mod scripts;
mod security;
mod store;
mod stream;
mod subscription_lifecycle;
mod subscriptions;
mod taxonomy;
pub(crate) mod tls;
mod tracing;
mod tree;
mod trees;
pub(crate) mod ws;
