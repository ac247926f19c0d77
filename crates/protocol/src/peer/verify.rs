//! Reading a signed EXECUTE a peer sent (the other half of
//! [`super::Execute`]): the envelope `{"execute": <entity>, "included":
//! {hash: entity}}`, every included entity named by its own hash, the
//! `system/protocol/execute` fields, and the author's signature over exactly
//! this EXECUTE. What the EXECUTE asks for (its handler, its capability) is
//! the receiving server's to check.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::protocol::{EXECUTE, MAX_EPOCHS};
use crate::tree::Entity;
use crate::tree::capability::{self, Included};

/// Most entities one EXECUTE may carry.
pub const MAX_INCLUDED: usize = 256;

/// The envelope a peer's `POST /v1/execute` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// The `system/protocol/execute` entity.
    pub execute: Entity,
    /// The entities it refers to, by hash (signatures, identities,
    /// capability chains, bundled entities).
    #[serde(default)]
    pub included: Map<String, Value>,
}

/// The fields of a `system/protocol/execute` a receiver reads; others
/// (request ids, bounds) are carried and ignored.
#[derive(Debug, Deserialize)]
pub struct ExecuteData {
    /// The handler (or inbox) it is addressed to.
    pub uri: String,
    /// What it asks there (`subscribe`, `receive`, ...).
    pub operation: String,
    /// What it acts on.
    #[serde(default)]
    pub resource: Option<Resource>,
    /// Its parameters.
    #[serde(default)]
    pub params: Option<Entity>,
    /// Who asks: the identity hash that signed it.
    pub author: String,
    /// The capability it is asked under (its hash).
    #[serde(default)]
    pub capability: Option<String>,
    /// A delivery's sequence (the sender's log id of the notification).
    #[serde(default)]
    pub sequence: Option<i64>,
    /// A delivery's list of the sender's epochs after its first.
    #[serde(default)]
    pub epochs: Vec<SenderEpoch>,
}

/// What an EXECUTE acts on.
#[derive(Debug, Deserialize)]
pub struct Resource {
    /// Paths or path patterns.
    pub targets: Vec<String>,
}

/// One epoch of a sender's log, as a delivery lists it: it began when the
/// ids in `(fork, base]` were lost (see [`super::Execute::epochs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenderEpoch {
    /// The epoch's number (2 and up: the first epoch is never listed).
    pub number: i32,
    /// The last id that survived into it.
    pub fork: i64,
    /// The highest id handed out before it (ids above are its own).
    pub base: i64,
}

impl SenderEpoch {
    /// Whether `epochs` is a list a sender could have sent: at most
    /// [`MAX_EPOCHS`], numbers and bases rising, each `0 <= fork <= base`.
    pub fn well_formed(epochs: &[SenderEpoch]) -> bool {
        let rising = epochs.windows(2).all(|w| w[0].number < w[1].number && w[0].base < w[1].base);
        epochs.len() <= MAX_EPOCHS && rising && epochs.iter().all(|e| e.number >= 1 && e.fork >= 0 && e.fork <= e.base)
    }
}

/// A signed EXECUTE whose envelope, included entities and signature were
/// checked.
#[derive(Debug)]
pub struct Verified {
    /// Its fields.
    pub data: ExecuteData,
    /// The entities it carried, each named by its hash.
    pub included: Included,
}

/// Why an EXECUTE was refused before anything it asks was looked at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// `invalid_execute`: not a `system/protocol/execute`, or its fields are wrong.
    #[error("{0}")]
    Execute(String),
    /// `invalid_included`: too many included entities, or one not named by its hash.
    #[error("{0}")]
    Included(String),
    /// `signature_invalid`: its author did not sign exactly this EXECUTE.
    #[error("{0}")]
    Signature(String),
}

