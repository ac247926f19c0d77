/**
 * Publishing: `POST /v1/events` with an `Idempotency-Key` that every retry
 * of the call carries, so an answer lost on the way stores nothing twice.
 *
 * @module
 */

import { delay, sleep, type Backoff } from "./backoff.js";
import { TidingsError } from "./codes.js";
import { endpoint, fetcher, headers, refusal, type ClientOptions } from "./http.js";
import type { NewEvent } from "./types.js";

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

/**
 * Publishes one event or a batch (all or nothing); resolves to the assigned
 * ids. A `503` or a lost connection may have stored the events or not; the
 * retry carries the same `Idempotency-Key`, so the server stores them once
 * and answers the retry with the original ids either way.
 */
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
