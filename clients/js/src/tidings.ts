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

function baseUrl(options: ClientOptions): URL {
  if (options.url !== undefined) return new URL(String(options.url));
  const here = (globalThis as { location?: { origin: string } }).location;
  if (here) return new URL(here.origin);
  throw new TypeError("tidings: no url given, and not in a page");
}

function endpoint(options: ClientOptions, path: string, query: Record<string, string | undefined> = {}): URL {
  const url = new URL(path, baseUrl(options));
  for (const [name, value] of Object.entries(query)) if (value !== undefined) url.searchParams.set(name, value);
  return url;
}

function fetcher(options: ClientOptions): typeof fetch {
  const f = options.fetch ?? globalThis.fetch;
  if (!f) throw new TypeError("tidings: no fetch available");
  return f.bind(globalThis);
}

/** The token to send now: the fixed one, or a fresh one from the function. */
async function currentToken(options: ClientOptions): Promise<string | undefined> {
  const t = options.token;
  return typeof t === "function" ? await t() : t;
}

async function headers(options: ClientOptions, extra: Record<string, string> = {}): Promise<Record<string, string>> {
  const token = await currentToken(options);
  return token ? { ...extra, authorization: `Bearer ${token}` } : extra;
}

function filterQuery(filter: Filter): string | undefined {
  return Object.keys(filter).length ? JSON.stringify(filter) : undefined;
}

/** Reads a refusal's `{error, message}` body into a {@link TidingsError}. */
async function refusal(response: Response): Promise<TidingsError> {
  let body: unknown = undefined;
  try {
    body = await response.json();
  } catch {
    // Not JSON (a proxy's page, say): the status alone speaks.
  }
  const b = (body ?? {}) as { error?: unknown; message?: unknown };
  const code = typeof b.error === "string" ? b.error : `http_${response.status}`;
  const message = typeof b.message === "string" ? b.message : response.statusText;
  return new TidingsError(response.status, code, message, body);
}

