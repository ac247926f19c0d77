/**
 * Streams over Server-Sent Events that resume after any disconnect from the
 * last event delivered, over the platform's `EventSource` or a reader over
 * `fetch`; handed to callbacks, or iterated with `for await`.
 *
 * @module
 */
import { type Backoff } from "./backoff.js";
import { TidingsError } from "./codes.js";
import { type ClientOptions } from "./http.js";
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
/**
 * Follows the events that match `filter`, live, resuming after any
 * disconnect from the last event delivered: nothing missed, nothing twice.
 */
export declare function stream(filter: Filter, options?: StreamOptions): Stream;
