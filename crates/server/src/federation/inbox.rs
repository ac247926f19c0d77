//! The receiving side of server-to-server delivery: the `system/inbox`
//! handler's `receive`, which a peer's courier calls with a signed EXECUTE
//! carrying one notification and the deliver token chain.
//!
//! A delivery is accepted only when the author signed it (checked by
//! dispatch), its capability is a deliver token chain rooted at this server
//! and granted to the author, every token in it is unexpired and grants
//! `receive` on the inbox addressed (by its path or a pattern covering it),
//! the EXECUTE's target is exactly that inbox, and its params are a
//! well-formed `system/subscription/notification`. It is then appended to
//! this server's log as a `subscription.notification` whose `ref` is the
//! inbox, with the sending server as its agent, exactly once: the
//! delivery's `sequence` (the sender's log id of the notification, rising
//! per subscription because deliveries stay in order) is recorded per
//! (sender, subscription) in the appending transaction, so a retry is
//! answered as success and stores nothing new.
//!
//! A sender whose log lost history it had notified here (a new epoch of
//! its log forked below the stream's mark: a failover, a restore) lists
//! its epochs in its deliveries; the first delivery after the loss is
//! appended after a `subscription.history_lost` notice to the same inbox,
//! with the mark it had reached (`requested`) and the fork, in the same
//! transaction, so readers of the inbox are told once
//! (docs/ref-subscriptions.md, "When the sender loses history").
//!
//! A decision of tidings' own (docs/ref-subscriptions.md,
//! "Delivery to another server"): the chain must be rooted at this server
//! itself; an inbox owned by another identity (delegated by an admin) is
//! not modelled yet, as local inboxes have no owners.

use serde::Deserialize;
use serde_json::json;
use tidings_protocol::peer::verify::SenderEpoch;

use super::{EVENTS, ExecuteError, Executed, Subscriptions};
use crate::store::NewRecord;
use tidings_protocol::event::{Agent, EventBody, Visibility, names};
use tidings_protocol::peer::protocol::MAX_EPOCHS;
use tidings_protocol::tree::capability::{self, CapabilityError, Included};
use tidings_protocol::tree::{Entity, is_hash, validate_path};

/// The handler a delivery EXECUTE targets, and the only operation it has.
pub const HANDLER: &str = "system/inbox";
/// The operation.
pub const RECEIVE: &str = "receive";
/// Where inboxes live.
const PREFIX: &str = "system/inbox/";
/// The type of the params a delivery carries.
pub const NOTIFICATION: &str = "system/subscription/notification";
/// The payload type of the notice that the sender lost history.
pub const HISTORY_LOST: &str = "system/subscription/history_lost";
/// Longest subscription id accepted from a peer.
const MAX_ID: usize = 128;

/// An EXECUTE addressed to an inbox, as dispatch read it.
#[derive(Debug)]
pub(super) struct Delivery<'a> {
    /// The inbox path on this server.
    pub(super) inbox: String,
    pub(super) operation: &'a str,
    pub(super) targets: &'a [String],
    pub(super) params: Option<Entity>,
    pub(super) author: &'a str,
    pub(super) capability: Option<&'a str>,
    pub(super) sequence: Option<i64>,
    /// The sender's epochs after its first, oldest first.
    pub(super) epochs: &'a [SenderEpoch],
}

/// The epoch in `epochs` whose lost stretch holds `mark`, when the list is
/// well-formed (at most [`MAX_EPOCHS`], numbers and bases rising, each
/// `0 <= fork <= base`); `Err` when it is not.
fn lost_at(epochs: &[SenderEpoch], mark: Option<i64>) -> Result<Option<&SenderEpoch>, ExecuteError> {
    if !SenderEpoch::well_formed(epochs) {
        return Err(ExecuteError::InvalidExecute(format!(
            "a delivery's epochs are at most {MAX_EPOCHS} of {{number >= 1, fork, base}}, 0 <= fork <= base, rising"
        )));
    }
    Ok(mark.and_then(|m| epochs.iter().find(|e| e.fork < m && m <= e.base)))
}

