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
export declare class TidingsError extends Error {
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
    constructor(status: number, code: string, message: string, body?: unknown, extra?: {
        rpcCode?: number;
        closeCode?: number;
    });
}
/** The device protocol's methods. */
export declare const METHOD: {
    readonly HELLO: "stream.hello";
    readonly AUTH: "stream.auth";
    readonly DELTA: "sync.delta";
    readonly ACK: "stream.ack";
    readonly REAUTH: "stream.reauth";
    readonly EVENT: "stream.event";
    readonly GAP: "stream.gap";
    readonly TOKEN_EXPIRED: "stream.token_expired";
    readonly FILTER_BUDGET_EXCEEDED: "stream.filter_budget_exceeded";
};
/** The JSON-RPC `error.code` of a refusal. */
export declare const RPC: {
    readonly INVALID_REQUEST: -32600;
    readonly METHOD_NOT_FOUND: -32601;
    readonly INVALID_PARAMS: -32602;
    readonly INTERNAL: -32603;
    readonly UNAUTHENTICATED: -32001;
    readonly FORBIDDEN: -32003;
    readonly NOT_FOUND: -32004;
    readonly CONFLICT: -32009;
    readonly TRY_LATER: -32013;
};
/** The close codes. */
export declare const CLOSE: {
    readonly NORMAL: 1000;
    readonly GOING_AWAY: 1001;
    readonly PROTOCOL: 1002;
    readonly UNSUPPORTED: 1003;
    readonly ABNORMAL: 1006;
    readonly INVALID: 1007;
    readonly POLICY: 1008;
    readonly TOO_BIG: 1009;
    readonly INTERNAL: 1011;
    readonly RESTART: 1012;
    readonly TRY_LATER: 1013;
};
/** Close codes after which the same connection would be refused again: no reconnect. */
export declare const REFUSING_CLOSES: ReadonlySet<number>;
/** JSON-RPC errors the same request would meet again: final. Others are retried. */
export declare const FINAL_RPC_ERRORS: ReadonlySet<number>;