async function call<T>(options: ClientOptions, method: string, url: URL, body?: unknown): Promise<T> {
  const init: RequestInit = { method, headers: await headers(options, body === undefined ? {} : { "content-type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetcher(options)(url, init);
  if (!response.ok) throw await refusal(response);
  return (response.status === 204 ? undefined : await response.json()) as T;
}

/** A refusal the same request would meet again: not retried. */
function isFinal(status: number): boolean {
  return status >= 400 && status < 500 && status !== 408 && status !== 429;
}

const sleep = (ms: number, signal: AbortSignal): Promise<void> =>
  new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });

/** Reconnection delay: doubles from `initialMs` up to `maxMs`, with jitter in [½, 1]. */
export interface Backoff {
  initialMs?: number;
  maxMs?: number;
}

class Delay {
  private next: number;
  constructor(private readonly backoff: Required<Backoff>) {
    this.next = backoff.initialMs;
  }
  take(): number {
    const ms = this.next * (0.5 + Math.random() / 2);
    this.next = Math.min(this.next * 2, this.backoff.maxMs);
    return ms;
  }
  reset(): void {
    this.next = this.backoff.initialMs;
  }
}

const delay = (b: Backoff = {}) => new Delay({ initialMs: b.initialMs ?? 250, maxMs: b.maxMs ?? 10_000 });

// ---------------------------------------------------------------------------
// Publishing

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

/** A new random Idempotency-Key: 32 hex digits. */
function newKey(): string {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
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
export type Published = number[] & { readonly replayed: boolean };

/**
 * The answers a publish retries under its key: the store unavailable
 * (503), a proxy's passing failures (502, 504), a request timeout (408) and a
 * rate limit (429, after its Retry-After), as the Python client does. Any other refusal is final.
 */
const RETRIED_STATUSES: ReadonlySet<number> = new Set([408, 429, 502, 503, 504]);

export async function publish(events: NewEvent | NewEvent[], options: PublishOptions = {}): Promise<Published> {
  const body = JSON.stringify(Array.isArray(events) ? { events } : events);
  const key = options.idempotencyKey ?? newKey();
  const retries = options.retries ?? 5;
  const wait = delay(options.backoff);
  const never = new AbortController().signal;
  for (let attempt = 0; ; attempt++) {
    let failure: unknown;
    let atLeastMs = 0;
    try {
      const response = await fetcher(options)(endpoint(options, "/v1/events"), {
        method: "POST",
        headers: await headers(options, { "content-type": "application/json", "idempotency-key": key }),
        body,
      });
      if (response.ok) {
        const ids = ((await response.json()) as { event_ids: number[] }).event_ids;
        return Object.assign(ids, { replayed: response.headers.get("idempotent-replayed") === "true" });
      }
      const refused = await refusal(response);
      if (!RETRIED_STATUSES.has(response.status)) throw refused;
      failure = refused;
      atLeastMs = 1000 * Math.min(Number(response.headers.get("retry-after")) || 0, 30);
    } catch (e) {
      if (e instanceof TidingsError && !RETRIED_STATUSES.has(e.status)) throw e;
      // A lost connection (or an answer cut short): the same key again.
      failure = e;
    }
    if (attempt >= retries) throw failure;
    await sleep(Math.max(wait.take(), atLeastMs), never);
  }
}

// ---------------------------------------------------------------------------
// Streams (Server-Sent Events)

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

const NOTICES = ["system.replay_gap", "system.client_dropped_slow", "system.token_expired"] as const;

/**
 * Follows the events that match `filter`, live, resuming after any
 * disconnect from the last event delivered: nothing missed, nothing twice.
 */
export function stream(filter: Filter, options: StreamOptions): Stream {
  const ES = options.EventSource ?? (globalThis as { EventSource?: typeof EventSource }).EventSource;
  const transport = options.transport ?? (ES && !options.token ? "eventsource" : "fetch");
  // A missing url or fetch is the caller's mistake: said now, never retried.
  endpoint(options, "/v1/stream");
  if (transport === "fetch") fetcher(options);
  const s = new StreamState(filter, options);
  if (transport === "eventsource") {
    if (!ES) throw new TypeError("tidings: no EventSource available; use transport: \"fetch\"");
    s.overEventSource(ES);
  } else {
    void s.overFetch();
  }
  return s;
}

class StreamState implements Stream {
  lastEventId: number | null = null;
  state: State = "connecting";
  private readonly stop = new AbortController();
  private source: EventSource | null = null;
  /** The `EventSource` class in use (reopened with a fresh token). */
  private eventSource: typeof EventSource | null = null;
  /** Frames are handled one at a time, in order, across reconnects too. */
  private chain: Promise<void> = Promise.resolve();
  private readonly delay: Delay;

  constructor(
    private readonly filter: Filter,
    private readonly options: StreamOptions,
  ) {
    this.delay = delay(options.backoff);
  }

  close(): void {
    this.stop.abort();
    this.source?.close();
    this.setState("closed");
  }

  private setState(state: State): void {
    if (this.state === state || (this.state === "closed" && this.stop.signal.aborted)) return;
    this.state = state;
    this.options.onState?.(state);
  }

  private async url(accessToken: boolean): Promise<URL> {
    const from = this.lastEventId ?? this.options.since;
    return endpoint(this.options, "/v1/stream", {
      filter: filterQuery(this.filter),
      since: from === undefined ? undefined : String(from),
      access_token: accessToken ? await currentToken(this.options) : undefined,
    });
  }

  /** One frame of the stream; resolves once its handler has. */
  private async frame(event: string, data: string, id: string | undefined): Promise<void> {
    if (this.stop.signal.aborted) return;
    if (event === "message") {
      const envelope = JSON.parse(data) as Envelope;
      const seq = id !== undefined && id !== "" ? Number(id) : envelope.event_id;
      if (this.lastEventId !== null && seq <= this.lastEventId) return;
      // Past it only once the handler is done: on `fetch`, a handler that
      // throws ends the connection and the event comes again.
      await this.options.onEvent(envelope);
      this.lastEventId = seq;
    } else if (event === "system.replay_gap") {
      const gap = JSON.parse(data) as ReplayGap;
      // A resume point past the head (a server that lost its log, another
      // server's ids): the stream goes on from the head, and what comes
      // after it is new, whatever ids this client saw before.
      if (this.lastEventId !== null && gap.requested > gap.head) this.lastEventId = gap.head;
      // History after the fork was lost: the stream goes on after the fork,
      // and a later resume from there is told nothing again.
      if (this.lastEventId !== null && gap.reason === "history_lost" && gap.fork !== undefined) this.lastEventId = gap.fork;
      this.options.onGap?.(gap);
    } else if (event === "system.client_dropped_slow") {
      this.options.onDropped?.(JSON.parse(data) as DroppedNotice);
    } else if (event === "system.token_expired") {
      // The server ends the stream; the next connection asks the token
      // function for a fresh one. EventSource would retry with the old
      // one by itself: it is reopened instead.
      this.options.onNotice?.(event, JSON.parse(data) as unknown);
      if (this.source && this.eventSource) {
        this.source.close();
        this.source = null;
        this.overEventSource(this.eventSource);
      }
    } else {
      let value: unknown = data;
      try {
        value = JSON.parse(data);
      } catch {
        // A notice whose data is not JSON goes on as text.
      }
      this.options.onNotice?.(event, value);
    }
  }

  overEventSource(ES: typeof EventSource): void {
    this.eventSource = ES;
    void this.url(true).then(
      (url) => this.openEventSource(ES, url),
      (error) => {
        report(error);
        void sleep(this.delay.take(), this.stop.signal).then(() => this.overEventSource(ES));
      },
    );
  }

  private openEventSource(ES: typeof EventSource, url: URL): void {
    if (this.stop.signal.aborted) return;
    this.setState("connecting");
    const es = new ES(url.toString());
    this.source = es;
    const handle = (event: string) => (m: MessageEvent) => {
      this.chain = this.chain.then(() => this.frame(event, m.data as string, m.lastEventId)).catch(report);
    };
    es.onopen = () => {
      this.delay.reset();
      this.setState("open");
    };
    es.onmessage = handle("message");
    for (const name of NOTICES) es.addEventListener(name, handle(name) as EventListener);
    es.onerror = () => {
      // A source closed for a fresh token says nothing more.
      if (this.stop.signal.aborted || this.source !== es) return;
      // Still CONNECTING: EventSource retries by itself with Last-Event-ID.
      if (es.readyState !== ES.CLOSED) return this.setState("connecting");
      // Closed for good: a refusal (any non-200) or a wrong content type.
      // EventSource does not say which; one request with fetch does.
      es.close();
      void this.diagnose(ES);
    };
  }

  private async diagnose(ES: typeof EventSource): Promise<void> {
    const probe = new AbortController();
    const stop = () => probe.abort();
    this.stop.signal.addEventListener("abort", stop, { once: true });
    let final: TidingsError | null = null;
    try {
      const response = await fetcher(this.options)(await this.url(true), { headers: { accept: "text/event-stream" }, signal: probe.signal });
      if (!response.ok && isFinal(response.status)) final = await refusal(response);
    } catch {
      // Unreachable: try again after the delay.
    } finally {
      probe.abort();
      this.stop.signal.removeEventListener("abort", stop);
    }
    if (final) return this.refused(final);
    this.setState("connecting");
    await sleep(this.delay.take(), this.stop.signal);
    this.overEventSource(ES);
  }

  private refused(error: TidingsError): void {
    this.stop.abort();
    this.state = "closed";
    this.options.onState?.("closed");
    this.options.onError?.(error);
  }

  async overFetch(): Promise<void> {
    const signal = this.stop.signal;
    while (!signal.aborted) {
      this.setState("connecting");
      let wait: number;
      // This connection's own: whatever ends it (a handler's exception
      // too) closes the response, not just the reading.
      const connection = new AbortController();
      const end = () => connection.abort();
      signal.addEventListener("abort", end, { once: true });
      try {
        const response = await fetcher(this.options)(await this.url(false), {
          headers: await headers(this.options, { accept: "text/event-stream" }),
          signal: connection.signal,
          cache: "no-store",
        });
        if (!response.ok) {
          const error = await refusal(response);
          if (isFinal(response.status)) return this.refused(error);
          throw error;
        }
        if (!response.body) throw new TypeError("tidings: a stream response without a body");
        this.delay.reset();
        this.setState("open");
        const retry = await this.read(response.body);
        // The server ended the stream (a drop, a shutdown): come back after
        // its hint, jittered by the server itself at shutdown.
        wait = retry ?? this.delay.take();
      } catch (error) {
        if (signal.aborted) return;
        report(error);
        wait = this.delay.take();
      } finally {
        connection.abort();
        signal.removeEventListener("abort", end);
      }
      if (signal.aborted) return;
      this.setState("connecting");
      await sleep(wait, signal);
    }
  }

  /** Reads frames until the body ends; resolves to the last `retry:` hint. */
  private async read(body: ReadableStream<Uint8Array>): Promise<number | undefined> {
    const reader = body.getReader();
    const parser = new SseParser();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        for (const f of parser.push(value)) await this.frame(f.event, f.data, f.id);
      }
    } finally {
      reader.releaseLock();
    }
    return parser.retry;
  }
}

