// Publishing over a fake `fetch`: one Idempotency-Key for a call and all its
// retries, the statuses retried (and a 503's Retry-After), refusals never
// retried, and whether the server replayed an earlier publish.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createClient, publish, TidingsError } from "../../dist/tidings.js";
import { fakeFetch, json } from "./fakes.mjs";

const url = "http://tidings.test";
const fast = { initialMs: 1, maxMs: 1 };

test("a publish retries the passing failures under one key, and says it was replayed", async () => {
  const f = fakeFetch((_, n) => {
    if (n === 0) throw new TypeError("connection reset");
    if (n === 1) return json(503, { error: "store_unavailable", message: "later" });
    if (n === 2) return json(502, { error: "http_502", message: "bad gateway" });
    return json(200, { event_ids: [41, 42] }, { "idempotent-replayed": "true" });
  });
  const ids = await publish([{ event_type: "a.b" }, { event_type: "a.c" }], { url, fetch: f, backoff: fast, token: "tok" });
  assert.deepEqual([...ids], [41, 42]);
  assert.equal(ids.replayed, true);
  assert.equal(f.requests.length, 4);
  const keys = new Set(f.requests.map((r) => r.headers["idempotency-key"]));
  assert.equal(keys.size, 1, "one key for the call and its retries");
  assert.match([...keys][0], /^[0-9a-f]{32}$/);
  for (const r of f.requests) {
    assert.equal(r.method, "POST");
    assert.equal(r.url.pathname, "/v1/events");
    assert.equal(r.headers.authorization, "Bearer tok");
    assert.deepEqual(JSON.parse(r.body), { events: [{ event_type: "a.b" }, { event_type: "a.c" }] });
  }
});

test("a first publish is not replayed; two calls have two keys", async () => {
  const f = fakeFetch((_, n) => json(201, { event_ids: [n + 1] }));
  const client = createClient({ url, fetch: f });
  const first = await client.publish({ event_type: "a.b" });
  const second = await client.publish({ event_type: "a.b" }, { idempotencyKey: "mine" });
  assert.deepEqual([...first], [1]);
  assert.equal(first.replayed, false);
  assert.notEqual(f.requests[0].headers["idempotency-key"], f.requests[1].headers["idempotency-key"]);
  assert.equal(f.requests[1].headers["idempotency-key"], "mine");
  assert.deepEqual(JSON.parse(f.requests[0].body), { event_type: "a.b" });
  assert.equal(second.replayed, false);
});

test("a refusal is thrown at once, never retried", async () => {
  for (const [status, code] of [[400, "invalid_event"], [401, "unauthorized"], [409, "idempotency_conflict"], [413, "payload_too_large"]]) {
    const f = fakeFetch(() => json(status, { error: code, message: "no" }));
    await assert.rejects(publish({ event_type: "a.b" }, { url, fetch: f, backoff: fast }), (e) => e instanceof TidingsError && e.code === code && e.status === status);
    assert.equal(f.requests.length, 1, `${status} is final`);
  }
});

test("retries stop after the given number, and a proxy's page still gives a code", async () => {
  const f = fakeFetch(() => new Response("<html>bad gateway</html>", { status: 504, statusText: "Gateway Timeout" }));
  await assert.rejects(publish({ event_type: "a.b" }, { url, fetch: f, retries: 2, backoff: fast }), (e) => e.code === "http_504");
  assert.equal(f.requests.length, 3);
});
