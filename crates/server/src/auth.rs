//! Who is calling, and what they may do: bearer JWTs verified with one
//! configured key and algorithm, the claims that grant publishing,
//! subscribing and visibility, and the local-development mode without
//! tokens.
//!
//! Verification uses `jsonwebtoken` with exactly one algorithm (HS256 for a
//! shared secret; EdDSA or RS256 for a PEM public key): `alg: none` and
//! algorithm switches are refused by construction, and `exp` is required.
//!
//! A token may travel in `Authorization: Bearer`, an `access_token` cookie,
//! or an `access_token` query parameter, because `EventSource` cannot set
//! headers. It is never written to a log, a metric label or an error message.

use std::path::Path;
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::filter::Filter;
use tidings_protocol::event::Visibility;
use tidings_protocol::glob::Glob;

/// A verified caller.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The identity (`sub`); for publishers, their agent id.
    pub sub: String,
    /// Type globs the caller may publish.
    pub publish: Vec<Glob>,
    /// Type globs the caller may receive.
    pub subscribe: Vec<Glob>,
    /// The highest visibility the caller may see.
    pub visibility: Visibility,
    /// Admins may publish as any agent and manage every consumer.
    pub admin: bool,
    /// Whether this identity came from a token (false with auth off).
    pub authenticated: bool,
    /// The first second (Unix) at which the token is refused (its `exp`
    /// plus the leeway, plus one: a token is valid through `exp + leeway`):
    /// what it opened ends then. `None` with auth off.
    pub expires_at: Option<i64>,
}

impl Identity {
    /// The caller when authentication is off (local development): may do
    /// everything.
    pub fn local() -> Self {
        let all = vec![Glob::new("**").expect("a valid glob")];
        Self {
            sub: "local".into(),
            publish: all.clone(),
            subscribe: all,
            visibility: Visibility::Admin,
            admin: true,
            authenticated: false,
            expires_at: None,
        }
    }

    /// Whether the caller may publish `event_type`.
    pub fn may_publish(&self, event_type: &str) -> bool {
        self.publish.iter().any(|g| g.matches(event_type))
    }

    /// Whether the caller may receive `event_type`.
    pub fn may_subscribe(&self, event_type: &str) -> bool {
        self.subscribe.iter().any(|g| g.matches(event_type))
    }

    /// `filter` intersected with what this caller may receive: its
    /// `subscribe` grants (unless it is an admin or holds `**`), its
    /// visibility, and (unless it is an admin) only the tree-subscription
    /// notifications of its own subscriptions.
    pub fn restrict(&self, filter: Filter) -> Filter {
        let everything = self.admin || self.subscribe.iter().any(|g| g.as_str() == "**");
        filter.restrict((!everything).then(|| self.subscribe.clone()), self.visibility, (!self.admin).then(|| self.sub.clone()))
    }
}

/// The claims tidings reads.
#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    subscribe: Vec<String>,
    #[serde(default)]
    visibility: Visibility,
    #[serde(default)]
    admin: bool,
    /// Required (checked by the validation), read for the identity's life.
    #[serde(default)]
    exp: Option<i64>,
    #[serde(default)]
    iat: Option<i64>,
}

/// Why a request is not authenticated (`401`). The message never contains
/// the token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No token anywhere; `cookie` says whether an `access_token` cookie
    /// would have been taken on this request.
    #[error(
        "a bearer token is required: an Authorization: Bearer header or an access_token query parameter{}",
        if *cookie { ", or an access_token cookie" } else { " (an access_token cookie authenticates only GET /v1/stream and GET /v1/ws)" }
    )]
    Missing {
        /// Whether the request may carry its token in a cookie.
        cookie: bool,
    },
    /// The token does not verify.
    #[error("the token is not valid: {0}")]
    Invalid(String),
}

