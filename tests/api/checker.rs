//! An independent checker of histories through a failover (docs/failover.md). It knows nothing of the server's
//! code: only what each client was shown, in order (events by id and body,
//! and the losses it was told of), what publishers were answered, and the
//! final log. It holds the server to the contract:
//! - no id is ever seen with two different bodies, by any client or in the
//!   final log;
//! - every event a client saw is in the final log under the same id, or
//!   was announced lost to that client afterwards (a `history_lost` whose
//!   fork lies below it);
//! - between announcements, a client's events follow the final log with
//!   nothing skipped, and after an announcement it goes on with the first
//!   event after the fork;
//! - every acknowledged publish is in the final log, exactly once (when the
//!   configuration promises it).
//!
//! Followers that collect what clients see over SSE, resuming as browsers
//! do, live here too.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::helpers::TestApp;

/// One thing a client was shown.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seen {
    /// An event: its id and payload.
    Event(i64, Value),
    /// History was lost: events after `fork` it may have seen are gone.
    Lost { fork: i64 },
    /// The same, told by a cursor the server keeps for the client (a
    /// durable consumer's, read without `since`): a cursor at the fork
    /// when the epoch changed may have been shown events past it, which
    /// the server cannot tell, so it is told at the fork too.
    LostAtCursor { fork: i64 },
}

/// What the checker found, when it found nothing wrong.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Events checked, over every client.
    pub(crate) events: usize,
    /// Losses announced, over every client.
    pub(crate) announced: usize,
    /// Events seen that the final log lacks (each announced lost).
    pub(crate) lost: usize,
}

/// Checks `clients` (a name and what it saw, in order) against the final
/// `log` (ids ascending).
pub(crate) fn check(log: &[(i64, Value)], clients: &[(String, Vec<Seen>)]) -> Result<Verdict, String> {
    let final_log: BTreeMap<i64, &Value> = log.iter().map(|(id, body)| (*id, body)).collect();
    if final_log.len() != log.len() {
        return Err("the final log holds an id twice".into());
    }
    // The successor of an id in the final log.
    let next_after = |id: i64| final_log.range(id + 1..).next().map(|(id, _)| *id);
    let mut bodies: HashMap<i64, (&str, &Value)> = log.iter().map(|(id, body)| (*id, ("the final log", body))).collect();
    let mut verdict = Verdict::default();
    for (name, seen) in clients {
        // Events seen that the final log lacks, not announced yet.
        let mut unannounced: Vec<i64> = Vec::new();
        // What must come next: the log's first event (every client starts
        // from 0), then the successor of the last event, or of the fork
        // after an announcement.
        let mut expected = final_log.keys().next().copied().unwrap_or(i64::MAX);
        // The last event shown (where the client would resume), and the
        // newest shown that survived.
        let mut last: Option<i64> = None;
        let mut kept: Option<i64> = None;
        for item in seen {
            match item {
                Seen::Event(id, body) => {
                    verdict.events += 1;
                    if let Some((who, earlier)) = bodies.get(id)
                        && *earlier != body
                    {
                        return Err(format!("id {id} named two events: {earlier} to {who}, {body} to {name}"));
                    }
                    bodies.entry(*id).or_insert((name, body));
                    if final_log.contains_key(id) {
                        // Nothing in the log comes after a lost event
                        // before the loss is announced.
                        if let Some(lost) = unannounced.first() {
                            return Err(format!("{name} was shown {id} after {lost}, which the final log lacks, without being told"));
                        }
                        if *id != expected {
                            return Err(format!("{name} was shown {id} where the final log goes on with {expected}"));
                        }
                        kept = Some(*id);
                    } else if *id > expected || last.is_some_and(|l| *id <= l) {
                        // A lost event still comes in order, and skips
                        // nothing of the log before it.
                        return Err(format!("{name} was shown {id}, which the final log lacks, out of order (next due: {expected})"));
                    } else {
                        unannounced.push(*id);
                    }
                    last = Some(*id);
                    expected = next_after(*id).unwrap_or(i64::MAX);
                }
                Seen::Lost { fork } | Seen::LostAtCursor { fork } => {
                    verdict.announced += 1;
                    // Told only where it resumes from a lost event, and
                    // the fork is below it and not below anything it saw
                    // that survived; by a kept cursor, at the fork too.
                    let at_cursor = matches!(item, Seen::LostAtCursor { .. });
                    match last {
                        Some(l) if !final_log.contains_key(&l) && l > *fork => {}
                        // At the fork itself only where an epoch began
                        // there: the log's ids jump after it.
                        Some(l) if at_cursor && l == *fork && next_after(*fork).is_none_or(|n| n > fork + 1) => {}
                        _ => return Err(format!("{name} was told of a loss (fork {fork}) after {last:?}, which is no lost event past it")),
                    }
                    if let Some(bad) = unannounced.iter().find(|&&id| id <= *fork) {
                        return Err(format!("{name} saw {bad}, at or below the fork {fork}, which the final log lacks"));
                    }
                    if let Some(k) = kept
                        && *fork < k
                    {
                        return Err(format!("{name} was told the fork is {fork}, below {k}, which it saw and which survived"));
                    }
                    verdict.lost += unannounced.len();
                    unannounced.clear();
                    expected = next_after(*fork).unwrap_or(i64::MAX);
                }
            }
        }
        if let Some(id) = unannounced.first() {
            return Err(format!("{name} saw {id}, which the final log lacks, and was never told"));
        }
    }
    Ok(verdict)
}

