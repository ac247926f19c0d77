//! What a request must be before any handler runs, so that a web page on
//! another origin cannot drive this server through its visitor's browser:
//!
//! - a body is accepted only as `application/json` (a cross-origin page can
//!   send `text/plain`, form and multipart bodies without a CORS preflight;
//!   it cannot send JSON without one, which this server only grants to
//!   `TIDINGS_CORS_ORIGINS`): `415 unsupported_media_type`;
//! - a request whose `Origin` is neither this server's own (the `Host` it
//!   was sent to, over `https` when it arrived over this server's TLS) nor
//!   listed in `TIDINGS_CORS_ORIGINS` is refused, whatever its method (a
//!   cross-site WebSocket or `EventSource` carries the visitor's cookie):
//!   `403 origin_refused`. A page served over plain `http` from the same
//!   name is another origin: whoever can alter plain traffic could script
//!   it. On a plain port both schemes pass (TLS may end at a proxy in
//!   front);
//! - with auth off, only `Host` names of loopback addresses are served
//!   (`localhost`, `*.localhost`, `127.0.0.0/8`, `[::1]`): a page whose
//!   own name was re-bound to `127.0.0.1` (DNS rebinding) is refused with
//!   `403 host_refused`.

use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};

use super::error::ApiError;
use crate::server::Connection;

/// The checks, settled once at start-up.
#[derive(Debug, Clone)]
pub(super) struct Guard {
    /// Origins allowed besides the server's own (`TIDINGS_CORS_ORIGINS`).
    origins: Vec<String>,
    /// `TIDINGS_CORS_ORIGINS=*`: every origin.
    any_origin: bool,
    /// Auth is off: loopback `Host` names only.
    loopback_only: bool,
}

impl Guard {
    pub(super) fn new(cors_origins: &str, auth_off: bool) -> Self {
        let origins: Vec<String> =
            cors_origins.split(',').map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase()).filter(|o| !o.is_empty()).collect();
        let any_origin = origins.iter().any(|o| o == "*");
        Self { origins, any_origin, loopback_only: auth_off }
    }

    /// The refusal of `request`, if it is refused.
    pub(super) fn check(&self, request: &Request) -> Option<ApiError> {
        let headers = request.headers();
        // The name the client addressed: `Host` on HTTP/1.1, the
        // `:authority` (in the URI) on HTTP/2.
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).or_else(|| request.uri().authority().map(|a| a.as_str()));
        if self.loopback_only && host.is_some_and(|h| !loopback_host(h)) {
            return Some(ApiError::new(
                StatusCode::FORBIDDEN,
                "host_refused",
                "with auth off this server answers only requests addressed to a loopback name (localhost, 127.0.0.1, [::1])",
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("").trim_end_matches('/').to_ascii_lowercase();
            let secure = request.extensions().get::<Connection>().is_some_and(Connection::secure);
            let own = host.is_some_and(|h| same_authority(&origin, h)) && (!secure || origin.starts_with("https://"));
            if !own && !self.any_origin && !self.origins.contains(&origin) {
                return Some(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "origin_refused",
                    "requests from this origin are refused: it is not this server's own and not in TIDINGS_CORS_ORIGINS",
                ));
            }
        }
        if has_body(request.method(), headers) && !json_content(headers) {
            return Some(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "a request body is accepted only as Content-Type: application/json",
            ));
        }
        None
    }
}

/// Whether `origin` names the authority `host` (a `Host` value), a
/// scheme's default port written or not on either side.
fn same_authority(origin: &str, host: &str) -> bool {
    let (Some((scheme, _)), Some(authority)) = (origin.split_once("://"), origin_authority(origin)) else { return false };
    let default = if scheme == "https" { ":443" } else { ":80" };
    let bare = |a: &str| a.strip_suffix(default).unwrap_or(a).to_ascii_lowercase();
    bare(authority) == bare(host)
}

/// The `host[:port]` of an origin (`scheme://host[:port]`).
fn origin_authority(origin: &str) -> Option<&str> {
    let (scheme, authority) = origin.split_once("://")?;
    (matches!(scheme, "http" | "https") && !authority.is_empty() && !authority.contains('/')).then_some(authority)
}

/// Whether a `Host` value names a loopback address.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => {
            return rest
                .split_once(']')
                .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok_and(|ip| ip.to_canonical().is_loopback()));
        }
        None => host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost") || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether the request carries a body: a method that takes one, with a
