// Waiting between attempts: full jitter (a wait anywhere in [0, ceiling],
// the ceiling doubling up to the maximum), and a page that comes back online
// or into view reconnecting at once instead of after its backoff.
import { mock, test } from "node:test";
import assert from "node:assert/strict";
import { publish, stream } from "../../dist/tidings.js";
import { fakeFetch, json, streamingFetch, until } from "./fakes.mjs";

mock.method(console, "warn", () => {});
const url = "http://tidings.test";

/** The waits a publish that meets only 503s takes, with Math.random giving `r`. */
async function waits(r) {
  const f = fakeFetch(() => json(503, { error: "store_unavailable", message: "later" }));
  const recorded = [];
  const real = globalThis.setTimeout;
  const random = mock.method(Math, "random", () => r);
  globalThis.setTimeout = (fn, ms, ...rest) => {
    recorded.push(ms);
    return real(fn, 0, ...rest);
  };
  try {
    await assert.rejects(publish({ event_type: "unit.test" }, { url, fetch: f, retries: 4, backoff: { initialMs: 100, maxMs: 400 } }));
  } finally {
    globalThis.setTimeout = real;
    random.mock.restore();
  }
  assert.equal(f.requests.length, 5);
  return recorded;
}

test("reconnection waits are full jitter: anywhere from nothing to a ceiling that doubles up to the maximum", async () => {
  assert.deepEqual(await waits(0), [0, 0, 0, 0]);
  const top = await waits(0.999);
  assert.deepEqual(top.map(Math.round), [100, 200, 400, 400]);
});

/** Makes the global object an event target (as a window is) for one test. */
function asWindow(t) {
  const target = new EventTarget();
  globalThis.addEventListener = target.addEventListener.bind(target);
  globalThis.removeEventListener = target.removeEventListener.bind(target);
  const doc = new EventTarget();
  doc.visibilityState = "hidden";
  globalThis.document = doc;
  t.after(() => {
    delete globalThis.addEventListener;
    delete globalThis.removeEventListener;
    delete globalThis.document;
  });
  return { target, doc };
}

/** A stream whose first connection fails, then waits a minute before the next. */
async function waitingStream() {
  const f = streamingFetch((_, n) => {
    if (n === 0) throw new TypeError("offline");
  });
  const streams = f.streams;
  const s = stream({}, { url, fetch: f, transport: "fetch", backoff: { initialMs: 60_000, maxMs: 60_000 }, onEvent: () => {} });
  await until(() => f.requests.length === 1 && s.state === "connecting", "the failed first connection");
  // Far from its minute: still waiting.
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(f.requests.length, 1);
  return { s, f, streams };
}

test("a page back online reconnects at once", async (t) => {
  const { target } = asWindow(t);
  const random = mock.method(Math, "random", () => 0.999);
  t.after(() => random.mock.restore());
  const { s, streams } = await waitingStream();
  target.dispatchEvent(new Event("online"));
  await until(() => streams.length === 1, "the reconnection", 2_000);
  s.close();
});

test("a tab shown again reconnects at once; one still hidden waits", async (t) => {
  const { doc } = asWindow(t);
  const random = mock.method(Math, "random", () => 0.999);
  t.after(() => random.mock.restore());
  const { s, f, streams } = await waitingStream();
  doc.dispatchEvent(new Event("visibilitychange"));
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(f.requests.length, 1, "hidden: still waiting");
  doc.visibilityState = "visible";
  doc.dispatchEvent(new Event("visibilitychange"));
  await until(() => streams.length === 1, "the reconnection", 2_000);
  s.close();
});
