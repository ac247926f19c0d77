// A stream over `fetch`, against a fake `fetch` the test plays the server
// of: resuming after a disconnect from the last event delivered, dropping
// what it delivered already, going on after a fork when history was lost,
// refusals that end it, a token function asked again after a 401 with the
// stream keeping its place, and iteration with `for await`.
import { mock, test } from "node:test";
import assert from "node:assert/strict";
import { createClient, stream, TidingsError } from "../../dist/tidings.js";
import { envelope, fakeFetch, json, streamingFetch, until } from "./fakes.mjs";

// A lost connection is reported on the console; not here.
mock.method(console, "warn", () => {});

const fast = { initialMs: 1, maxMs: 2 };
const url = "http://tidings.test";

test("a stream resumes after a disconnect from the last event it delivered, nothing twice", async () => {
  const f = streamingFetch();
  const streams = f.streams;
  const seen = [];
  const s = stream({ types: ["unit.*"] }, { url, fetch: f, transport: "fetch", since: 10, backoff: fast, onEvent: (e) => void seen.push(e.event_id) });
  await until(() => streams.length === 1, "the first connection");
  assert.equal(f.requests[0].url.searchParams.get("since"), "10");
  assert.deepEqual(JSON.parse(f.requests[0].url.searchParams.get("filter")), { types: ["unit.*"] });
  streams[0].event(envelope(11));
  streams[0].event(envelope(12));
  await until(() => seen.length === 2, "two events");
  streams[0].fail();
  await until(() => streams.length === 2, "the reconnection");
  assert.equal(f.requests[1].url.searchParams.get("since"), "12", "resumes after the last event delivered");
  // The server replays one the client has: dropped.
  streams[1].event(envelope(12));
  streams[1].event(envelope(13));
  await until(() => seen.length === 3, "the third event");
  assert.deepEqual(seen, [11, 12, 13]);
  assert.equal(s.lastEventId, 13);
  s.close();
  await until(() => streams[1].aborted, "the response closed");
  assert.equal(s.state, "closed");
});

test("a gap that says history was lost moves the resume point back to the fork", async () => {
  const f = streamingFetch();
  const streams = f.streams;
  const gaps = [];
  const seen = [];
  const s = stream({}, { url, fetch: f, transport: "fetch", backoff: fast, onEvent: (e) => void seen.push(e.event_id), onGap: (g) => void gaps.push(g) });
  await until(() => streams.length === 1, "the first connection");
  streams[0].event(envelope(40));
  await until(() => seen.length === 1, "an event");
  streams[0].notice("system.replay_gap", { requested: 40, available_from: 31, head: 35, reason: "history_lost", fork: 30 });
  await until(() => gaps.length === 1, "the gap");
  assert.equal(s.lastEventId, 30);
  streams[0].fail();
  await until(() => streams.length === 2, "the reconnection");
  assert.equal(f.requests[1].url.searchParams.get("since"), "30");
  // Ids after the fork are new events now, and delivered.
  streams[1].event(envelope(31));
  await until(() => seen.length === 2, "the event after the fork");
  assert.deepEqual(seen, [40, 31]);
  s.close();
});

test("a handler that throws ends the connection, and its event comes again", async () => {
  const f = streamingFetch();
  const streams = f.streams;
  let failOnce = true;
  const seen = [];
  {
    const s = stream({}, {
      url, fetch: f, transport: "fetch", backoff: fast,
      onEvent: (e) => {
        if (e.event_id === 2 && failOnce) {
          failOnce = false;
          throw new Error("handler failed");
        }
        seen.push(e.event_id);
      },
    });
    await until(() => streams.length === 1, "the first connection");
    streams[0].event(envelope(1));
    streams[0].event(envelope(2));
    await until(() => streams.length === 2, "the reconnection");
    assert.equal(f.requests[1].url.searchParams.get("since"), "1");
    streams[1].event(envelope(2));
    await until(() => seen.length === 2, "the event again");
    assert.deepEqual(seen, [1, 2]);
    s.close();
  }
});