function report(error: unknown): void {
  // A handler's own exception or a lost connection: shown, not fatal.
  if (typeof console !== "undefined" && !(error instanceof DOMException && error.name === "AbortError")) console.warn("tidings:", error);
}

/** One dispatched Server-Sent Events frame (what [SseParser] hands out). */
export interface Frame {
  event: string;
  data: string;
  id: string | undefined;
}

/**
 * The longest line of an event stream the client holds: a server's
 * envelopes are far smaller (`TIDINGS_MAX_PAYLOAD`, 64 KiB by default). A
 * longer one is a broken stream: the client resumes from its last event.
 */
const MAX_LINE = 4 * 1024 * 1024;
/** The most data one event may gather over its `data:` lines. */
const MAX_EVENT = 8 * 1024 * 1024;

/**
 * The event-stream parser of the HTML standard (§9.2.6), fed with bytes.
 * Bounded: a line or an event past the bounds throws (the stream is then
 * broken and resumed) rather than growing without end, in time linear
 * in what arrives, however it is cut.
 */
export class SseParser {
  /** The last `retry:` value, in milliseconds. */
  retry: number | undefined;
  private readonly decoder = new TextDecoder();
  /** The unterminated rest of the stream, in pieces. */
  private parts: string[] = [];
  private partsLength = 0;
  private started = false;
  private data: string[] = [];
  private dataLength = 0;
  private event = "";
  private id: string | undefined;
  private lastId: string | undefined;

