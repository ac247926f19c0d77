//! `subscribe` and renewal (docs/ref-subscriptions.md, "Subscribe" and
//! "Renewal"; the numbered comments below are its checks): the checks a
//! subscribe passes in order (the deliver token, the caller's capability, the
//! pattern and payload grants, where the notifications go and whether that
//! peer is known or learnable), the capacity of a prefix (a `303` to relays
//! when it is full), and the write of the subscription entity.

use super::*;

impl Subscriptions {
    /// `subscribe`, with renewal (docs/ref-subscriptions.md, "Subscribe" and
    /// "Renewal"): the checks, in order; the room, once more under the gate
    /// after a new peer is proven; then a renewal or a new entity.
    pub async fn subscribe(&self, caller: &Caller<'_>, request: SubscribeRequest) -> Result<Executed, ExecuteError> {
        let Delivery { token_hash, chain, learn } = self.delivery(caller, &request).await?;
        // 6. Bundling content needs read access, not only subscribe.
        if let Some(refused) = payload_check(caller, request.include_payload, &request.pattern) {
            return Err(refused);
        }
        // Room is counted against the identity this server granted the
        // caller capability to (the chain's root grantee), whoever it was
        // delegated to; without a capability, against the subscriber.
        let accountable = caller.capability.and_then(<[_]>::last).map_or(caller.author, |root| root.grantee.as_str()).to_owned();
        // A new peer is proven by a call to its endpoint: only once the
        // request is accepted (every check above, and room for it), and
        // outside the gate (a slow endpoint holds up no other subscribe).
        // The room is checked again under the gate before anything is
        // stored.
        if let Some((peer, endpoint)) = &learn {
            {
                let _gate = self.gate.lock().await;
                let existing = self.list().await?;
                if !self.renews(&existing, caller.author, &request)
                    && let Room::Full(redirect) = self.room(&existing, caller.author, &accountable, request.pattern.as_str()).await?
                {
                    return Ok(redirect);
                }
            }
            self.prove_peer(peer, endpoint).await?;
        }
        // Keep the chain (tokens, their signatures, their granters) so
        // the engine can resolve the token by hash later; stored once the
        // subscription is, so a refused request stores nothing.
        let content = chain_content(&chain, caller.included);
        let deliver_chain: Vec<String> =
            if request.deliver_peer.is_some() { content.iter().map(|(hash, _)| hash.clone()).collect() } else { Vec::new() };
        let terms = Terms { token_hash, deliver_chain, content, learn, accountable };
        let _gate = self.gate.lock().await;
        let existing = self.list().await?;
        if let Some(held) = existing.iter().find(|h| renewal_of(&h.subscription, caller.author, &request)) {
            return self.renew(caller, request, terms, &existing, held).await;
        }
        if let Room::Full(redirect) = self.room(&existing, caller.author, &terms.accountable, request.pattern.as_str()).await? {
            return Ok(redirect);
        }
        let subscription = self.create(caller, request, terms, &existing).await?;
        drop(_gate);
        self.refresh_config_logged().await;
        Ok(Executed::Done(result(&subscription, false)))
    }

    /// Checks 1 to 5: the deliver token travels with the request, grants
    /// this server the delivery, and its chain resolves with the subscriber
    /// in it, rooted at the inbox's server when that is a peer (which this
    /// server must know, or be able to learn).
    async fn delivery(&self, caller: &Caller<'_>, request: &SubscribeRequest) -> Result<Delivery, ExecuteError> {
        // 1. The deliver token must travel with the request.
        let Some(token_hash) = request.deliver_token.as_deref().filter(|h| caller.included.contains_key(*h)) else {
            return Err(ExecuteError::MissingDeliverToken("the deliver token is not among the included entities".into()));
        };
        // 2. It must grant this server delivery to the inbox.
        let leaf =
            capability::read_token(caller.included, token_hash).map_err(|e| ExecuteError::DeliverTokenInsufficient(e.to_string()))?;
        if leaf.grantee != self.server.hash() || !leaf.grants("system/inbox", &request.deliver_operation, &request.deliver_path) {
            return Err(ExecuteError::DeliverTokenInsufficient(format!(
                "the deliver token does not grant this server {} on {}",
                request.deliver_operation, request.deliver_uri
            )));
        }
        // 3 and 5. Its chain must resolve and verify, and the subscriber must
        // be a granter somewhere in it (in-chain, not chain-root: third-party
        // delivery roots the chain at the inbox's owner).
        let chain = match capability::resolve_chain(caller.included, token_hash, caller.now_ms) {
            Ok(chain) => chain,
            Err(e @ (CapabilityError::Missing(_) | CapabilityError::ChainTooLong)) => {
                return Err(ExecuteError::ChainUnreachable(format!("the deliver token's authority chain is not resolvable: {e}")));
            }
            Err(e) => return Err(ExecuteError::DeliverTokenInsufficient(e.to_string())),
        };
        if !capability::chain_grants(&chain, "system/inbox", &request.deliver_operation, &request.deliver_path) {
            return Err(ExecuteError::DeliverTokenInsufficient("a token in the deliver token's chain does not grant the delivery".into()));
        }
        // 4. A remote inbox's server verifies the chain at every delivery: it
        // must be rooted there, and this server must know where that is.
        let mut learn = None;
        if let Some(peer) = &request.deliver_peer {
            if chain.last().is_none_or(|root| root.granter != *peer) {
                return Err(ExecuteError::DeliverTokenInsufficient(format!(
                    "the deliver token's chain must be rooted at {peer}, the server holding the inbox"
                )));
            }
            if self.store.tree_get(&format!("{}{peer}", tidings_protocol::peer::PREFIX)).await?.is_none() {
                learn = Some((peer.clone(), self.learnable(peer, caller.author, request.relay_endpoint.as_deref())?));
            }
        }
        if !capability::in_chain(&chain, caller.author) {
            return Err(ExecuteError::EmbeddedCapUnauthorized("subscriber identity not in deliver_token authority chain".into()));
        }
        Ok(Delivery { token_hash: token_hash.to_owned(), chain, learn })
    }

