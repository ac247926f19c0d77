/**
 * Waiting between attempts: reconnection delays with full jitter, and a
 * sleep that a page coming back (`online`, or the tab shown again on
 * `visibilitychange`) cuts short, so a laptop that wakes up or a phone
 * back on the network reconnects at once rather than after its backoff.
 *
 * @module
 */
/**
 * Reconnection delay: "full jitter", a uniformly random wait in
 * `[0, ceiling]` where the ceiling doubles from `initialMs` up to `maxMs`,
 * so a thousand clients a restart disconnected come back spread over the
 * whole window rather than in waves.
 */
export interface Backoff {
    initialMs?: number;
    maxMs?: number;
}
/** The delays of one stream, connection or publish. */
export declare class Delay {
    private readonly backoff;
    private ceiling;
    constructor(backoff: Required<Backoff>);
    /** The next wait, in milliseconds. */
    take(): number;
    /** After a success: the next failure waits little again. */
    reset(): void;
}
/** The delays for `b`: from 250 ms up to 10 s unless it says otherwise. */
export declare const delay: (b?: Backoff) => Delay;
/**
 * Waits `ms`, or less: until `signal` aborts or, with `wake`, until the
 * page is back (`online` on the window, `visibilitychange` to visible on
 * the document). Outside a page there is nothing to wake it.
 */
export declare function sleep(ms: number, signal: AbortSignal, wake?: boolean): Promise<void>;
