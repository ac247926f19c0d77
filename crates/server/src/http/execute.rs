//! `POST /v1/execute`: signed EXECUTEs for the `system/subscription`
//! handler (subscribe, unsubscribe, renewal) and for this server's inboxes
//! (`receive`, a peer delivering a notification). The HTTP status is the
//! handler's status and the body its answer, `{status, result}` or
//! `{status, error: {code, message}}`; dispatch lives in
//! [`crate::service::execute`].

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::caller::MaybeCaller;
use super::error::ApiError;
use crate::auth::AuthMode;
use crate::refusal::Refusal;
use crate::service::execute::{Call, ExecuteError, Executed};
use serde_json::json;

/// Runs a signed EXECUTE.
#[utoipa::path(
    post,
    path = "/v1/execute",
    tag = "tree",
    params(
        ("X-Chain-Id" = Option<String>, Header, description = "The causal chain this request belongs to (one path segment); generated when absent"),
        ("traceparent" = Option<String>, Header, description = "The W3C trace context of a peer's delivery (a sending tidings sends its notification's): the notification appended to the inbox carries it (see `POST /v1/events`)."),
        ("tracestate" = Option<String>, Header, description = "The `tracestate` that goes with `traceparent`."),
    ),
    request_body(content = Object, content_type = "application/json", description = "`{execute: {type: \"system/protocol/execute\", data: {uri: \"system/subscription\", operation: \"subscribe\"|\"unsubscribe\", resource: {targets: [pattern]}, params: {type, data}, author, capability?}}, included: {hash: entity}}`; a peer's delivery has `uri` and `resource.targets` an inbox here, `operation: \"receive\"`, `params` a `system/subscription/notification`, `capability` the deliver token and `sequence` its log id: the author's signature over the EXECUTE's hash, its identity, the caller capability chain and the deliver token chain travel in `included`"),
    responses(
        (status = 200, description = "`{status: 200, result: {subscription_id, pattern, events, limits, renewed}}` (subscribe) or `{status: 200, result: null}` (unsubscribe)", body = Object),
        (status = 303, description = "`{status: 303, result: {type: \"system/subscription/redirect\", data: {reason: \"at_capacity\", prefix, alternatives: [{peer, endpoint}], capacity}}}`: alternatives are current subscribers that gave a `relay_endpoint`", body = Object),
        (status = 400, description = "`missing_deliver_token`, `invalid_execute`, `invalid_included`, `invalid_params`, `invalid_resource`, `unknown_operation`, `delivery_unsupported`, `unknown_peer`, `invalid_chain_id`, `malformed_body`, `invalid_traceparent`, `invalid_tracestate`", body = Object),
        (status = 401, description = "`unauthorized` (a bearer token that does not verify; none is needed, since an EXECUTE carries its caller capability), `signature_invalid`", body = Object),
        (status = 403, description = "`deliver_token_insufficient`, `embedded_cap_unauthorized`, `payload_unauthorized`, `not_subscription_owner`, `capability_required`, `capability_invalid`, `capability_insufficient`", body = Object),
        (status = 404, description = "`chain_unreachable`, `subscription_not_found`, `handler_not_found`", body = Object),
        (status = 409, description = "`subscription_changed`", body = Object),
        (status = 413, description = "`body_too_large`", body = crate::http::openapi::ErrorBody),
        (status = 408, description = "`body_timeout`: the body did not arrive within `TIDINGS_BODY_TIMEOUT` (the connection closes)", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "`too_many_subscriptions_for_identity`: the subscriber keeps `TIDINGS_MAX_SUBSCRIPTIONS_PER_IDENTITY` subscriptions", body = Object),
        (status = 503, description = "`store_unavailable`, `too_many_subscriptions`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn execute(
    State(app): State<AppState>,
    MaybeCaller(caller): MaybeCaller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = super::events::read_body(app.settings(), &headers, body).await?;
    let chain_id = super::tree::chain_id(&headers)?;
    let trace = super::events::trace_context(&headers)?;
    let call = Call {
        auth_on: matches!(app.auth(), AuthMode::Jwt(_)),
        // Only an authenticated admin overrides ownership; with authentication
        // off the author's signature alone decides.
        admin: caller.is_some_and(|c| c.admin && c.authenticated),
        chain_id: chain_id.clone(),
        trace,
        now_ms: chrono::Utc::now().timestamp_millis().max(0) as u64,
    };
    // The answer body carries the status too: `{status, result}` or
    // `{status, error: {code, message}}` (docs/ref-subscriptions.md,
    // "The EXECUTE envelope").
    let (status, body) = match crate::service::execute::execute(app.core(), &bytes, call).await {
        Ok(Executed::Done(result)) => (StatusCode::OK, json!({ "status": 200, "result": result })),
        Ok(Executed::Redirect(result)) => (StatusCode::SEE_OTHER, json!({ "status": 303, "result": result })),
        Err(ExecuteError::Store(e)) => return Err(e.into()),
        Err(refused) => {
            let status = super::error::status(refused.kind());
            tracing::debug!(code = refused.code(), status = status.as_u16(), "execute refused");
            let error = json!({ "code": refused.code(), "message": refused.message() });
            (status, json!({ "status": status.as_u16(), "error": error }))
        }
    };
    let mut response = (status, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&chain_id) {
        response.headers_mut().insert("x-chain-id", v);
    }
    Ok(response)
}