test("a refusal ends the stream and is not retried", async () => {
  const f = fakeFetch(() => json(400, { error: "invalid_filter", message: "bad glob" }));
  const errors = [];
  const s = stream({ types: ["["] }, { url, fetch: f, transport: "fetch", backoff: fast, onEvent: () => {}, onError: (e) => void errors.push(e) });
  await until(() => errors.length === 1, "the refusal");
  assert.ok(errors[0] instanceof TidingsError);
  assert.equal(errors[0].code, "invalid_filter");
  assert.equal(errors[0].status, 400);
  assert.equal(s.state, "closed");
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(f.requests.length, 1, "never asked again");
});

test("a 401 asks the token function once more, and the stream keeps its place", async () => {
  let tokens = 0;
  const f = streamingFetch((_, n) => (n === 1 ? json(401, { error: "unauthorized", message: "token expired" }) : undefined));
  const streams = f.streams;
  const seen = [];
  const errors = [];
  const s = stream({}, { url, fetch: f, transport: "fetch", backoff: fast, token: () => `t${++tokens}`, onEvent: (e) => void seen.push(e.event_id), onError: (e) => void errors.push(e) });
  await until(() => streams.length === 1, "the first connection");
  streams[0].event(envelope(7));
  await until(() => seen.length === 1, "an event");
  // The server ends the stream for an expired token; the next request still
  // carries a stale one and meets a 401: the function is asked again.
  streams[0].notice("system.token_expired", { reason: "token_expired" });
  streams[0].send("retry: 1\n\n");
  streams[0].end();
  await until(() => streams.length === 2, "the connection under a fresh token");
  assert.deepEqual(errors, []);
  assert.deepEqual(f.requests.map((r) => r.headers.authorization), ["Bearer t1", "Bearer t2", "Bearer t3"]);
  assert.equal(f.requests[2].url.searchParams.get("since"), "7", "the stream kept its place");
  streams[1].event(envelope(8));
  await until(() => seen.length === 2, "the next event");
  assert.equal(s.state, "open");
  s.close();
});

test("a second 401 in a row is final, and a fixed token's first is", async () => {
  const f = fakeFetch(() => json(401, { error: "unauthorized", message: "no" }));
  const errors = [];
  stream({}, { url, fetch: f, transport: "fetch", backoff: fast, token: () => "stale", onEvent: () => {}, onError: (e) => void errors.push(e) });
  await until(() => errors.length === 1, "the refusal");
  assert.equal(f.requests.length, 2);
  assert.equal(errors[0].code, "unauthorized");

  const fixed = fakeFetch(() => json(401, { error: "unauthorized", message: "no" }));
  const more = [];
  stream({}, { url, fetch: fixed, transport: "fetch", backoff: fast, token: "stale", onEvent: () => {}, onError: (e) => void more.push(e) });
  await until(() => more.length === 1, "the refusal");
  assert.equal(fixed.requests.length, 1);
});

test("a stream without onEvent is iterated; the next event waits for the loop, and break closes it", async () => {
  const f = streamingFetch();
  const streams = f.streams;
  const client = createClient({ url, fetch: f });
  const s = client.stream({ types: ["unit.test"] }, { transport: "fetch", backoff: fast });
  await until(() => streams.length === 1, "the connection");
  for (const id of [1, 2, 3]) streams[0].event(envelope(id));
  const seen = [];
  for await (const event of s) {
    seen.push(event.event_id);
    // The stream is past an event only once the loop's body is done with it.
    assert.equal(s.lastEventId, seen.length === 1 ? null : seen[seen.length - 2]);
    if (event.event_id === 2) break;
  }
  assert.deepEqual(seen, [1, 2]);
  assert.equal(s.state, "closed");
  await until(() => streams[0].aborted, "the response closed");
});

test("an iterated stream throws its refusal", async () => {
  const f = fakeFetch(() => json(403, { error: "forbidden", message: "not for you" }));
  const s = createClient({ url, fetch: f }).stream({}, { transport: "fetch", backoff: fast });
  await assert.rejects(async () => {
    for await (const _ of s) assert.fail("no event");
  }, (e) => e instanceof TidingsError && e.code === "forbidden");
});

test("a stream with onEvent is not iterated", () => {
  const f = fakeFetch(() => new Promise(() => {}));
  const s = stream({}, { url, fetch: f, transport: "fetch", onEvent: () => {} });
  assert.throws(() => s[Symbol.asyncIterator](), /not iterated/);
  s.close();
});
