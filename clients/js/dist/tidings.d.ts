/**
 * The JavaScript client of tidings, for browsers and Node (20 or later), with
 * no runtime dependencies.
 *
 * - {@link stream}: a live stream of envelopes over Server-Sent Events that
 *   resumes after any disconnect from the last id it delivered, and surfaces
 *   the server's notices (`system.replay_gap`, `system.client_dropped_slow`).
 * - {@link poll}, {@link Consumer}: one-shot and long polls, and durable
 *   consumers whose cursor moves only when you acknowledge.
 * - {@link connect}: the WebSocket device transport (JSON-RPC 2.0): hello,
 *   an auth signed with a WebCrypto Ed25519 key, catch-up, realtime, acks,
 *   and reconnection with backoff that carries the cursor; never a retry
 *   after a rejection.
 * - {@link publish}: `POST /v1/events`, with an `Idempotency-Key`, retried
 *   after a `503` or a lost connection without ever storing twice.
 *
 * The module is also served by every tidings server at `/tidings.js`, so a
 * page can `import { stream } from "/tidings.js"` with no build step.
 *
 * @module
 */
/** Who may see an event. */
export type Visibility = "public" | "reviewer_only" | "admin";
/** The agent an event is attributed to. */
export interface Agent {
    id: string;
    /** Free-form (`ai_persona`, `human`); optional, as the server takes it. */
    kind?: string;
}
/** A typed relation from an event to something it concerns. */
export interface Link {
    rel: string;
    ref: string;
}
/** An event as the server delivers it (envelope version 1). */
export interface Envelope<Payload = Record<string, unknown>> {
    envelope_version: number;
    /** Assigned by the server: increasing, the resume point of every transport. */
    event_id: number;
    event_type: string;
    ref?: string | null;
    agent?: Agent | null;
    session_id?: string | null;
    occurred_at: string;
    payload: Payload;
    links: Link[];
    visibility: Visibility;
    /** The W3C trace context the event was published in, if any: continue the trace from it. */
    traceparent?: string;
    tracestate?: string;
}
/** What a client asks for; fields are AND-combined, values within one OR-combined. */
export interface Filter {
    /** Globs over dotted event types: `*` is one segment, `**` one or more. */
    types?: string[];
    agents?: string[];
    /** Matches an event's `ref` or any of its `links[].ref`. */
    targets?: string[];
    /** A JsonLogic rule over the payload, evaluated by the server. */
    payload?: unknown;
}
/** An event to publish: the server assigns the id (and the time, by default). */
export interface NewEvent {
    event_type: string;
    ref?: string;
    agent?: Agent;
    session_id?: string;
    payload?: Record<string, unknown>;
    links?: Link[];
    visibility?: Visibility;
    occurred_at?: string;
}
/** A resume point the server could not serve whole: resume from `available_from`. */
export interface ReplayGap {
    requested: number;
    available_from: number;
    head: number;
    /**
     * Why: `pruned` (history before `available_from` was deleted),
     * `replay_limit` (further back than one resume may replay), `beyond_head`
     * (the point is past the head), `history_lost` (the server's store lost
     * the history after `fork` in a failover or a restore: events seen after
     * the fork are gone, and every event after the fork follows).
     */
    reason?: "pruned" | "replay_limit" | "beyond_head" | "history_lost";
    /** With `history_lost`: the last id that survived. */
    fork?: number;
}
/** The server closed a stream that fell behind; the client resumes from `last_event_id`. */
export interface DroppedNotice {
    reason: "queue_full" | "no_progress";
    last_event_id: number | null;
    queue: number;
}
/** Where a stream or connection is. */
export type State = "connecting" | "open" | "closed";
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
/** Where the server is and how to reach it. */
export interface ClientOptions {
    /** The server's base URL; in a page, the page's own origin by default. */
    url?: string | URL;
    /**
     * A bearer token (JWT), when the server has authentication on; or a
     * function returning one, called before every request and (re)connect,
     * so a stream whose token expired (`system.token_expired` on a stream,
     * `stream.token_expired` on a device connection) goes on under a fresh
     * one. A fixed token that expires ends the stream with `unauthorized`.
     */
    token?: string | (() => string | Promise<string>);
    /** A `fetch` to use instead of the global one. */
    fetch?: typeof fetch;
}
/** Reconnection delay: doubles from `initialMs` up to `maxMs`, with jitter in [½, 1]. */
export interface Backoff {
    initialMs?: number;
    maxMs?: number;
}
/** How {@link publish} retries. */
export interface PublishOptions extends ClientOptions {
    /**
     * The publish's `Idempotency-Key` (1–255 visible ASCII characters;
     * default: a new random one per call). Every retry of the call carries
     * it, so a retry after an answer that was lost stores nothing twice.
     */
    idempotencyKey?: string;
    /** Retries after a `503` or a lost connection (default 5); a refusal is never retried. */
    retries?: number;
    /** Delay between retries (a `503`'s `Retry-After` is waited at least). */
    backoff?: Backoff;
}
/**
 * Publishes one event or a batch (all or nothing); resolves to the assigned
 * ids. A `503` or a lost connection may have stored the events or not; the
 * retry carries the same `Idempotency-Key`, so the server stores them once
 * and answers the retry with the original ids either way.
 */
