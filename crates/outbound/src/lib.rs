//! Calling other tidings servers, for the server (the courier, mirrors,
//! proving a peer's endpoint) and the terminal commands (`tidings
//! subscribe`, the peer benches) alike: where one may call out
//! ([`PeerAllow`], `TIDINGS_PEER_ALLOW`), the one HTTP client every call
//! goes through ([`Outbound`]: the allow list checked before a request is
//! built and for every address a name resolves to, no redirect followed,
//! no proxy), answers read within a bound ([`read_answer`]), and following
//! capacity redirects to relays ([`follow_redirects`],
//! docs/ref-federation.md, "Relays"). What the peers say to each other is
//! the protocol crate's (`tidings_protocol::peer`).

mod allow;

use std::future::Future;

pub use allow::{Outbound, PeerAllow};
use tidings_protocol::peer::{MAX_HOPS, PeerError, Relay, Subscribed};

/// A failed call as the peer error it comes to: no answer.
pub fn unreachable(e: reqwest::Error) -> PeerError {
    PeerError::Unreachable(e.to_string())
}

/// Most bytes read from one answer of a peer: a peer cannot make this
/// server buffer more.
pub const MAX_ANSWER: usize = 16 << 20;

/// Reads a peer's answer body, refusing one over [`MAX_ANSWER`].
pub async fn read_answer(mut response: reqwest::Response) -> Result<Vec<u8>, PeerError> {
    let too_large = || PeerError::Unreachable(format!("the peer's answer is over {MAX_ANSWER} bytes"));
    if response.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A peer's JSON answer (`null` when it is not JSON or too large).
pub async fn read_json(response: reqwest::Response) -> serde_json::Value {
    read_answer(response).await.ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(serde_json::Value::Null)
}

/// Whether `endpoint` answers `GET /v1/identity` as `peer`: how an
/// endpoint learned from a request (a `relay_endpoint`, a redirect's
/// alternative) is proven before it is used.
pub async fn proves(http: &reqwest::Client, peer: &str, endpoint: &str, within: std::time::Duration) -> bool {
    match http.get(format!("{endpoint}/v1/identity")).timeout(within).send().await {
        Ok(r) if r.status() == 200 => read_json(r).await["hash"] == peer,
        _ => false,
    }
}

/// Where a subscription ended up after [`follow_redirects`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The server holding it: the one asked first, or a relay.
    pub upstream: String,
    /// Its id there.
    pub id: String,
    /// Redirects followed to reach it.
    pub hops: u32,
    /// The alternatives of the last redirect followed (none: no redirect),
    /// where to go first when the relay dies (docs/ref-federation.md, "Repair").
    pub alternatives: Vec<Relay>,
}

impl Attached {
    /// Reached from a server `base` redirects below the source.
    pub fn below(mut self, base: u32) -> Self {
        self.hops += base;
        self
    }
}

/// A subscriber that follows redirects: how it subscribes at one server,
/// and how it proves (and remembers) a relay a redirect offered.
pub trait Subscriber {
    /// One subscribe request at the server `at` (an identity hash).
    fn subscribe_at(&self, at: &str) -> impl Future<Output = Subscribed> + Send;
    /// Whether `endpoint` answers `GET /v1/identity` as `peer`; if so the
    /// subscriber can reach `peer` there from now on.
    fn prove(&self, peer: &str, endpoint: &str) -> impl Future<Output = bool> + Send;
}

/// Subscribes at `from`, following capacity redirects
/// (docs/ref-federation.md, "Relays"): a random alternative each time, proven
/// before it is used, another one of the same list when it refuses or does
/// not prove, never a server already tried nor `own` (the subscriber itself)
/// nor one of `avoid` (a relay known dead), at most [`MAX_HOPS`] redirects. A
/// redirect loop thus ends with an error; the caller backs off before trying
/// again.
pub async fn follow_redirects(from: &str, own: &str, avoid: &[&str], subscriber: &(impl Subscriber + Sync)) -> Result<Attached, PeerError> {
    use rand::seq::SliceRandom as _;
    let (mut at, mut hops) = (from.to_owned(), 0u32);
    let mut tried: std::collections::HashSet<String> = avoid.iter().map(|a| (*a).to_owned()).collect();
    tried.extend([at.clone(), own.to_owned()]);
    let (mut pending, mut offered): (Vec<Relay>, Vec<Relay>) = Default::default();
    loop {
        match subscriber.subscribe_at(&at).await {
            Subscribed::Held(id) => return Ok(Attached { upstream: at, id, hops, alternatives: offered }),
            Subscribed::Redirected(mut alternatives) => {
                hops += 1;
                if hops > MAX_HOPS {
                    return Err(PeerError::Redirects(format!("redirected more than {MAX_HOPS} times (a redirect loop?)")));
                }
                alternatives.shuffle(&mut rand::rng());
                offered = alternatives.clone();
                pending = alternatives;
            }
            // A relay that refuses: another of the alternatives.
            Subscribed::Failed(why) if pending.is_empty() => return Err(why),
            Subscribed::Failed(_) => {}
        }
        loop {
            let Some((peer, endpoint)) = pending.pop() else {
                return Err(PeerError::Redirects("no alternative of the redirect accepted".into()));
            };
            if !tried.insert(peer.clone()) {
                continue;
            }
            if subscriber.prove(&peer, &endpoint).await {
                at = peer;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn a_peer_answer_over_the_limit_is_refused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        // One answer with a length over the limit, one streamed without a length.
        let app = axum::Router::new()
            .route("/sized", axum::routing::get(|| async { vec![b'x'; MAX_ANSWER + 1] }))
            .route(
                "/streamed",
                axum::routing::get(|| async {
                    let chunks = futures_util::stream::iter((0..17).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 1 << 20])));
                    axum::body::Body::from_stream(chunks)
                }),
            )
            .route("/small", axum::routing::get(|| async { "{\"ok\":true}" }));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let http = reqwest::Client::new();
        for path in ["sized", "streamed"] {
            let r = http.get(format!("{base}/{path}")).send().await.unwrap();
            assert!(read_answer(r).await.is_err(), "{path}");
        }
        let r = http.get(format!("{base}/small")).send().await.unwrap();
        assert_eq!(read_json(r).await, json!({"ok": true}));
    }
}
