/**
 * Polls of `POST /v1/poll` and durable consumers, whose cursor the server
 * keeps and moves only when the consumer acknowledges.
 *
 * @module
 */

import { delay, sleep, type Backoff } from "./backoff.js";
import { TidingsError } from "./codes.js";
import { call, endpoint, isFinal, type ClientOptions } from "./http.js";
import type { Envelope, Filter, ReplayGap } from "./types.js";

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
