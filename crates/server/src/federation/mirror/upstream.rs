//! A mirror's side of the conversation with its peer and any relay: the
//! signed EXECUTEs that subscribe, renew and cancel, proving a relay's
//! endpoint, and re-reading a path at the peer.

use super::*;
use tidings_protocol::peer::protocol::{Execute, PeerError, SignedExecute, receive_token};

impl Mirrors {
    pub(super) async fn endpoint(&self, peer: &str) -> Result<String, PeerError> {
        match self.store.tree_get(&format!("{}{peer}", tidings_protocol::peer::PREFIX)).await {
            Ok(Some(entry)) => tidings_protocol::peer::endpoint_of(&entry.entity)
                .ok_or_else(|| PeerError::Unknown("the peer entity has no endpoint".into())),
            Ok(None) => Err(PeerError::Unknown(format!("peer {peer} is not known here ({}{peer})", tidings_protocol::peer::PREFIX))),
            Err(e) => Err(PeerError::Store(e.to_string())),
        }
    }

    /// A signed EXECUTE on `upstream`'s `system/subscription` (the caller
    /// capability, minted by the peer, only travels to the peer).
    pub(super) fn execute(&self, spec: &Spec, upstream: &str, execute: Execute, mut included: Map<String, Value>) -> SignedExecute {
        let mut execute = execute;
        if let Some((hash, bundle)) = spec.capability.as_ref().filter(|_| upstream == spec.peer) {
            execute = execute.capability(hash);
            included.extend(bundle.clone());
        }
        execute.signed(&self.server, included)
    }

    pub(super) async fn post(&self, upstream: &str, envelope: &SignedExecute) -> Result<(u16, Value), PeerError> {
        let endpoint = self.endpoint(upstream).await?;
        let r = self.http.post(&format!("{endpoint}/v1/execute"))?.json(envelope).send().await.map_err(tidings_outbound::unreachable)?;
        let status = r.status().as_u16();
        Ok((status, tidings_outbound::read_json(r).await))
    }

    /// Subscribes (or renews) at `upstream`.
    pub(super) async fn subscribe(&self, spec: &Spec, upstream: &str, inbox: &str) -> Subscribed {
        let expires_at = now_ms() + self.settings.token_ttl.as_millis() as i64;
        let mut included = Map::new();
        let token = receive_token(&self.server, upstream, inbox, None, Some(expires_at), &mut included);
        let execute = Execute::new(crate::federation::HANDLER, "subscribe", self.server.hash()).targets(json!([spec.pattern])).params(
            "system/subscription/request",
            json!({
                "deliver_to": {"uri": format!("entity://{}/{inbox}", self.server.hash())},
                "deliver_token": token,
                "include_payload": true,
                "relay_endpoint": self.settings.public_url,
            }),
        );
        let envelope = self.execute(spec, upstream, execute, included);
        match self.post(upstream, &envelope).await {
            Err(why) => Subscribed::Failed(why),
            Ok((status, body)) => Subscribed::from_answer(status, &body),
        }
    }

    /// Subscribes at `from`, following capacity redirects to relays
    /// ([`tidings_outbound::follow_redirects`]; each relay proven by
    /// `GET /v1/identity` and learned here).
    pub(super) async fn attach(&self, spec: &Spec, from: &str, inbox: &str, avoid: &[&str]) -> Result<Attached, PeerError> {
        tidings_outbound::follow_redirects(from, self.server.hash(), avoid, &Asking { mirrors: self, spec, inbox }).await
    }

    /// Attaches again after `dead` stopped answering: at one of the cached
    /// `alternatives` (the dead relay's siblings, at its depth `hops`,
    /// following their redirects), else at the peer, which redirects anew;
    /// and when none of those accepts but `dead` answers again (it was
    /// slow, or restarted), back at it: the subscription left there is
    /// renewed, keeping its place. (Without that, a mirror whose relay was
    /// the peer's only offer waited on a slot it already held.)
    pub(super) async fn reattach(
        &self,
        spec: &Spec,
        dead: &str,
        alternatives: &[Relay],
        hops: u32,
        inbox: &str,
        shunned: &[&str],
    ) -> Result<Attached, PeerError> {
        use rand::seq::SliceRandom as _;
        let avoid: Vec<&str> = std::iter::once(dead).chain(shunned.iter().copied()).collect();
        let mut cached: Vec<&(String, String)> = alternatives
            .iter()
            .filter(|(peer, _)| !avoid.contains(&peer.as_str()) && peer != self.server.hash() && *peer != spec.peer)
            .collect();
        cached.shuffle(&mut rand::rng());
        for (peer, endpoint) in cached {
            if self.prove(peer, endpoint).await
                && let Ok(a) = self.attach(spec, peer, inbox, &avoid).await
            {
                return Ok(a.below(hops));
            }
        }
        match self.attach(spec, &spec.peer, inbox, &avoid).await {
            Err(why) if self.answers(dead).await => {
                tracing::info!(mirror = spec.name, relay = dead, why = %why, "the relay answers again and none other accepts; back at it");
                self.attach(spec, dead, inbox, shunned).await.map(|a| a.below(hops))
            }
            attached => attached,
        }
    }

    /// Whether `peer` answers `GET /v1/identity` as itself within a
    /// quarter of the repair timeout (the probe of an upstream).
    pub(super) async fn answers(&self, peer: &str) -> bool {
        let Ok(endpoint) = self.endpoint(peer).await else { return false };
        let within = (self.settings.repair_timeout / 4).min(self.settings.timeout).max(Duration::from_millis(50));
        self.http.proves(peer, &endpoint, within).await
    }