/// Checks that every acknowledged publish (the ids and payload it was
/// answered `201` for) is in the final log under those ids, once.
pub(crate) fn acknowledged_kept(log: &[(i64, Value)], acknowledged: &[(i64, Value)]) -> Result<(), String> {
    for (id, body) in acknowledged {
        let held: Vec<&(i64, Value)> = log.iter().filter(|(_, b)| b == body).collect();
        match held.as_slice() {
            [(at, _)] if at == id => {}
            [] => return Err(format!("{id} ({body}) was acknowledged and is not in the final log")),
            _ => return Err(format!("{id} ({body}) was acknowledged and the final log holds {held:?}")),
        }
    }
    Ok(())
}

/// Checks that no payload is stored twice (publishers retry with
/// idempotency keys, and every payload they send is new).
pub(crate) fn stored_once(log: &[(i64, Value)]) -> Result<(), String> {
    let mut ids: HashMap<String, i64> = HashMap::new();
    for (id, body) in log {
        if let Some(first) = ids.insert(body.to_string(), *id) {
            return Err(format!("{body} is stored twice: {first} and {id}"));
        }
    }
    Ok(())
}

/// The final log as polls from 0 read it: `(id, payload)`.
pub(crate) async fn final_log(app: &TestApp) -> Vec<(i64, Value)> {
    final_log_at(&app.http, &app.url("")).await
}

/// [`final_log`] of the server at `base`.
pub(crate) async fn final_log_at(http: &reqwest::Client, base: &str) -> Vec<(i64, Value)> {
    let (mut log, mut since) = (Vec::new(), 0i64);
    loop {
        let page: Value = http.get(format!("{base}/v1/poll?since={since}&limit=1000")).send().await.unwrap().json().await.unwrap();
        let events = page["events"].as_array().unwrap_or_else(|| panic!("{page}"));
        if events.is_empty() {
            return log;
        }
        log.extend(events.iter().map(|e| (e["event_id"].as_i64().unwrap(), e["payload"].clone())));
        since = page["next_since"].as_i64().unwrap();
    }
}

/// A client that follows a server's stream from `since` as a browser
/// does: when the stream ends or cannot be opened, it resumes with the last
/// id it saw. Everything it is shown is recorded.
pub(crate) struct Follower {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Follower {
    pub(crate) fn start(app: &TestApp, since: i64) -> Self {
        Self::start_at(app.http.clone(), app.url(&format!("/v1/stream?since={since}")))
    }

