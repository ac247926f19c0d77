//! Chain-error markers (docs/ref-subscriptions.md, "Chain-error markers"):
//! the entity a server binds when a notification was not delivered
//! (suppressed by a limit, or given up by the courier), at a path that
//! makes binding the same one twice a no-op.
//! A leaf the engine and the courier both use.

use serde_json::json;

use super::MARKER_DIR;
use crate::store::{Condition, TreeWrite};
use tidings_protocol::event::EventId;
use tidings_protocol::tree::{Entity, change_event};

/// A chain-error marker of a notification that was not delivered
/// (docs/ref-subscriptions.md, "Chain-error markers").
#[derive(Debug)]
pub(super) struct Marker<'a> {
    /// Who binds it (this server).
    pub(super) agent: tidings_protocol::event::Agent,
    pub(super) subscription_id: &'a str,
    pub(super) reason: &'a str,
    /// The change kind.
    pub(super) kind: &'a str,
    pub(super) uri: &'a str,
    pub(super) hash: Option<&'a str>,
    pub(super) previous_hash: Option<&'a str>,
    pub(super) chain_id: &'a str,
    /// The log id of the change (or of the notification given up).
    pub(super) event_id: EventId,
}

impl Marker<'_> {
    /// The write binding it at
    /// `system/runtime/chain-errors/lost/{chain_id}/{subscription_id}/{reason}/{marker_hash}`;
    /// binding the same marker again is a no-op.
    pub(super) fn write(&self) -> TreeWrite {
        let mut data = json!({
            "chain_id": self.chain_id,
            "subscription_id": self.subscription_id,
            "reason": self.reason,
            "event": self.kind,
            "uri": self.uri,
            "event_id": self.event_id,
        });
        if let Some(h) = self.hash {
            data["hash"] = json!(h);
        }
        if let Some(p) = self.previous_hash {
            data["previous_hash"] = json!(p);
        }
        let (canonical, hash) = Entity { kind: "system/chain-error/lost".into(), data }.canonical();
        let path = format!("{MARKER_DIR}/{}/{}/{}/{hash}", self.chain_id, self.subscription_id, self.reason);
        TreeWrite {
            path: path.clone(),
            entity: Some((canonical, hash.clone())),
            condition: Condition::IfAbsent,
            event: change_event(&path, self.agent.clone(), Some(hash), self.chain_id.to_owned()),
        }
    }
}