/// Why a verification key is unusable (a startup error).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The HS256 secret is shorter than the hash it keys.
    #[error(
        "TIDINGS_JWT_HS256_SECRET must be at least {MIN_SECRET} bytes (HS256 is keyed with 256 bits); `openssl rand -base64 32` makes one"
    )]
    ShortSecret,
    /// A token to mint names a grant the server would refuse.
    #[error("{0}")]
    Claim(String),
    /// The HS256 secret was refused.
    #[error("unusable HS256 secret: {0}")]
    Secret(jsonwebtoken::errors::Error),
    /// The PEM is neither an Ed25519 nor an RSA public key.
    #[error("not an Ed25519 or RSA public key in PEM form: {0}")]
    NotAPublicKey(jsonwebtoken::errors::Error),
    /// The key file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// How requests are authenticated.
#[derive(Clone)]
pub enum AuthMode {
    /// Every caller is [`Identity::local`].
    Off,
    /// Bearer JWTs.
    Jwt(Arc<Verifier>),
}

impl std::fmt::Debug for AuthMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => f.write_str("AuthMode::Off"),
            Self::Jwt(v) => write!(f, "AuthMode::Jwt({v:?})"),
        }
    }
}

/// A configured verifier: one key, one algorithm.
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for Verifier {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("algorithms", &self.validation.algorithms).finish_non_exhaustive()
    }
}

impl Verifier {
    /// HS256 with a shared secret.
    pub fn hs256(secret: &[u8]) -> Result<Self, KeyError> {
        if secret.len() < MIN_SECRET {
            return Err(KeyError::ShortSecret);
        }
        let key = DecodingKey::from_secret(secret).map_err(KeyError::Secret)?;
        Ok(Self { key, validation: Validation::new(Algorithm::HS256) })
    }

    /// A PEM public key: Ed25519 (EdDSA) or RSA (RS256), detected from the key.
    pub fn public_key_pem(pem: &[u8]) -> Result<Self, KeyError> {
        if let Ok(key) = DecodingKey::from_ed_pem(pem) {
            return Ok(Self { key, validation: Validation::new(Algorithm::EdDSA) });
        }
        DecodingKey::from_rsa_pem(pem)
            .map(|key| Self { key, validation: Validation::new(Algorithm::RS256) })
            .map_err(KeyError::NotAPublicKey)
    }

    /// Loads a PEM public key file.
    pub fn public_key_file(path: &Path) -> Result<Self, KeyError> {
        let pem = std::fs::read(path).map_err(|source| KeyError::Read { path: path.display().to_string(), source })?;
        Self::public_key_pem(&pem)
    }

    /// Requires `aud` and/or `iss` to match.
    pub fn expect(mut self, audience: Option<&str>, issuer: Option<&str>) -> Self {
        let mut required = vec!["exp", "sub"];
        if let Some(aud) = audience {
            self.validation.set_audience(&[aud]);
            required.push("aud");
        }
        if let Some(iss) = issuer {
            self.validation.set_issuer(&[iss]);
            required.push("iss");
        }
        self.validation.set_required_spec_claims(&required);
        self
    }

    /// Verifies a token and returns the caller.
    pub fn verify(&self, token: &str) -> Result<Identity, AuthError> {
        let mut validation = self.validation.clone();
        if validation.required_spec_claims.is_empty() || !validation.required_spec_claims.contains("exp") {
            validation.set_required_spec_claims(&["exp", "sub"]);
        }
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.leeway = LEEWAY;
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &validation).map_err(|e| AuthError::Invalid(describe(&e)))?;
        let claims = data.claims;
        if claims.iat.is_some_and(|iat| iat > chrono::Utc::now().timestamp() + LEEWAY as i64) {
            return Err(AuthError::Invalid("it was issued in the future (iat)".into()));
        }
        let globs = |field: &str, list: &[String]| -> Result<Vec<Glob>, AuthError> {
            list.iter().map(|g| Glob::new(g).map_err(|e| AuthError::Invalid(format!("claim {field}: {e}")))).collect()
        };
        if claims.sub.is_empty() {
            return Err(AuthError::Invalid("claim sub is empty".into()));
        }
        Ok(Identity {
            publish: globs("publish", &claims.publish)?,
            subscribe: globs("subscribe", &claims.subscribe)?,
            sub: claims.sub,
            visibility: claims.visibility,
            admin: claims.admin,
            authenticated: true,
            expires_at: claims.exp.map(|exp| exp.saturating_add(LEEWAY as i64 + 1)),
        })
    }
}

