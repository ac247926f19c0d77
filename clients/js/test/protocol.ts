// What the server sends, generated from the protocol crate's schemas
// (crates/protocol/src/wire.rs, tests/api/schemas.rs) and type-checked by
// `tsc --noEmit -p test`: for each shape the client's type takes what the
// server always sends and has every field it may send, and no other.
// generated from crates/protocol/src/wire.rs: TIDINGS_BLESS=1 cargo test schemas:: rewrites it
import type {
  Envelope,
  ReplayGap,
  DroppedNotice,
  TokenExpiredNotice,
  FilterBudgetExceeded,
  PollPage,
  Hello,
  AuthAnswer,
  DeviceEvent,
  DeltaPage,
  AckAnswer,
  DeviceTokenExpired,
  Identity,
  OriginProof,
  AuthBody,
  AuthParams,
  DeltaParams,
  AckBody,
  AckParams,
  ReauthParams,
} from "../src/tidings.js";

/** Envelope: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalEnvelope: Envelope = {"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"visibility":"public"};
export const fullEnvelope: Required<Envelope> = {"agent":{"id":"x","kind":"x"},"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"ref":"x","session_id":"x","traceparent":"x","tracestate":"x","visibility":"public"};

/** ReplayGap: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalReplayGap: ReplayGap = {"available_from":1,"head":1,"reason":"pruned","requested":1};
export const fullReplayGap: Required<ReplayGap> = {"available_from":1,"fork":1,"head":1,"reason":"pruned","requested":1};

/** DroppedNotice: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalDroppedNotice: DroppedNotice = {"last_event_id":1,"queue":1,"reason":"queue_full"};
export const fullDroppedNotice: Required<DroppedNotice> = {"last_event_id":1,"queue":1,"reason":"queue_full"};

/** TokenExpiredNotice: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalTokenExpiredNotice: TokenExpiredNotice = {"last_event_id":1};
export const fullTokenExpiredNotice: Required<TokenExpiredNotice> = {"last_event_id":1};

/** FilterBudgetExceeded: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalFilterBudgetExceeded: FilterBudgetExceeded = {"budget":1};
export const fullFilterBudgetExceeded: Required<FilterBudgetExceeded> = {"budget":1};

/** PollPage: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalPollPage: PollPage = {"events":[{"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"visibility":"public"}],"has_more":true,"next_since":1};
export const fullPollPage: Required<PollPage> = {"events":[{"agent":{"id":"x","kind":"x"},"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"ref":"x","session_id":"x","traceparent":"x","tracestate":"x","visibility":"public"}],"gap":{"available_from":1,"fork":1,"head":1,"reason":"pruned","requested":1},"has_more":true,"next_since":1};

/** Hello: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalHello: Hello = {"head_seq":1,"nonce":"x","profiles":["x"],"server_did":"x"};
export const fullHello: Required<Hello> = {"head_seq":1,"nonce":"x","profiles":["x"],"server_did":"x"};

/** AuthAnswer: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalAuthAnswer: AuthAnswer = {"cursor":1,"head_seq":1};
export const fullAuthAnswer: Required<AuthAnswer> = {"cursor":1,"head_seq":1};

/** DeviceEvent: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalDeviceEvent: DeviceEvent = {"event":{"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"visibility":"public"},"seq":1};
export const fullDeviceEvent: Required<DeviceEvent> = {"event":{"agent":{"id":"x","kind":"x"},"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"ref":"x","session_id":"x","traceparent":"x","tracestate":"x","visibility":"public"},"seq":1};

/** DeltaPage: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalDeltaPage: DeltaPage = {"has_more":true,"items":[{"event":{"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"visibility":"public"},"seq":1}],"next_since":1};
export const fullDeltaPage: Required<DeltaPage> = {"gap":{"available_from":1,"fork":1,"head":1,"reason":"pruned","requested":1},"has_more":true,"items":[{"event":{"agent":{"id":"x","kind":"x"},"envelope_version":1,"event_id":1,"event_type":"x","links":[{"ref":"x","rel":"x"}],"occurred_at":"x","payload":{},"ref":"x","session_id":"x","traceparent":"x","tracestate":"x","visibility":"public"},"seq":1}],"next_since":1};

/** AckAnswer: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalAckAnswer: AckAnswer = {"cursor":1};
export const fullAckAnswer: Required<AckAnswer> = {"cursor":1};

/** DeviceTokenExpired: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalDeviceTokenExpired: DeviceTokenExpired = {"last_seq":1,"reauth_by_ms":1};
export const fullDeviceTokenExpired: Required<DeviceTokenExpired> = {"last_seq":1,"reauth_by_ms":1};

/** Identity: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalIdentity: Identity = {"data":{"algorithm":"ed25519","public_key":"x"},"type":"system/identity"};
export const fullIdentity: Required<Identity> = {"data":{"algorithm":"ed25519","public_key":"x"},"type":"system/identity"};

/** OriginProof: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalOriginProof: OriginProof = {"identity":{"data":{"algorithm":"ed25519","public_key":"x"},"type":"system/identity"},"signature":"x"};
export const fullOriginProof: Required<OriginProof> = {"identity":{"data":{"algorithm":"ed25519","public_key":"x"},"type":"system/identity"},"signature":"x"};

/** AuthBody: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalAuthBody: AuthBody = {"device_id":"x"};
export const fullAuthBody: Required<AuthBody> = {"cursor":1,"device_id":"x","filter":{}};

/** AuthParams: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalAuthParams: AuthParams = {"body":{"device_id":"x"},"origin_proof":{"identity":{"data":{"algorithm":"ed25519","public_key":"x"},"type":"system/identity"},"signature":"x"}};
export const fullAuthParams: Required<AuthParams> = {"body":{"cursor":1,"device_id":"x","filter":{}},"origin_proof":{"identity":{"data":{"algorithm":"ed25519","public_key":"x"},"type":"system/identity"},"signature":"x"}};

/** DeltaParams: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalDeltaParams: DeltaParams = {"device_id":"x","since":1};
export const fullDeltaParams: Required<DeltaParams> = {"device_id":"x","limit":1,"since":1};

/** AckBody: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalAckBody: AckBody = {"seq":1};
export const fullAckBody: Required<AckBody> = {"seq":1};

/** AckParams: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalAckParams: AckParams = {"body":{"seq":1},"origin_proof":{"identity":{"data":{"algorithm":"ed25519","public_key":"x"},"type":"system/identity"},"signature":"x"}};
export const fullAckParams: Required<AckParams> = {"body":{"seq":1},"origin_proof":{"identity":{"data":{"algorithm":"ed25519","public_key":"x"},"type":"system/identity"},"signature":"x"}};

/** ReauthParams: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */
export const minimalReauthParams: ReauthParams = {"token":"x"};
export const fullReauthParams: Required<ReauthParams> = {"token":"x"};
// end of the generated shapes
