//! What the engine does with one change: matches it against every
//! subscription, checks each match's limits and deliver token at the
//! change's commit time ([`check`]), and produces the notification, or the
//! chain-error marker of one suppressed, or the termination.

use super::*;

impl Engine {
    /// Matches one change against every subscription; `true` if one was
    /// terminated.
    pub(super) async fn fire(
        &self,
        state: &mut State,
        record: &Record,
        kind: &'static str,
        change: &Change,
        out: &mut Output,
    ) -> Result<bool, StoreError> {
        let Output { effects, counts, outcomes } = out;
        let at = record.recorded_ms;
        let chain_id = change.chain_id.clone().unwrap_or_else(|| format!("event-{}", record.id));
        let mut ended = Vec::new();
        // Signed once, for the notifications that bundle the entity.
        let mut carried: Option<Vec<SignedChange>> = None;
        let ids: Vec<String> = state
            .subs
            .values()
            .filter(|a| a.glob.matches(&change.uri) && a.sub.events.iter().any(|e| e == kind) && change.uri != a.sub.path())
            .map(|a| a.sub.subscription_id.clone())
            .collect();
        for id in ids {
            let Some(active) = state.subs.get_mut(&id) else { continue };
            let verdict = check(active, at);
            let outcome = match verdict {
                Verdict::Deliver => "delivered",
                Verdict::Drop(reason) | Verdict::Terminate(reason) => reason,
            };
            *outcomes.entry(outcome).or_default() += 1;
            match verdict {
                Verdict::Deliver => {
                    let carried =
                        active.sub.include_payload.then(|| carried.get_or_insert_with(|| self.carried(change, record.id)).as_slice());
                    effects.push(EngineEffect::Append(self.notification(active, kind, change, &chain_id, carried).await?));
                    active.delivered_at(at);
                    counts.push((id.clone(), Some(active.tally())));
                }
                Verdict::Drop(reason) => {
                    effects.push(self.marker(&active.sub, reason, kind, change, &chain_id, record.id));
                }
                Verdict::Terminate(reason) => {
                    effects.push(self.marker(&active.sub, reason, kind, change, &chain_id, record.id));
                    let path = active.sub.path();
                    // A token that expired stays terminated only if the
                    // subscription was not renewed meanwhile.
                    let condition =
                        if reason == "deliver_token_expired" { Condition::IfMatch(active.hash.clone()) } else { Condition::Always };
                    effects.push(EngineEffect::Tree(TreeWrite {
                        path: path.clone(),
                        entity: None,
                        condition,
                        event: change_event(&path, self.handler.agent(), None, chain_id.clone()),
                    }));
                    // The count stays until the engine reaches the deletion
                    // in the log: a reload rewinds to a cursor before it.
                    ended.push(id);
                }
            }
        }
        let terminated = !ended.is_empty();
        for id in ended {
            state.subs.remove(&id);
        }
        Ok(terminated)
    }

    /// The signed changes a notification of `change` (log id `sequence`)
    /// carries: this server's own signature, then those a mirror took the
    /// change from, when they sign exactly this transition.
    fn carried(&self, change: &Change, sequence: EventId) -> Vec<SignedChange> {
        let t = change.transition();
        let own = signed::sign(&self.handler.server, t, sequence);
        let me = self.handler.server.hash();
        let forwarded = signed::verified(&change.signed, t);
        own.into_iter().chain(forwarded.into_iter().filter(|s| s.origin() != Some(me))).take(signed::MAX_CARRIED).collect()
    }

