// Envelopes as the server sends them, generated from the protocol crate's
// schema (tests/api/schemas.rs) and type-checked by `tsc --noEmit -p test`:
// the client's `Envelope` takes what the server always sends and has every
// field it may send, and no other.
// generated from crates/protocol/src/event.rs (envelope_schema): TIDINGS_BLESS=1 cargo test schemas:: rewrites it
import type { Envelope } from "../src/tidings.js";

/** What the server always sends: the type takes it. */
export const minimal: Envelope = {"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"visibility":"public"};

/** Everything the server may send: the type has each field, and no other. */
export const full: Required<Envelope> = {"agent":{"id":"x","kind":"x"},"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"ref":"x","session_id":"x","traceparent":"x","tracestate":"x","visibility":"public"};
// end of the generated envelopes