    /// Renewal: same subscriber, pattern, inbox and operation. The token
    /// rotates (it was just checked for that operation) and the request's
    /// terms (events, include_payload, limits) replace the stored ones,
    /// checked as for a new subscription; the id, the creation time (so
    /// max_duration_ms) and the delivered count stay. Runs under the gate.
    async fn renew(
        &self,
        caller: &Caller<'_>,
        request: SubscribeRequest,
        terms: Terms,
        existing: &[Held],
        held: &Held,
    ) -> Result<Executed, ExecuteError> {
        let renewed = PathSubscription {
            deliver_token: terms.token_hash,
            deliver_chain: terms.deliver_chain,
            relay_endpoint: request.relay_endpoint,
            events: request.events,
            include_payload: request.include_payload,
            limits: request.limits,
            ..held.subscription.clone()
        };
        if let Some((peer, endpoint)) = &terms.learn {
            self.store.tree_write(learned_peer(peer, endpoint, self.agent(), caller.chain_id.to_owned())).await?;
        }
        let Some(stored) = self.write(&renewed, Condition::IfMatch(held.entry.hash.clone()), caller.chain_id).await? else {
            return Err(ExecuteError::SubscriptionChanged("the subscription changed during renewal; retry".into()));
        };
        self.wrote(existing, Some(&held.entry), stored, renewed.clone());
        self.store.content_put(terms.content).await?;
        Ok(Executed::Done(result(&renewed, true)))
    }

    /// A new subscription: stores the learned peer, the chain's content and
    /// the entity (the engine registers it when it reaches the change in
    /// the log). Runs under the gate, after the room was checked.
    async fn create(
        &self,
        caller: &Caller<'_>,
        request: SubscribeRequest,
        terms: Terms,
        existing: &[Held],
    ) -> Result<PathSubscription, ExecuteError> {
        let subscription = PathSubscription {
            subscription_id: generate_id(),
            pattern: request.pattern.as_str().to_owned(),
            events: request.events,
            deliver_uri: request.deliver_uri,
            deliver_operation: request.deliver_operation,
            subscriber_identity: caller.author.to_owned(),
            deliver_token: terms.token_hash,
            include_payload: request.include_payload,
            created_at: caller.now_ms,
            limits: request.limits,
            deliver_chain: terms.deliver_chain,
            relay_endpoint: request.relay_endpoint,
            accountable: (terms.accountable != caller.author).then_some(terms.accountable),
        };
        if let Some((peer, endpoint)) = &terms.learn {
            // Lost to a concurrent write of the same peer: that one stands.
            self.store.tree_write(learned_peer(peer, endpoint, self.agent(), caller.chain_id.to_owned())).await?;
            tracing::info!(peer, endpoint, "learned a peer's endpoint, proven by its identity");
        }
        self.store.content_put(terms.content).await?;
        if let Some(stored) = self.write(&subscription, Condition::IfAbsent, caller.chain_id).await? {
            self.wrote(existing, None, stored, subscription.clone());
        }
        Ok(subscription)
    }

    /// Whether `request` renews one of `existing`.
    fn renews(&self, existing: &[Held], author: &str, request: &SubscribeRequest) -> bool {
        existing.iter().any(|h| renewal_of(&h.subscription, author, request))
    }

