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
export class Delay {
  private ceiling: number;
  constructor(private readonly backoff: Required<Backoff>) {
    this.ceiling = backoff.initialMs;
  }
  /** The next wait, in milliseconds. */
  take(): number {
    const ms = Math.random() * this.ceiling;
    this.ceiling = Math.min(this.ceiling * 2, this.backoff.maxMs);
    return ms;
  }
  /** After a success: the next failure waits little again. */
  reset(): void {
    this.ceiling = this.backoff.initialMs;
  }
}

/** The delays for `b`: from 250 ms up to 10 s unless it says otherwise. */
export const delay = (b: Backoff = {}): Delay => new Delay({ initialMs: b.initialMs ?? 250, maxMs: b.maxMs ?? 10_000 });

interface Target {
  addEventListener(type: string, listener: () => void): void;
  removeEventListener(type: string, listener: () => void): void;
}

const target = (value: unknown): Target | null =>
  value !== null && typeof value === "object" && typeof (value as Target).addEventListener === "function" ? (value as Target) : null;

/**
 * Waits `ms`, or less: until `signal` aborts or, with `wake`, until the
 * page is back (`online` on the window, `visibilitychange` to visible on
 * the document). Outside a page there is nothing to wake it.
 */
export function sleep(ms: number, signal: AbortSignal, wake = false): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    const win = wake ? target(globalThis) : null;
    const doc = wake ? target((globalThis as { document?: unknown }).document) : null;
    win?.addEventListener("online", done);
    doc?.addEventListener("visibilitychange", shown);
    function shown() {
      if ((globalThis as { document?: { visibilityState?: string } }).document?.visibilityState === "visible") done();
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