/// Checks `envelope` (already read, strictly, from the request): its kind,
/// at most [`MAX_INCLUDED`] included entities each named by its own hash,
/// its fields, and its author's signature over exactly this EXECUTE.
pub fn verify(envelope: Envelope) -> Result<Verified, VerifyError> {
    if envelope.execute.kind != EXECUTE {
        return Err(VerifyError::Execute("execute must be a system/protocol/execute entity".into()));
    }
    if envelope.included.len() > MAX_INCLUDED {
        return Err(VerifyError::Included(format!("at most {MAX_INCLUDED} included entities")));
    }
    let mut included = Included::with_capacity(envelope.included.len());
    for (hash, entity) in envelope.included {
        match capability::hash_of(&entity) {
            Ok(h) if h == hash => {
                included.insert(hash, entity);
            }
            Ok(_) => return Err(VerifyError::Included(format!("included entity {hash} is not named by its hash"))),
            Err(e) => return Err(VerifyError::Included(format!("included {hash}: {e}"))),
        }
    }
    if !envelope.execute.data.is_object() {
        return Err(VerifyError::Execute("execute data: an object is expected".into()));
    }
    let data: ExecuteData =
        serde_json::from_value(envelope.execute.data.clone()).map_err(|e| VerifyError::Execute(format!("execute data: {e}")))?;
    // The author signed exactly this EXECUTE.
    let execute_hash = envelope.execute.canonical().1;
    if let Err(e) = capability::verify_signed(&included, &execute_hash, &data.author) {
        return Err(VerifyError::Signature(format!("the EXECUTE is not signed by its author: {e}")));
    }
    Ok(Verified { data, included })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::identity::ServerIdentity;
    use crate::peer::Execute;

    fn key(n: u8) -> ServerIdentity {
        ServerIdentity::from_key(ed25519_dalek::SigningKey::from_bytes(&[n; 32]))
    }

    fn envelope(value: Value) -> Envelope {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn what_the_builder_signs_verifies_and_a_changed_one_does_not() {
        let author = key(1);
        let built = Execute::new("system/subscription", "subscribe", author.hash())
            .targets(json!(["notes/*"]))
            .sequence(7)
            .epochs(&[(2, 3, 5)])
            .signed(&author, Map::new());
        let built = built.into_value();
        let verified = verify(envelope(built.clone())).unwrap();
        assert_eq!((verified.data.operation.as_str(), verified.data.sequence), ("subscribe", Some(7)));
        assert_eq!(verified.data.epochs, vec![SenderEpoch { number: 2, fork: 3, base: 5 }]);
        assert_eq!(verified.data.resource.map(|r| r.targets), Some(vec!["notes/*".to_owned()]));

        let mut changed = built.clone();
        changed["execute"]["data"]["operation"] = json!("unsubscribe");
        assert!(matches!(verify(envelope(changed)), Err(VerifyError::Signature(_))), "the author did not sign that");

        let mut forged = built.clone();
        forged["execute"]["data"]["author"] = json!(key(2).hash());
        assert!(matches!(verify(envelope(forged)), Err(VerifyError::Signature(_))), "another author's name");

        let mut misnamed = built.clone();
        let (hash, _) = built["included"].as_object().unwrap().iter().next().unwrap();
        misnamed["included"][hash] = json!({"type": "note", "data": {}});
        assert!(matches!(verify(envelope(misnamed)), Err(VerifyError::Included(_))));

        let mut other_kind = built;
        other_kind["execute"]["type"] = json!("note");
        assert!(matches!(verify(envelope(other_kind)), Err(VerifyError::Execute(_))));
    }

    #[test]
    fn too_many_included_entities_are_refused_before_any_is_hashed() {
        let author = key(1);
        let mut included = Map::new();
        for i in 0..=MAX_INCLUDED {
            included.insert(format!("sha256:{i}"), json!({"type": "note", "data": {}}));
        }
        let built = Execute::new("system/subscription", "subscribe", author.hash()).signed(&author, included);
        assert!(matches!(verify(envelope(built.into_value())), Err(VerifyError::Included(_))));
    }

    #[test]
    fn only_a_list_a_sender_could_send_is_well_formed() {
        let e = |number, fork, base| SenderEpoch { number, fork, base };
        assert!(SenderEpoch::well_formed(&[]));
        assert!(SenderEpoch::well_formed(&[e(2, 3, 5), e(3, 5, 9)]));
        for bad in [vec![e(0, 1, 2)], vec![e(2, 3, 2)], vec![e(2, -1, 2)], vec![e(3, 1, 2), e(2, 3, 4)], vec![e(2, 1, 5), e(3, 2, 5)]] {
            assert!(!SenderEpoch::well_formed(&bad), "{bad:?}");
        }
        assert!(!SenderEpoch::well_formed(&(1..=MAX_EPOCHS as i32 + 1).map(|n| e(n, i64::from(n), i64::from(n))).collect::<Vec<_>>()));
    }
}
