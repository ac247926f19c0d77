/**
 * The WebSocket device transport (JSON-RPC 2.0, docs/ref-websocket.md):
 * device keys (WebCrypto Ed25519), the signed proofs of auth and acks, and
 * a connection that catches up, follows realtime, acknowledges and
 * reconnects with its cursor, never after a rejection.
 *
 * @module
 */
import { type Backoff } from "./backoff.js";
import { TidingsError } from "./codes.js";
import { type ClientOptions } from "./http.js";
import type { Envelope, Filter, ReplayGap, State } from "./types.js";
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
export declare function originProof(key: DeviceKey, method: string, body: unknown, nonce: string): Promise<OriginProof>;
/** A device's signature over one call (`origin_proof`). */
export interface OriginProof {
    identity: Identity;
    signature: string;
}
/** What a device's `stream.auth` signs. */
export interface AuthBody {
    device_id: string;
    /** Where a device the server does not know starts (exclusive); the high-water mark of a known one. */
    cursor?: number;
    filter?: Filter;
}
/** `stream.auth`'s params. */
export interface AuthParams {
    body: AuthBody;
    origin_proof: OriginProof;
}
/** `sync.delta`'s params: the page after `since`. */
export interface DeltaParams {
    device_id: string;
    since: number;
    limit?: number;
}
/** What a device's `stream.ack` signs. */
export interface AckBody {
    seq: number;
}
/** `stream.ack`'s params. */
export interface AckParams {
    body: AckBody;
    origin_proof: OriginProof;
}
/** `stream.reauth`'s params: a fresh token for the same subject. */
export interface ReauthParams {
    token: string;
}
/** `stream.hello`'s params: the server's first message on a device connection. */
export interface Hello {
    server_did: string;
    head_seq: number;
    profiles: string[];
    /** What the device's `stream.auth` proof signs. */
    nonce: string;
}
/** `stream.auth`'s result: catch up from `cursor` to `head_seq`. */
export interface AuthAnswer {
    head_seq: number;
    cursor: number;
}
/** One event of a catch-up page, and `stream.event`'s params. */
export interface DeviceEvent {
    seq: number;
    event: Envelope;
}
/** `sync.delta`'s result: one catch-up page. */
export interface DeltaPage {
    items: DeviceEvent[];
    next_since: number;
    has_more: boolean;
    gap?: ReplayGap;
}
/** `stream.ack`'s result: the cursor the server stored. */
export interface AckAnswer {
    cursor: number;
}
/** `stream.token_expired`'s params: live delivery stops until a `stream.reauth`. */
export interface DeviceTokenExpired {
    last_seq: number;
    reauth_by_ms: number;
}
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
/**
 * Connects a device over `GET /v1/ws` (docs/ref-websocket.md):
 * authenticates with an Ed25519 proof over the server's nonce, catches up
 * from the stored cursor with `sync.delta`, then follows realtime
 * `stream.event`s; acknowledges what `onEvent` handled; reconnects with
 * backoff carrying its cursor after a lost connection, a slow-consumer
 * close or a shutdown, and never after a rejection.
 */
export declare function connect(options: ConnectOptions): Connection;
