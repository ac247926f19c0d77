//! WebSocket devices (docs/ref-websocket.md), without the socket: proofs
//! of origin over a connection's nonce, the per-(owner, device) cursor that only
//! acknowledgements move, and catch-up pages. The WebSocket transport frames these as
//! JSON-RPC and drives the connection; delivery itself is a
//! [`Session`](super::session::Session) as for every transport.

use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Services;
use super::error::{Kind, Refusal};
use super::gap::Gap;
use super::poll::{PollError, PollPage, PollRequest};
use crate::auth::Identity;
use crate::store::{DeviceRead, StoreError};
use tidings_protocol::event::EventId;

/// Longest device id.
pub const MAX_DEVICE_ID: usize = 128;

/// Why a device request is refused.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// `proof_invalid`: the origin proof is missing, malformed, or does not
    /// verify over this request and this connection's nonce.
    #[error("{0}")]
    ProofInvalid(String),
    /// `proof_not_owner`: signed by another identity than the connection's.
    #[error("this connection belongs to another identity")]
    NotOwner,
    /// `invalid_device_id`.
    #[error("device_id must be 1 to {MAX_DEVICE_ID} characters of [A-Za-z0-9._:-]")]
    InvalidDeviceId,
    /// `invalid_seq`.
    #[error("seq must be a non-negative integer event id")]
    InvalidSeq,
    /// A catch-up page was refused.
    #[error(transparent)]
    Poll(#[from] PollError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Refusal for DeviceError {
    fn code(&self) -> &'static str {
        match self {
            Self::ProofInvalid(_) => "proof_invalid",
            Self::NotOwner => "proof_not_owner",
            Self::InvalidDeviceId => "invalid_device_id",
            Self::InvalidSeq => "invalid_seq",
            Self::Poll(e) => e.code(),
            Self::Store(e) => e.code(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::ProofInvalid(_) => Kind::Unauthenticated,
            Self::NotOwner => Kind::Forbidden,
            Self::InvalidDeviceId | Self::InvalidSeq => Kind::Invalid,
            Self::Poll(e) => e.kind(),
            Self::Store(e) => e.kind(),
        }
    }

    fn wrapped(&self) -> Option<&dyn Refusal> {
        match self {
            Self::Poll(e) => Some(e),
            Self::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// `origin_proof`: who signs, and the signature.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Proof {
    /// The signer's `system/identity` entity.
    identity: Value,
    /// Base64 Ed25519 signature over the ASCII of the request's hash.
    signature: String,
}

/// Verifies `proof` over `method` and `body` on the connection with
/// `nonce`; returns the signer (its identity hash).
pub fn verify(method: &str, body: &Value, nonce: &str, proof: Option<&Value>) -> Result<String, DeviceError> {
    let proof = proof.ok_or_else(|| DeviceError::ProofInvalid("origin_proof is required".into()))?;
    let proof: Proof = crate::json::from_object(proof.clone()).map_err(|e| DeviceError::ProofInvalid(format!("origin_proof: {e}")))?;
    let target = tidings_protocol::identity::proof_target(method, body, nonce);
    tidings_protocol::tree::capability::verify_inline(&proof.identity, &target, &proof.signature)
        .map_err(|e| DeviceError::ProofInvalid(format!("origin_proof does not verify: {e}")))
}

/// Checks a device id.
pub fn check_device_id(id: &str) -> Result<(), DeviceError> {
    let ok = !id.is_empty() && id.len() <= MAX_DEVICE_ID && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok { Ok(()) } else { Err(DeviceError::InvalidDeviceId) }
}

/// The cursor a device resumes from: its acknowledged one, else what the
/// client gives, else the head; never past the head. With it, the gap to
/// announce when the store lost history the device may have been shown:
/// its stored cursor stands at or past the fork of an epoch begun since
/// its last hello or ack (told once), or the point it gives lies in a lost
/// stretch (then that point is where it resumes, and its session says so).
pub async fn resume_point(
    core: &Services,
    owner: &str,
    device_id: &str,
    given: Option<EventId>,
    head: EventId,
) -> Result<(EventId, Option<Gap>), DeviceError> {
    let store = core.store();
    let read = store.device_read(owner, device_id).await?;
    let mut told = None;
    if let Some(DeviceRead { cursor: stored, read_epoch, epoch }) = read {
        let epochs = store.epochs(epoch).await?;
        if let Some(given) = given
            && given > stored
            && epochs.lost(given).is_some()
        {
            return Ok((given, None));
        }
        if read_epoch < epoch {
            told = super::gap::told_at_epoch_change(&epochs, stored, read_epoch, head);
        }
    }
    Ok((read.map(|r| r.cursor).or(given).unwrap_or(head).clamp(0, head), told))
}

/// Acknowledges `seq` for the device: the only writer of its cursor, which
/// becomes `max(cursor, min(seq, head))`.
pub async fn ack(core: &Services, owner: &str, device_id: &str, seq: EventId) -> Result<EventId, DeviceError> {
    if seq < 0 {
        return Err(DeviceError::InvalidSeq);
    }
    Ok(core.store().device_ack(owner, device_id, seq, chrono::Utc::now().timestamp_millis()).await?)
}

/// One catch-up page after `since` through `filter_json` (what the caller
/// may receive): a poll that does not wait and writes no cursor.
pub async fn delta(
    core: &Services,
    caller: &Identity,
    filter_json: Option<String>,
    since: EventId,
    limit: Option<u64>,
) -> Result<PollPage, DeviceError> {
    let since = u64::try_from(since).map_err(|_| DeviceError::InvalidSeq)?;
    let request = PollRequest {
        filter_json,
        since: Some(since),
        consumer_id: None,
        limit,
        wait_ms: Some(0),
        gone: CancellationToken::new(),
        own_place: false,
    };
    Ok(super::poll::poll(core, caller, request).await?)
}
