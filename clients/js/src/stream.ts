/**
 * Streams over Server-Sent Events that resume after any disconnect from the
 * last event delivered, over the platform's `EventSource` or a reader over
 * `fetch`; handed to callbacks, or iterated with `for await`.
 *
 * @module
 */

import { delay, sleep, type Backoff, type Delay } from "./backoff.js";
import { TidingsError } from "./codes.js";
import { currentToken, endpoint, fetcher, filterQuery, headers, isFinal, refusal, report, type ClientOptions } from "./http.js";
import { SseParser } from "./sse.js";
import type { DroppedNotice, Envelope, Filter, ReplayGap, State } from "./types.js";


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
   *
   * Without it the stream is iterated instead: `for await (const event of
   * stream(filter, options))`, each event past once the loop's body for it
   * is done (a `break` or `return` closes the stream).
   */
  onEvent?: (event: Envelope) => void | Promise<void>;
  /** The resume point was older than the retained history (or past the head). */
  onGap?: (gap: ReplayGap) => void;
  /** The server dropped this stream for falling behind; it resumes by itself. */
  onDropped?: (notice: DroppedNotice) => void;
  /** Any other named notice the server sends. */
  onNotice?: (type: string, data: unknown) => void;
  /**
   * A refusal (bad filter, bad token, forbidden type): the stream is closed
   * and not retried (an iterating loop throws it). A `401` is final only
   * with a fixed token: a token function is asked once more first.
   */
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

/** A running stream; without `onEvent`, iterated for its events. */
export interface Stream extends AsyncIterable<Envelope> {
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
export function stream(filter: Filter, options: StreamOptions = {}): Stream {
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
  /** Where events wait for a `for await` loop, when there is no `onEvent`. */
  private readonly inbox: Inbox | null;
  private readonly handle: (event: Envelope) => void | Promise<void>;
  /** A `401` was met and the token function asked again: another is final. */
  private refreshed = false;

  constructor(
    private readonly filter: Filter,
    private readonly options: StreamOptions,
  ) {
    this.delay = delay(options.backoff);
    this.inbox = options.onEvent ? null : new Inbox();
    this.handle = options.onEvent ?? ((event) => this.inbox!.put(event));
  }

  close(): void {
    this.stop.abort();
    this.source?.close();
    this.setState("closed");
    this.inbox?.end();
  }

  [Symbol.asyncIterator](): AsyncIterator<Envelope> {
    if (!this.inbox) throw new TypeError("tidings: a stream with onEvent is not iterated");
    const inbox = this.inbox;
    return {
      next: () => inbox.next(),
      return: async () => {
        this.close();
        return { value: undefined, done: true };
      },
    };
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
      await this.handle(envelope);
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
        void sleep(this.delay.take(), this.stop.signal, true).then(() => this.overEventSource(ES));
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
      this.refreshed = false;
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
    // A token function asked again after a 401: reopened at once.
    let again = false;
    try {
      const response = await fetcher(this.options)(await this.url(true), { headers: { accept: "text/event-stream" }, signal: probe.signal });
      if (!response.ok && isFinal(response.status)) {
        if (this.refreshAfter(response.status)) again = true;
        else final = await refusal(response);
      }
    } catch {
      // Unreachable: try again after the delay.
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
  private refreshAfter(status: number): boolean {
    if (status !== 401 || typeof this.options.token !== "function" || this.refreshed) return false;
    this.refreshed = true;
    return true;
  }

  private refused(error: TidingsError): void {
    this.stop.abort();
    this.state = "closed";
    this.options.onState?.("closed");
    this.options.onError?.(error);
    this.inbox?.end(error);
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
          if (this.refreshAfter(response.status)) continue;
          if (isFinal(response.status)) return this.refused(error);
          throw error;
        }
        if (!response.body) throw new TypeError("tidings: a stream response without a body");
        this.refreshed = false;
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
      await sleep(wait, signal, true);
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

/**
 * The events of an iterated stream, handed one at a time: the stream waits
 * on `put` until the loop comes back for the next one, as it waits on an
 * `onEvent` handler's promise.
 */
class Inbox {
  private waiting: { event: Envelope; taken: () => void } | null = null;
  /** The event the loop holds: done with once it asks for the next. */
  private held: (() => void) | null = null;
  private reader: ((result: IteratorResult<Envelope>) => void) | null = null;
  private failer: ((error: unknown) => void) | null = null;
  private ended: { error: unknown } | null = null;

  put(event: Envelope): Promise<void> {
    return new Promise((taken) => {
      if (this.ended) return taken();
      this.waiting = { event, taken };
      this.hand();
    });
  }

  end(error?: unknown): void {
    if (this.ended) return;
    this.ended = { error };
    this.waiting?.taken();
    this.waiting = null;
    this.hand();
  }

  next(): Promise<IteratorResult<Envelope>> {
    this.held?.();
    this.held = null;
    return new Promise((resolve, reject) => {
      this.reader = resolve;
      this.failer = reject;
      this.hand();
    });
  }

  private hand(): void {
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
      // Thrown once; the loop that asks again after it is simply done.
      this.ended = { error: undefined };
      if (error !== undefined) reject(error);
      else resolve({ value: undefined, done: true });
    }
  }
}