    async fn notification(
        &self,
        active: &Active,
        kind: &str,
        change: &Change,
        chain_id: &str,
        carried: Option<&[SignedChange]>,
    ) -> Result<NewRecord, StoreError> {
        let mut data = json!({ "subscription_id": active.sub.subscription_id, "event": kind, "uri": change.uri });
        if let Some(h) = &change.hash {
            data["hash"] = json!(h);
        }
        if let Some(p) = &change.previous_hash {
            data["previous_hash"] = json!(p);
        }
        // `subscriber`: whose notification this is; only that identity (a
        // token whose `sub` it is) and admins receive it. Not part of what
        // a courier forwards (`type` and `data`).
        let mut payload = json!({
            "type": "system/subscription/notification",
            "data": data,
            "chain_id": chain_id,
            "subscriber": active.sub.subscriber_identity,
        });
        // include_payload: the changed entity rides along whenever it
        // resolves; nothing is bundled for a deletion.
        if active.sub.include_payload
            && let Some(hash) = &change.hash
            && let Some(body) = self.store.content_get(hash).await?
            && let Ok(entity) = serde_json::from_str::<Value>(&body)
        {
            payload["included"] = json!({ hash.clone(): entity });
        }
        if let Some(carried) = carried.filter(|c| !c.is_empty()) {
            let mut included = payload["included"].as_object().cloned().unwrap_or_default();
            let hashes: Vec<String> = carried.iter().filter_map(|s| s.include(&mut included)).collect();
            payload["data"]["signed"] = json!(hashes);
            payload["included"] = Value::Object(included);
        }
        let body = EventBody {
            event_type: names::SUBSCRIPTION_NOTIFICATION.to_owned(),
            reference: Some(active.sub.deliver_uri.clone()),
            agent: Some(self.handler.agent()),
            session_id: None,
            occurred_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            payload,
            links: vec![],
            visibility: Visibility::Public,
            // The change's trace goes on with its notification (and to the
            // peer it is delivered to).
            traceparent: change.trace.as_ref().map(|t| t.traceparent.clone()),
            tracestate: change.trace.as_ref().and_then(|t| t.tracestate.clone()),
        };
        Ok(NewRecord::event(&body))
    }

    /// A chain-error marker for a notification of `sub` suppressed for `reason`.
    pub(super) fn marker(
        &self,
        sub: &PathSubscription,
        reason: &str,
        kind: &str,
        change: &Change,
        chain_id: &str,
        event_id: EventId,
    ) -> EngineEffect {
        let marker = Marker {
            agent: self.handler.agent(),
            subscription_id: &sub.subscription_id,
            reason,
            kind,
            uri: &change.uri,
            hash: change.hash.as_deref(),
            previous_hash: change.previous_hash.as_deref(),
            chain_id,
            event_id,
        };
        EngineEffect::Tree(marker.write())
    }
}

pub(super) enum Verdict {
    Deliver,
    Drop(&'static str),
    Terminate(&'static str),
}

/// The deliver token's expiry and the limits (docs/ref-subscriptions.md,
/// "Limits"), before each delivery, at the change's commit time `at`.
pub(super) fn check(active: &mut Active, at: i64) -> Verdict {
    let at_ms = at.max(0) as u64;
    if active.token_expires_at.is_some_and(|t| t <= at_ms) {
        return Verdict::Terminate("deliver_token_expired");
    }
    let Some(limits) = &active.sub.limits else { return Verdict::Deliver };
    if let Some(max) = limits.max_events
        && active.delivered as u64 >= max
    {
        return Verdict::Terminate("max_events_reached");
    }
    if let Some(max) = limits.max_duration_ms
        && at_ms.saturating_sub(active.sub.created_at) >= max
    {
        return Verdict::Terminate("max_duration_reached");
    }
    if let Some(rate) = limits.rate_limit {
        // Deliveries in the minute (the 60 whole seconds of commit time)
        // ending with this change's second, this one included, may not
        // exceed the rate.
        prune(&mut active.recent, at.div_euclid(1000));
        let in_window: u64 = active.recent.iter().map(|(_, n)| u64::from(*n)).sum();
        if in_window + 1 > rate {
            return Verdict::Drop("rate_limited");
        }
    }
    Verdict::Deliver
}

pub(super) fn is_marker_path(uri: &str) -> bool {
    uri.strip_prefix(MARKER_DIR).is_some_and(|r| r.starts_with('/'))
}
