/**
 * Polls of `POST /v1/poll` and durable consumers, whose cursor the server
 * keeps and moves only when the consumer acknowledges.
 *
 * @module
 */
import { type Backoff } from "./backoff.js";
import { type ClientOptions } from "./http.js";
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