/**
 * The ids a publish was assigned, in order; `replayed` is true when the
 * server had stored it before under the same `Idempotency-Key` (a retry
 * whose first answer was lost) and stored nothing now.
 */
export type Published = number[] & {
    readonly replayed: boolean;
};
export declare function publish(events: NewEvent | NewEvent[], options?: PublishOptions): Promise<Published>;
/** How {@link stream} is told what happens. */
export interface StreamOptions extends ClientOptions {
    /**
     * Where to start: events after this id are replayed first. Without it the
     * stream is live only. After a reconnect the stream always resumes after
     * the last event it delivered.
     */
    since?: number;
    /**
     * Each event, in id order, once. On `fetch` the next event waits for a
     * returned promise, and a handler that throws ends the connection: the
     * event comes again after the reconnect. On `eventsource` the exception
     * is reported and the stream goes on.
     */
    onEvent: (event: Envelope) => void | Promise<void>;
    /** The resume point was older than the retained history (or past the head). */
    onGap?: (gap: ReplayGap) => void;
    /** The server dropped this stream for falling behind; it resumes by itself. */
    onDropped?: (notice: DroppedNotice) => void;
    /** Any other named notice the server sends. */
    onNotice?: (type: string, data: unknown) => void;
    /** A refusal (bad filter, bad token, forbidden type): the stream is closed and not retried. */
    onError?: (error: TidingsError) => void;
    onState?: (state: State) => void;
    /**
     * `eventsource`: the platform's `EventSource` (the default where there is
     * one and no token; a token then goes as `access_token` in the query).
     * `fetch`: a reader over `fetch` (the default in Node, or with a token: it
     * sends `Authorization`); it applies backpressure, because the next event
     * is read only once `onEvent` has returned.
     */
    transport?: "eventsource" | "fetch";
    /** An `EventSource` to use instead of the global one. */
    EventSource?: typeof EventSource;
    /** Reconnection delay after an error (a stream the server ends resumes after its `retry:` hint). */
    backoff?: Backoff;
}
/** A running stream. */
export interface Stream {
    /** The id of the last event delivered, the point a reconnect resumes after. */
    readonly lastEventId: number | null;
    readonly state: State;
    /** Stops the stream for good. */
    close(): void;
}
/**
 * Follows the events that match `filter`, live, resuming after any
 * disconnect from the last event delivered: nothing missed, nothing twice.
 */
export declare function stream(filter: Filter, options: StreamOptions): Stream;
/** One dispatched Server-Sent Events frame (what [SseParser] hands out). */
export interface Frame {
    event: string;
    data: string;
    id: string | undefined;
}
/**
 * The event-stream parser of the HTML standard (§9.2.6), fed with bytes.
 * Bounded: a line or an event past the bounds throws (the stream is then
 * broken and resumed) rather than growing without end, in time linear
 * in what arrives, however it is cut.
 */
export declare class SseParser {
    /** The last `retry:` value, in milliseconds. */
    retry: number | undefined;
    private readonly decoder;
    /** The unterminated rest of the stream, in pieces. */
    private parts;
    private partsLength;
    private started;
    private data;
    private dataLength;
    private event;
    private id;
    private lastId;
    push(bytes: Uint8Array): Frame[];
    private line;
}
/** A poll: `since` (exclusive), or a durable `consumer_id`, or neither (from the head). */
export interface PollRequest {
    filter?: Filter;
    since?: number;
    consumer_id?: string;
    /** At most this many events (the server caps it). */
    limit?: number;
    /** Hold the request open up to this long until an event matches. */
    wait_ms?: number;
}
/** One page of a poll. */
export interface PollPage {
    events: Envelope[];
    /** Where the next poll starts (and what to acknowledge once these are handled). */
    next_since: number;
    has_more: boolean;
    /** The resume point could not be served whole (the events go on after it). */
    gap?: ReplayGap;
}
/** One poll of `POST /v1/poll`. */
export declare function poll(request: PollRequest, options?: ClientOptions): Promise<PollPage>;
/** What {@link Consumer.run} does between pages. */
export interface RunOptions {
    /** Events per page. */
    limit?: number;
    /** Long-poll time per request (default 25 s). */
    wait_ms?: number;
    /** Stops the loop (after the page in hand is handled and acknowledged). */
    signal?: AbortSignal;
    backoff?: Backoff;
    /**
     * A page says its resume point could not be served whole: history
     * pruned, or lost by the server's store in a failover (`history_lost`:
     * events handled after `fork` are gone). Called before the page's events.
     */
    onGap?: (gap: ReplayGap) => void | Promise<void>;
}
/**
 * A durable consumer: the server keeps its filter and a cursor that moves
 * only on {@link Consumer.ack}, so a worker that stops resumes where its last
 * acknowledgement left it, and two workers sharing an id are safe.
 */