    /// Cancels the abandoned subscriptions whose relay answers again (all
    /// probed at once); forgets those whose token has expired. (One at a
    /// server attached to again is dropped from the list then: a renewal
    /// keeps the id, so it is the live subscription.) Those at `keep`, the
    /// relay a repair under way may go back to, are kept: cancelled, the
    /// place a return would renew would be given up.
    pub(super) async fn cancel_abandoned(&self, spec: &Spec, abandoned: &mut Vec<Abandoned>, keep: Option<String>) {
        let now = tokio::time::Instant::now();
        abandoned.retain(|a| a.until > now);
        let kept_for_return = |a: &Abandoned| keep.as_deref() == Some(a.upstream.as_str());
        let answering =
            futures_util::future::join_all(abandoned.iter().map(|a| async { !kept_for_return(a) && self.answers(&a.upstream).await }))
                .await;
        let mut kept = Vec::new();
        for (a, answers) in std::mem::take(abandoned).into_iter().zip(answering) {
            if !answers {
                kept.push(a);
                continue;
            }
            match self.unsubscribe(spec, &a.upstream, &a.id).await {
                Ok(()) => tracing::info!(
                    mirror = spec.name,
                    upstream = a.upstream,
                    "cancelled the subscription left at a relay that answers again"
                ),
                Err(why) => {
                    tracing::debug!(mirror = spec.name, upstream = a.upstream, why = %why, "could not cancel a subscription left at a relay yet");
                    kept.push(a);
                }
            }
        }
        *abandoned = kept;
    }

    /// Whether `endpoint` answers `GET /v1/identity` as `peer`; if so, and
    /// this server does not know `peer` yet, it learns it there.
    async fn prove(&self, peer: &str, endpoint: &str) -> bool {
        if !self.http.proves(peer, endpoint, self.settings.timeout).await {
            return false;
        }
        let agent = Agent::server(self.server.hash());
        match self.store.tree_write(crate::federation::learned_peer(peer, endpoint, agent, generate_id())).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %crate::report::chain(&e), peer, "could not store a relay's endpoint");
                false
            }
        }
    }

    pub(super) async fn unsubscribe(&self, spec: &Spec, upstream: &str, id: &str) -> Result<(), PeerError> {
        let execute = Execute::new(crate::federation::HANDLER, "unsubscribe", self.server.hash())
            .params("system/subscription/cancel", json!({"subscription_id": id}));
        let envelope = self.execute(spec, upstream, execute, Map::new());
        match self.post(upstream, &envelope).await? {
            (200 | 404, _) => Ok(()),
            (status, body) => Err(PeerError::refused(status, &body)),
        }
    }

    /// The peer's entity at `path` now, read at the peer itself.
    pub(super) async fn reread(&self, peer: &str, path: &str) -> Result<Read, PeerError> {
        let endpoint = self.endpoint(peer).await?;
        let r = self.http.get(&format!("{endpoint}/v1/tree/{path}"))?.send().await.map_err(tidings_outbound::unreachable)?;
        // The change that wrote what is there, or (for nothing there) the
        // change as of which nothing is.
        let sequence = r.headers().get(tidings_protocol::tree::CHANGE_ID_HEADER).and_then(|v| v.to_str().ok()?.parse().ok());
        match r.status().as_u16() {
            404 => Ok(Read { bytes: None, sequence }),
            200 => {
                let body = String::from_utf8(tidings_outbound::read_answer(r).await?).map_err(|e| PeerError::Unexpected(e.to_string()))?;
                let entity: Entity =
                    serde_json::from_str(&body).map_err(|e| PeerError::Unexpected(format!("the peer's entity at {path}: {e}")))?;
                entity.check().map_err(|e| PeerError::Unexpected(e.0))?;
                Ok(Read { bytes: Some(entity.canonical()), sequence })
            }
            status => Err(PeerError::Unexpected(format!("GET {path} at the peer answered {status}"))),
        }
    }
}

/// One mirror subscribing, as [`tidings_outbound::follow_redirects`] drives it.
pub(super) struct Asking<'a> {
    pub(super) mirrors: &'a Mirrors,
    pub(super) spec: &'a Spec,
    pub(super) inbox: &'a str,
}

impl tidings_outbound::Subscriber for Asking<'_> {
    async fn subscribe_at(&self, at: &str) -> Subscribed {
        self.mirrors.subscribe(self.spec, at, self.inbox).await
    }

    async fn prove(&self, peer: &str, endpoint: &str) -> bool {
        self.mirrors.prove(peer, endpoint).await
    }
}

/// A subscription left at a relay that stopped answering.
#[derive(Debug)]
pub(super) struct Abandoned {
    pub(super) upstream: String,
    pub(super) id: String,
    /// When its deliver token expires (and the relay ends it itself).
    pub(super) until: tokio::time::Instant,
}

impl Abandoned {
    /// Remembers subscription `id` left at `upstream` (the newest first,
    /// at most [`MAX_ABANDONED`]).
    pub(super) fn push(abandoned: &mut Vec<Abandoned>, upstream: &str, id: String, token_ttl: Duration) {
        abandoned.truncate(MAX_ABANDONED - 1);
        abandoned.insert(0, Abandoned { upstream: upstream.to_owned(), id, until: tokio::time::Instant::now() + token_ttl });
    }
}

/// What a re-read at the peer found.
pub(super) struct Read {
    /// The canonical bytes and hash, `None` when nothing is there.
    pub(super) bytes: Option<(String, String)>,
    /// The peer's log id of the change that wrote them (`Tidings-Change-Id`).
    pub(super) sequence: Option<u64>,
}
