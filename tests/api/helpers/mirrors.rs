//! Mirrors between [`Server`]s: the path they mirror, reading an entity and
//! the changes under it, waiting until a mirror settles, its state, and
//! making one server a mirror of another.

use std::ops::ControlFlow;
use std::time::Duration;

use serde_json::{Value, json};

use super::federation::Server;
use super::gather;

pub(crate) const PATH: &str = "feeds/x";

/// The entity at `PATH` on `server` (its canonical bytes), if any.
pub(crate) async fn entity(server: &Server) -> Option<String> {
    let r = server.http.get(format!("{}/v1/tree/{PATH}", server.base())).send().await.unwrap();
    (r.status() == 200).then_some(r.text().await.unwrap())
}

/// The `tree.*` changes on `PATH` in `server`'s log after `since`, long-polling up to `wait_ms`.
pub(crate) async fn changes(server: &Server, since: i64, wait_ms: u32) -> Vec<Value> {
    let url = format!(
        "{}/v1/poll?types=tree.created,tree.updated,tree.deleted&targets=tree:{PATH}&since={since}&limit=1000&wait_ms={wait_ms}",
        server.base()
    );
    let r: Value = server.http.get(url).send().await.unwrap().json().await.unwrap();
    r["events"].as_array().unwrap().clone()
}

/// Every change settled on `PATH` (waits until `server` holds `latest`).
pub(crate) async fn settle(server: &Server, latest: &str) -> Vec<Value> {
    let read = changes(server, 0, 0).await;
    let what = |_: &Vec<Value>| format!("{} did not converge to the latest write", server.base());
    gather(Duration::from_secs(60), read, what, |mut all: Vec<Value>| async move {
        let converged = entity(server).await.as_deref() == Some(latest);
        // Once converged, the rest of what is there; until then, a long poll.
        let since = all.last().map_or(0, |e| e["event_id"].as_i64().unwrap());
        all.extend(changes(server, since, if converged { 0 } else { 2_000 }).await);
        if converged { ControlFlow::Break(all) } else { ControlFlow::Continue(all) }
    })
    .await
}

/// The mirror `name`'s entry in `server`'s `/health/deep`.
pub(crate) async fn mirror_state(server: &Server, name: &str) -> Value {
    let deep = server.deep().await;
    deep["mirrors"].as_array().into_iter().flatten().find(|m| m["name"] == name).cloned().unwrap_or(Value::Null)
}

pub(crate) async fn mirror_of(m: &Server, upstream: &Server, name: &str) {
    m.knows(upstream).await;
    let mirror = json!({"type": "system/mirror", "data": {"peer": upstream.hash, "pattern": "feeds/**"}});
    let r = m.http.put(format!("{}/v1/tree/system/mirror/{name}", m.base())).json(&mirror).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}