    /// Follows the stream at `url` (a `/v1/stream` URL with its query).
    pub(crate) fn start_at(http: reqwest::Client, url: String) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (seen, stop) = (seen.clone(), stop.clone());
            async move {
                let mut last: Option<i64> = None;
                while !stop.is_cancelled() {
                    let opened = tokio::select! {
                        _ = stop.cancelled() => return,
                        r = tidings_client::sse::connect(&http, &url, last) => r,
                    };
                    let Ok(mut reader) = opened else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    loop {
                        let frame = tokio::select! {
                            _ = stop.cancelled() => return,
                            f = reader.next_event() => f,
                        };
                        let Some(frame) = frame else { break };
                        let data: Value = serde_json::from_str(&frame.data).unwrap_or(Value::Null);
                        match frame.event.as_deref() {
                            None => {
                                let id: i64 = frame.id.as_deref().and_then(|i| i.parse().ok()).expect("events carry an id");
                                last = Some(id);
                                seen.lock().unwrap().push(Seen::Event(id, data["payload"].clone()));
                            }
                            Some("system.replay_gap") if data["reason"] == "history_lost" => {
                                seen.lock().unwrap().push(Seen::Lost { fork: data["fork"].as_i64().expect("a fork") });
                            }
                            _ => {}
                        }
                    }
                }
            }
        });
        Self { seen, stop, task }
    }

    /// What it was shown so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until it was shown event `id` (failing after `within`).
    pub(crate) async fn wait_for(&self, what: &str, within: Duration, id: i64) {
        crate::helpers::wait_until(what, within, Duration::from_millis(20), || async {
            self.seen().iter().any(|s| matches!(s, Seen::Event(i, _) if *i == id))
        })
        .await;
    }

    /// Stops it and returns what it was shown.
    pub(crate) async fn stop(self) -> Vec<Seen> {
        self.stop.cancel();
        let seen = self.seen.clone();
        let _ = self.task.await;
        seen.lock().unwrap().clone()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn log(ids: &[i64]) -> Vec<(i64, Value)> {
        ids.iter().map(|&i| (i, json!(i))).collect()
    }

    #[test]
    fn the_checker_catches_what_the_contract_forbids() {
        let log = log(&[1, 2, 3, 100]);
        let ev = |i: i64| Seen::Event(i, json!(i));
        let judge = |seen: Vec<Seen>| check(&log, &[("a".into(), seen)]);
        assert_eq!(
            judge(vec![ev(1), ev(2), ev(3), ev(4), Seen::Lost { fork: 3 }, ev(100)]),
            Ok(Verdict { events: 5, announced: 1, lost: 1 })
        );
        // Told again where it resumes from the same lost event: fine.
        let twice = vec![ev(1), ev(2), ev(3), ev(4), Seen::Lost { fork: 3 }, Seen::Lost { fork: 3 }, ev(100)];
        assert_eq!(judge(twice), Ok(Verdict { events: 5, announced: 2, lost: 1 }));
        // An id reused for another body (the defect this guards against).
        assert!(judge(vec![ev(1), ev(2), ev(3), Seen::Event(100, json!("other"))]).unwrap_err().contains("named two events"));
        // Lost and never told; told only after an event of the log.
        assert!(judge(vec![ev(1), ev(2), ev(3), ev(4)]).unwrap_err().contains("never told"));
        assert!(judge(vec![ev(1), ev(2), ev(3), ev(4), ev(100)]).unwrap_err().contains("without being told"));
        // Skipped an event of the log, the first one included.
        assert!(judge(vec![ev(1), ev(3)]).unwrap_err().contains("goes on with 2"));
        assert!(judge(vec![ev(2), ev(3)]).unwrap_err().contains("goes on with 1"));
        // A loss announced where nothing was lost.
        assert!(judge(vec![ev(1), ev(2), Seen::Lost { fork: 0 }, ev(1)]).unwrap_err().contains("no lost event"));
        // A kept cursor at the fork may be told there; anywhere else not,
        // and a stream's resume point never at the fork.
        assert_eq!(
            judge(vec![ev(1), ev(2), ev(3), Seen::LostAtCursor { fork: 3 }, ev(100)]),
            Ok(Verdict { events: 4, announced: 1, lost: 0 })
        );
        assert!(judge(vec![ev(1), ev(2), Seen::LostAtCursor { fork: 1 }, ev(2)]).unwrap_err().contains("no lost event"));
        assert!(
            judge(vec![ev(1), ev(2), Seen::LostAtCursor { fork: 2 }, ev(3)]).unwrap_err().contains("no lost event"),
            "no epoch began at 2"
        );
        assert!(judge(vec![ev(1), ev(2), ev(3), Seen::Lost { fork: 3 }, ev(100)]).unwrap_err().contains("no lost event"));
        // A fork below what it saw survive (it would be shown 2 and 3 again).
        assert!(judge(vec![ev(1), ev(2), ev(3), ev(4), Seen::Lost { fork: 1 }, ev(2)]).unwrap_err().contains("below 3"));
        // A lost event that skipped the log's events before it, or repeated.
        assert!(judge(vec![ev(1), ev(4), Seen::Lost { fork: 3 }, ev(100)]).unwrap_err().contains("out of order"));
        assert!(judge(vec![ev(1), ev(2), ev(3), ev(4), ev(4)]).unwrap_err().contains("out of order"));
        assert!(acknowledged_kept(&log, &[(2, json!(2))]).is_ok());
        assert!(acknowledged_kept(&log, &[(4, json!(4))]).unwrap_err().contains("not in the final log"));
    }
}
