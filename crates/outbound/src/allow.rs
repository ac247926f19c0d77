//! Where this server may call out (`TIDINGS_PEER_ALLOW`), and the one HTTP
//! client every outbound call to a peer goes through ([`Outbound`]).
//!
//! Endpoints reach this server from requests (a subscriber's
//! `relay_endpoint`, a redirect's alternatives) and from the tree
//! (`system/peer/*`), so an address is never trusted because it was
//! written down: the URL's host is checked before the request is built (an
//! address literal) and again for every address a name resolves to (a name
//! that resolves into a refused range, the DNS-rebinding shape, gets no
//! connection). The default allows loopback only; link-local and cloud
//! metadata addresses (`169.254.169.254`, ...) and the unspecified address
//! are never contacted unless a listed range lies inside them.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use tidings_protocol::peer::PeerError;

/// Ranges no `*` or wide range opens: link-local (where the cloud metadata
/// services answer), the metadata services at other addresses, and the
/// unspecified address (which Linux connects to loopback). Only a listed
/// range inside one of these allows an address in it.
const NEVER: &[&str] = &[
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "100.100.100.200/32",
    "192.0.0.192/32",
    "168.63.129.16/32",
    "0.0.0.0/32",
    "::/128",
];

/// `TIDINGS_PEER_ALLOW`: a comma list of address ranges (`10.0.0.0/8`,
/// `::1/128`, a bare address), host names (`peer.example.com`, or
/// `*.example.com` for its subdomains), `loopback` (the default:
/// `127.0.0.0/8`, `::1` and `localhost`) and `*` (any host, the never
/// ranges excepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAllow {
    any: bool,
    nets: Vec<IpNet>,
    /// Exact names, lower case.
    names: Vec<String>,
    /// Suffixes from `*.example.com`, stored as `.example.com`.
    suffixes: Vec<String>,
}

impl Default for PeerAllow {
    fn default() -> Self {
        Self::parse("loopback").expect("the default parses")
    }
}

impl std::str::FromStr for PeerAllow {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

impl PeerAllow {
    /// Parses the setting's syntax (see the type).
    pub fn parse(setting: &str) -> Result<Self, String> {
        let mut allow = Self { any: false, nets: Vec::new(), names: Vec::new(), suffixes: Vec::new() };
        for item in setting.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if item == "*" {
                allow.any = true;
            } else if item.eq_ignore_ascii_case("loopback") {
                allow.nets.extend(["127.0.0.0/8", "::1/128"].map(|n| n.parse::<IpNet>().expect("a valid range")));
                allow.names.push("localhost".to_owned());
            } else if let Ok(net) = item.parse::<IpNet>() {
                allow.nets.push(net.trunc());
            } else if let Ok(ip) = item.parse::<IpAddr>() {
                allow.nets.push(IpNet::from(ip));
            } else if let Some(domain) = item.strip_prefix("*.").filter(|d| is_name(d)) {
                allow.suffixes.push(format!(".{}", domain.to_ascii_lowercase()));
            } else if is_name(item) {
                allow.names.push(item.to_ascii_lowercase());
            } else {
                return Err(format!("TIDINGS_PEER_ALLOW: {item:?} is not an address range, a host name, `loopback` or `*`"));
            }
        }
        Ok(allow)
    }

    /// Whether `name` is allowed by name (listed, under a listed suffix, or `*`).
    fn names(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.any || self.names.contains(&name) || self.suffixes.iter().any(|s| name.ends_with(s.as_str()))
    }

    /// Whether `ip` may be contacted, reached under a host name that is
    /// (`by_name`) or is not allowed by name.
    pub fn allows_ip(&self, ip: IpAddr, by_name: bool) -> bool {
        let ip = unwrapped(ip);
        let never: Vec<IpNet> = NEVER.iter().map(|n| n.parse().expect("a valid range")).collect();
        if let Some(range) = never.iter().find(|n| n.contains(&ip)) {
            // Only a listed range inside the never range opens it.
            return self.nets.iter().any(|n| n.contains(&ip) && range.contains(n));
        }
        by_name || self.any || self.nets.iter().any(|n| n.contains(&ip))
    }

