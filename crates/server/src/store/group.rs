//! Group commit for publishes and tree writes: requests that arrive while a
//! commit is in flight are written together in the next transaction, one
//! head-row lock, one NOTIFY and one fsync for all of them, instead of one
//! transaction (and one fsync queued behind the head row) per request.
//!
//! One committer task per kind takes the first waiting request, then
//! whatever else is already queued, up to [`GroupSettings::max_events`]
//! (and, with [`GroupSettings::max_delay`], waits that long for more), and
//! commits them as one batch: ids stay gap-free and in commit order, each
//! request gets its own answer (a publish its ids, a tree write its
//! outcome: tree writes in a group apply in order, each seeing those before
//! it, and one whose condition fails changes nothing while the others go
//! on), and each is answered only once the whole group is durable.
//! Validation happens before a request joins (the services check every
//! event and entity first), so a group only fails for a reason of the
//! store's; then each member is committed again on its own, so a request
//! that cannot be stored fails alone and its neighbours do not (when the
//! store is unreachable every member is answered `503` at once rather than
//! each waiting for it in turn).
//! With no concurrency nothing waits: a lone request is committed at once.
//! The queue is bounded, so requests beyond it wait for room (back
//! pressure, no unbounded memory).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::{Publish, Published, Store, StoreError, TreeOutcome, TreeWrite};

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

/// A kind of request the committer groups.
#[async_trait::async_trait]
pub trait Grouped: Send + Sync + 'static {
    /// One request.
    type Request: Clone + Send + 'static;
    /// Its answer.
    type Answer: Send + 'static;
    /// The `kind` label of its groups in `tidings_publish_group_events`.
    const KIND: &'static str;
    /// The events a request appends (what the group bound counts).
    fn events(request: &Self::Request) -> usize;
    /// Commits one request alone.
    async fn alone(store: &dyn Store, request: Self::Request) -> Result<Self::Answer, StoreError>;
    /// Commits several in one transaction: each one's answer, in order.
    async fn together(store: &dyn Store, requests: Vec<Self::Request>) -> Result<Vec<Self::Answer>, StoreError>;
}

/// Publishes: a request is its records and its idempotency key, its answer
/// their ids (or the ids its key answered before).
#[derive(Debug)]
pub struct Publishes;

#[async_trait::async_trait]
impl Grouped for Publishes {
    type Request = Publish;
    type Answer = Published;
    const KIND: &'static str = "publish";

    fn events(request: &Self::Request) -> usize {
        request.records.len()
    }

    async fn alone(store: &dyn Store, request: Self::Request) -> Result<Self::Answer, StoreError> {
        let mut answers = store.publish(vec![request]).await?;
        answers.pop().ok_or_else(|| StoreError::Unavailable("the store answered a publish with nothing".into()))
    }

    async fn together(store: &dyn Store, requests: Vec<Self::Request>) -> Result<Vec<Self::Answer>, StoreError> {
        store.publish(requests).await
    }
}

/// Tree writes: a request is one write, its answer the write's outcome.
#[derive(Debug)]
pub struct TreeWrites;

#[async_trait::async_trait]
impl Grouped for TreeWrites {
    type Request = TreeWrite;
    type Answer = TreeOutcome;
    const KIND: &'static str = "tree";

    fn events(_: &Self::Request) -> usize {
        1
    }

    async fn alone(store: &dyn Store, request: Self::Request) -> Result<Self::Answer, StoreError> {
        store.tree_write(request).await
    }

    async fn together(store: &dyn Store, requests: Vec<Self::Request>) -> Result<Vec<Self::Answer>, StoreError> {
        store.tree_write_many(requests).await
    }
}

/// When the committer took a request's group up, and when the store
/// answered for it: a publish's `queue` and `commit` parts (its
/// `Server-Timing`, docs/events.md).
#[derive(Debug, Clone, Copy)]
pub struct Stamps {
    /// The committer began the request's group.
    pub taken: Instant,
    /// The store answered for it (durable, when it was stored).
    pub stored: Instant,
}

/// What a request is answered: its outcome, and when.
type Answer<G> = (Result<<G as Grouped>::Answer, StoreError>, Stamps);