/// non-zero length or a transfer coding (HTTP/2 streams that carry data
/// have neither at times: they are judged by their method alone).
fn has_body(method: &Method, headers: &HeaderMap) -> bool {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return false;
    }
    match headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok()) {
        Some(length) => length > 0,
        None => headers.contains_key(header::TRANSFER_ENCODING) || headers.contains_key(header::CONTENT_TYPE),
    }
}

/// Whether the body is declared JSON (`application/json`, any parameters).
fn json_content(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = axum::http::Request::builder().method(method).uri("/v1/execute");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(axum::body::Body::empty()).unwrap()
    }

    fn code(guard: &Guard, method: &str, headers: &[(&str, &str)]) -> Option<&'static str> {
        guard.check(&request(method, headers)).map(|e| e.code())
    }

    #[test]
    fn a_simple_cross_origin_post_is_refused() {
        let guard = Guard::new("", true);
        let evil =
            [("host", "127.0.0.1:8080"), ("origin", "https://evil.example"), ("content-type", "text/plain"), ("content-length", "9")];
        assert_eq!(code(&guard, "POST", &evil), Some("origin_refused"));
        // The same body from no browser at all: JSON only.
        let plain = [("host", "127.0.0.1:8080"), ("content-type", "text/plain"), ("content-length", "9")];
        assert_eq!(code(&guard, "POST", &plain), Some("unsupported_media_type"));
        let form = [("host", "localhost:8080"), ("content-type", "application/x-www-form-urlencoded"), ("content-length", "9")];
        assert_eq!(code(&guard, "POST", &form), Some("unsupported_media_type"));
        let chunked = [("host", "localhost"), ("transfer-encoding", "chunked")];
        assert_eq!(code(&guard, "POST", &chunked), Some("unsupported_media_type"), "a body without a type");
        let json = [("host", "127.0.0.1:8080"), ("content-type", "Application/JSON; charset=utf-8"), ("content-length", "9")];
        assert_eq!(code(&guard, "POST", &json), None);
        assert_eq!(code(&guard, "POST", &[("host", "127.0.0.1:8080"), ("content-length", "0")]), None, "no body, no type needed");
        assert_eq!(code(&guard, "DELETE", &[("host", "127.0.0.1:8080")]), None);
    }

    #[test]
    fn the_servers_own_origin_and_listed_ones_pass() {
        let guard = Guard::new("https://app.example, http://other.example:3000/", false);
        let with = |origin: &'static str, host: &'static str| code(&guard, "GET", &[("host", host), ("origin", origin)]);
        assert_eq!(with("http://tidings.example:8080", "tidings.example:8080"), None, "same origin");
        assert_eq!(with("https://TIDINGS.example", "tidings.example"), None, "case does not matter");
        assert_eq!(with("https://tidings.example", "tidings.example:443"), None, "a default port, written or not");
        assert_eq!(with("http://tidings.example:80", "tidings.example"), None);
        assert_eq!(with("https://app.example", "tidings.example"), None);
        assert_eq!(with("http://other.example:3000", "tidings.example"), None);
        for refused in ["https://evil.example", "null", "http://tidings.example:9999", "https://app.example.evil", "file://"] {
            assert_eq!(with(refused, "tidings.example:8080"), Some("origin_refused"), "{refused}");
        }
        let any = Guard::new("*", false);
        assert_eq!(code(&any, "GET", &[("host", "t.example"), ("origin", "https://evil.example")]), None);
    }

    #[test]
    fn with_auth_off_only_loopback_names_are_served() {
        let guard = Guard::new("", true);
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "127.9.9.9",
            "[::1]:8080",
            "[::1]",
            "app.localhost:80",
            "LOCALHOST.",
            "[::ffff:127.0.0.1]:8080",
        ] {
            assert_eq!(code(&guard, "GET", &[("host", host)]), None, "{host}");
        }
        for host in
            ["evil.example", "evil.example:8080", "10.0.0.1", "[fe80::1]", "127.0.0.1.evil.example", "localhost.evil.example", "0.0.0.0"]
        {
            assert_eq!(code(&guard, "GET", &[("host", host)]), Some("host_refused"), "{host}");
        }
        // With auth on, any name is served (tokens guard it).
        assert_eq!(code(&Guard::new("", false), "GET", &[("host", "evil.example")]), None);
    }
}
