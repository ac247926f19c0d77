// The event-stream parser against the examples of the HTML standard's
// Server-Sent Events section (§9.2), fed whole and cut at every byte, and
// its bounds.
import { test } from "node:test";
import assert from "node:assert/strict";
import { SseParser } from "../../dist/tidings.js";

const encoder = new TextEncoder();

/** Every frame the parser dispatches for `text`, fed in pieces of `size` bytes. */
function parse(text, size = Infinity) {
  const bytes = encoder.encode(text);
  const parser = new SseParser();
  const frames = [];
  for (let at = 0; at < bytes.length; at += size) frames.push(...parser.push(bytes.subarray(at, Math.min(at + size, bytes.length))));
  return { frames, retry: parser.retry };
}

/** The same frames however the bytes are cut: whole, byte by byte, and at every single cut. */
function assertFrames(text, expected) {
  assert.deepEqual(parse(text).frames, expected, "whole");
  assert.deepEqual(parse(text, 1).frames, expected, "byte by byte");
  const bytes = encoder.encode(text);
  for (let cut = 1; cut < bytes.length; cut++) {
    const parser = new SseParser();
    const frames = [...parser.push(bytes.subarray(0, cut)), ...parser.push(bytes.subarray(cut))];
    assert.deepEqual(frames, expected, `cut at ${cut}`);
  }
}

test("the standard's stock example: data lines join with newlines", () => {
  assertFrames("data: YHOO\ndata: +2\ndata: 10\n\n", [{ event: "message", data: "YHOO\n+2\n10", id: undefined }]);
});

test("the standard's example with a comment and ids: an empty id resets the last event id", () => {
  const text = ": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n";
  assertFrames(text, [
    { event: "message", data: "first event", id: "1" },
    { event: "message", data: "second event", id: "" },
    { event: "message", data: " third event", id: "" },
  ]);
});

test("the standard's example of empty data: a block not followed by a blank line is discarded", () => {
  assertFrames("data\n\ndata\ndata\n\ndata:", [
    { event: "message", data: "", id: undefined },
    { event: "message", data: "\n", id: undefined },
  ]);
});

test("the standard's example: one space after the colon is dropped, and only one", () => {
  assertFrames("data:test\n\ndata: test\n\n", [
    { event: "message", data: "test", id: undefined },
    { event: "message", data: "test", id: undefined },
  ]);
});

test("CR, LF and CRLF all end lines; a byte-order mark at the start is skipped", () => {
  assertFrames("\uFEFFevent: a\r\ndata: 1\r\rdata: 2\n\nevent: b\rid: 7\rdata: é€😀\r\n\r\n", [
    { event: "a", data: "1", id: undefined },
    { event: "message", data: "2", id: undefined },
    { event: "b", data: "é€😀", id: "7" },
  ]);
});

test("the last id carries over to later events; an id with NUL is ignored; retry takes digits only", () => {
  const { frames, retry } = parse("id: 5\ndata: a\n\ndata: b\n\nid: x\0y\ndata: c\n\nretry: 1500\n\nretry: soon\n\n");
  assert.deepEqual(frames.map((f) => f.id), ["5", "5", "5"]);
  assert.equal(retry, 1500);
});

test("a line past the bound throws instead of growing without end", () => {
  const parser = new SseParser();
  const chunk = encoder.encode("x".repeat(1024 * 1024));
  assert.throws(() => {
    for (let i = 0; i < 8; i++) parser.push(chunk);
  }, /stream line past/);
});

test("an event's data past the bound throws", () => {
  const parser = new SseParser();
  const line = encoder.encode(`data: ${"x".repeat(1024 * 1024)}\n`);
  assert.throws(() => {
    for (let i = 0; i < 16; i++) parser.push(line);
  }, /stream event past/);
});