/// One request and where its answer goes.
struct Job<G: Grouped> {
    request: G::Request,
    answer: oneshot::Sender<Answer<G>>,
    /// The span of the request, when spans are exported: the group's
    /// commit span is a child of the first and links to every one.
    trace: Option<opentelemetry::trace::SpanContext>,
}

/// A group committer's handle.
pub struct GroupCommit<G: Grouped> {
    jobs: mpsc::Sender<Job<G>>,
}

impl<G: Grouped> Clone for GroupCommit<G> {
    fn clone(&self) -> Self {
        Self { jobs: self.jobs.clone() }
    }
}

impl<G: Grouped> std::fmt::Debug for GroupCommit<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").field("kind", &std::any::type_name::<G>()).finish_non_exhaustive()
    }
}

impl<G: Grouped> GroupCommit<G> {
    /// Starts the committer on `store` (it ends when the last handle is
    /// dropped, after committing what was queued).
    #[expect(clippy::disallowed_methods, reason = "the group committer is a task for the store's lifetime")]
    pub fn start(store: Arc<dyn Store>, settings: GroupSettings) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE);
        tokio::spawn(commit_groups::<G>(store, settings, queue));
        Self { jobs }
    }

    /// Commits `request` in the next group; its answer once the group is
    /// durable.
    pub async fn submit(&self, request: G::Request) -> Result<G::Answer, StoreError> {
        self.submit_traced(request, None).await
    }

    /// [`Self::submit`] for a request whose span is `trace`.
    pub async fn submit_traced(
        &self,
        request: G::Request,
        trace: Option<opentelemetry::trace::SpanContext>,
    ) -> Result<G::Answer, StoreError> {
        self.submit_stamped(request, trace).await.0
    }

    /// [`Self::submit_traced`], with when its group was taken up and
    /// stored (none when the committer had stopped).
    pub async fn submit_stamped(
        &self,
        request: G::Request,
        trace: Option<opentelemetry::trace::SpanContext>,
    ) -> (Result<G::Answer, StoreError>, Option<Stamps>) {
        let (answer, answered) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the group committer has stopped".into());
        if self.jobs.send(Job { request, answer, trace }).await.is_err() {
            return (Err(stopped()), None);
        }
        match answered.await {
            Ok((outcome, stamps)) => (outcome, Some(stamps)),
            Err(_) => (Err(stopped()), None),
        }
    }
}

impl GroupCommit<Publishes> {
    /// Publishes in the next group; what became of it once the group is
    /// durable, and when (none for a publish of nothing, which waits for
    /// no group).
    pub async fn publish(
        &self,
        publish: Publish,
        trace: Option<opentelemetry::trace::SpanContext>,
    ) -> (Result<Published, StoreError>, Option<Stamps>) {
        if publish.records.is_empty() {
            return (Ok(Published::Stored(Vec::new())), None);
        }
        self.submit_stamped(publish, trace).await
    }
}

async fn commit_groups<G: Grouped>(store: Arc<dyn Store>, settings: GroupSettings, mut queue: mpsc::Receiver<Job<G>>) {
    let max_events = settings.max_events.max(1);
    while let Some(first) = queue.recv().await {
        let mut events = G::events(&first.request);
        let mut group = vec![first];
        // What queued while the last commit was in flight.
        while events < max_events {
            match queue.try_recv() {
                Ok(job) => {
                    events += G::events(&job.request);
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
                        events += G::events(&job.request);
                        group.push(job);
                    }
                    _ => break,
                }
            }
        }
        commit::<G>(store.as_ref(), group, events).await;
    }
}

