//! What a refusal is, for every layer and every transport: a stable code,
//! a [`Kind`] (what went wrong from the client's side), a message and what
//! a client may do next. Each module's typed error (`thiserror`) implements
//! [`Refusal`]; each transport maps [`Kind`] to its own vocabulary in one
//! place (the HTTP transport to a status; a JSON-RPC transport to an error
//! code), so none of them parses codes. A leaf: it imports nothing of
//! tidings.

use serde_json::Value;

/// The kind of a refusal: what went wrong, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The request is malformed or a value is out of range (`400`).
    Invalid,
    /// No valid credentials (`401`).
    Unauthenticated,
    /// The caller may not do this (`403`).
    Forbidden,
    /// Nothing by that name (`404`).
    NotFound,
    /// None of the representations the client accepts (`406`).
    NotAcceptable,
    /// The state changed under the request (`409`).
    Conflict,
    /// It existed and is gone for good (`410`).
    Gone,
    /// Over a size limit (`413`).
    TooLarge,
    /// Well-formed but refused by the rules (`422`).
    Unprocessable,
    /// Over a per-identity budget; retry later (`429`).
    TooMany,
    /// The server cannot serve it now; retry later (`503`).
    Unavailable,
    /// A bug or corruption: logged, never detailed to the client (`500`).
    Internal,
}

/// A typed refusal, as every transport needs to see it.
pub trait Refusal: std::error::Error {
    /// The stable error code.
    fn code(&self) -> &'static str;

    /// What kind of refusal this is.
    fn kind(&self) -> Kind;

    /// The refusal this one wraps (a store or limit failure inside a
    /// service's error), whose message, retry and details it passes on.
    fn wrapped(&self) -> Option<&dyn Refusal> {
        None
    }

    /// The human message sent to the client (by default the error's text).
    fn message(&self) -> String {
        self.wrapped().map_or_else(|| self.to_string(), |c| c.message())
    }

    /// Seconds after which a retry may succeed.
    fn retry_after(&self) -> Option<u64> {
        self.wrapped().and_then(|c| c.retry_after())
    }

    /// Extra fields for the error body (an object).
    fn details(&self) -> Option<Value> {
        self.wrapped().and_then(|c| c.details())
    }
}