    /// Whether a URL may be requested: its host is an allowed address, or
    /// a name (whose addresses [`Outbound`]'s resolver checks each time).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), PeerError> {
        let allowed = match url.host() {
            Some(url::Host::Ipv4(ip)) => self.allows_ip(IpAddr::V4(ip), false),
            Some(url::Host::Ipv6(ip)) => self.allows_ip(IpAddr::V6(ip), false),
            Some(url::Host::Domain(_)) => true,
            None => false,
        };
        if allowed { Ok(()) } else { Err(PeerError::NotAllowed(refused(url.host_str().unwrap_or("")))) }
    }
}

/// The address a connection to `ip` really reaches: an IPv4-mapped IPv6
/// address is its IPv4 address, and so is a NAT64 one (`64:ff9b::/96`,
/// which a NAT64 gateway forwards to the IPv4 address in its low bits).
fn unwrapped(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] => {
            IpAddr::V4(std::net::Ipv4Addr::from((u32::from(v6.segments()[6]) << 16) | u32::from(v6.segments()[7])))
        }
        other => other,
    }
}

fn refused(host: &str) -> String {
    format!("{host} is not allowed by TIDINGS_PEER_ALLOW: this server does not call it")
}

/// A host name as DNS spells one: labels of letters, digits and hyphens.
fn is_name(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && s.parse::<IpAddr>().is_err()
}

/// Resolves names and keeps only the addresses [`PeerAllow`] allows for
/// them; none left is a refusal (no connection is attempted).
#[derive(Debug)]
struct Resolver {
    allow: Arc<PeerAllow>,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let by_name = allow.names(&host);
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let kept: Vec<SocketAddr> = found.filter(|a| allow.allows_ip(a.ip(), by_name)).collect();
            if kept.is_empty() {
                return Err(refused(&host).into());
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The HTTP client for calls to peers: no redirect is followed, every URL
/// is checked against [`PeerAllow`] before a request is built, and every
/// name's addresses when it is resolved.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// `None` when the client could not be built: then nothing is called.
    http: Option<reqwest::Client>,
    allow: Arc<PeerAllow>,
}

impl Outbound {
    /// A client under `allow`, each request bounded by `timeout`.
    pub fn new(allow: Arc<PeerAllow>, timeout: Duration) -> Self {
        // No proxy from the environment: a proxy would resolve names
        // itself, past the resolver's check.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(Resolver { allow: allow.clone() }))
            .build();
        if let Err(e) = &http {
            tracing::error!(error = %e, "the client for calls to peers could not be built: no peer will be called");
        }
        Self { http: http.ok(), allow }
    }

    fn client(&self) -> Result<&reqwest::Client, PeerError> {
        self.http.as_ref().ok_or(PeerError::NoClient)
    }

    fn checked(&self, url: &str) -> Result<reqwest::Url, PeerError> {
        let url = reqwest::Url::parse(url).map_err(|e| PeerError::BadUrl(format!("{url:?} is not a URL: {e}")))?;
        self.allow.check_url(&url)?;
        Ok(url)
    }

    /// A `GET` of `url`, if it may be called.
    pub fn get(&self, url: &str) -> Result<reqwest::RequestBuilder, PeerError> {
        Ok(self.client()?.get(self.checked(url)?))
    }

    /// A `POST` to `url`, if it may be called.
    pub fn post(&self, url: &str) -> Result<reqwest::RequestBuilder, PeerError> {
        Ok(self.client()?.post(self.checked(url)?))
    }

    /// Whether `endpoint` answers `GET /v1/identity` as `peer`
    /// ([`crate::proves`]), if it may be called.
    pub async fn proves(&self, peer: &str, endpoint: &str, within: Duration) -> bool {
        self.prove(peer, endpoint, within).await.is_ok()
    }

    /// [`Outbound::proves`], saying why not: the host is not allowed
    /// (nothing was called), or the endpoint did not prove the identity.
    /// How a call failed (refused, timed out, another answer) is logged,
    /// never told: the caller must not learn which ports answer here.
    pub async fn prove(&self, peer: &str, endpoint: &str, within: Duration) -> Result<(), PeerError> {
        let request = self.get(&format!("{endpoint}/v1/identity"))?;
        let response = match request.timeout(within).send().await {
            Ok(response) => response,
            Err(e) => {
                // The resolver's refusal is deep in the error's sources.
                let mut why = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    if s.to_string().contains("TIDINGS_PEER_ALLOW") {
                        return Err(PeerError::NotAllowed(s.to_string()));
                    }
                    why = format!("{why}: {s}");
                    source = s.source();
                }
                tracing::debug!(endpoint, error = why, "a peer's endpoint did not answer");
                return Err(PeerError::Unproven);
            }
        };
        match response.status().as_u16() {
            200 if crate::read_json(response).await["hash"] == peer => Ok(()),
            _ => Err(PeerError::Unproven),
        }
    }

