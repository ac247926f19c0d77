// src/codes.ts
var TidingsError = class extends Error {
  /** The HTTP status, or 0. */
  status;
  /** The stable error code (`invalid_filter`, `unauthorized`, ...). */
  code;
  /** The whole error body as the server sent it. */
  body;
  /** The JSON-RPC error code, for a WebSocket refusal. */
  rpcCode;
  /** The WebSocket close code, for a connection closed as a refusal. */
  closeCode;
  constructor(status, code, message, body, extra = {}) {
    super(message || code);
    this.name = "TidingsError";
    this.status = status;
    this.code = code;
    this.body = body;
    this.rpcCode = extra.rpcCode;
    this.closeCode = extra.closeCode;
  }
};
var METHOD = {
  HELLO: "stream.hello",
  AUTH: "stream.auth",
  DELTA: "sync.delta",
  ACK: "stream.ack",
  REAUTH: "stream.reauth",
  EVENT: "stream.event",
  GAP: "stream.gap",
  TOKEN_EXPIRED: "stream.token_expired",
  FILTER_BUDGET_EXCEEDED: "stream.filter_budget_exceeded"
};
var RPC = {
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL: -32603,
  UNAUTHENTICATED: -32001,
  FORBIDDEN: -32003,
  NOT_FOUND: -32004,
  CONFLICT: -32009,
  TRY_LATER: -32013
};
var CLOSE = {
  NORMAL: 1e3,
  GOING_AWAY: 1001,
  PROTOCOL: 1002,
  UNSUPPORTED: 1003,
  ABNORMAL: 1006,
  INVALID: 1007,
  POLICY: 1008,
  TOO_BIG: 1009,
  INTERNAL: 1011,
  RESTART: 1012,
  TRY_LATER: 1013
};
var REFUSING_CLOSES = /* @__PURE__ */ new Set([1002, 1003, 1007, 1008, 1009]);
var FINAL_RPC_ERRORS = /* @__PURE__ */ new Set([-32600, -32601, -32602, -32001, -32003]);

// src/backoff.ts
var Delay = class {
  constructor(backoff) {
    this.backoff = backoff;
    this.ceiling = backoff.initialMs;
  }
  backoff;
  ceiling;
  /** The next wait, in milliseconds. */
  take() {
    const ms = Math.random() * this.ceiling;
    this.ceiling = Math.min(this.ceiling * 2, this.backoff.maxMs);
    return ms;
  }
  /** After a success: the next failure waits little again. */
  reset() {
    this.ceiling = this.backoff.initialMs;
  }
};
var delay = (b = {}) => new Delay({ initialMs: b.initialMs ?? 250, maxMs: b.maxMs ?? 1e4 });
var target = (value) => value !== null && typeof value === "object" && typeof value.addEventListener === "function" ? value : null;
function sleep(ms, signal, wake = false) {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    const win = wake ? target(globalThis) : null;
    const doc = wake ? target(globalThis.document) : null;
    win?.addEventListener("online", done);
    doc?.addEventListener("visibilitychange", shown);
    function shown() {
      if (globalThis.document?.visibilityState === "visible") done();
    }
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      win?.removeEventListener("online", done);
      doc?.removeEventListener("visibilitychange", shown);
      resolve();
    }
  });
}

