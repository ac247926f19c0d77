//! Signed changes: what lets a mirror trust bytes that reached it through
//! a relay it cannot trust.
//!
//! Every notification that bundles its entity (`include_payload`) carries
//! the change signed by the server that notifies it: a
//! `system/tree/change` entity `{origin, uri, hash?, previous_hash?,
//! sequence}` (`sequence` is the change's id in the origin's log, which
//! only rises), a `system/signature` by `origin` on that entity's hash, and
//! `origin`'s identity, all in `included`, named by `data.signed`. A mirror
//! that applies the change keeps those signed changes with its own change
//! event, and its engine forwards them unchanged next to its own signature,
//! so a mirror further down finds the signature of the server it mirrors
//! whichever relays the change crossed.
//!
//! A mirror applies a bundled entity only when the change is signed by the
//! peer it mirrors, the signed uri, hash and previous hash are the
//! notification's, the entity hashes to the signed hash, and the sequence
//! is newer than the one it last took from that peer for the path. A relay
//! can therefore delay or withhold a change, never forge one or roll a
//! path back.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use tidings_protocol::event::EventId;
use tidings_protocol::identity::ServerIdentity;
use tidings_protocol::tree::capability::{self, Included, hash_of};

/// The entity type of a signed change.
pub const TYPE: &str = "system/tree/change";
/// Most signed changes one notification carries (the notifier's own and
/// those it forwards).
pub(super) const MAX_CARRIED: usize = 4;

/// A transition of one path: what a change says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Transition<'a> {
    pub(super) uri: &'a str,
    pub(super) hash: Option<&'a str>,
    pub(super) previous_hash: Option<&'a str>,
}

/// One signed change: the change entity, the signature on its hash, and
/// the signer's identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct SignedChange {
    change: Value,
    signature: Value,
    identity: Value,
}

/// `transition`, signed by `server` as its change number `sequence`.
pub(super) fn sign(server: &ServerIdentity, transition: Transition<'_>, sequence: EventId) -> Option<SignedChange> {
    let mut data = json!({"origin": server.hash(), "uri": transition.uri, "sequence": sequence});
    if let Some(h) = transition.hash {
        data["hash"] = json!(h);
    }
    if let Some(p) = transition.previous_hash {
        data["previous_hash"] = json!(p);
    }
    let change = json!({"type": TYPE, "data": data});
    let hash = hash_of(&change).ok()?;
    Some(SignedChange { change, signature: server.sign(&hash), identity: server.entity().clone() })
}

impl SignedChange {
    /// Who signed it.
    pub(super) fn origin(&self) -> Option<&str> {
        self.change["data"]["origin"].as_str()
    }

    /// The origin's log id of the change.
    pub(super) fn sequence(&self) -> Option<u64> {
        self.change["data"]["sequence"].as_u64()
    }

    /// Whether it signs exactly `t`.
    pub(super) fn signs(&self, t: Transition<'_>) -> bool {
        let d = &self.change["data"];
        d["uri"].as_str() == Some(t.uri) && d["hash"].as_str() == t.hash && d["previous_hash"].as_str() == t.previous_hash
    }

    /// Puts its three entities into `included`, named by their hashes;
    /// the change's hash.
    pub(super) fn include(&self, included: &mut Map<String, Value>) -> Option<String> {
        let change = hash_of(&self.change).ok()?;
        let signature = hash_of(&self.signature).ok()?;
        let identity = hash_of(&self.identity).ok()?;
        included.insert(change.clone(), self.change.clone());
        included.insert(signature, self.signature.clone());
        included.insert(identity, self.identity.clone());
        Some(change)
    }

    /// Whether the signature is `origin`'s own over this change (the
    /// identity hashes to the origin, the key verifies).
    pub(super) fn verifies(&self) -> bool {
        let (Some(origin), Ok(change), Ok(identity)) = (self.origin(), hash_of(&self.change), hash_of(&self.identity)) else {
            return false;
        };
        let Ok(signature) = hash_of(&self.signature) else { return false };
        if identity != origin {
            return false;
        }
        let included: Included =
            [(change.clone(), self.change.clone()), (signature, self.signature.clone()), (identity, self.identity.clone())].into();
        capability::verify_signed(&included, &change, origin).is_ok()
    }
}

/// The signed changes named by `hashes`, read from `included` (a map of
/// entities by hash; each change with a signature by its origin and the
/// origin's identity; what is not there is skipped, verification comes
/// later). At most [`MAX_CARRIED`].
pub(super) fn carried<'a, 'v, I>(hashes: impl IntoIterator<Item = &'a str>, included: I) -> Vec<SignedChange>
where
    I: IntoIterator<Item = (&'v String, &'v Value)> + Copy,
{
    let get = |key: &str| included.into_iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v);
    let mut out = Vec::new();
    for hash in hashes.into_iter().take(MAX_CARRIED) {
        // Named by its own hash, or it is not the change named.
        let Some(change) = get(hash).filter(|c| c["type"] == TYPE && hash_of(c).is_ok_and(|h| h == hash)) else { continue };
        let Some(origin) = change["data"]["origin"].as_str() else { continue };
        let Some(identity) = get(origin) else { continue };
        // Of the signatures claiming to be the origin's, one that verifies
        // (else the first, which proves a forgery).
        let candidates = included
            .into_iter()
            .map(|(_, s)| s)
            .filter(|s| s["type"] == "system/signature" && s["data"]["target"] == hash && s["data"]["signer"] == origin)
            .map(|signature| SignedChange { change: change.clone(), signature: signature.clone(), identity: identity.clone() });
        let mut first = None;
        for candidate in candidates {
            if candidate.verifies() {
                first = Some(candidate);
                break;
            }
            first.get_or_insert(candidate);
        }
        out.extend(first);
    }
    out
}

