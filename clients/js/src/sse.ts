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
 * The longest line of an event stream the client holds: a server's
 * envelopes are far smaller (`TIDINGS_MAX_PAYLOAD`, 64 KiB by default). A
 * longer one is a broken stream: the client resumes from its last event.
 */
const MAX_LINE = 4 * 1024 * 1024;
/** The most data one event may gather over its `data:` lines. */
const MAX_EVENT = 8 * 1024 * 1024;

/**
 * The event-stream parser of the HTML standard (§9.2.6), fed with bytes.
 * Bounded: a line or an event past the bounds throws (the stream is then
 * broken and resumed) rather than growing without end, in time linear
 * in what arrives, however it is cut.
 */
export class SseParser {
  /** The last `retry:` value, in milliseconds. */
  retry: number | undefined;
  private readonly decoder = new TextDecoder();
  /** The unterminated rest of the stream, in pieces. */
  private parts: string[] = [];
  private partsLength = 0;
  private started = false;
  private data: string[] = [];
  private dataLength = 0;
  private event = "";
  private id: string | undefined;
  private lastId: string | undefined;

  push(bytes: Uint8Array): Frame[] {
    let text = this.decoder.decode(bytes, { stream: true });
    if (!this.started && text.length) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    const last = this.parts.length ? this.parts[this.parts.length - 1]! : "";
    if (!text.includes("\n") && !text.includes("\r") && !last.endsWith("\r")) {
      // No line end yet: keep the piece; join only once one arrives
      // (appending to one string would copy it every time).
      this.parts.push(text);
      this.partsLength += text.length;
      if (this.partsLength > MAX_LINE) throw new Error(`tidings: a stream line past ${MAX_LINE} characters; resuming`);
      return [];
    }
    const buffer = this.parts.join("") + text;
    this.parts = [];
    this.partsLength = 0;
    const frames: Frame[] = [];
    let start = 0;
    // The next CR and LF, each searched again only once passed: every
    // character is looked at a bounded number of times.
    let cr = buffer.indexOf("\r");
    let lf = buffer.indexOf("\n");
    for (;;) {
      if (cr !== -1 && cr < start) cr = buffer.indexOf("\r", start);
      if (lf !== -1 && lf < start) lf = buffer.indexOf("\n", start);
      let end: number;
      let next: number;
      if (cr !== -1 && (lf === -1 || cr < lf)) {
        // A CR at the very end may be the first half of a CRLF.
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

  private line(line: string): Frame | null {
    if (line === "") {
      const frame = this.data.length ? { event: this.event || "message", data: this.data.join("\n"), id: this.id ?? this.lastId } : null;
      if (this.id !== undefined) this.lastId = this.id;
      this.data = [];
      this.dataLength = 0;
      this.event = "";
      this.id = undefined;
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
    }
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
    else if (field === "retry" && /^\d{1,9}$/.test(value)) this.retry = Number(value);
    return null;
  }
}