/// The fewest bytes an HS256 secret may have: the 256 bits of the hash it
/// keys.
pub const MIN_SECRET: usize = 32;

/// A token to mint with the server's own HS256 secret (`tidings token`).
#[derive(Debug, Clone, Default)]
pub struct NewToken {
    /// The identity (`sub`); for publishers, their agent id.
    pub sub: String,
    /// Event-type globs the holder may publish.
    pub publish: Vec<String>,
    /// Event-type globs the holder may receive.
    pub subscribe: Vec<String>,
    /// The highest visibility the holder may see.
    pub visibility: Visibility,
    /// Admin rights.
    pub admin: bool,
    /// How long the token lives.
    pub ttl: std::time::Duration,
    /// `aud`, when the server checks one (`TIDINGS_JWT_AUDIENCE`).
    pub audience: Option<String>,
    /// `iss`, when the server checks one (`TIDINGS_JWT_ISSUER`).
    pub issuer: Option<String>,
}

/// Mints `token` with `secret`, as [`Verifier::hs256`] with the same secret
/// (and audience and issuer) accepts it. Refuses a secret the server would
/// refuse, an empty `sub`, and a glob it could not read.
pub fn mint_hs256(secret: &[u8], token: &NewToken) -> Result<String, KeyError> {
    if secret.len() < MIN_SECRET {
        return Err(KeyError::ShortSecret);
    }
    if token.sub.is_empty() {
        return Err(KeyError::Claim("the subject (sub) must not be empty".into()));
    }
    for (field, list) in [("publish", &token.publish), ("subscribe", &token.subscribe)] {
        for glob in list {
            Glob::new(glob).map_err(|e| KeyError::Claim(format!("{field} {glob:?}: {e}")))?;
        }
    }
    let now = chrono::Utc::now().timestamp();
    let ttl = i64::try_from(token.ttl.as_secs()).map_err(|_| KeyError::Claim("the lifetime is too long".into()))?;
    let mut claims = serde_json::json!({
        "sub": token.sub,
        "iat": now,
        "exp": now.saturating_add(ttl),
        "visibility": token.visibility,
    });
    if !token.publish.is_empty() {
        claims["publish"] = serde_json::json!(token.publish);
    }
    if !token.subscribe.is_empty() {
        claims["subscribe"] = serde_json::json!(token.subscribe);
    }
    if token.admin {
        claims["admin"] = true.into();
    }
    if let Some(aud) = &token.audience {
        claims["aud"] = aud.as_str().into();
    }
    if let Some(iss) = &token.issuer {
        claims["iss"] = iss.as_str().into();
    }
    let key = jsonwebtoken::EncodingKey::from_secret(secret).map_err(KeyError::Secret)?;
    jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), &claims, &key).map_err(KeyError::Secret)
}

/// Seconds of clock skew allowed around `exp`, `nbf` and `iat`.
pub const LEEWAY: u64 = 5;

/// A short reason that names the failure, never the token.
fn describe(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => "it has expired".into(),
        K::InvalidSignature => "its signature does not verify".into(),
        K::InvalidAlgorithm | K::InvalidAlgorithmName => "it is not signed with the configured algorithm".into(),
        K::MissingRequiredClaim(c) => format!("claim {c} is required"),
        K::InvalidAudience => "its audience is not accepted".into(),
        K::InvalidIssuer => "its issuer is not accepted".into(),
        K::ImmatureSignature => "it is not valid yet".into(),
        K::Json(_) => "its claims are malformed".into(),
        _ => "it is malformed".into(),
    }
}