export declare class Consumer {
    readonly id: string;
    readonly filter: Filter;
    private readonly options;
    /** Acknowledged up to here (as far as this object knows). */
    cursor: number | null;
    constructor(id: string, filter?: Filter, options?: ClientOptions);
    /** The next page after the stored cursor (or after `since`, which also confirms it). */
    next(request?: Omit<PollRequest, "consumer_id" | "filter">): Promise<PollPage>;
    /** Confirms everything up to `cursor`; the server never moves it backwards or past the head. */
    ack(cursor: number): Promise<number>;
    /** Removes the consumer and its cursor from the server. */
    delete(): Promise<void>;
    /**
     * Long-polls and hands each event to `handler`, acknowledging a page once
     * every event of it is handled; a handler that throws stops the loop with
     * that page unacknowledged (so it comes again). Transient errors are
     * retried with backoff; a refusal rejects.
     *
     * It keeps the last id it handled: a page that starts at or below it
     * means the server's cursor went back (an acknowledgement lost with a
     * process, or rolled back with the database in a failover), and the
     * consumer asks again from that id (`since`), so a point the store lost
     * is told to `onGap` rather than handed the survivors twice.
     */
    run(handler: (event: Envelope) => void | Promise<void>, options?: RunOptions): Promise<void>;
}
/** A `system/identity` entity: the public half of a device key. */
export interface Identity {
    type: "system/identity";
    data: {
        algorithm: "ed25519";
        public_key: string;
    };
}
/** A device's Ed25519 key: what signs its auth and acks. */
export interface DeviceKey {
    identity: Identity;
    privateKey: CryptoKey;
}
/** A device key as JWKs, to keep (in IndexedDB, a file, a keychain) and import again. */
export interface DeviceKeyJwk {
    private: JsonWebKey;
    public: JsonWebKey;
}
/** A new device key, and its JWKs to keep. */
export declare function createDeviceKey(): Promise<{
    key: DeviceKey;
    jwk: DeviceKeyJwk;
}>;
/** A device key from the JWKs {@link createDeviceKey} gave. */
export declare function importDeviceKey(jwk: DeviceKeyJwk): Promise<DeviceKey>;
/**
 * RFC 8785 canonical JSON of a JSON value: object keys sorted by UTF-16 code
 * units, no whitespace, numbers and strings as ECMAScript writes them, which
 * is what the RFC specifies.
 */
export declare function canonicalJson(value: unknown): string;
/** The `origin_proof` of a signed call: the key's signature over `sha256:<hex>` of the canonical `{method, body, nonce}`. */
export declare function originProof(key: DeviceKey, method: string, body: unknown, nonce: string): Promise<{
    identity: Identity;
    signature: string;
}>;
/** How {@link connect} is told what happens. */
export interface ConnectOptions extends ClientOptions {
    /** This device's id: with the key's identity, it names the cursor on the server. */
    deviceId: string;
    key: DeviceKey;
    filter?: Filter;
    /**
     * Where a device the server does not know yet starts (exclusive); a known
     * device resumes from its stored cursor. Without it a new device starts at
     * the head.
     */
    cursor?: number;
    /**
     * Each event in seq order, once; it is acknowledged once the returned
     * promise resolves. A handler that throws ends the connection, and the
     * event comes again after the reconnect.
     */
    onEvent: (seq: number, event: Envelope) => void | Promise<void>;
    onGap?: (gap: ReplayGap) => void;
    /** The server confirmed the device's cursor up to here. */
    onAck?: (cursor: number) => void;
    onState?: (state: State) => void;
    /** A refusal (bad proof, bad token, invalid filter, protocol close): closed, never retried. */
    onRejected?: (error: TidingsError) => void;
    /** Catch-up page size. */
    pageSize?: number;
    backoff?: Backoff;
    /** A `WebSocket` to use instead of the global one. */
    WebSocket?: typeof WebSocket;
}
/** A device connection that reconnects by itself. */
export interface Connection {
    /** The highest seq delivered to `onEvent`. */
    readonly highWater: number;
    /** The cursor the server confirmed last (`null` before the first answer). */
    readonly cursor: number | null;
    readonly state: State;
    /** Resolves once the connection is caught up (and again is after each reconnect). */
    ready(): Promise<void>;
    close(): void;
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
/**
 * Connects a device over `GET /v1/ws` (docs/ref-websocket.md):
 * authenticates with an Ed25519 proof over the server's nonce, catches up
 * from the stored cursor with `sync.delta`, then follows realtime
 * `stream.event`s; acknowledges what `onEvent` handled; reconnects with
 * backoff carrying its cursor after a lost connection, a slow-consumer
 * close or a shutdown, and never after a rejection.
 */
export declare function connect(options: ConnectOptions): Connection;
