//! The subscription work's supervisor. One process per database leads it
//! ([`FederationStore::engine_lead`](crate::store::FederationStore::engine_lead));
//! while this one does, the supervisor runs three siblings: the
//! [`engine`](super::engine) turning tree changes into notifications, the
//! [`courier`](super::courier) carrying those addressed to other servers,
//! and the [`mirrors`](super::mirror) applying peers' notifications here.
//! It takes the lead (and retries it), starts the three once it holds it,
//! and stops them, waiting for each, when it loses the lead or the process
//! stops: nothing of one lead outlives it (a restart reopens the store).
//!
//! The engine talks to its siblings only through watch channels it owns:
//! the remote subscriptions (the courier's lanes) and a counter of changes
//! under `system/mirror/`. Neither sibling knows the engine.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Subscriptions;
use super::courier::Courier;
use super::engine::{Engine, EngineSettings, StepError};
use super::mirror::Mirrors;
use tidings_protocol::event::EventId;

use crate::store::Store;

/// Runs the subscription work while this process leads it.
#[derive(Debug)]
pub struct Supervisor {
    engine: Engine,
    store: Arc<dyn Store>,
    handler: Arc<Subscriptions>,
    settings: EngineSettings,
}

impl Supervisor {
    /// A supervisor woken by `follow` (the broker's position).
    pub fn new(store: Arc<dyn Store>, handler: Arc<Subscriptions>, follow: watch::Receiver<EventId>, settings: EngineSettings) -> Self {
        let engine = Engine::new(store.clone(), handler.clone(), follow, settings.clone());
        Self { engine, store, handler, settings }
    }

    /// Takes the lead whenever it can and leads until `cancel`; then lets
    /// the lead go, so another process takes over at once.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut backoff = crate::pacing::STORE;
        while !cancel.is_cancelled() {
            match self.store.engine_lead().await {
                Ok(true) => {}
                Ok(false) => {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(self.settings.lead_retry) => continue,
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %crate::report::chain(&e), "subscription engine cannot reach the store; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(backoff.step()) => {}
                    }
                    continue;
                }
            }
            match self.lead(&cancel).await {
                Ok(()) => backoff.reset(),
                Err(e) => {
                    tracing::warn!(error = %crate::report::chain(&e), "subscription engine step failed; rebuilding its index");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(backoff.step()) => {}
                    }
                }
            }
        }
        self.store.engine_resign().await;
    }

    /// One lead: the engine's index loaded and its lanes published, then
    /// the courier and the mirrors started beside it, and stopped with it.
    #[expect(clippy::disallowed_methods, reason = "the supervisor starts the courier and the mirrors while this process leads")]
    async fn lead(&mut self, cancel: &CancellationToken) -> Result<(), StepError> {
        let mut state = self.engine.begin().await?;
        let siblings = cancel.child_token();
        let courier = Courier::new(
            self.store.clone(),
            self.handler.server.clone(),
            self.settings.courier.clone(),
            self.engine.follow(),
            self.handler.peer_states.clone(),
        );
        let courier = tokio::spawn(courier.run(self.engine.lanes(), siblings.clone()));
        let mirrors = Mirrors::new(
            self.store.clone(),
            self.handler.server.clone(),
            self.settings.mirror.clone(),
            self.engine.follow(),
            self.handler.mirror_states.clone(),
        );
        let mirrors = tokio::spawn(mirrors.run(self.engine.mirror_changes(), siblings.clone()));
        let led = self.engine.steps(&mut state, cancel).await;
        siblings.cancel();
        let _ = tokio::join!(courier, mirrors);
        led
    }
}