  push(bytes: Uint8Array): Frame[] {
    let text = this.decoder.decode(bytes, { stream: true });
    if (!this.started && text.length) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    const last = this.parts.length ? this.parts[this.parts.length - 1]! : "";
    if (!text.includes("\n") && !text.includes("\r") && !last.endsWith("\r")) {
      // No line end yet: keep the piece; join only once one arrives
      // (appending to one string would copy it every time).
      this.parts.push(text);
      this.partsLength += text.length;
      if (this.partsLength > MAX_LINE) throw new Error(`tidings: a stream line past ${MAX_LINE} characters; resuming`);
      return [];
    }
    const buffer = this.parts.join("") + text;
    this.parts = [];
    this.partsLength = 0;
    const frames: Frame[] = [];
    let start = 0;
    // The next CR and LF, each searched again only once passed: every
    // character is looked at a bounded number of times.
    let cr = buffer.indexOf("\r");
    let lf = buffer.indexOf("\n");
    for (;;) {
      if (cr !== -1 && cr < start) cr = buffer.indexOf("\r", start);
      if (lf !== -1 && lf < start) lf = buffer.indexOf("\n", start);
      let end: number;
      let next: number;
      if (cr !== -1 && (lf === -1 || cr < lf)) {
        // A CR at the very end may be the first half of a CRLF.
        if (cr === buffer.length - 1) break;
        end = cr;
        next = buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
      } else if (lf !== -1) {
        end = lf;
        next = lf + 1;
      } else {
        break;
      }
      const frame = this.line(buffer.slice(start, end));
      if (frame) frames.push(frame);
      start = next;
    }
    const rest = buffer.slice(start);
    if (rest) {
      this.parts.push(rest);
      this.partsLength = rest.length;
    }
    if (this.partsLength > MAX_LINE) throw new Error(`tidings: a stream line past ${MAX_LINE} characters; resuming`);
    return frames;
  }

  private line(line: string): Frame | null {
    if (line === "") {
      const frame = this.data.length ? { event: this.event || "message", data: this.data.join("\n"), id: this.id ?? this.lastId } : null;
      if (this.id !== undefined) this.lastId = this.id;
      this.data = [];
      this.dataLength = 0;
      this.event = "";
      this.id = undefined;
      return frame;
    }
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") {
      this.dataLength += value.length + 1;
      if (this.dataLength > MAX_EVENT) throw new Error(`tidings: a stream event past ${MAX_EVENT} characters; resuming`);
      this.data.push(value);
    }
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
    else if (field === "retry" && /^\d{1,9}$/.test(value)) this.retry = Number(value);
    return null;
  }
}

// ---------------------------------------------------------------------------
// Polls and durable consumers

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
export async function poll(request: PollRequest, options: ClientOptions = {}): Promise<PollPage> {
  return call<PollPage>(options, "POST", endpoint(options, "/v1/poll"), request);
}

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
export class Consumer {
  /** Acknowledged up to here (as far as this object knows). */
  cursor: number | null = null;

  constructor(
    readonly id: string,
    readonly filter: Filter = {},
    private readonly options: ClientOptions = {},
  ) {}

  /** The next page after the stored cursor (or after `since`, which also confirms it). */
  async next(request: Omit<PollRequest, "consumer_id" | "filter"> = {}): Promise<PollPage> {
    const body: PollRequest = { ...request, consumer_id: this.id };
    if (Object.keys(this.filter).length) body.filter = this.filter;
    return poll(body, this.options);
  }

