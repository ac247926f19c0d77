//! The refusals the services share: the store's, the filter's and the
//! token's as [`Refusal`]s, and the request fields every transport reads the
//! same way (resume points, envelope negotiation). Every service returns a
//! typed error (`thiserror`) whose variants are the stable error codes.

use serde_json::{Value, json};

pub use crate::refusal::{Kind, Refusal};

use crate::auth::AuthError;
use crate::filter::FilterError;
use crate::store::StoreError;

impl Refusal for StoreError {
    fn code(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "store_unavailable",
            StoreError::Unreplicated(_) => "replication_unavailable",
            StoreError::Other(_) => "internal",
        }
    }

    fn kind(&self) -> Kind {
        match self {
            StoreError::Unavailable(_) | StoreError::Unreplicated(_) => Kind::Unavailable,
            StoreError::Other(_) => Kind::Internal,
        }
    }

    fn message(&self) -> String {
        // The database's own words stay in the log.
        match self {
            StoreError::Unavailable(_) => "the event store is unavailable; retry later".to_owned(),
            StoreError::Unreplicated(_) => {
                "the database's synchronous standby does not confirm, and this server answers and shows nothing it has not confirmed; \
                 retry later with the same Idempotency-Key (a publish may have been stored)"
                    .to_owned()
            }
            StoreError::Other(_) => "internal error".to_owned(),
        }
    }

    fn retry_after(&self) -> Option<u64> {
        matches!(self, StoreError::Unavailable(_) | StoreError::Unreplicated(_)).then_some(1)
    }
}

impl Refusal for AuthError {
    fn code(&self) -> &'static str {
        "unauthorized"
    }

    fn kind(&self) -> Kind {
        Kind::Unauthenticated
    }
}

impl Refusal for FilterError {
    fn code(&self) -> &'static str {
        "invalid_filter"
    }

    fn kind(&self) -> Kind {
        Kind::Invalid
    }
}

/// A refusal of a request's shape, found while reading it: the code names
/// the field (`invalid_since`, `invalid_limit`, ...). Shared by every
/// transport that takes the same fields.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct InvalidField {
    /// The stable code.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl InvalidField {
    /// A refusal with `code`.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

impl Refusal for InvalidField {
    fn code(&self) -> &'static str {
        self.code
    }

    fn kind(&self) -> Kind {
        Kind::Invalid
    }
}

/// The envelope versions a client accepts include none this server writes.
#[derive(Debug, thiserror::Error)]
#[error(
    "none of the requested envelope versions is supported; this server writes {:?}",
    tidings_protocol::event::SUPPORTED_ENVELOPE_VERSIONS
)]
pub struct EnvelopeUnsupported;

impl Refusal for EnvelopeUnsupported {
    fn code(&self) -> &'static str {
        "envelope_version_unsupported"
    }

    fn kind(&self) -> Kind {
        Kind::NotAcceptable
    }

    fn details(&self) -> Option<Value> {
        Some(json!({ "supported": tidings_protocol::event::SUPPORTED_ENVELOPE_VERSIONS }))
    }
}

/// Why a request's envelope negotiation or resume point is refused.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// A field is malformed.
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    /// No common envelope version.
    #[error(transparent)]
    Envelope(#[from] EnvelopeUnsupported),
}

impl Refusal for RequestError {
    fn code(&self) -> &'static str {
        match self {
            Self::Invalid(e) => e.code(),
            Self::Envelope(e) => e.code(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::Invalid(e) => e.kind(),
            Self::Envelope(e) => e.kind(),
        }
    }

    fn wrapped(&self) -> Option<&dyn Refusal> {
        Some(match self {
            Self::Invalid(e) => e,
            Self::Envelope(e) => e,
        })
    }
}

/// Checks `accept_envelope` (`1,2`): `406 envelope_version_unsupported` when
/// the client knows none of the versions this server writes.
pub fn check_envelope(accept: Option<&str>) -> Result<(), RequestError> {
    match tidings_protocol::event::negotiate_envelope(accept) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(EnvelopeUnsupported.into()),
        Err(bad) => Err(InvalidField::new("invalid_accept_envelope", bad.to_string()).into()),
    }
}

/// Parses a resume point: a non-negative integer event id.
pub fn parse_cursor(value: &str, code: &'static str, what: &str) -> Result<tidings_protocol::event::EventId, InvalidField> {
    value
        .trim()
        .parse::<tidings_protocol::event::EventId>()
        .ok()
        .filter(|v| *v >= 0)
        .ok_or_else(|| InvalidField::new(code, format!("{what} must be a non-negative integer event id")))
}