/// Commits `group` as one batch and answers each member; if the batch
/// fails, each member is committed alone.
async fn commit<G: Grouped>(store: &dyn Store, group: Vec<Job<G>>, events: usize) {
    let taken = Instant::now();
    let stamped = |outcome| (outcome, Stamps { taken, stored: Instant::now() });
    // Ends when the group is answered.
    let _span = match crate::telemetry::tracer() {
        Some(_) => crate::telemetry::batch(
            "commit",
            opentelemetry::trace::SpanKind::Internal,
            group.iter().map(|job| job.trace.as_ref()),
            vec![
                opentelemetry::KeyValue::new("tidings.group.kind", G::KIND),
                opentelemetry::KeyValue::new("tidings.group.members", group.len() as i64),
                opentelemetry::KeyValue::new("tidings.group.events", events as i64),
            ],
        ),
        None => None,
    };
    if group.len() == 1 {
        let job = group.into_iter().next().expect("one member");
        let _ = job.answer.send(stamped(G::alone(store, job.request).await));
        return;
    }
    crate::metrics::group_committed(G::KIND, events);
    let (requests, answers): (Vec<G::Request>, Vec<_>) = group.into_iter().map(|job| (job.request, job.answer)).unzip();
    let together = G::together(store, requests.clone()).await;
    let stored = Stamps { taken, stored: Instant::now() };
    match together {
        Ok(outcomes) if outcomes.len() == answers.len() => {
            for (outcome, answer) in outcomes.into_iter().zip(answers) {
                let _ = answer.send((Ok(outcome), stored));
            }
        }
        Ok(outcomes) => {
            // A store that answers for fewer or more than it was given.
            tracing::error!(given = answers.len(), answered = outcomes.len(), "a group commit's answers do not match its requests");
            let why = "the store answered a group commit wrongly";
            for answer in answers {
                let _ = answer.send((Err(StoreError::Unavailable(why.into())), stored));
            }
        }
        // The store is down: each member would wait for it in turn; all
        // get the answer at once (503, retry later).
        Err(StoreError::Unavailable(why)) => {
            for answer in answers {
                let _ = answer.send((Err(StoreError::Unavailable(why.clone())), stored));
            }
        }
        // The synchronous standby does not confirm: the group may be
        // committed already (only not yet confirmed), so it is never
        // retried member by member, which would store it twice.
        Err(StoreError::Unreplicated(why)) => {
            for answer in answers {
                let _ = answer.send((Err(StoreError::Unreplicated(why.clone())), stored));
            }
        }
        Err(e) => {
            tracing::debug!(error = %crate::report::chain(&e), members = answers.len(), "a group commit failed; committing its members one by one");
            // Each member's commit is its own: the failed attempt and the
            // members before it count as its wait (`queue`).
            for (request, answer) in requests.into_iter().zip(answers) {
                let taken = Instant::now();
                let outcome = G::alone(store, request).await;
                let _ = answer.send((outcome, Stamps { taken, stored: Instant::now() }));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind whose groups fail (after [`SLOW`]) and whose members commit
    /// alone at once.
    struct Failing;

    const SLOW: Duration = Duration::from_secs(1);

    #[async_trait::async_trait]
    impl Grouped for Failing {
        type Request = u32;
        type Answer = u32;
        const KIND: &'static str = "test";

        fn events(_: &u32) -> usize {
            1
        }

        async fn alone(_: &dyn Store, request: u32) -> Result<u32, StoreError> {
            Ok(request)
        }

        async fn together(_: &dyn Store, _: Vec<u32>) -> Result<Vec<u32>, StoreError> {
            tokio::time::sleep(SLOW).await;
            Err(StoreError::Other(anyhow::anyhow!("one member cannot be stored")))
        }
    }

    /// Members of a failed group are committed alone, and each one's
    /// `commit` is its own commit: the failed attempt counts as waiting.
    #[tokio::test]
    async fn a_failed_group_s_members_are_stamped_with_their_own_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(crate::store::embedded::EmbeddedStore::open(dir.path()).await.unwrap());
        let group = GroupCommit::<Failing>::start(store, GroupSettings { max_events: 8, max_delay: Duration::from_millis(200) });
        let submitted = Instant::now();
        let (a, b) = tokio::join!(group.submit_stamped(1, None), group.submit_stamped(2, None));
        for (answer, want) in [(a, 1), (b, 2)] {
            let (outcome, stamps) = answer;
            assert_eq!(outcome.unwrap(), want, "committed alone after the group failed");
            let stamps = stamps.expect("stamped");
            assert!(stamps.taken.duration_since(submitted) >= SLOW, "the failed attempt is waiting, not committing");
            assert!(stamps.stored.duration_since(stamps.taken) < SLOW, "its commit is its own");
        }
    }
}
