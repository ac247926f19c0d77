/**
 * Publishing: `POST /v1/events` with an `Idempotency-Key` that every retry
 * of the call carries, so an answer lost on the way stores nothing twice.
 *
 * @module
 */
import { type Backoff } from "./backoff.js";
import { type ClientOptions } from "./http.js";
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
/**
 * The ids a publish was assigned, in order; `replayed` is true when the
 * server had stored it before under the same `Idempotency-Key` (a retry
 * whose first answer was lost) and stored nothing now.
 */
export type Published = number[] & {
    readonly replayed: boolean;
};
/**
 * Publishes one event or a batch (all or nothing); resolves to the assigned
 * ids. A `503` or a lost connection may have stored the events or not; the
 * retry carries the same `Idempotency-Key`, so the server stores them once
 * and answers the retry with the original ids either way.
 */
export declare function publish(events: NewEvent | NewEvent[], options?: PublishOptions): Promise<Published>;
