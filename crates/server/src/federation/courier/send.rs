//! One lane's deliveries: the signed `receive` EXECUTE of a notification
//! (its deliver-token chain read once), each attempt at the peer's
//! `POST /v1/execute`, retries with backoff, and giving up with a marker.

use super::*;
use tidings_protocol::peer::protocol::SignedExecute;
use tidings_protocol::trace::TraceContext;

/// A lane's sending side, with the deliver token's chain cached (it is
/// fixed for the lane's life). The peer's endpoint is looked up at every
/// attempt, so an admin's change applies at once.
pub(super) struct Sender<'a> {
    courier: &'a Courier,
    lane: &'a Lane,
    chain: Option<Map<String, Value>>,
    /// Since when every attempt failed (none answered).
    failing_since: Option<tokio::time::Instant>,
}

impl<'a> Sender<'a> {
    pub(super) async fn new(courier: &'a Courier, lane: &'a Lane) -> Self {
        Self { courier, lane, chain: None, failing_since: None }
    }

    async fn endpoint(&self) -> Result<String, PeerError> {
        let peer = &self.lane.peer;
        match self.courier.store.tree_get(&format!("{}{peer}", tidings_protocol::peer::PREFIX)).await {
            Ok(Some(entry)) => tidings_protocol::peer::endpoint_of(&entry.entity)
                .ok_or_else(|| PeerError::Unknown("the peer entity has no endpoint".into())),
            Ok(None) => Err(PeerError::Unknown("the peer is not known".into())),
            Err(e) => Err(PeerError::Store(e.to_string())),
        }
    }

    /// Delivers one notification, retrying per the settings; `None` if the
    /// lane was stopped meanwhile (the notification is then left for the
    /// next run, its cursor unmoved).
    pub(super) async fn deliver(&mut self, record: &Record, stored: Stored, stop: &CancellationToken) -> Option<()> {
        let (courier, lane) = (self.courier, self.lane);
        let chain_id = stored.payload.chain_id.clone().unwrap_or_else(|| format!("event-{}", record.id));
        // A store that cannot be read now is retried, not a lost delivery.
        let mut backoff = crate::pacing::DELIVERY;
        let envelope = loop {
            match self.envelope(record.id, &stored).await {
                Ok(envelope) => break envelope,
                Err(e) => {
                    tracing::warn!(error = %crate::report::chain(&e), subscription = lane.subscription_id, "cannot build a delivery; retrying");
                    if sleep_or_stop(stop, backoff.next_delay()).await {
                        return None;
                    }
                }
            }
        };
        // The delivery's span (when spans are exported) under the
        // notification's trace; the peer is sent its context, else the
        // notification's, so the notification it appends goes on with it.
        let stored_trace =
            stored.traceparent.clone().map(|traceparent| TraceContext { traceparent, tracestate: stored.tracestate.clone() });
        let entering = crate::telemetry::Entering::start("peer-deliver", stored_trace.as_ref(), || {
            vec![
                opentelemetry::KeyValue::new("tidings.peer", lane.peer.clone()),
                opentelemetry::KeyValue::new("messaging.message.id", record.id),
            ]
        });
        let trace = entering.stored.clone().or(stored_trace);
        let _span = entering;
        let mut backoff = crate::pacing::DELIVERY;
        for attempt in 1..=courier.settings.attempts.max(1) {
            if stop.is_cancelled() {
                return None;
            }
            let outcome = tokio::select! {
                biased;
                _ = stop.cancelled() => return None,
                outcome = self.attempt(&envelope, &chain_id, trace.as_ref()) => outcome,
            };
            match outcome {
                Attempt::Delivered { duplicate } => {
                    self.failing_since = None;
                    courier.note(&lane.peer, |s| {
                        s.delivered += 1;
                        s.unreachable = false;
                        s.last_error = None;
                        s.last_delivered_ms = Some(now_ms());
                    });
                    let outcome = if duplicate { "duplicate" } else { "delivered" };
                    crate::metrics::peer_delivery(outcome);
                    return Some(());
                }
                Attempt::Refused(code) => {
                    self.failing_since = None;
                    tracing::warn!(code, subscription = lane.subscription_id, peer = lane.peer, "a peer refused a delivery");
                    crate::metrics::peer_delivery("refused");
                    courier.note(&lane.peer, |s| {
                        s.lost += 1;
                        s.unreachable = false;
                        s.last_error = Some(format!("refused: {code}"));
                    });
                    courier.give_up(lane, record, &stored, &chain_id, &code).await;
                    return Some(());
                }
                Attempt::Failed(why) => {
                    tracing::debug!(why = %why, attempt, subscription = lane.subscription_id, "delivery to a peer failed");
                    courier.note(&lane.peer, |s| {
                        s.failed_attempts += 1;
                        s.unreachable = true;
                        s.last_error = Some(why.to_string());
                    });
                    let since = *self.failing_since.get_or_insert_with(tokio::time::Instant::now);
                    let evict_after = courier.settings.evict_after;
                    if !evict_after.is_zero() && since.elapsed() >= evict_after && courier.evict(lane, &chain_id).await {
                        // Ended: the lane stops when the engine reaches the
                        // deletion; nothing more is sent meanwhile.
                        stop.cancelled().await;
                        return None;
                    }
                    if attempt == courier.settings.attempts.max(1) {
                        break;
                    }
                    crate::metrics::peer_retry();
                    if sleep_or_stop(stop, backoff.next_delay()).await {
                        return None;
                    }
                }
            }
        }
        tracing::warn!(subscription = lane.subscription_id, peer = lane.peer, "giving up a delivery after its attempts");
        crate::metrics::peer_delivery("given_up");
        courier.note(&lane.peer, |s| s.lost += 1);
        courier.give_up(lane, record, &stored, &chain_id, "delivery_failed").await;
        Some(())
    }

