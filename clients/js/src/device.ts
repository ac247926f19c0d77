/**
 * The WebSocket device transport (JSON-RPC 2.0, docs/ref-websocket.md):
 * device keys (WebCrypto Ed25519), the signed proofs of auth and acks, and
 * a connection that catches up, follows realtime, acknowledges and
 * reconnects with its cursor, never after a rejection.
 *
 * @module
 */

import { delay, sleep, type Backoff, type Delay } from "./backoff.js";
import { CLOSE, FINAL_RPC_ERRORS, METHOD, REFUSING_CLOSES, TidingsError } from "./codes.js";
import { currentToken, endpoint, fetcher, headers, refusal, report, type ClientOptions } from "./http.js";
import type { Envelope, Filter, ReplayGap, State } from "./types.js";

/** A `system/identity` entity: the public half of a device key. */
export interface Identity {
  type: "system/identity";
  data: { algorithm: "ed25519"; public_key: string };
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

const b64 = (bytes: ArrayBuffer): string => {
  let s = "";
  for (const b of new Uint8Array(bytes)) s += String.fromCharCode(b);
  return btoa(s);
};
const hex = (bytes: ArrayBuffer): string => [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");

async function fromPair(privateKey: CryptoKey, publicKey: CryptoKey): Promise<DeviceKey> {
  const raw = await crypto.subtle.exportKey("raw", publicKey);
  return { privateKey, identity: { type: "system/identity", data: { algorithm: "ed25519", public_key: b64(raw) } } };
}

/** A new device key, and its JWKs to keep. */
export async function createDeviceKey(): Promise<{ key: DeviceKey; jwk: DeviceKeyJwk }> {
  const pair = (await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"])) as CryptoKeyPair;
  const jwk = { private: await crypto.subtle.exportKey("jwk", pair.privateKey), public: await crypto.subtle.exportKey("jwk", pair.publicKey) };
  return { key: await fromPair(pair.privateKey, pair.publicKey), jwk };
}

/** A device key from the JWKs {@link createDeviceKey} gave. */
export async function importDeviceKey(jwk: DeviceKeyJwk): Promise<DeviceKey> {
  const privateKey = await crypto.subtle.importKey("jwk", jwk.private, { name: "Ed25519" }, false, ["sign"]);
  const publicKey = await crypto.subtle.importKey("jwk", jwk.public, { name: "Ed25519" }, true, ["verify"]);
  return fromPair(privateKey, publicKey);
}

/**
 * RFC 8785 canonical JSON of a JSON value: object keys sorted by UTF-16 code
 * units, no whitespace, numbers and strings as ECMAScript writes them, which
 * is what the RFC specifies.
 */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const o = value as Record<string, unknown>;
    const keys = Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(",")}}`;
  }
  if (typeof value === "number" && !Number.isFinite(value)) throw new TypeError("tidings: a non-finite number has no JSON form");
  return JSON.stringify(value);
}

/** The `origin_proof` of a signed call: the key's signature over `sha256:<hex>` of the canonical `{method, body, nonce}`. */
export async function originProof(key: DeviceKey, method: string, body: unknown, nonce: string): Promise<OriginProof> {
  const encoder = new TextEncoder();
  const digest = await crypto.subtle.digest("SHA-256", encoder.encode(canonicalJson({ method, body, nonce })));
  const signature = await crypto.subtle.sign({ name: "Ed25519" }, key.privateKey, encoder.encode(`sha256:${hex(digest)}`));
  return { identity: key.identity, signature: b64(signature) };
}

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
export function connect(options: ConnectOptions): Connection {
  const WS = options.WebSocket ?? (globalThis as { WebSocket?: typeof WebSocket }).WebSocket;
  if (!WS) throw new TypeError("tidings: no WebSocket available (Node 20 needs --experimental-websocket)");
  // A missing url is the caller's mistake: said now, never retried.
  endpoint(options, "/v1/ws");
  const c = new DeviceConnection(options, WS);
  c.open();
  return c;
}

interface Pending {
  resolve: (value: unknown) => void;
  reject: (error: unknown) => void;
}

class Lost extends Error {}

class DeviceConnection implements Connection {
  highWater = 0;
  /** A starting cursor was given (0 included): it goes along even at 0. */
  private cursorGiven = false;
  cursor: number | null = null;
  state: State = "connecting";
  private stopped = false;
  /** Aborted by `close()`: ends a wait before reconnecting. */
  private readonly stop = new AbortController();
  private socket: WebSocket | null = null;
  private readonly delay: Delay;
  private readonly waiters: { resolve: () => void; reject: (error: unknown) => void }[] = [];
  private caughtUp = false;
  /** The refusal that stopped the connection, if one did. */
  private rejection: TidingsError | null = null;
  /** Messages are handled one at a time, in order, across reconnects too. */
  private chain: Promise<void> = Promise.resolve();

  constructor(
    private readonly options: ConnectOptions,
    private readonly WS: typeof WebSocket,
  ) {
    this.delay = delay(options.backoff);
    if (options.cursor !== undefined) {
      this.highWater = options.cursor;
      this.cursorGiven = true;
    }
  }

  ready(): Promise<void> {
    if (this.caughtUp) return Promise.resolve();
    if (this.stopped) return Promise.reject(this.rejection ?? new Error("tidings: the connection is closed"));
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  close(): void {
    this.stopped = true;
    this.stop.abort();
    this.caughtUp = false;
    this.socket?.close(CLOSE.NORMAL);
    this.setState("closed");
    this.settle(new Error("tidings: the connection was closed"));
  }

  /** Resolves the `ready()` waiters, or rejects them with `error`. */
  private settle(error?: unknown): void {
    for (const w of this.waiters.splice(0)) {
      if (error === undefined) w.resolve();
      else w.reject(error);
    }
  }

  private setState(state: State): void {
    if (this.state === state) return;
    this.state = state;
    this.options.onState?.(state);
  }

  open(): void {
    if (this.stopped) return;
    this.setState("connecting");
    this.caughtUp = false;
    // A fresh token for every connection (the function's, when it is one).
    void currentToken(this.options).then(
      (token) => this.openWith(token),
      (error) => {
        report(error);
        this.retry();
      },
    );
  }

  private openWith(token: string | undefined): void {
    if (this.stopped) return;
    const url = endpoint(this.options, "/v1/ws", { access_token: token });
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const socket = new this.WS(url.toString());
    this.socket = socket;
    const pending = new Map<number, Pending>();
    let nextId = 1;
    let rejection: TidingsError | null = null;
    let nonce = "";
    let hello = false;
    // Set once a handler failed on this connection: what it still brings is
    // dropped, and the next connection resumes before the failed event.
    let broken = false;
    // Realtime events that arrive while catch-up runs wait here; duplicates
    // of catch-up are dropped by the high-water mark.
    const rpc = (method: string, params: unknown): Promise<unknown> =>
      new Promise((resolve, reject) => {
        if (socket.readyState !== this.WS.OPEN) return reject(new Lost());
        const id = nextId++;
        pending.set(id, { resolve, reject });
        socket.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
      });
    let acking = false;
    let ackWanted = 0;
    const ack = async (seq: number) => {
      ackWanted = Math.max(ackWanted, seq);
      if (acking) return;
      acking = true;
      try {
        while (ackWanted > (this.cursor ?? 0) && !this.stopped) {
          const body: AckBody = { seq: ackWanted };
          const params: AckParams = { body, origin_proof: await originProof(this.options.key, METHOD.ACK, body, nonce) };
          const answer = (await rpc(METHOD.ACK, params)) as AckAnswer;
          this.cursor = Math.max(this.cursor ?? 0, answer.cursor);
          this.options.onAck?.(this.cursor);
          if (answer.cursor < body.seq) break; // capped at the head: nothing more to confirm now
        }
      } catch {
        // The connection went; the next one resumes from the stored cursor.
      } finally {
        acking = false;
      }
    };
    const take = async (seq: number, event: Envelope) => {
      if (this.stopped || seq <= this.highWater) return;
      // Past it (and acknowledged) only once the handler is done: a handler
      // that throws ends the connection, and the event comes again.
      await this.options.onEvent(seq, event);
      this.highWater = seq;
    };
    const gap = (g: ReplayGap) => this.options.onGap?.(g);
    const handshake = async () => {
      const body: AuthBody = { device_id: this.options.deviceId };
      if (this.options.filter && Object.keys(this.options.filter).length) body.filter = this.options.filter;
      // The high-water mark goes along: a device whose acks never landed
      // would otherwise start at the head, past what came while it was away.
      // A cursor given as 0 goes too: the device starts at the beginning,
      // not at the head.
      if (this.highWater > 0 || this.cursorGiven) body.cursor = this.highWater;
      const auth: AuthParams = { body, origin_proof: await originProof(this.options.key, METHOD.AUTH, body, nonce) };
      const { head_seq: head, cursor } = (await rpc(METHOD.AUTH, auth)) as AuthAnswer;
      this.cursor = cursor;
      // A high-water mark past the head (a server that lost its log, or
      // another server's ids): what comes after the head is new.
      if (this.highWater > head) this.highWater = Math.min(cursor, head);
      let from = Math.max(cursor, 0);
      while (from < head) {
        const delta: DeltaParams = { device_id: this.options.deviceId, since: from, limit: this.options.pageSize ?? 500 };
        const page = (await rpc(METHOD.DELTA, delta)) as DeltaPage;
        if (page.gap) gap(page.gap);
        for (const item of page.items) await take(item.seq, item.event);
        void ack(this.highWater);
        if (page.next_since <= from && !page.has_more) break;
        from = page.next_since;
        if (!page.has_more && from >= head) break;
      }
      this.delay.reset();
      this.caughtUp = true;
      this.setState("open");
      this.settle();
    };
    const finalRpc = (error: TidingsError) => error.rpcCode !== undefined && FINAL_RPC_ERRORS.has(error.rpcCode);
    socket.onmessage = (m: MessageEvent) => {
      let msg: { id?: number | null; method?: string; params?: Record<string, unknown>; result?: unknown; error?: { code: number; message: string; data?: { code?: string } } };
      try {
        msg = JSON.parse(String(m.data));
      } catch {
        return;
      }
      // Answers settle at once (catch-up awaits them); notifications queue.
      if (msg.method === undefined) {
        const error = msg.error ? new TidingsError(0, msg.error.data?.code ?? "rpc_error", msg.error.message, msg.error, { rpcCode: msg.error.code }) : null;
        if (msg.id === null || msg.id === undefined) {
          // About the connection: a refused token is final; anything else
          // (the live session could not open) ends this connection and the
          // next one tries again.
          if (error) {
            if (finalRpc(error)) rejection = error;
            for (const p of pending.values()) p.reject(error);
            pending.clear();
            socket.close(CLOSE.NORMAL);
          }
          return;
        }
        const p = pending.get(msg.id);
        if (!p) return;
        pending.delete(msg.id);
        if (error) p.reject(error);
        else p.resolve(msg.result);
        return;
      }
      const params = msg.params ?? {};
      if (msg.method === METHOD.HELLO) {
        nonce = String((params as unknown as Hello).nonce);
        hello = true;
        // Realtime events queue behind the catch-up (the server sends none
        // before it, but the order holds either way).
        this.chain = this.chain
          .then(handshake)
          .catch((error) => {
            if (error instanceof Lost) return;
            // A refusal is final; anything else (a transient error, a
            // handler that threw) ends this connection and the next one
            // resumes from the cursor.
            if (error instanceof TidingsError && finalRpc(error)) rejection = error;
            else report(error);
            broken = true;
            socket.close(CLOSE.NORMAL);
          });
        return;
      }
      this.chain = this.chain
        .then(async () => {
          if (broken) return;
          if (msg.method === METHOD.EVENT) {
            const event = params as unknown as DeviceEvent;
            const seq = Number(event.seq);
            await take(seq, event.event);
            void ack(this.highWater);
          } else if (msg.method === METHOD.GAP) {
            gap(params as unknown as ReplayGap);
          } else if (msg.method === METHOD.TOKEN_EXPIRED && typeof this.options.token === "function") {
            // The same connection goes on under a fresh token; should the
            // server refuse it, a new connection asks for one again.
            try {
              const reauth: ReauthParams = { token: (await currentToken(this.options)) ?? "" };
              await rpc(METHOD.REAUTH, reauth);
            } catch (error) {
              if (!(error instanceof Lost)) report(error);
              socket.close(CLOSE.NORMAL);
            }
          }
        })
        .catch((error) => {
          broken = true;
          report(error);
          socket.close(CLOSE.NORMAL);
        });
    };
    socket.onclose = (e: CloseEvent) => {
      for (const p of pending.values()) p.reject(new Lost());
      pending.clear();
      if (this.socket !== socket) return;
      this.caughtUp = false;
      if (this.stopped) return this.setState("closed");
      if (!hello && !rejection) {
        // Refused before the protocol began: a browser does not show the
        // upgrade's status, so one plain request asks (401/403 are final).
        void this.diagnose(url).then((refused) => (refused ? this.rejected(refused) : this.retry()));
        return;
      }
      if (rejection || REFUSING_CLOSES.has(e.code)) {
        return this.rejected(rejection ?? new TidingsError(0, e.reason || "protocol_error", `closed with ${e.code}`, undefined, { closeCode: e.code }));
      }
      this.retry();
    };
  }

  private retry(): void {
    if (this.stopped) return;
    this.setState("connecting");
    void sleep(this.delay.take(), this.stop.signal, true).then(() => this.open());
  }

  private rejected(error: TidingsError): void {
    this.rejection = error;
    this.stopped = true;
    this.setState("closed");
    this.settle(error);
    this.options.onRejected?.(error);
  }

  private async diagnose(url: URL): Promise<TidingsError | null> {
    const http = new URL(url);
    http.protocol = http.protocol === "wss:" ? "https:" : "http:";
    try {
      const response = await fetcher(this.options)(http, { headers: await headers(this.options) });
      if (response.status === 401 || response.status === 403) return refusal(response);
      await response.body?.cancel();
    } catch {
      // Unreachable: retried.
    }
    return null;
  }
}
