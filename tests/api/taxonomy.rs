//! The event-type registry (docs/events.md): emit sites use registry
//! constants, and the registry mode decides what happens to unregistered
//! names and payloads that break their schema.

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(strict_mode_refuses_what_the_registry_does_not_know, warn_mode_accepts_logs_and_counts, registry_is_listed);

/// No string-literal event names at emit sites (docs/events.md). tidings
/// emits events in two ways: SSE system notices
/// (`sse_frame(.., Some(name), ..)`) and records
/// (`NewRecord { event_type: .. }`, `EventBody { event_type: .. }`). Each must
/// take its name from `event::names` (or from a publisher's request), never
/// from a literal.
#[test]
fn no_string_literal_event_names_at_emit_sites() {
    let emit_site =
        regex::Regex::new(r#"(sse_frame\([^;]*Some\(\s*"|event_type:\s*"[a-z_]+\.[a-z_.]+"|event_type\s*=\s*"[a-z_]+\.)"#).unwrap();
    let mut offenders = Vec::new();
    let mut files = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/crates/server/src"))];
    let mut scanned = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        scanned += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        // Unit tests build fixtures with literal names; they emit nothing.
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (n, line) in code.lines().enumerate() {
            if emit_site.is_match(line) {
                offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(scanned > 10, "the scan found the sources");
    assert!(offenders.is_empty(), "emit sites must use event::names constants:\n{}", offenders.join("\n"));
    // The detector itself catches what it is meant to catch.
    assert!(emit_site.is_match(r#"sse_frame(None, Some("system.replay_gap"), data)"#));
    assert!(emit_site.is_match(r#"NewRecord { event_type: "tree.created".into(), body }"#));
    assert!(!emit_site.is_match(r#"sse_frame(None, Some(names::SYSTEM_REPLAY_GAP), data)"#));
}

async fn strict_mode_refuses_what_the_registry_does_not_know(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.publish.registry_mode = tidings_server::registry::RegistryMode::Strict).await;
    let (status, body) = app.post_events(&json!({"event_type": "hypothesis.vanished"})).await;
    assert_eq!((status, body["error"].as_str()), (422, Some("unregistered_event_type")), "{body}");
    let (status, body) = app.post_events(&json!({"event_type": "signal.upvote.recorded", "payload": {"weight": "heavy"}})).await;
    assert_eq!((status, body["error"].as_str()), (422, Some("payload_schema_violation")), "{body}");
    assert_eq!(app.head().await, 0, "nothing stored");
    assert_eq!(app.publish("signal.upvote.recorded", json!({"weight": 7})).await, 1);
}

async fn warn_mode_accepts_logs_and_counts(backend: Backend) {
    let app = spawn_app(backend).await;
    let unregistered = r#"tidings_registry_violations_total{kind="unregistered_type"}"#;
    let schema = r#"tidings_registry_violations_total{kind="schema_violation"}"#;
    let (u0, s0) = (app.metric(unregistered).await, app.metric(schema).await);
    let id = app.publish("hypothesis.vanished", json!({})).await;
    app.publish("signal.upvote.recorded", json!({"weight": "heavy"})).await;
    // The counters are process-wide and tests run in parallel: at least ours.
    assert!(app.metric(unregistered).await >= u0 + 1.0);
    assert!(app.metric(schema).await >= s0 + 1.0);
    let mut s = app.stream("?types=hypothesis.vanished&since=0", None).await;
    assert_eq!(s.ids(1).await, vec![id], "warn mode stores and delivers it");
}

async fn registry_is_listed(backend: Backend) {
    let app = spawn_app(backend).await;
    let r: Value = app.http.get(app.url("/v1/registry")).send().await.unwrap().json().await.unwrap();
    let types = r["types"].as_array().unwrap();
    assert_eq!(types.len(), 33);
    let names: Vec<&str> = types.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for spec in [
        "hypothesis.created",
        "hypothesis.promoted",
        "pantheon_debate.frozen",
        "paper.archived",
        "wiki_page.merged",
        "signal.upvote.recorded",
        "signal.fund.recorded",
        "signal.calibration_score.recorded",
        "link.supports.added",
        "link.cites.added",
        "link.contradicts.removed",
        "comment.posted",
        "comment.reacted",
        "comment.edited",
        "mission.assigned",
        "market.resolved",
        "collider.opened",
        "senate.quality_gate_evaluated",
        "flag.raised",
        "system.lmsr_subsidy_exhausted",
        "system.embed_backfill_completed",
        "system.client_dropped_slow",
        "system.replay_gap",
        "subscription.history_lost",
        "link.supports.removed",
        "link.cites.removed",
        "link.contradicts.added",
    ] {
        assert!(names.contains(&spec), "{spec} is registered");
    }
    assert!(types.iter().all(|t| t["payload_schema"].is_object()));
    let deep: Value = app.http.get(app.url("/health/deep")).send().await.unwrap().json().await.unwrap();
    assert_eq!(deep["events"]["registered_types"], 33);
    assert_eq!(deep["database"], "up");
    assert_eq!(
        deep["store"],
        match backend {
            Backend::Postgres => "postgres",
            Backend::Embedded => "embedded",
        }
    );
}
