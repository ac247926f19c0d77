//! The Prometheus catalog: every family exported from start-up, on both
//! stores, with the type the book's metrics table (docs/metrics.md) gives it and a panel on the dashboard;
//! the process's own families and `tidings_build_info`; and the
//! exposition valid for `promtool check metrics`.

use std::process::Stdio;

use tokio::io::AsyncWriteExt as _;

use crate::both_stores;
use crate::helpers::{Backend, spawn_app};

both_stores!(every_family_from_start_up_and_promtool_accepts_it, a_fresh_process_exports_every_family_as_documented);

const CATALOG: &[&str] = &[
    "tidings_events_published_total",
    "tidings_tls_reloads_total",
    "tidings_events_delivered_total",
    "tidings_clients_connected",
    "tidings_clients_dropped_total",
    "tidings_queue_depth",
    "tidings_broker_lag_seconds",
    "tidings_delivery_latency_seconds",
    "tidings_listener_reconnects_total",
    "tidings_replayed_events_total",
    "tidings_poll_requests_total",
    "tidings_consumer_lag_events",
    "tidings_http_requests_total",
    "tidings_replay_gaps_total",
    "tidings_epochs_begun_total",
    "tidings_registry_violations_total",
    "tidings_database_up",
    "tidings_listener_up",
    "tidings_subscription_notifications_total",
    "tidings_subscriptions",
    "tidings_peer_deliveries_total",
    "tidings_peer_delivery_retries_total",
    "tidings_peer_evictions_total",
    "tidings_peer_received_total",
    "tidings_mirror_applies_total",
    "tidings_publish_group_events",
    "tidings_broker_behind_seconds",
    "tidings_listener_silence_seconds",
    "tidings_outbox_oldest_age_seconds",
];

/// Families with a series per peer, per mirror or per standby, so exported
/// once there is one; on the dashboard all the same.
/// (And `tidings_replication_stalled`, exported with
/// `TIDINGS_DELIVERY=replicated`: tests/api/failover.rs reads it.)
const PER_OBJECT: &[&str] = &[
    "tidings_peer_backlog_events",
    "tidings_mirror_repairs_total",
    "tidings_mirror_hops",
    "tidings_mirror_upstream",
    "tidings_replication_stalled",
    "tidings_replica_up",
    "tidings_replica_lag_seconds",
    "tidings_mirror_relays_left_total",
];

async fn every_family_from_start_up_and_promtool_accepts_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let text = app.http.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for family in CATALOG {
        assert!(
            text.lines().any(|l| l.starts_with("# TYPE ") && l.split(' ').nth(2) == Some(family)),
            "{family} is exported before any event"
        );
    }
    // Labels are bounded: transports, reasons, types, route templates.
    for transport in ["sse", "poll", "ws"] {
        assert!(text.contains(&format!("tidings_clients_connected{{transport=\"{transport}\"}}")));
    }
    let promtool = which("promtool").expect("promtool is needed (scripts/test installs Debian's prometheus package)");
    let mut child = tokio::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).await.unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join(name)).find(|p| p.is_file())
}

/// Every family of the catalog is on the Grafana dashboard and every alert
/// rule uses a family tidings exports.
#[test]
fn the_deploy_kit_covers_the_catalog() {
    let dashboard = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/tidings-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_owned()))
        .collect();
    for family in CATALOG.iter().chain(PER_OBJECT) {
        assert!(exprs.iter().any(|e| e.contains(family)), "{family} is on the dashboard");
    }
    let alerts = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yml")).unwrap();
    for needed in ["tidings_database_up", "tidings_listener_up", "tidings_clients_dropped_total", "tidings_broker_lag_seconds_bucket"] {
        assert!(alerts.contains(needed), "an alert uses {needed}");
    }
    let used: Vec<&str> = alerts.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("tidings_")).collect();
    for name in used {
        let family = name.trim_end_matches("_bucket");
        assert!(CATALOG.contains(&family) || PER_OBJECT.contains(&family), "alert rules use only exported families: {name}");
    }
}

/// Every family the server defines (the names in `crates/server/src/metrics.rs`).
fn defined_families() -> Vec<String> {
    let source = include_str!("../../crates/server/src/metrics.rs");
    let mut names: Vec<String> = source
        .lines()
        .filter(|l| l.starts_with("const ") && l.contains(": &str = \"tidings_"))
        .map(|l| l.split('"').nth(1).unwrap().to_owned())
        .collect();
    names.sort();
    names
}

/// The book's metrics table (docs/metrics.md): each family and its
/// documented type.
fn documented_types() -> std::collections::BTreeMap<String, String> {
    let readme = include_str!("../../docs/metrics.md");
    readme
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let kind = cells.get(2)?;
            (name.starts_with("tidings_") || name.starts_with("process_")).then(|| (name.to_owned(), kind.to_string()))
        })
        .collect()
}

/// A fresh `tidings` process (no other server's series in it) exports every
/// family the server defines from start-up, except those with a series per
/// peer, mirror or setting; plus `tidings_build_info` and the process's own
/// (CPU, resident memory, open and maximum file descriptors). Each has the
/// type docs/metrics.md's table gives it, and a panel on the dashboard.
async fn a_fresh_process_exports_every_family_as_documented(backend: Backend) {
    let (envs, _dir) = crate::helpers::process_store(backend).await;
    let server = crate::helpers::spawn_process(&envs).await;
    let text = reqwest::get(format!("{}/metrics", server.base)).await.unwrap().text().await.unwrap();
    drop(server);
    let exported: std::collections::BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("# TYPE ")?.split(' ');
            Some((words.next()?, words.next()?))
        })
        .collect();
    let documented = documented_types();
    let dashboard = include_str!("../../deploy/grafana/tidings-dashboard.json");
    let process = ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "process_max_fds"];
    let mut wrong = Vec::new();
    for family in defined_families().iter().map(String::as_str).chain(process) {
        let Some(kind) = exported.get(family) else {
            if !PER_OBJECT.contains(&family) {
                wrong.push(format!("{family} is not exported at start-up"));
            }
            continue;
        };
        match documented.get(family) {
            Some(doc) if doc == kind => {}
            Some(doc) => wrong.push(format!("{family} is a {kind}, documented as a {doc}")),
            None => wrong.push(format!("{family} ({kind}) is not in docs/metrics.md's table")),
        }
        if !dashboard.contains(family) {
            wrong.push(format!("{family} has no panel on the dashboard"));
        }
    }
    assert!(text.contains(&format!("tidings_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))), "{text}");
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The shipped alert rules pass their unit tests
/// (`deploy/prometheus/alerts.test.yml`): each freshness alert fires for
/// the instance that stopped moving, after its `for:`, and for no other.
#[test]
fn the_shipped_alerts_pass_their_unit_tests() {
    let promtool = which("promtool").expect("promtool is needed (scripts/test installs Debian's prometheus package)");
    let out = std::process::Command::new(promtool)
        .args(["test", "rules", "alerts.test.yml"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}
