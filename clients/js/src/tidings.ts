/**
 * The JavaScript client of tidings, for browsers and Node (20 or later), with
 * no runtime dependencies.
 *
 * - {@link createClient}: the server's address and token given once, and
 *   everything below bound to them.
 * - {@link stream}: a live stream of envelopes over Server-Sent Events that
 *   resumes after any disconnect from the last id it delivered, and surfaces
 *   the server's notices (`system.replay_gap`, `system.client_dropped_slow`);
 *   handed to callbacks, or iterated with `for await`.
 * - {@link poll}, {@link Consumer}: one-shot and long polls, and durable
 *   consumers whose cursor moves only when you acknowledge.
 * - {@link connect}: the WebSocket device transport (JSON-RPC 2.0): hello,
 *   an auth signed with a WebCrypto Ed25519 key, catch-up, realtime, acks,
 *   and reconnection with backoff that carries the cursor; never a retry
 *   after a rejection.
 * - {@link publish}: `POST /v1/events`, with an `Idempotency-Key`, retried
 *   after a `503` or a lost connection without ever storing twice.
 *
 * Reconnections wait with full jitter, and at once when a page comes back
 * online or into view. The source is one module per concern; the build
 * bundles them into one file, which every tidings server also serves at
 * `/tidings.js`, so a page can `import { stream } from "/tidings.js"` with
 * no build step.
 *
 * @module
 */

export type {
  Agent,
  DroppedNotice,
  Envelope,
  Filter,
  FilterBudgetExceeded,
  Link,
  NewEvent,
  ReplayGap,
  State,
  TokenExpiredNotice,
  Visibility,
} from "./types.js";
export { CLOSE, FINAL_RPC_ERRORS, METHOD, REFUSING_CLOSES, RPC, TidingsError } from "./codes.js";
export type { ClientOptions } from "./http.js";
export type { Backoff } from "./backoff.js";
export { publish, type Published, type PublishOptions } from "./publish.js";
export { stream, type Stream, type StreamOptions } from "./stream.js";
export { SseParser, type Frame } from "./sse.js";
export { Consumer, poll, type PollPage, type PollRequest, type RunOptions } from "./poll.js";
export {
  canonicalJson,
  connect,
  createDeviceKey,
  importDeviceKey,
  originProof,
  type AckAnswer,
  type AckBody,
  type AckParams,
  type AuthAnswer,
  type AuthBody,
  type AuthParams,
  type Connection,
  type ConnectOptions,
  type DeltaPage,
  type DeltaParams,
  type DeviceEvent,
  type DeviceTokenExpired,
  type Hello,
  type OriginProof,
  type ReauthParams,
  type DeviceKey,
  type DeviceKeyJwk,
  type Identity,
} from "./device.js";
export { createClient, type Client } from "./client.js";
