//! Group commit for publishes: appends that arrive while a commit is in
//! flight are written together in the next transaction, one head-row lock,
//! one insert, one NOTIFY and one fsync for all of them, instead of one
//! transaction (and one fsync queued behind the head row) per request.
//!
//! One committer task takes the first waiting append, then whatever else is
//! already queued, up to [`GroupSettings::max_events`] (and, with
//! [`GroupSettings::max_delay`], waits that long for more), and appends
//! them as one batch: ids stay gap-free and in commit order, each request
//! gets the ids of its own records, and each is answered only once the
//! whole group is durable. Validation happens before a request joins (the
//! service checks every event first), so a group only fails for a reason of
//! the store's; then each member is appended again on its own, so a
//! request that cannot be stored fails alone and its neighbours do not
//! (when the store is unreachable every member is answered `503` at once
//! rather than each waiting for it in turn).
//! With no concurrency nothing waits: a lone publish is committed at once.
//! The queue is bounded, so publishers beyond it wait for room (back
//! pressure, no unbounded memory).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{NewRecord, Store, StoreError};
use crate::event::EventId;

/// Appends waiting for the committer, at most.
const QUEUE: usize = 4096;

/// How groups are bounded (settings).
#[derive(Debug, Clone, Copy)]
pub struct GroupSettings {
    /// Most events in one group (`TIDINGS_PUBLISH_GROUP_EVENTS`); a single
    /// append larger than this is committed alone.
    pub max_events: usize,
    /// How long a group waits for more appends once it has one
    /// (`TIDINGS_PUBLISH_GROUP_DELAY`; zero: only what queued meanwhile).
    pub max_delay: Duration,
}

/// One request's records and where its ids go.
struct Job {
    records: Vec<NewRecord>,
    answer: oneshot::Sender<Result<Vec<EventId>, StoreError>>,
}

/// The group committer's handle.
#[derive(Debug, Clone)]
pub struct GroupCommit {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("records", &self.records.len()).finish()
    }
}

impl GroupCommit {
    /// Starts the committer on `store` (it ends when the last handle is
    /// dropped, after committing what was queued).
    pub fn start(store: Arc<dyn Store>, settings: GroupSettings) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE);
        tokio::spawn(commit_groups(store, settings, queue));
        Self { jobs }
    }

    /// Appends `records` in the next group; their ids, in order, once the
    /// group is durable.
    pub async fn append(&self, records: Vec<NewRecord>) -> Result<Vec<EventId>, StoreError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let (answer, answered) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the publish committer has stopped".into());
        self.jobs.send(Job { records, answer }).await.map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

async fn commit_groups(store: Arc<dyn Store>, settings: GroupSettings, mut queue: mpsc::Receiver<Job>) {
    let max_events = settings.max_events.max(1);
    while let Some(first) = queue.recv().await {
        let mut events = first.records.len();
        let mut group = vec![first];
        // What queued while the last commit was in flight.
        while events < max_events {
            match queue.try_recv() {
                Ok(job) => {
                    events += job.records.len();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        if !settings.max_delay.is_zero() && events < max_events {
            let until = tokio::time::Instant::now() + settings.max_delay;
            while events < max_events {
                match tokio::time::timeout_at(until, queue.recv()).await {
                    Ok(Some(job)) => {
                        events += job.records.len();
                        group.push(job);
                    }
                    _ => break,
                }
            }
        }
        commit(store.as_ref(), group, events).await;
    }
}

/// Appends `group` as one batch and answers each member with its ids; if
/// the batch fails, each member is appended alone.
async fn commit(store: &dyn Store, group: Vec<Job>, events: usize) {
    if group.len() == 1 {
        let job = group.into_iter().next().expect("one member");
        let _ = job.answer.send(store.append(job.records).await);
        return;
    }
    let mut batch = Vec::with_capacity(events);
    let mut sizes = Vec::with_capacity(group.len());
    let mut answers = Vec::with_capacity(group.len());
    let mut kept = Vec::with_capacity(group.len());
    for job in group {
        sizes.push(job.records.len());
        batch.extend(job.records.iter().cloned());
        kept.push(job.records);
        answers.push(job.answer);
    }
    metrics::histogram!(crate::metrics::PUBLISH_GROUP_EVENTS).record(events as f64);
    match store.append(batch).await {
        Ok(ids) => {
            let mut ids = ids.into_iter();
            for (size, answer) in sizes.into_iter().zip(answers) {
                let _ = answer.send(Ok(ids.by_ref().take(size).collect()));
            }
        }
        // The store is down: each member would wait for it in turn; all
        // get the answer at once (503, retry later).
        Err(StoreError::Unavailable(why)) => {
            for answer in answers {
                let _ = answer.send(Err(StoreError::Unavailable(why.clone())));
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, members = kept.len(), "a publish group failed; appending its members one by one");
            for (records, answer) in kept.into_iter().zip(answers) {
                let _ = answer.send(store.append(records).await);
            }
        }
    }
}