// src/http.ts
function baseUrl(options) {
  if (options.url !== void 0) return new URL(String(options.url));
  const here = globalThis.location;
  if (here) return new URL(here.origin);
  throw new TypeError("tidings: no url given, and not in a page");
}
function endpoint(options, path, query = {}) {
  const url = new URL(path, baseUrl(options));
  for (const [name, value] of Object.entries(query)) if (value !== void 0) url.searchParams.set(name, value);
  return url;
}
function fetcher(options) {
  const f = options.fetch ?? globalThis.fetch;
  if (!f) throw new TypeError("tidings: no fetch available");
  return f.bind(globalThis);
}
async function currentToken(options) {
  const t = options.token;
  return typeof t === "function" ? await t() : t;
}
async function headers(options, extra = {}) {
  const token = await currentToken(options);
  return token ? { ...extra, authorization: `Bearer ${token}` } : extra;
}
function filterQuery(filter) {
  return Object.keys(filter).length ? JSON.stringify(filter) : void 0;
}
async function refusal(response) {
  let body = void 0;
  try {
    body = await response.json();
  } catch {
  }
  const b = body ?? {};
  const code = typeof b.error === "string" ? b.error : `http_${response.status}`;
  const message = typeof b.message === "string" ? b.message : response.statusText;
  return new TidingsError(response.status, code, message, body);
}
async function call(options, method, url, body) {
  const init = { method, headers: await headers(options, body === void 0 ? {} : { "content-type": "application/json" }) };
  if (body !== void 0) init.body = JSON.stringify(body);
  const response = await fetcher(options)(url, init);
  if (!response.ok) throw await refusal(response);
  return response.status === 204 ? void 0 : await response.json();
}
function isFinal(status) {
  return status >= 400 && status < 500 && status !== 408 && status !== 429;
}
function report(error) {
  if (typeof console !== "undefined" && !(error instanceof DOMException && error.name === "AbortError")) console.warn("tidings:", error);
}

