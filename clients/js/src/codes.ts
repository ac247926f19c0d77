/**
 * What a refusal looks like to a caller ({@link TidingsError}), and the
 * device protocol's method names, JSON-RPC error codes and close codes,
 * generated from the protocol crate (docs/ref-websocket.md).
 *
 * @module
 */

/**
 * A request the server refused, with its stable error code: `status` is the
 * HTTP status (0 for a refusal that came as a WebSocket JSON-RPC error or
 * close, where `rpcCode` or `closeCode` says which).
 */
export class TidingsError extends Error {
  /** The HTTP status, or 0. */
  readonly status: number;
  /** The stable error code (`invalid_filter`, `unauthorized`, ...). */
  readonly code: string;
  /** The whole error body as the server sent it. */
  readonly body: unknown;
  /** The JSON-RPC error code, for a WebSocket refusal. */
  readonly rpcCode: number | undefined;
  /** The WebSocket close code, for a connection closed as a refusal. */
  readonly closeCode: number | undefined;

  constructor(status: number, code: string, message: string, body?: unknown, extra: { rpcCode?: number; closeCode?: number } = {}) {
    super(message || code);
    this.name = "TidingsError";
    this.status = status;
    this.code = code;
    this.body = body;
    this.rpcCode = extra.rpcCode;
    this.closeCode = extra.closeCode;
  }
}

// generated from crates/protocol/src/ws.rs: TIDINGS_BLESS=1 cargo test ws_protocol:: rewrites it
/** The device protocol's methods. */
export const METHOD = {
  HELLO: "stream.hello",
  AUTH: "stream.auth",
  DELTA: "sync.delta",
  ACK: "stream.ack",
  REAUTH: "stream.reauth",
  EVENT: "stream.event",
  GAP: "stream.gap",
  TOKEN_EXPIRED: "stream.token_expired",
  FILTER_BUDGET_EXCEEDED: "stream.filter_budget_exceeded",
} as const;
/** The JSON-RPC `error.code` of a refusal. */
export const RPC = {
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL: -32603,
  UNAUTHENTICATED: -32001,
  FORBIDDEN: -32003,
  NOT_FOUND: -32004,
  CONFLICT: -32009,
  TRY_LATER: -32013,
} as const;
/** The close codes. */
export const CLOSE = {
  NORMAL: 1000,
  GOING_AWAY: 1001,
  PROTOCOL: 1002,
  UNSUPPORTED: 1003,
  ABNORMAL: 1006,
  INVALID: 1007,
  POLICY: 1008,
  TOO_BIG: 1009,
  INTERNAL: 1011,
  RESTART: 1012,
  TRY_LATER: 1013,
} as const;
/** Close codes after which the same connection would be refused again: no reconnect. */
export const REFUSING_CLOSES: ReadonlySet<number> = new Set([1002, 1003, 1007, 1008, 1009]);
/** JSON-RPC errors the same request would meet again: final. Others are retried. */
export const FINAL_RPC_ERRORS: ReadonlySet<number> = new Set([-32600, -32601, -32602, -32001, -32003]);
// end of the generated protocol
