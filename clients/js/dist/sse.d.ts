/**
 * The event-stream parser of the HTML standard, fed with bytes and bounded
 * in what it holds; `test/unit/sse.test.mjs` runs the standard's examples
 * through it, cut at every byte.
 *
 * @module
 */
/** One dispatched Server-Sent Events frame (what [SseParser] hands out). */
export interface Frame {
    event: string;
    data: string;
    id: string | undefined;
}
/**
 * The event-stream parser of the HTML standard (§9.2.6), fed with bytes.
 * Bounded: a line or an event past the bounds throws (the stream is then
 * broken and resumed) rather than growing without end, in time linear
 * in what arrives, however it is cut.
 */
export declare class SseParser {
    /** The last `retry:` value, in milliseconds. */
    retry: number | undefined;
    private readonly decoder;
    /** The unterminated rest of the stream, in pieces. */
    private parts;
    private partsLength;
    private started;
    private data;
    private dataLength;
    private event;
    private id;
    private lastId;
    push(bytes: Uint8Array): Frame[];
    private line;
}
