//! Bearer tokens for the tests: HS256 under [`SECRET`], the secret the
//! authenticated test servers are given.

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

/// The HS256 secret of the authenticated test servers.
pub(crate) const SECRET: &str = "a-test-secret-of-enough-bytes-for-hs256";

/// A token with exactly `claims`, signed with `secret`.
pub(crate) fn token_with(claims: Value, secret: &str) -> String {
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap()).unwrap()
}

/// A valid token for `sub` with extra claims.
pub(crate) fn token(sub: &str, mut claims: Value) -> String {
    claims["sub"] = json!(sub);
    claims["exp"] = json!(chrono::Utc::now().timestamp() + 600);
    token_with(claims, SECRET)
}