/// Those of `carried` that verify and sign exactly `t`: what a mirror keeps
/// with the change it applied, and an engine forwards.
pub(super) fn verified(carried: &[SignedChange], t: Transition<'_>) -> Vec<SignedChange> {
    carried.iter().filter(|s| s.signs(t) && s.verifies()).take(MAX_CARRIED).cloned().collect()
}

/// What the signed changes a notification carries prove about it, for a
/// mirror of `peer`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Proof {
    /// `peer` signed exactly this transition, as its change `sequence`.
    Signed {
        /// The peer's log id of the change.
        sequence: u64,
    },
    /// Nothing signed by `peer`: the transition is the notifier's own (a
    /// relay's re-read, say); the mirror asks the peer itself.
    Unsigned,
    /// Something claims to be `peer`'s and is not: a bad signature, or a
    /// signed transition other than the one notified.
    Forged,
}

/// Checks `carried` for `peer`'s signature on `t`.
pub(super) fn prove(carried: &[SignedChange], peer: &str, t: Transition<'_>) -> Proof {
    let mut claimed = false;
    for signed in carried.iter().filter(|s| s.origin() == Some(peer)) {
        claimed = true;
        if let (true, true, Some(sequence)) = (signed.signs(t), signed.verifies(), signed.sequence()) {
            return Proof::Signed { sequence };
        }
    }
    if claimed { Proof::Forged } else { Proof::Unsigned }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn server(seed: u8) -> ServerIdentity {
        ServerIdentity::from_key(SigningKey::from_bytes(&[seed; 32]))
    }

    const H1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const H2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn a_signed_change_survives_the_trip_and_proves_only_what_it_signs() {
        let (origin, relay) = (server(1), server(2));
        let t = Transition { uri: "feeds/a", hash: Some(H2), previous_hash: Some(H1) };
        let own = sign(&origin, t, 42).unwrap();
        let relayed = sign(&relay, t, 7).unwrap();
        let mut included = Map::new();
        let hashes = [own.include(&mut included).unwrap(), relayed.include(&mut included).unwrap()];
        let back = carried(hashes.iter().map(String::as_str), &included);
        assert_eq!(back, vec![own.clone(), relayed.clone()]);
        assert_eq!(prove(&back, origin.hash(), t), Proof::Signed { sequence: 42 });
        assert_eq!(prove(&back, relay.hash(), t), Proof::Signed { sequence: 7 });
        assert_eq!(prove(&back, server(3).hash(), t), Proof::Unsigned);
        // Another transition under the same signature is not proven.
        let other = Transition { uri: "feeds/a", hash: Some(H1), previous_hash: None };
        assert_eq!(prove(&back, origin.hash(), other), Proof::Forged);
    }

    #[test]
    fn a_bad_signature_next_to_the_good_one_hides_nothing() {
        let (origin, relay) = (server(1), server(2));
        let t = Transition { uri: "feeds/a", hash: Some(H2), previous_hash: Some(H1) };
        let honest = sign(&origin, t, 5).unwrap();
        let mut included = Map::new();
        let hash = honest.include(&mut included).unwrap();
        // A second signature claiming to be the origin's, by the relay.
        let mut bad = relay.sign(&hash);
        bad["data"]["signer"] = json!(origin.hash());
        included.insert(hash_of(&bad).unwrap(), bad);
        for _ in 0..8 {
            let back = carried([hash.as_str()], &included);
            assert_eq!(prove(&back, origin.hash(), t), Proof::Signed { sequence: 5 });
            assert_eq!(verified(&back, t), vec![honest.clone()]);
        }
        // A change under a key that is not its hash is not the change named.
        let mut renamed = Map::new();
        for (k, v) in &included {
            let key = if *k == hash { H1.to_owned() } else { k.clone() };
            renamed.insert(key, v.clone());
        }
        assert!(carried([H1], &renamed).is_empty());
    }

    #[test]
    fn a_relay_cannot_sign_in_the_origins_name() {
        let (origin, relay) = (server(1), server(2));
        let t = Transition { uri: "feeds/a", hash: Some(H2), previous_hash: None };
        let honest = sign(&origin, t, 3).unwrap();
        // The relay writes a change naming the origin and signs it itself.
        let mut forged = honest.clone();
        forged.change["data"]["sequence"] = json!(99);
        let hash = hash_of(&forged.change).unwrap();
        forged.signature = relay.sign(&hash);
        forged.signature["data"]["signer"] = json!(origin.hash());
        assert_eq!(prove(&[forged.clone()], origin.hash(), t), Proof::Forged);
        // Or passes its own identity off as the origin's.
        forged.identity = relay.entity().clone();
        assert_eq!(prove(&[forged], origin.hash(), t), Proof::Forged);
        assert_eq!(prove(&[honest], origin.hash(), t), Proof::Signed { sequence: 3 });
    }
}