    /// Whether a new subscription of `author`, counted against
    /// `accountable` (see [`PathSubscription::counted_against`]), for `pattern`
    /// has room: refused (`too_many_subscriptions`) at the server's cap or
    /// the identity's, [`Room::Full`] with a capacity redirect
    /// (docs/ref-subscriptions.md, "Capacity and redirects") at the
    /// prefix's.
    async fn room(&self, existing: &[Held], author: &str, accountable: &str, pattern: &str) -> Result<Room, ExecuteError> {
        if existing.len() >= self.max_total {
            return Err(ExecuteError::TooManySubscriptions(format!(
                "this server keeps at most {} subscriptions; unsubscribe some or use another server",
                self.max_total
            )));
        }
        // One subscriber cannot take the server's room from everyone else.
        if existing.iter().filter(|h| h.subscription.counted_against() == accountable).count() >= self.max_per_identity {
            return Err(ExecuteError::TooManySubscriptionsForIdentity(format!(
                "this identity keeps at most {} subscriptions here (TIDINGS_MAX_SUBSCRIPTIONS_PER_IDENTITY); unsubscribe some",
                self.max_per_identity
            )));
        }
        // 7. Capacity for this prefix.
        let subscribers: Vec<&PathSubscription> = existing.iter().map(|h| &h.subscription).filter(|s| s.pattern == pattern).collect();
        if self.max_per_prefix == 0 || (subscribers.len() as u64) < self.max_per_prefix {
            return Ok(Room::Fits);
        }
        // Offered as relays: only subscribers that really hold a relaying
        // mirror of the prefix (a server receiving the entities into its
        // own mirror inbox, which said it relays), at the endpoint this
        // server knows for them (proven by /v1/identity, or written by an
        // admin), never the one a request claimed; never the requester,
        // each once; not one the last delivery attempt here got no answer
        // from (a relay that died is not offered; its slot is freed once
        // its deliveries have failed for TIDINGS_PEER_EVICT_AFTER). Only
        // the process leading the engine delivers, so only it knows. What
        // such a relay forwards is signed by this server, so it can delay
        // or withhold, never forge (see `signed`).
        let failing: std::collections::HashSet<String> = self
            .peer_states
            .lock()
            .map(|states| states.iter().filter(|(_, s)| s.unreachable).map(|(peer, _)| peer.clone()).collect())
            .unwrap_or_default();
        let mut candidates: Vec<&str> = subscribers
            .iter()
            .filter(|s| s.subscriber_identity != author && !failing.contains(&s.subscriber_identity))
            .filter(|s| s.relay_endpoint.is_some() && s.include_payload && relays_as_mirror(s))
            .map(|s| s.subscriber_identity.as_str())
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        candidates.shuffle(&mut rand::rng());
        let mut alternatives: Vec<Value> = Vec::new();
        for peer in candidates {
            if alternatives.len() >= tidings_protocol::peer::MAX_ALTERNATIVES {
                break;
            }
            if let Some(entry) = self.store.tree_get(&format!("{}{peer}", tidings_protocol::peer::PREFIX)).await?
                && let Some(endpoint) = tidings_protocol::peer::endpoint_of(&entry.entity)
            {
                alternatives.push(json!({"peer": peer, "endpoint": endpoint}));
            }
        }
        Ok(Room::Full(Executed::Redirect(json!({
            "type": "system/subscription/redirect",
            "data": { "reason": "at_capacity", "prefix": pattern, "alternatives": alternatives, "capacity": self.max_per_prefix }
        }))))
    }

    /// Where an unknown peer may be learned from the request, checked
    /// without calling anything: only when the subscriber is that peer
    /// itself (it delivers to its own inbox, as a mirror or a relay does),
    /// with a `relay_endpoint` whose host `TIDINGS_PEER_ALLOW` allows.
    /// Nothing else a request says is trusted as an address.
    fn learnable(&self, peer: &str, author: &str, endpoint: Option<&str>) -> Result<String, ExecuteError> {
        let Some(endpoint) = endpoint.filter(|_| author == peer) else { return Err(unknown_peer(peer, "no proven endpoint")) };
        let endpoint = endpoint.trim_end_matches('/');
        self.http.may_call(endpoint).map_err(|why| unknown_peer(peer, why))?;
        Ok(endpoint.to_owned())
    }

    /// Proves a peer's endpoint: `GET /v1/identity` there answers its
    /// identity (the one call out a subscribe makes, after it is accepted).
    async fn prove_peer(&self, peer: &str, endpoint: &str) -> Result<(), ExecuteError> {
        self.http.prove(peer, endpoint, std::time::Duration::from_secs(5)).await.map_err(|why| unknown_peer(peer, why))
    }
}

/// Whether a new subscription has room here.
enum Room {
    /// It fits.
    Fits,
    /// The prefix is at capacity: the redirect to answer with.
    Full(Executed),
}

/// What checks 1 to 5 found: the deliver token, its chain, and a peer to
/// learn (its hash and the endpoint to prove) when the inbox is on a peer
/// this server does not know yet.
struct Delivery {
    token_hash: String,
    chain: Vec<Token>,
    learn: Option<(String, String)>,
}

/// What a subscribe stores beside the request's own terms.
struct Terms {
    /// The deliver token's hash.
    token_hash: String,
    /// For a peer's inbox, the hashes of the chain the peer verifies.
    deliver_chain: Vec<String>,
    /// The chain's entities, stored with the subscription.
    content: Vec<(String, String)>,
    /// A peer proven just now, stored with the subscription.
    learn: Option<(String, String)>,
    /// Who the room is counted against.
    accountable: String,
}
