//! `GET /v1/identity` (the server's identity entity and hash),
//! `GET /v1/me` (the caller as the server sees it: what its token grants)
//! and `POST /v1/admin/capabilities` (mints a server-rooted capability
//! token, admin only when authentication is on).

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use tidings_protocol::glob::Glob;
use tidings_protocol::tree::capability::hash_of;
use tidings_protocol::tree::is_hash;

/// The caller as the server sees it: its identity and what its token
/// grants (never the token itself). The console uses it to show admins
/// their actions and everyone else a read-only view; the grants are
/// enforced by every endpoint either way.
#[utoipa::path(
    get,
    path = "/v1/me",
    tag = "operations",
    responses(
        (status = 200, description = "`{sub, authenticated, admin, visibility, publish: [glob], subscribe: [glob]}`", body = Object),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn me(Caller(caller): Caller) -> Json<Value> {
    let globs = |g: &[Glob]| g.iter().map(|g| g.as_str().to_owned()).collect::<Vec<_>>();
    Json(json!({
        "sub": caller.sub,
        "authenticated": caller.authenticated,
        "admin": caller.admin,
        "visibility": caller.visibility,
        "publish": globs(&caller.publish),
        "subscribe": globs(&caller.subscribe),
    }))
}

/// The server's identity.
#[utoipa::path(
    get,
    path = "/v1/identity",
    tag = "tree",
    responses((status = 200, description = "`{hash, identity: {type: \"system/identity\", data: {algorithm, public_key}}, endpoint}`: `endpoint` is where peers reach this server (`TIDINGS_PUBLIC_URL`)", body = Object))
)]
pub(crate) async fn get(State(app): State<AppState>) -> Json<Value> {
    let server = app.core().identity();
    Json(json!({ "hash": server.hash(), "identity": server.entity(), "endpoint": app.settings().http.public_url }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MintRequest {
    grantee: String,
    grants: Vec<GrantRequest>,
    #[serde(default)]
    expires_at: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantRequest {
    handler: String,
    operations: Vec<String>,
    resources: Vec<String>,
}

/// Mints a caller capability rooted at this server.
#[utoipa::path(
    post,
    path = "/v1/admin/capabilities",
    tag = "tree",
    request_body(content = Object, content_type = "application/json", description = "`{grantee: <identity hash>, grants: [{handler, operations, resources}], expires_at?}`"),
    responses(
        (status = 200, description = "`{hash, included: {hash: entity}}`: the token, its signature and the server identity", body = Object),
        (status = 400, description = "`invalid_capability`, `malformed_body`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`admin_only` (the token has no `admin` claim)", body = crate::http::openapi::ErrorBody),
        (status = 408, description = "`body_timeout`: the body did not arrive within `TIDINGS_BODY_TIMEOUT` (the connection closes)", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "`body_too_large`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn mint(
    State(app): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    if !caller.admin {
        return Err(ApiError::forbidden("admin_only", "minting capabilities needs an admin token"));
    }
    let bytes = super::events::read_body(app.settings(), &headers, body).await?;
    let request: MintRequest =
        crate::json::from_object_slice(&bytes).map_err(|e| ApiError::bad_request("invalid_capability", e.to_string()))?;
    if !is_hash(&request.grantee) {
        return Err(ApiError::bad_request("invalid_capability", "grantee must be an identity hash (sha256:<64 lowercase hex>)"));
    }
    let expires_at = match &request.expires_at {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            crate::json::as_uint(v)
                .ok_or_else(|| ApiError::bad_request("invalid_capability", "expires_at must be a non-negative integer (ms)"))?,
        ),
    };
    if request.grants.is_empty() {
        return Err(ApiError::bad_request("invalid_capability", "grants must not be empty"));
    }
    for g in &request.grants {
        if g.handler.is_empty() || g.operations.is_empty() || g.resources.is_empty() {
            return Err(ApiError::bad_request("invalid_capability", "each grant needs a handler, operations and resources"));
        }
        for r in &g.resources {
            Glob::new_path(r).map_err(|e| ApiError::bad_request("invalid_capability", format!("resource {r:?}: {e}")))?;
        }
    }
    let server = app.core().identity();
    let grants: Vec<Value> =
        request.grants.iter().map(|g| json!({"handler": g.handler, "operations": g.operations, "resources": g.resources})).collect();
    let mut data = json!({ "granter": server.hash(), "grantee": request.grantee, "grants": grants });
    if let Some(t) = expires_at {
        data["expires_at"] = json!(t);
    }
    let token = json!({ "type": "system/capability/token", "data": data });
    let hash = hash_of(&token).map_err(|e| ApiError::bad_request("invalid_capability", e.to_string()))?;
    let signature = server.sign(&hash);
    let signature_hash = hash_of(&signature).expect("a signature is an entity");
    let mut included = serde_json::Map::new();
    included.insert(hash.clone(), token);
    included.insert(signature_hash, signature);
    included.insert(server.hash().to_owned(), server.entity().clone());
    Ok(Json(json!({ "hash": hash, "included": included })))
}