    /// One POST to the peer's `/v1/execute`.
    async fn attempt(&mut self, envelope: &SignedExecute, chain_id: &str, trace: Option<&TraceContext>) -> Attempt {
        let endpoint = match self.endpoint().await {
            Ok(endpoint) => endpoint,
            Err(why) => return Attempt::Failed(why),
        };
        let request = match self.courier.http.post(&format!("{endpoint}/v1/execute")) {
            Ok(request) => request,
            Err(why) => return Attempt::Failed(why),
        };
        let mut request = request.header("x-chain-id", chain_id);
        if let Some(trace) = trace {
            request = request.header("traceparent", &trace.traceparent);
            if let Some(state) = &trace.tracestate {
                request = request.header("tracestate", state);
            }
        }
        let sent = request.json(envelope).send().await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => return Attempt::Failed(tidings_outbound::unreachable(e)),
        };
        let status = response.status().as_u16();
        let body = tidings_outbound::read_json(response).await;
        match status {
            200 => Attempt::Delivered { duplicate: body["result"]["duplicate"] == true },
            408 | 429 | 500..=599 => Attempt::Failed(PeerError::refused(status, &body)),
            _ => Attempt::Refused(refusal_code(&body)),
        }
    }

    /// The signed `receive` EXECUTE for the notification at `seq`, with the
    /// deliver token chain, the signature, this server's identity and (for
    /// `include_payload`) the changed entity in `included`. It lists the
    /// epochs of this server's log after the first: a receiver that holds
    /// notifications of a lost stretch tells its readers.
    async fn envelope(&mut self, seq: EventId, stored: &Stored) -> Result<SignedExecute, StoreError> {
        let (courier, lane) = (self.courier, self.lane);
        let epochs = courier.store.epochs(0).await?;
        let epochs: Vec<(i32, i64, i64)> = epochs.all().iter().skip(1).map(|e| (e.number, e.fork, e.base)).collect();
        let execute = Execute::new(&lane.deliver_uri, &lane.operation, courier.server.hash())
            .request_id(format!("{}-{seq}", lane.subscription_id))
            .targets(json!([lane.deliver_uri]))
            .params(NOTIFICATION, stored.payload.data.clone())
            .capability(&lane.deliver_token)
            .sequence(seq)
            .epochs(&epochs);
        if self.chain.is_none() {
            let mut chain = Map::new();
            for hash in &lane.deliver_chain {
                if let Some(body) = courier.store.content_get(hash).await?
                    && let Ok(entity) = serde_json::from_str::<Value>(&body)
                {
                    chain.insert(hash.clone(), entity);
                }
            }
            self.chain = Some(chain);
        }
        let mut included = self.chain.clone().unwrap_or_default();
        if let Some(bundled) = &stored.payload.included {
            included.extend(bundled.clone());
        }
        Ok(execute.signed(&courier.server, included))
    }
}

enum Attempt {
    Delivered {
        duplicate: bool,
    },
    /// Refused for good, with the peer's code (a marker's reason).
    Refused(String),
    /// Worth another attempt.
    Failed(PeerError),
}