/// Finds the token in a request: `Authorization: Bearer`, else the
/// `access_token` cookie, else the `access_token` query parameter.
pub fn find_token<'a>(
    authorization: Option<&'a str>,
    cookie: Option<&'a str>,
    query: Option<&'a str>,
) -> Option<std::borrow::Cow<'a, str>> {
    if let Some(value) = authorization {
        let (scheme, token) = value.trim().split_once(' ').unwrap_or((value, ""));
        if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() {
            return Some(token.trim().into());
        }
    }
    if let Some(cookies) = cookie {
        for pair in cookies.split(';') {
            if let Some(("access_token", v)) = pair.trim().split_once('=')
                && !v.is_empty()
            {
                return Some(v.into());
            }
        }
    }
    // The name as written, never percent-encoded (`access%5Ftoken`): what
    // proxies' log redaction looks for is what authenticates.
    let query = query?;
    query
        .split(['&', ';'])
        .find_map(|pair| pair.strip_prefix("access_token="))
        .map(|v| form_urlencoded::parse(format!("v={v}").as_bytes()).next().map(|(_, v)| v.into_owned()).unwrap_or_default().into())
}

/// Replaces the value of `access_token` in a query string, for logs. The
/// name is compared decoded, as [`find_token`] reads it, so every spelling
/// that authenticates (`access%5Ftoken`, `%61ccess_token`, ...) is redacted;
/// parameters are split on `;` as well as `&` (some clients and proxies
/// read `;` as a separator, so a token after one is redacted too).
pub fn redact_query(query: &str) -> String {
    let redact = |pair: &str| match pair.split_once('=') {
        Some((name, _)) if form_urlencoded::parse(name.as_bytes()).next().is_some_and(|(k, _)| k.trim() == "access_token") => {
            format!("{name}=REDACTED")
        }
        _ => pair.to_owned(),
    };
    query.split('&').map(|pair| pair.split(';').map(redact).collect::<Vec<_>>().join(";")).collect::<Vec<_>>().join("&")
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};
    use serde_json::json;

    fn token(claims: serde_json::Value, secret: &[u8]) -> String {
        encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret).unwrap()).unwrap()
    }

    fn exp() -> i64 {
        chrono::Utc::now().timestamp() + 600
    }

    #[test]
    fn a_secret_shorter_than_the_hash_is_refused_and_a_minted_token_verifies() {
        assert!(matches!(Verifier::hs256(&[b'x'; 31]), Err(KeyError::ShortSecret)));
        let secret = [b'k'; 32];
        let v = Verifier::hs256(&secret).unwrap().expect(Some("aud-1"), Some("iss-1"));
        let new = NewToken {
            sub: "persona:mendel".into(),
            publish: vec!["hypothesis.*".into()],
            visibility: Visibility::ReviewerOnly,
            ttl: std::time::Duration::from_secs(600),
            audience: Some("aud-1".into()),
            issuer: Some("iss-1".into()),
            ..NewToken::default()
        };
        let id = v.verify(&mint_hs256(&secret, &new).unwrap()).unwrap();
        assert_eq!((id.sub.as_str(), id.visibility, id.admin), ("persona:mendel", Visibility::ReviewerOnly, false));
        assert!(id.may_publish("hypothesis.created") && !id.may_subscribe("hypothesis.created"));
        let other_audience = NewToken { audience: Some("aud-2".into()), ..new.clone() };
        assert!(v.verify(&mint_hs256(&secret, &other_audience).unwrap()).is_err());
        assert!(matches!(mint_hs256(&[b'k'; 31], &new), Err(KeyError::ShortSecret)));
        assert!(matches!(mint_hs256(&secret, &NewToken { sub: String::new(), ..new.clone() }), Err(KeyError::Claim(_))));
        assert!(matches!(mint_hs256(&secret, &NewToken { publish: vec!["a..b".into()], ..new }), Err(KeyError::Claim(_))));
    }

    #[test]
    fn verifies_claims_and_refuses_the_rest() {
        let v = Verifier::hs256(b"a-secret-of-thirty-two-bytes-abcd").unwrap();
        let id = v
            .verify(&token(
                json!({"sub":"persona:mendel","exp":exp(),"publish":["hypothesis.*"],"visibility":"reviewer_only"}),
                b"a-secret-of-thirty-two-bytes-abcd",
            ))
            .unwrap();
        assert_eq!(id.sub, "persona:mendel");
        assert!(id.may_publish("hypothesis.created") && !id.may_publish("comment.posted"));
        assert!(!id.may_subscribe("hypothesis.created"), "no subscribe claim, no subscription");
        assert_eq!(id.visibility, Visibility::ReviewerOnly);
        assert!(matches!(v.verify(&token(json!({"sub":"a","exp":exp()}), b"other")), Err(AuthError::Invalid(_))));
        assert!(
            matches!(v.verify(&token(json!({"sub":"a"}), b"a-secret-of-thirty-two-bytes-abcd")), Err(AuthError::Invalid(m)) if m.contains("exp"))
        );
        let expired = token(json!({"sub":"a","exp":chrono::Utc::now().timestamp() - 600}), b"a-secret-of-thirty-two-bytes-abcd");
        assert_eq!(v.verify(&expired).unwrap_err(), AuthError::Invalid("it has expired".into()));
        // alg: none
        let none = format!("{}.{}.", b64(r#"{"alg":"none","typ":"JWT"}"#), b64(&json!({"sub":"a","exp":exp()}).to_string()));
        assert!(v.verify(&none).is_err());
        assert!(v.verify(&token(json!({"sub":"a","exp":exp(),"publish":["a..b"]}), b"a-secret-of-thirty-two-bytes-abcd")).is_err());
        // Not yet valid, or issued in the future: refused (beyond the leeway).
        let later = chrono::Utc::now().timestamp() + 60;
        let early = token(json!({"sub":"a","exp":exp(),"nbf":later}), b"a-secret-of-thirty-two-bytes-abcd");
        assert_eq!(v.verify(&early).unwrap_err(), AuthError::Invalid("it is not valid yet".into()));
        let issued_later = token(json!({"sub":"a","exp":exp(),"iat":later}), b"a-secret-of-thirty-two-bytes-abcd");
        assert!(matches!(v.verify(&issued_later), Err(AuthError::Invalid(m)) if m.contains("iat")));
        let (now, until) = (chrono::Utc::now().timestamp(), exp());
        let fine =
            v.verify(&token(json!({"sub":"a","exp":until,"nbf":now - 1,"iat":now + 2}), b"a-secret-of-thirty-two-bytes-abcd")).unwrap();
        assert_eq!(fine.expires_at, Some(until + LEEWAY as i64 + 1), "the token's life, with the leeway, bounds what it opens");
    }

    fn b64(s: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    }

    #[test]
    fn tokens_travel_three_ways_and_are_redacted() {
        assert_eq!(find_token(Some("Bearer abc"), None, None).as_deref(), Some("abc"));
        assert_eq!(find_token(None, Some("x=1; access_token=def"), None).as_deref(), Some("def"));
        assert_eq!(find_token(None, None, Some("types=a.b&access_token=g%2Bh")).as_deref(), Some("g+h"));
        assert!(find_token(Some("Basic zzz"), None, None).is_none());
        assert_eq!(redact_query("types=a.b&access_token=secret"), "types=a.b&access_token=REDACTED");
        // After a `;` (read as a separator by some), and with odd spellings.
        assert_eq!(redact_query("x=1;access_token=secret&y=2"), "x=1;access_token=REDACTED&y=2");
        assert_eq!(redact_query("x=1; access_token=secret"), "x=1; access_token=REDACTED");
        assert_eq!(redact_query("access%5Ftoken=secret"), "access%5Ftoken=REDACTED");
    }
}