// src/publish.ts
function newKey() {
  const bytes = new Uint8Array(16);
  globalThis.crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
var RETRIED_STATUSES = /* @__PURE__ */ new Set([408, 429, 502, 503, 504]);
async function publish(events, options = {}) {
  const body = JSON.stringify(Array.isArray(events) ? { events } : events);
  const key = options.idempotencyKey ?? newKey();
  const retries = options.retries ?? 5;
  const wait = delay(options.backoff);
  const never = new AbortController().signal;
  for (let attempt = 0; ; attempt++) {
    let failure;
    let atLeastMs = 0;
    try {
      const response = await fetcher(options)(endpoint(options, "/v1/events"), {
        method: "POST",
        headers: await headers(options, { "content-type": "application/json", "idempotency-key": key }),
        body
      });
      if (response.ok) {
        const ids = (await response.json()).event_ids;
        return Object.assign(ids, { replayed: response.headers.get("idempotent-replayed") === "true" });
      }
      const refused = await refusal(response);
      if (!RETRIED_STATUSES.has(response.status)) throw refused;
      failure = refused;
      atLeastMs = 1e3 * Math.min(Number(response.headers.get("retry-after")) || 0, 30);
    } catch (e) {
      if (e instanceof TidingsError && !RETRIED_STATUSES.has(e.status)) throw e;
      failure = e;
    }
    if (attempt >= retries) throw failure;
    await sleep(Math.max(wait.take(), atLeastMs), never);
  }
}

// src/sse.ts
var MAX_LINE = 4 * 1024 * 1024;
var MAX_EVENT = 8 * 1024 * 1024;
var SseParser = class {
  /** The last `retry:` value, in milliseconds. */
  retry;
  decoder = new TextDecoder();
  /** The unterminated rest of the stream, in pieces. */
  parts = [];
  partsLength = 0;
  started = false;
  data = [];
  dataLength = 0;
  event = "";
  id;
  lastId;
  push(bytes) {
    let text = this.decoder.decode(bytes, { stream: true });
    if (!this.started && text.length) {
      this.started = true;
      if (text.charCodeAt(0) === 65279) text = text.slice(1);
    }
    const last = this.parts.length ? this.parts[this.parts.length - 1] : "";
    if (!text.includes("\n") && !text.includes("\r") && !last.endsWith("\r")) {
      this.parts.push(text);
      this.partsLength += text.length;
      if (this.partsLength > MAX_LINE) throw new Error(`tidings: a stream line past ${MAX_LINE} characters; resuming`);
      return [];
    }
    const buffer = this.parts.join("") + text;
    this.parts = [];
    this.partsLength = 0;
    const frames = [];
    let start = 0;
    let cr = buffer.indexOf("\r");
    let lf = buffer.indexOf("\n");
    for (; ; ) {
      if (cr !== -1 && cr < start) cr = buffer.indexOf("\r", start);
      if (lf !== -1 && lf < start) lf = buffer.indexOf("\n", start);
      let end;
      let next;
      if (cr !== -1 && (lf === -1 || cr < lf)) {
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
  line(line) {
    if (line === "") {
      const frame = this.data.length ? { event: this.event || "message", data: this.data.join("\n"), id: this.id ?? this.lastId } : null;
      if (this.id !== void 0) this.lastId = this.id;
      this.data = [];
      this.dataLength = 0;
      this.event = "";
      this.id = void 0;
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
    } else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
    else if (field === "retry" && /^\d{1,9}$/.test(value)) this.retry = Number(value);
    return null;
  }
};

// src/stream.ts
var NOTICES = ["system.replay_gap", "system.client_dropped_slow", "system.token_expired"];
function stream(filter, options = {}) {
  const ES = options.EventSource ?? globalThis.EventSource;
  const transport = options.transport ?? (ES && !options.token ? "eventsource" : "fetch");
  endpoint(options, "/v1/stream");
  if (transport === "fetch") fetcher(options);
  const s = new StreamState(filter, options);
  if (transport === "eventsource") {
    if (!ES) throw new TypeError('tidings: no EventSource available; use transport: "fetch"');
    s.overEventSource(ES);
  } else {
    void s.overFetch();
  }
  return s;
}
var StreamState = class {
  constructor(filter, options) {
    this.filter = filter;
    this.options = options;
    this.delay = delay(options.backoff);
    this.inbox = options.onEvent ? null : new Inbox();
    this.handle = options.onEvent ?? ((event) => this.inbox.put(event));
  }
  filter;
  options;
  lastEventId = null;
  state = "connecting";
  stop = new AbortController();
  source = null;
  /** The `EventSource` class in use (reopened with a fresh token). */
  eventSource = null;
  /** Frames are handled one at a time, in order, across reconnects too. */
  chain = Promise.resolve();
  delay;
  /** Where events wait for a `for await` loop, when there is no `onEvent`. */
  inbox;
  handle;
  /** A `401` was met and the token function asked again: another is final. */
  refreshed = false;
  close() {
    this.stop.abort();
    this.source?.close();
    this.setState("closed");
    this.inbox?.end();
  }
  [Symbol.asyncIterator]() {
    if (!this.inbox) throw new TypeError("tidings: a stream with onEvent is not iterated");
    const inbox = this.inbox;
    return {
      next: () => inbox.next(),
      return: async () => {
        this.close();
        return { value: void 0, done: true };
      }
    };
  }
  setState(state) {
    if (this.state === state || this.state === "closed" && this.stop.signal.aborted) return;
    this.state = state;
    this.options.onState?.(state);
  }
  async url(accessToken) {
    const from = this.lastEventId ?? this.options.since;
    return endpoint(this.options, "/v1/stream", {
      filter: filterQuery(this.filter),
      since: from === void 0 ? void 0 : String(from),
      access_token: accessToken ? await currentToken(this.options) : void 0
    });
  }
  /** One frame of the stream; resolves once its handler has. */
  async frame(event, data, id) {
    if (this.stop.signal.aborted) return;
    if (event === "message") {
      const envelope = JSON.parse(data);
      const seq = id !== void 0 && id !== "" ? Number(id) : envelope.event_id;
      if (this.lastEventId !== null && seq <= this.lastEventId) return;
      await this.handle(envelope);
      this.lastEventId = seq;
    } else if (event === "system.replay_gap") {
      const gap = JSON.parse(data);
      if (this.lastEventId !== null && gap.requested > gap.head) this.lastEventId = gap.head;
      if (this.lastEventId !== null && gap.reason === "history_lost" && gap.fork !== void 0) this.lastEventId = gap.fork;
      this.options.onGap?.(gap);
    } else if (event === "system.client_dropped_slow") {
      this.options.onDropped?.(JSON.parse(data));
    } else if (event === "system.token_expired") {
      this.options.onNotice?.(event, JSON.parse(data));
      if (this.source && this.eventSource) {
        this.source.close();
        this.source = null;
        this.overEventSource(this.eventSource);
      }
    } else {
      let value = data;
      try {
        value = JSON.parse(data);
      } catch {
      }
      this.options.onNotice?.(event, value);
    }
  }
  overEventSource(ES) {
    this.eventSource = ES;
    void this.url(true).then(
      (url) => this.openEventSource(ES, url),
      (error) => {
        report(error);
        void sleep(this.delay.take(), this.stop.signal, true).then(() => this.overEventSource(ES));
      }
    );
  }
  openEventSource(ES, url) {
    if (this.stop.signal.aborted) return;
    this.setState("connecting");
    const es = new ES(url.toString());
    this.source = es;
    const handle = (event) => (m) => {
      this.chain = this.chain.then(() => this.frame(event, m.data, m.lastEventId)).catch(report);
    };
    es.onopen = () => {
      this.refreshed = false;
      this.delay.reset();
      this.setState("open");
    };
    es.onmessage = handle("message");
    for (const name of NOTICES) es.addEventListener(name, handle(name));
    es.onerror = () => {
      if (this.stop.signal.aborted || this.source !== es) return;
      if (es.readyState !== ES.CLOSED) return this.setState("connecting");
      es.close();
      void this.diagnose(ES);
    };
  }
  async diagnose(ES) {
    const probe = new AbortController();
    const stop = () => probe.abort();
    this.stop.signal.addEventListener("abort", stop, { once: true });
    let final = null;
    let again = false;
    try {
      const response = await fetcher(this.options)(await this.url(true), { headers: { accept: "text/event-stream" }, signal: probe.signal });
      if (!response.ok && isFinal(response.status)) {
        if (this.refreshAfter(response.status)) again = true;
        else final = await refusal(response);
      }
    } catch {
    } finally {
      probe.abort();
      this.stop.signal.removeEventListener("abort", stop);
    }
    if (final) return this.refused(final);
    this.setState("connecting");
    if (!again) await sleep(this.delay.take(), this.stop.signal, true);
    this.overEventSource(ES);
  }
  /**
   * Whether a refusal with `status` is worth one more try at once: a `401`
   * with a token function, which may now give a fresh token (the stream
   * keeps its place). A second `401` in a row is final.
   */
  refreshAfter(status) {
    if (status !== 401 || typeof this.options.token !== "function" || this.refreshed) return false;
    this.refreshed = true;
    return true;
  }
  refused(error) {
    this.stop.abort();
    this.state = "closed";
    this.options.onState?.("closed");
    this.options.onError?.(error);
    this.inbox?.end(error);
  }
  async overFetch() {
    const signal = this.stop.signal;
    while (!signal.aborted) {
      this.setState("connecting");
      let wait;
      const connection = new AbortController();
      const end = () => connection.abort();
      signal.addEventListener("abort", end, { once: true });
      try {
        const response = await fetcher(this.options)(await this.url(false), {
          headers: await headers(this.options, { accept: "text/event-stream" }),
          signal: connection.signal,
          cache: "no-store"
        });
        if (!response.ok) {
          const error = await refusal(response);
          if (this.refreshAfter(response.status)) continue;
          if (isFinal(response.status)) return this.refused(error);
          throw error;
        }
        if (!response.body) throw new TypeError("tidings: a stream response without a body");
        this.refreshed = false;
        this.delay.reset();
        this.setState("open");
        const retry = await this.read(response.body);
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
      await sleep(wait, signal, true);
    }
  }
  /** Reads frames until the body ends; resolves to the last `retry:` hint. */
  async read(body) {
    const reader = body.getReader();
    const parser = new SseParser();
    try {
      for (; ; ) {
        const { done, value } = await reader.read();
        if (done) break;
        for (const f of parser.push(value)) await this.frame(f.event, f.data, f.id);
      }
    } finally {
      reader.releaseLock();
    }
    return parser.retry;
  }
};
var Inbox = class {
  waiting = null;
  /** The event the loop holds: done with once it asks for the next. */
  held = null;
  reader = null;
  failer = null;
  ended = null;
  put(event) {
    return new Promise((taken) => {
      if (this.ended) return taken();
      this.waiting = { event, taken };
      this.hand();
    });
  }
  end(error) {
    if (this.ended) return;
    this.ended = { error };
    this.waiting?.taken();
    this.waiting = null;
    this.hand();
  }
  next() {
    this.held?.();
    this.held = null;
    return new Promise((resolve, reject) => {
      this.reader = resolve;
      this.failer = reject;
      this.hand();
    });
  }
  hand() {
    const resolve = this.reader;
    const reject = this.failer;
    if (!resolve || !reject) return;
    if (this.waiting) {
      const { event, taken } = this.waiting;
      this.waiting = null;
      this.held = taken;
      this.reader = this.failer = null;
      resolve({ value: event, done: false });
    } else if (this.ended) {
      this.reader = this.failer = null;
      const error = this.ended.error;
      this.ended = { error: void 0 };
      if (error !== void 0) reject(error);
      else resolve({ value: void 0, done: true });
    }
  }
};

// src/poll.ts
async function poll(request, options = {}) {
  return call(options, "POST", endpoint(options, "/v1/poll"), request);
}
var Consumer = class {
  constructor(id, filter = {}, options = {}) {
    this.id = id;
    this.filter = filter;
    this.options = options;
  }
  id;
  filter;
  options;
  /** Acknowledged up to here (as far as this object knows). */
  cursor = null;
  /** The next page after the stored cursor (or after `since`, which also confirms it). */
  async next(request = {}) {
    const body = { ...request, consumer_id: this.id };
    if (Object.keys(this.filter).length) body.filter = this.filter;
    return poll(body, this.options);
  }
  /** Confirms everything up to `cursor`; the server never moves it backwards or past the head. */
  async ack(cursor) {
    const answer = await call(this.options, "POST", endpoint(this.options, `/v1/consumers/${encodeURIComponent(this.id)}/ack`), { cursor });
    this.cursor = answer.cursor;
    return answer.cursor;
  }
  /** Removes the consumer and its cursor from the server. */
  async delete() {
    await call(this.options, "DELETE", endpoint(this.options, `/v1/consumers/${encodeURIComponent(this.id)}`));
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
  async run(handler, options = {}) {
    const d = delay(options.backoff);
    const limit = options.limit ? { limit: options.limit } : {};
    let handled = null;
    while (!options.signal?.aborted) {
      let page;
      let told;
      try {
        page = await this.next({ wait_ms: options.wait_ms ?? 25e3, ...limit });
        const first = page.events[0];
        if (handled !== null && first !== void 0 && first.event_id <= handled) {
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
      while (this.cursor === null || page.next_since > this.cursor) {
        try {
          await this.ack(page.next_since);
          break;
        } catch (error) {
          if (error instanceof TidingsError && isFinal(error.status)) throw error;
          if (options.signal?.aborted) return;
          await sleep(d.take(), options.signal ?? new AbortController().signal);
        }
      }
    }
  }
};

// src/device.ts
var b64 = (bytes) => {
  let s = "";
  for (const b of new Uint8Array(bytes)) s += String.fromCharCode(b);
  return btoa(s);
};
var hex = (bytes) => [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");
async function fromPair(privateKey, publicKey) {
  const raw = await crypto.subtle.exportKey("raw", publicKey);
  return { privateKey, identity: { type: "system/identity", data: { algorithm: "ed25519", public_key: b64(raw) } } };
}
async function createDeviceKey() {
  const pair = await crypto.subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"]);
  const jwk = { private: await crypto.subtle.exportKey("jwk", pair.privateKey), public: await crypto.subtle.exportKey("jwk", pair.publicKey) };
  return { key: await fromPair(pair.privateKey, pair.publicKey), jwk };
}
async function importDeviceKey(jwk) {
  const privateKey = await crypto.subtle.importKey("jwk", jwk.private, { name: "Ed25519" }, false, ["sign"]);
  const publicKey = await crypto.subtle.importKey("jwk", jwk.public, { name: "Ed25519" }, true, ["verify"]);
  return fromPair(privateKey, publicKey);
}
function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const o = value;
    const keys = Object.keys(o).filter((k) => o[k] !== void 0).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(",")}}`;
  }
  if (typeof value === "number" && !Number.isFinite(value)) throw new TypeError("tidings: a non-finite number has no JSON form");
  return JSON.stringify(value);
}
async function originProof(key, method, body, nonce) {
  const encoder = new TextEncoder();
  const digest = await crypto.subtle.digest("SHA-256", encoder.encode(canonicalJson({ method, body, nonce })));
  const signature = await crypto.subtle.sign({ name: "Ed25519" }, key.privateKey, encoder.encode(`sha256:${hex(digest)}`));
  return { identity: key.identity, signature: b64(signature) };
}
function connect(options) {
  const WS = options.WebSocket ?? globalThis.WebSocket;
  if (!WS) throw new TypeError("tidings: no WebSocket available (Node 20 needs --experimental-websocket)");
  endpoint(options, "/v1/ws");
  const c = new DeviceConnection(options, WS);
  c.open();
  return c;
}
var Lost = class extends Error {
};
var DeviceConnection = class {
  constructor(options, WS) {
    this.options = options;
    this.WS = WS;
    this.delay = delay(options.backoff);
    if (options.cursor !== void 0) {
      this.highWater = options.cursor;
      this.cursorGiven = true;
    }
  }
  options;
  WS;
  highWater = 0;
  /** A starting cursor was given (0 included): it goes along even at 0. */
  cursorGiven = false;
  cursor = null;
  state = "connecting";
  stopped = false;
  /** Aborted by `close()`: ends a wait before reconnecting. */
  stop = new AbortController();
  socket = null;
  delay;
  waiters = [];
  caughtUp = false;
  /** The refusal that stopped the connection, if one did. */
  rejection = null;
  /** Messages are handled one at a time, in order, across reconnects too. */
  chain = Promise.resolve();
  ready() {
    if (this.caughtUp) return Promise.resolve();
    if (this.stopped) return Promise.reject(this.rejection ?? new Error("tidings: the connection is closed"));
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }
  close() {
    this.stopped = true;
    this.stop.abort();
    this.caughtUp = false;
    this.socket?.close(CLOSE.NORMAL);
    this.setState("closed");
    this.settle(new Error("tidings: the connection was closed"));
  }
  /** Resolves the `ready()` waiters, or rejects them with `error`. */
  settle(error) {
    for (const w of this.waiters.splice(0)) {
      if (error === void 0) w.resolve();
      else w.reject(error);
    }
  }
  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.options.onState?.(state);
  }
  open() {
    if (this.stopped) return;
    this.setState("connecting");
    this.caughtUp = false;
    void currentToken(this.options).then(
      (token) => this.openWith(token),
      (error) => {
        report(error);
        this.retry();
      }
    );
  }
  openWith(token) {
    if (this.stopped) return;
    const url = endpoint(this.options, "/v1/ws", { access_token: token });
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const socket = new this.WS(url.toString());
    this.socket = socket;
    const pending = /* @__PURE__ */ new Map();
    let nextId = 1;
    let rejection = null;
    let nonce = "";
    let hello = false;
    let broken = false;
    const rpc = (method, params) => new Promise((resolve, reject) => {
      if (socket.readyState !== this.WS.OPEN) return reject(new Lost());
      const id = nextId++;
      pending.set(id, { resolve, reject });
      socket.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
    });
    let acking = false;
    let ackWanted = 0;
    const ack = async (seq) => {
      ackWanted = Math.max(ackWanted, seq);
      if (acking) return;
      acking = true;
      try {
        while (ackWanted > (this.cursor ?? 0) && !this.stopped) {
          const body = { seq: ackWanted };
          const params = { body, origin_proof: await originProof(this.options.key, METHOD.ACK, body, nonce) };
          const answer = await rpc(METHOD.ACK, params);
          this.cursor = Math.max(this.cursor ?? 0, answer.cursor);
          this.options.onAck?.(this.cursor);
          if (answer.cursor < body.seq) break;
        }
      } catch {
      } finally {
        acking = false;
      }
    };
    const take = async (seq, event) => {
      if (this.stopped || seq <= this.highWater) return;
      await this.options.onEvent(seq, event);
      this.highWater = seq;
    };
    const gap = (g) => this.options.onGap?.(g);
    const handshake = async () => {
      const body = { device_id: this.options.deviceId };
      if (this.options.filter && Object.keys(this.options.filter).length) body.filter = this.options.filter;
      if (this.highWater > 0 || this.cursorGiven) body.cursor = this.highWater;
      const auth = { body, origin_proof: await originProof(this.options.key, METHOD.AUTH, body, nonce) };
      const { head_seq: head, cursor } = await rpc(METHOD.AUTH, auth);
      this.cursor = cursor;
      if (this.highWater > head) this.highWater = Math.min(cursor, head);
      let from = Math.max(cursor, 0);
      while (from < head) {
        const delta = { device_id: this.options.deviceId, since: from, limit: this.options.pageSize ?? 500 };
        const page = await rpc(METHOD.DELTA, delta);
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
    const finalRpc = (error) => error.rpcCode !== void 0 && FINAL_RPC_ERRORS.has(error.rpcCode);
    socket.onmessage = (m) => {
      let msg;
      try {
        msg = JSON.parse(String(m.data));
      } catch {
        return;
      }
      if (msg.method === void 0) {
        const error = msg.error ? new TidingsError(0, msg.error.data?.code ?? "rpc_error", msg.error.message, msg.error, { rpcCode: msg.error.code }) : null;
        if (msg.id === null || msg.id === void 0) {
          if (error) {
            if (finalRpc(error)) rejection = error;
            for (const p2 of pending.values()) p2.reject(error);
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
        this.chain = this.chain.then(handshake).catch((error) => {
          if (error instanceof Lost) return;
          if (error instanceof TidingsError && finalRpc(error)) rejection = error;
          else report(error);
          broken = true;
          socket.close(CLOSE.NORMAL);
        });
        return;
      }
      this.chain = this.chain.then(async () => {
        if (broken) return;
        if (msg.method === METHOD.EVENT) {
          const event = params;
          const seq = Number(event.seq);
          await take(seq, event.event);
          void ack(this.highWater);
        } else if (msg.method === METHOD.GAP) {
          gap(params);
        } else if (msg.method === METHOD.TOKEN_EXPIRED && typeof this.options.token === "function") {
          try {
            const reauth = { token: await currentToken(this.options) ?? "" };
            await rpc(METHOD.REAUTH, reauth);
          } catch (error) {
            if (!(error instanceof Lost)) report(error);
            socket.close(CLOSE.NORMAL);
          }
        }
      }).catch((error) => {
        broken = true;
        report(error);
        socket.close(CLOSE.NORMAL);
      });
    };
    socket.onclose = (e) => {
      for (const p of pending.values()) p.reject(new Lost());
      pending.clear();
      if (this.socket !== socket) return;
      this.caughtUp = false;
      if (this.stopped) return this.setState("closed");
      if (!hello && !rejection) {
        void this.diagnose(url).then((refused) => refused ? this.rejected(refused) : this.retry());
        return;
      }
      if (rejection || REFUSING_CLOSES.has(e.code)) {
        return this.rejected(rejection ?? new TidingsError(0, e.reason || "protocol_error", `closed with ${e.code}`, void 0, { closeCode: e.code }));
      }
      this.retry();
    };
  }
  retry() {
    if (this.stopped) return;
    this.setState("connecting");
    void sleep(this.delay.take(), this.stop.signal, true).then(() => this.open());
  }
  rejected(error) {
    this.rejection = error;
    this.stopped = true;
    this.setState("closed");
    this.settle(error);
    this.options.onRejected?.(error);
  }
  async diagnose(url) {
    const http = new URL(url);
    http.protocol = http.protocol === "wss:" ? "https:" : "http:";
    try {
      const response = await fetcher(this.options)(http, { headers: await headers(this.options) });
      if (response.status === 401 || response.status === 403) return refusal(response);
      await response.body?.cancel();
    } catch {
    }
    return null;
  }
};

// src/client.ts
function createClient(options = {}) {
  const bound = { ...options };
  return {
    stream: (filter = {}, more = {}) => stream(filter, { ...more, ...bound }),
    poll: (request = {}) => poll(request, bound),
    consumer: (id, filter = {}) => new Consumer(id, filter, bound),
    connect: (more) => connect({ ...more, ...bound }),
    publish: (events, more = {}) => publish(events, { ...more, ...bound })
  };
}
export {
  CLOSE,
  Consumer,
  FINAL_RPC_ERRORS,
  METHOD,
  REFUSING_CLOSES,
  RPC,
  SseParser,
  TidingsError,
  canonicalJson,
  connect,
  createClient,
  createDeviceKey,
  importDeviceKey,
  originProof,
  poll,
  publish,
  stream
};
