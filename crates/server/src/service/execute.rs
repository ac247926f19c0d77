//! Signed EXECUTEs (docs/ref-subscriptions.md, "The EXECUTE envelope"):
//! what `POST /v1/execute` calls. A subscriber's subscribe or unsubscribe,
//! or a peer's delivery into one of this server's inboxes; federation
//! ([`crate::federation`]) checks the envelope and the capability and does
//! the work, so the transports reach it only through here.

pub use crate::federation::execute::Call;
pub use crate::federation::{ExecuteError, Executed};

use super::Services;

/// Runs one signed EXECUTE (`body`, the request's bytes) as `call` says.
pub async fn execute(core: &Services, body: &[u8], call: Call) -> Result<Executed, ExecuteError> {
    crate::federation::execute::execute(core.subscriptions(), body, call).await
}