/// The inbox path on this server that `uri` names (`system/inbox/...`, bare
/// or as `entity://<this server>/system/inbox/...`), if it names one.
pub(super) fn local_inbox(uri: &str, server: &str) -> Option<String> {
    let path = match tidings_protocol::peer::parse_remote(uri) {
        Some((peer, path)) if peer == server => path,
        Some(_) => return None,
        None => uri,
    };
    (path.starts_with(PREFIX) && validate_path(path).is_ok()).then(|| path.to_owned())
}

/// The `data` of a `system/subscription/notification`.
#[derive(Debug, Deserialize)]
pub(super) struct NotificationData {
    pub(super) subscription_id: String,
    pub(super) event: String,
    pub(super) uri: String,
    #[serde(default)]
    pub(super) hash: Option<String>,
    #[serde(default)]
    pub(super) previous_hash: Option<String>,
    /// The signed changes it carries, by hash (see [`super::signed`]).
    #[serde(default)]
    pub(super) signed: Vec<String>,
}

/// Runs `receive`.
pub(super) async fn receive(
    handler: &Subscriptions,
    delivery: Delivery<'_>,
    included: &Included,
    chain_id: &str,
    trace: Option<&tidings_protocol::trace::TraceContext>,
    now_ms: u64,
) -> Result<Executed, ExecuteError> {
    if delivery.operation != RECEIVE {
        return Err(ExecuteError::UnknownOperation(format!("{HANDLER} has {RECEIVE}, not {:?}", delivery.operation)));
    }
    let server = handler.identity().hash();
    if delivery.targets.is_empty() || delivery.targets.iter().any(|t| local_inbox(t, server).as_deref() != Some(&delivery.inbox)) {
        return Err(ExecuteError::InvalidResource("a delivery's resource.targets is exactly [its inbox]".into()));
    }
    // The deliver token: rooted here, granted to the sending server,
    // unexpired, granting receive on this inbox all the way down.
    let Some(cap) = delivery.capability else {
        return Err(ExecuteError::CapabilityRequired("a delivery carries its deliver token as the capability".into()));
    };
    let chain = match capability::resolve_chain(included, cap, now_ms) {
        Ok(chain) => chain,
        Err(e @ (CapabilityError::Missing(_) | CapabilityError::ChainTooLong)) => {
            return Err(ExecuteError::ChainUnreachable(format!("the deliver token's chain is not resolvable: {e}")));
        }
        Err(e) => return Err(ExecuteError::CapabilityInvalid(format!("deliver token: {e}"))),
    };
    if chain.last().is_none_or(|root| root.granter != server) {
        return Err(ExecuteError::CapabilityInvalid("the deliver token is not rooted at this server".into()));
    }
    if chain[0].grantee != delivery.author {
        return Err(ExecuteError::CapabilityInvalid("the deliver token is not granted to the delivering server".into()));
    }
    if !capability::chain_grants(&chain, HANDLER, RECEIVE, &delivery.inbox) {
        return Err(ExecuteError::CapabilityInsufficient(format!("the deliver token does not grant {RECEIVE} on {}", delivery.inbox)));
    }
    let Some(seq) = delivery.sequence.filter(|s| *s > 0) else {
        return Err(ExecuteError::InvalidExecute("a delivery carries its sequence, a positive integer".into()));
    };
    let Some(params) = delivery.params.filter(|p| p.kind == NOTIFICATION) else {
        return Err(ExecuteError::InvalidParams(format!("a delivery's params are a {NOTIFICATION}")));
    };
    let n: NotificationData = crate::json::from_object(params.data).map_err(|e| ExecuteError::InvalidParams(e.to_string()))?;
    let id_ok = !n.subscription_id.is_empty() && n.subscription_id.len() <= MAX_ID && !n.subscription_id.contains('/');
    let hashes_ok = [&n.hash, &n.previous_hash].into_iter().flatten().chain(&n.signed).all(|h| is_hash(h))
        && n.signed.len() <= super::signed::MAX_CARRIED;
    // A deletion names no entity; a creation or an update names the one it wrote.
    let kind_ok = (n.event == "deleted") == n.hash.is_none();
    if !id_ok || !EVENTS.contains(&n.event.as_str()) || validate_path(&n.uri).is_err() || !hashes_ok || !kind_ok {
        return Err(ExecuteError::InvalidParams(
            "a notification is {subscription_id, event: created|updated|deleted, uri, hash (none for a deletion), previous_hash?, signed?: [hash, ...at most 4]}"
                .into(),
        ));
    }
    // Store only what was checked, in the shape of a local notification,
    // with the sender's log id of it: a reader told that the sender lost
    // history after `fork` knows which notifications it holds are gone.
    let mut data = json!({ "subscription_id": n.subscription_id, "event": n.event, "uri": n.uri, "sequence": seq });
    if let Some(h) = &n.hash {
        data["hash"] = json!(h);
    }
    if let Some(p) = &n.previous_hash {
        data["previous_hash"] = json!(p);
    }
    let mut kept = serde_json::Map::new();
    if let Some(h) = &n.hash
        && let Some(entity) = included.get(h)
    {
        kept.insert(h.clone(), entity.clone());
    }
    // The signed changes it carries, as sent: the mirror verifies them
    // against the peer it mirrors (this server does not know which).
    let carried = super::signed::carried(n.signed.iter().map(String::as_str), included);
    let signed: Vec<String> = carried.iter().filter_map(|s| s.include(&mut kept)).collect();
    if !signed.is_empty() {
        data["signed"] = json!(signed);
    }
    let mut payload = json!({ "type": NOTIFICATION, "data": data, "chain_id": chain_id });
    if !kept.is_empty() {
        payload["included"] = serde_json::Value::Object(kept);
    }
    let body = EventBody {
        event_type: names::SUBSCRIPTION_NOTIFICATION.to_owned(),
        reference: Some(delivery.inbox),
        agent: Some(Agent { id: delivery.author.to_owned(), kind: Some("peer".into()) }),
        session_id: None,
        occurred_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        payload,
        links: vec![],
        visibility: Visibility::Public,
        // The sender's trace (its notification's, sent as headers) goes on.
        traceparent: trace.map(|t| t.traceparent.clone()),
        tracestate: trace.and_then(|t| t.tracestate.clone()),
    };
    let mut records = Vec::with_capacity(2);
    let mark = handler.store.received_mark(delivery.author, &n.subscription_id).await?;
    // Told with a delivery of the epoch that followed the loss (an honest
    // sender hands out no id of a lost stretch again).
    let lost = lost_at(delivery.epochs, mark)?.filter(|e| e.base < seq);
    if let (Some(epoch), Some(requested)) = (lost, mark) {
        let told = EventBody {
            event_type: names::SUBSCRIPTION_HISTORY_LOST.to_owned(),
            payload: json!({
                "type": HISTORY_LOST,
                "data": {
                    "subscription_id": n.subscription_id,
                    "reason": "history_lost",
                    "requested": requested,
                    "fork": epoch.fork,
                    "base": epoch.base,
                    "epoch": epoch.number,
                },
                "chain_id": chain_id,
            }),
            ..body.clone()
        };
        records.push(NewRecord::event(&told));
    }
    records.push(NewRecord::event(&body));
    let appended = handler.store.append_once(delivery.author, &n.subscription_id, seq, records).await?;
    let outcome = match (appended, lost) {
        (None, _) => "duplicate",
        (Some(_), Some(_)) => "history_lost",
        (Some(_), None) => "appended",
    };
    crate::metrics::peer_received(outcome);
    if appended.is_some() {
        crate::metrics::events_published(names::SUBSCRIPTION_NOTIFICATION, 1);
        if lost.is_some() {
            crate::metrics::events_published(names::SUBSCRIPTION_HISTORY_LOST, 1);
            crate::metrics::replay_gap("history_lost");
        }
    }
    Ok(Executed::Done(json!({ "event_id": appended, "duplicate": appended.is_none() })))
}
