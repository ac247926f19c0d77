// Polls and durable consumers over a fake `fetch`: a page acknowledged once
// every event of it is handled, a handler that throws leaving its page
// unacknowledged, a cursor that went back asked again from the last handled
// id, and a refusal ending the loop.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Consumer, createClient, TidingsError } from "../../dist/tidings.js";
import { envelope, fakeFetch, json } from "./fakes.mjs";

const url = "http://tidings.test";
const fast = { initialMs: 1, maxMs: 1 };

/** A fake server for one consumer: pages from `pages` in turn, acks recorded. */
function server(pages) {
  const acks = [];
  let n = 0;
  const f = fakeFetch((r) => {
    if (r.url.pathname.endsWith("/ack")) {
      const { cursor } = JSON.parse(r.body);
      acks.push(cursor);
      return json(200, { cursor });
    }
    const page = pages[Math.min(n++, pages.length - 1)];
    return typeof page === "function" ? page(r) : json(200, page);
  });
  return { f, acks };
}

test("a consumer acknowledges a page once its events are handled, and stops on its signal", async () => {
  const stop = new AbortController();
  const { f, acks } = server([
    { events: [envelope(1), envelope(2)], next_since: 2, has_more: true },
    { events: [envelope(3)], next_since: 3, has_more: false },
  ]);
  const seen = [];
  const consumer = createClient({ url, fetch: f }).consumer("worker-1", { types: ["unit.*"] });
  await consumer.run(
    (e) => {
      seen.push(e.event_id);
      // Not acknowledged before the page's last event is handled.
      assert.deepEqual(acks, e.event_id <= 2 ? [] : [2]);
      if (e.event_id === 3) stop.abort();
    },
    { signal: stop.signal, backoff: fast },
  );
  assert.deepEqual(seen, [1, 2, 3]);
  assert.deepEqual(acks, [2, 3]);
  const first = JSON.parse(f.requests[0].body);
  assert.deepEqual(first, { consumer_id: "worker-1", filter: { types: ["unit.*"] }, wait_ms: 25000 });
  assert.equal(f.requests[1].url.pathname, "/v1/consumers/worker-1/ack");
});

test("a handler that throws stops the loop with its page unacknowledged", async () => {
  const { f, acks } = server([{ events: [envelope(1), envelope(2)], next_since: 2, has_more: false }]);
  const consumer = new Consumer("w", {}, { url, fetch: f });
  await assert.rejects(consumer.run((e) => {
    if (e.event_id === 2) throw new Error("handler failed");
  }), /handler failed/);
  assert.deepEqual(acks, []);
});

test("a page that starts at or below the last handled id is asked again from it, and its gap told", async () => {
  const stop = new AbortController();
  const gap = { requested: 5, available_from: 4, head: 6, reason: "history_lost", fork: 3 };
  const { f } = server([
    { events: [envelope(4), envelope(5)], next_since: 5, has_more: false },
    // The cursor went back (rolled back with the database): 4 and 5 again.
    { events: [envelope(4), envelope(5), envelope(6)], next_since: 6, has_more: false, gap },
    (r) => {
      assert.equal(JSON.parse(r.body).since, 5, "asked again from the last handled id");
      return json(200, { events: [envelope(6)], next_since: 6, has_more: false });
    },
  ]);
  const seen = [];
  const gaps = [];
  await new Consumer("w", {}, { url, fetch: f }).run(
    (e) => {
      seen.push(e.event_id);
      if (e.event_id === 6) stop.abort();
    },
    { signal: stop.signal, backoff: fast, onGap: (g) => void gaps.push(g) },
  );
  assert.deepEqual(seen, [4, 5, 6]);
  assert.deepEqual(gaps, [gap]);
});

test("a refusal ends the loop; a passing failure is retried", async () => {
  const { f } = server([
    () => json(503, { error: "store_unavailable", message: "later" }),
    () => json(400, { error: "invalid_filter", message: "bad" }),
  ]);
  await assert.rejects(new Consumer("w", { types: ["["] }, { url, fetch: f }).run(() => {}, { backoff: fast }), (e) => e instanceof TidingsError && e.code === "invalid_filter");
  assert.equal(f.requests.length, 2);
});
