//! Dispatch of `POST /v1/execute`: reads the `system/protocol/execute`
//! envelope `{"execute": <entity>, "included": {hash: entity}}`, checks that
//! every included entity is named by its own hash, that the author signed the
//! EXECUTE, and that the caller capability (rooted at this server, granted to
//! the author) allows the operation on every resource target; then runs the
//! `system/subscription` handler, or, for an EXECUTE addressed to one of
//! this server's inboxes, the `system/inbox` handler's `receive` (a peer
//! delivering a notification), whose capability is the deliver token.
//!
//! The caller capability is required when authentication is on; with
//! authentication off (a loopback development server) an EXECUTE without one
//! is accepted, and one that carries a capability is still checked.

use serde::Deserialize;

use super::{Caller, EVENTS, ExecuteError, Executed, HANDLER, Limits, SubscribeRequest, Subscriptions};
use tidings_protocol::glob::Glob;
use tidings_protocol::peer::verify::{Envelope, ExecuteData, Resource, Verified, VerifyError, verify};
use tidings_protocol::tree::capability::{self, Included, Token};
use tidings_protocol::tree::validate_path;

/// How the HTTP layer calls [`execute`].
#[derive(Debug, Clone)]
pub struct Call {
    /// Whether requests are authenticated (then a caller capability is required).
    pub auth_on: bool,
    /// The HTTP caller is an admin.
    pub admin: bool,
    /// The causal chain (`X-Chain-Id`, else generated).
    pub chain_id: String,
    /// The request's W3C trace context: a delivery's notification carries it.
    pub trace: Option<tidings_protocol::trace::TraceContext>,
    /// Now, Unix ms.
    pub now_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestData {
    #[serde(default)]
    events: Option<Vec<String>>,
    deliver_to: DeliverTo,
    #[serde(default)]
    deliver_token: Option<String>,
    #[serde(default)]
    include_payload: Option<bool>,
    #[serde(default)]
    limits: Option<Limits>,
    #[serde(default)]
    relay_endpoint: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeliverTo {
    uri: String,
    #[serde(default)]
    operation: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelData {
    subscription_id: String,
}

/// Runs one EXECUTE: reads and verifies it, routes it (one of this
/// server's inboxes, or the subscription handler), checks the caller
/// capability, then runs the operation with its parameters.
pub async fn execute(handler: &Subscriptions, body: &[u8], call: Call) -> Result<Executed, ExecuteError> {
    let Verified { data, included } = read(body)?;
    if let Some(inbox) = super::inbox::local_inbox(&data.uri, handler.identity().hash()) {
        let targets = data.resource.map(|r| r.targets).unwrap_or_default();
        let delivery = super::inbox::Delivery {
            inbox,
            operation: &data.operation,
            targets: &targets,
            params: data.params,
            author: &data.author,
            capability: data.capability.as_deref(),
            sequence: data.sequence,
            epochs: &data.epochs,
        };
        return super::inbox::receive(handler, delivery, &included, &call.chain_id, call.trace.as_ref(), call.now_ms).await;
    }
    if data.uri != HANDLER {
        return Err(ExecuteError::HandlerNotFound(format!("no handler at {:?}; tidings serves {HANDLER}", data.uri)));
    }
    if data.operation != "subscribe" && data.operation != "unsubscribe" {
        return Err(ExecuteError::UnknownOperation(format!("{HANDLER} has subscribe and unsubscribe, not {:?}", data.operation)));
    }
    let patterns = targets(data.resource.as_ref())?;
    let chain = caller_chain(handler, &data, &included, &patterns, &call)?;
    let caller = Caller {
        author: &data.author,
        capability: chain.as_deref(),
        admin: call.admin,
        included: &included,
        chain_id: &call.chain_id,
        now_ms: call.now_ms,
    };
    let Some(params) = data.params else { return Err(ExecuteError::InvalidParams("params are required".into())) };
    if data.operation == "unsubscribe" {
        if params.kind != "system/subscription/cancel" {
            return Err(ExecuteError::InvalidParams("unsubscribe params are a system/subscription/cancel".into()));
        }
        return match crate::json::from_object::<CancelData>(params.data) {
            Ok(cancel) => handler.unsubscribe(&caller, &cancel.subscription_id).await,
            Err(e) => Err(ExecuteError::InvalidParams(e.to_string())),
        };
    }
    if params.kind != "system/subscription/request" {
        return Err(ExecuteError::InvalidParams("subscribe params are a system/subscription/request".into()));
    }
    let Some(pattern) = patterns.into_iter().next() else {
        return Err(ExecuteError::InvalidResource("subscribe needs resource.targets[0], the pattern to watch".into()));
    };
    let request = subscribe_request(handler, pattern, params.data)?;
    handler.subscribe(&caller, request).await
}

/// The envelope, parsed, with its included entities named by their hashes
/// and the author's signature checked.
fn read(body: &[u8]) -> Result<Verified, ExecuteError> {
    let envelope: Envelope = crate::json::from_object_slice(body).map_err(|e| {
        ExecuteError::InvalidExecute(format!("the body must be {{\"execute\": {{type, data}}, \"included\": {{hash: entity}}}}: {e}"))
    })?;
    verify(envelope).map_err(|e| match e {
        VerifyError::Execute(m) => ExecuteError::InvalidExecute(m),
        VerifyError::Included(m) => ExecuteError::InvalidIncluded(m),
        VerifyError::Signature(m) => ExecuteError::SignatureInvalid(m),
    })
}

/// The resource targets, each a path pattern.
fn targets(resource: Option<&Resource>) -> Result<Vec<Glob>, ExecuteError> {
    let targets = resource.map(|r| r.targets.as_slice()).unwrap_or_default();
    targets.iter().map(|t| Glob::new_path(t).map_err(|e| ExecuteError::InvalidResource(format!("resource target {t:?}: {e}")))).collect()
}

/// The caller capability's chain: rooted at this server, granted to the
/// author, allowing the operation on every target. `None` when the EXECUTE
/// carries none and authentication is off.
fn caller_chain(
    handler: &Subscriptions,
    data: &ExecuteData,
    included: &Included,
    patterns: &[Glob],
    call: &Call,
) -> Result<Option<Vec<Token>>, ExecuteError> {
    let Some(cap) = &data.capability else {
        if call.auth_on {
            return Err(ExecuteError::CapabilityRequired("an EXECUTE needs a caller capability when authentication is on".into()));
        }
        return Ok(None);
    };
    let chain = capability::resolve_chain(included, cap, call.now_ms)
        .map_err(|e| ExecuteError::CapabilityInvalid(format!("caller capability: {e}")))?;
    let server = handler.identity().hash();
    if chain.last().is_none_or(|root| root.granter != server) {
        return Err(ExecuteError::CapabilityInvalid("the caller capability is not rooted at this server".into()));
    }
    if chain[0].grantee != data.author {
        return Err(ExecuteError::CapabilityInvalid("the caller capability is not granted to the EXECUTE's author".into()));
    }
    if let Some(p) = patterns.iter().find(|p| !capability::chain_covers(&chain, HANDLER, &data.operation, p)) {
        return Err(ExecuteError::CapabilityInsufficient(format!(
            "the caller capability does not grant {} on {}",
            data.operation,
            p.as_str()
        )));
    }
    Ok(Some(chain))
}

/// A subscribe's parameters (`system/subscription/request`), checked: the
/// events it asks for, where notifications go (an inbox here, or on a
/// peer), and the relay it may name.
fn subscribe_request(handler: &Subscriptions, pattern: Glob, params: serde_json::Value) -> Result<SubscribeRequest, ExecuteError> {
    let request: RequestData = crate::json::from_object(params).map_err(|e| ExecuteError::InvalidParams(e.to_string()))?;
    let mut events = request.events.unwrap_or_else(|| EVENTS.iter().map(|e| (*e).to_owned()).collect());
    if events.is_empty() || events.iter().any(|e| !EVENTS.contains(&e.as_str())) {
        return Err(ExecuteError::InvalidParams("events must be a non-empty subset of created, updated, deleted".into()));
    }
    events.sort_by_key(|e| EVENTS.iter().position(|k| k == e));
    events.dedup();
    let (deliver_peer, deliver_path) = match tidings_protocol::peer::parse_remote(&request.deliver_to.uri) {
        Some((peer, path)) if peer == handler.identity().hash() => (None, path.to_owned()),
        Some((peer, path)) => (Some(peer.to_owned()), path.to_owned()),
        None if request.deliver_to.uri.contains("://") => {
            return Err(ExecuteError::DeliveryUnsupported(
                "deliver_to.uri is an inbox path on this server or entity://<peer hash>/<inbox path>".into(),
            ));
        }
        None => (None, request.deliver_to.uri.clone()),
    };
    if let Err(e) = validate_path(&deliver_path) {
        return Err(ExecuteError::InvalidParams(format!("deliver_to.uri: {}", e.0)));
    }
    if let Some(endpoint) = &request.relay_endpoint
        && let Err(e) = tidings_protocol::peer::check_endpoint(endpoint)
    {
        return Err(ExecuteError::InvalidParams(format!("relay_endpoint: {e}")));
    }
    // An inbox of this server named by its full URI is stored as the path.
    let deliver_uri = if deliver_peer.is_some() { request.deliver_to.uri } else { deliver_path.clone() };
    Ok(SubscribeRequest {
        pattern,
        events,
        deliver_uri,
        deliver_path,
        deliver_peer,
        deliver_operation: request.deliver_to.operation.unwrap_or_else(|| "receive".into()),
        deliver_token: request.deliver_token,
        include_payload: request.include_payload.unwrap_or(false),
        limits: request.limits,
        relay_endpoint: request.relay_endpoint.map(|e| e.trim_end_matches('/').to_owned()),
    })
}