  /** Confirms everything up to `cursor`; the server never moves it backwards or past the head. */
  async ack(cursor: number): Promise<number> {
    const answer = await call<{ cursor: number }>(this.options, "POST", endpoint(this.options, `/v1/consumers/${encodeURIComponent(this.id)}/ack`), { cursor });
    this.cursor = answer.cursor;
    return answer.cursor;
  }

  /** Removes the consumer and its cursor from the server. */
  async delete(): Promise<void> {
    await call<void>(this.options, "DELETE", endpoint(this.options, `/v1/consumers/${encodeURIComponent(this.id)}`));
  }

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
  async run(handler: (event: Envelope) => void | Promise<void>, options: RunOptions = {}): Promise<void> {
    const d = delay(options.backoff);
    const limit = options.limit ? { limit: options.limit } : {};
    let handled: number | null = null;
    while (!options.signal?.aborted) {
      let page: PollPage;
      // A gap the server told with a page handed again (it tells once).
      let told: ReplayGap | undefined;
      try {
        page = await this.next({ wait_ms: options.wait_ms ?? 25_000, ...limit });
        const first = page.events[0];
        if (handled !== null && first !== undefined && first.event_id <= handled) {
          told = page.gap;
          page = await this.next({ since: handled, ...limit });
        }
      } catch (error) {
        if (error instanceof TidingsError && isFinal(error.status)) throw error;
        await sleep(d.take(), options.signal ?? new AbortController().signal);
        continue;
      }
      d.reset();
      if (told) await options.onGap?.(told);
      if (page.gap) await options.onGap?.(page.gap);
      for (const event of page.events) {
        await handler(event);
        handled = event.event_id;
      }
      // Acknowledged once; again only after an error (a server that
      // answers a cursor short of it, at its head, is not asked again).
      while (this.cursor === null || page.next_since > this.cursor) {
        try {
          await this.ack(page.next_since);
          break;
        } catch (error) {
          if (error instanceof TidingsError && isFinal(error.status)) throw error;
          // Stopped: the page stays unacknowledged and comes again.
          if (options.signal?.aborted) return;
          await sleep(d.take(), options.signal ?? new AbortController().signal);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// WebSocket device transport (JSON-RPC 2.0)

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
export async function originProof(key: DeviceKey, method: string, body: unknown, nonce: string): Promise<{ identity: Identity; signature: string }> {
  const encoder = new TextEncoder();
  const digest = await crypto.subtle.digest("SHA-256", encoder.encode(canonicalJson({ method, body, nonce })));
  const signature = await crypto.subtle.sign({ name: "Ed25519" }, key.privateKey, encoder.encode(`sha256:${hex(digest)}`));
  return { identity: key.identity, signature: b64(signature) };
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
          const body = { seq: ackWanted };
          const answer = (await rpc(METHOD.ACK, { body, origin_proof: await originProof(this.options.key, METHOD.ACK, body, nonce) })) as { cursor: number };
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
      const body: Record<string, unknown> = { device_id: this.options.deviceId };
      if (this.options.filter && Object.keys(this.options.filter).length) body.filter = this.options.filter;
      // The high-water mark goes along: a device whose acks never landed
      // would otherwise start at the head, past what came while it was away.
      // A cursor given as 0 goes too: the device starts at the beginning,
      // not at the head.
      if (this.highWater > 0 || this.cursorGiven) body.cursor = this.highWater;
      const { head_seq: head, cursor } = (await rpc(METHOD.AUTH, { body, origin_proof: await originProof(this.options.key, METHOD.AUTH, body, nonce) })) as {
        head_seq: number;
        cursor: number;
      };
      this.cursor = cursor;
      // A high-water mark past the head (a server that lost its log, or
      // another server's ids): what comes after the head is new.
      if (this.highWater > head) this.highWater = Math.min(cursor, head);
      let from = Math.max(cursor, 0);
      while (from < head) {
        const page = (await rpc(METHOD.DELTA, { device_id: this.options.deviceId, since: from, limit: this.options.pageSize ?? 500 })) as {
          items: { seq: number; event: Envelope }[];
          next_since: number;
          has_more: boolean;
          gap?: ReplayGap;
        };
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
        nonce = String(params.nonce);
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
            const seq = Number(params.seq);
            await take(seq, params.event as Envelope);
            void ack(this.highWater);
          } else if (msg.method === METHOD.GAP) {
            gap(params as unknown as ReplayGap);
          } else if (msg.method === METHOD.TOKEN_EXPIRED && typeof this.options.token === "function") {
            // The same connection goes on under a fresh token; should the
            // server refuse it, a new connection asks for one again.
            try {
              await rpc(METHOD.REAUTH, { token: await currentToken(this.options) });
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
    setTimeout(() => this.open(), this.delay.take());
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