    /// Whether `url` may be called at all (its host, before any name is
    /// resolved): for refusing a request that carries an endpoint before
    /// anything else is done with it.
    pub fn may_call(&self, url: &str) -> Result<(), PeerError> {
        self.checked(url).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_allows_loopback_only() {
        let allow = PeerAllow::default();
        assert!(allow.allows_ip(ip("127.0.0.1"), false));
        assert!(allow.allows_ip(ip("127.8.9.10"), false));
        assert!(allow.allows_ip(ip("::1"), false));
        assert!(allow.allows_ip(ip("::ffff:127.0.0.1"), false), "a v4-mapped loopback is loopback");
        for other in ["10.0.0.1", "192.168.1.1", "8.8.8.8", "169.254.169.254", "0.0.0.0", "::", "fe80::1"] {
            assert!(!allow.allows_ip(ip(other), false), "{other}");
        }
        assert!(allow.names("localhost") && allow.names("LOCALHOST.") && !allow.names("evil.example"));
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(allow.check_url(&url("http://127.0.0.1:8080/x")).is_ok());
        assert!(allow.check_url(&url("http://[::1]:8080")).is_ok());
        // The URL parser reads the odd spellings of an address as the address.
        for refused in [
            "http://169.254.169.254/",
            "http://2852039166/",
            "http://0xa9.0xfe.0xa9.0xfe/",
            "http://[::ffff:169.254.169.254]/",
            "http://10.1.2.3/",
        ] {
            assert!(allow.check_url(&url(refused)).is_err(), "{refused}");
        }
    }

    #[test]
    fn star_and_wide_ranges_never_open_metadata_addresses() {
        for setting in ["*", "0.0.0.0/0,::/0", "169.0.0.0/8"] {
            let allow = PeerAllow::parse(setting).unwrap();
            assert!(allow.allows_ip(ip("10.1.2.3"), false) || setting == "169.0.0.0/8", "{setting}");
            for never in [
                "169.254.169.254",
                "fe80::1",
                "fd00:ec2::254",
                "100.100.100.200",
                "0.0.0.0",
                "::ffff:169.254.169.254",
                "64:ff9b::a9fe:a9fe",
                "168.63.129.16",
            ] {
                assert!(!allow.allows_ip(ip(never), true), "{setting} {never}");
            }
        }
        let explicit = PeerAllow::parse("169.254.169.254").unwrap();
        assert!(explicit.allows_ip(ip("169.254.169.254"), false), "listed on its own, it is allowed");
        assert!(!explicit.allows_ip(ip("169.254.169.253"), false));
    }

    #[test]
    fn names_and_ranges() {
        let allow = PeerAllow::parse("10.0.0.0/8, peer.example.com, *.mesh.internal").unwrap();
        assert!(allow.allows_ip(ip("10.9.9.9"), false));
        assert!(!allow.allows_ip(ip("11.0.0.1"), false));
        assert!(allow.names("peer.example.com") && allow.names("a.b.mesh.internal"));
        assert!(!allow.names("mesh.internal") && !allow.names("example.com") && !allow.names("evilpeer.example.com"));
        // A listed name may resolve anywhere but into the never ranges.
        assert!(allow.allows_ip(ip("203.0.113.9"), true));
        assert!(!allow.allows_ip(ip("169.254.169.254"), true));
        for bad in ["http://x", "a b", "*", "10.0.0.0/33", "*.", "-bad.example"] {
            if bad == "*" {
                continue;
            }
            assert!(PeerAllow::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_into_a_refused_range_gets_no_connection() {
        // `localhost` resolves to loopback: refused when only 10/8 is allowed,
        // and the refusal comes before any connection.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let outbound = Outbound::new(Arc::new(PeerAllow::parse("10.0.0.0/8").unwrap()), Duration::from_secs(2));
        let sent = outbound.get(&format!("http://localhost:{port}/v1/identity")).unwrap().send().await;
        assert!(sent.is_err());
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "no connection was made");
        assert!(outbound.get(&format!("http://127.0.0.1:{port}/")).is_err(), "an address literal is refused before a request");
    }
}
