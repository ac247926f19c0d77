// The client's behaviour, written once and run twice: in Node
// (test/node.test.mjs, Node's test runner) and in headless Chromium
// (test/browser.mjs). Each scenario gets the client module and an `env`:
//   env.url      the server the scenario talks to, through a TCP proxy;
//   env.drop()   cuts every connection through that proxy (a lost network);
//   env.stall(), env.unstall() hold back, then let go, what the proxy's open
//                connections send to the client (a network too slow);
//   env.requests(prefix) how many requests whose line starts with prefix
//                went through the proxy so far;
//   env.runtime  "node" or "chromium".
//   env.mint(ttlSeconds) a token for the server with tokens on (scenarios
//                whose `server` is "auth"), expiring that many seconds from now;
//   env.publish(event) publishes straight to the server, env.deep() reads
//   its /health/deep (both done by the runner, in Node);
//   env.swap(true) sends the proxy's new connections to another, fresh
//                 server (its own log, so its ids start low), env.swap(false)
//                 back; env.other has publish and deep for that one;
// Scenarios tell their events apart from everyone else's with a payload
// field (`run`), so they can share a server. Waits are on events, each with
// a deadline.

const DEADLINE_MS = 20_000;

function fail(message) {
  throw new Error(message);
}
function equal(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) fail(`${what}: expected ${e}, got ${a}`);
}
function ok(condition, what) {
  if (!condition) fail(what);
}

/** Resolves when `predicate()` holds, checked on every `signal()`; rejects at the deadline. */
function waiter() {
  const waits = [];
  return {
    signal() {
      for (const w of [...waits]) {
        if (w.predicate()) {
          waits.splice(waits.indexOf(w), 1);
          clearTimeout(w.timer);
          w.resolve();
        }
      }
    },
    until(predicate, what) {
      if (predicate()) return Promise.resolve();
      return new Promise((resolve, reject) => {
        const w = { predicate, resolve };
        w.timer = setTimeout(() => {
          waits.splice(waits.indexOf(w), 1);
          reject(new Error(`timed out waiting for ${what}`));
        }, DEADLINE_MS);
        waits.push(w);
      });
    },
  };
}

const tag = () => `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
const byRun = (run) => ({ payload: { "==": [{ var: "run" }, run] } });

/**
 * A stream of `run`'s events that records what reaches its callbacks:
 * `got` (ids), `gaps`, `dropped`, `opened` (times it went open), and `w`
 * to wait on them. `options.onEvent(e)` runs after an event is recorded.
 */
function watch(lib, env, run, options = {}) {
  const w = waiter();
  const seen = { got: [], gaps: [], dropped: [], opened: 0, w };
  const { onEvent, ...rest } = options;
  seen.s = lib.stream(byRun(run), {
    url: env.url,
    backoff: { initialMs: 50, maxMs: 200 },
    ...rest,
    onEvent: async (e) => {
      seen.got.push(e.event_id);
      w.signal();
      if (onEvent) {
        await onEvent(e);
        w.signal();
      }
    },
    onGap: (g) => {
      seen.gaps.push(g);
      w.signal();
    },
    onDropped: (d) => {
      seen.dropped.push(d);
      w.signal();
    },
    onState: (state) => {
      if (state === "open") seen.opened++;
      w.signal();
    },
  });
  return seen;
}

async function publishRun(env, run, n, extra = {}) {
  const ids = [];
  // One at a time, straight to the server (not through the proxy the
  // client under test uses), as a live producer's would be.
  for (let i = 0; i < n; i++) ids.push(...(await env.publish({ event_type: "comment.posted", payload: { run, i, ...extra } })));
  return ids;
}

/** Replay from `since`, then live; typed envelopes, in order, once each. */
async function replayThenLive(lib, env, transport) {
  const run = tag();
  const w = waiter();
  const got = [];
  const states = [];
  const first = await publishRun(env, run, 3);
  const s = lib.stream(byRun(run), {
    url: env.url,
    since: first[0] - 1,
    transport,
    onEvent: (e) => {
      got.push(e);
      w.signal();
    },
    onState: (state) => {
      states.push(state);
      w.signal();
    },
  });
  try {
    await w.until(() => got.length >= 3, "the replayed events");
    const live = await publishRun(env, run, 2);
    await w.until(() => got.length >= 5, "the live events");
    equal(
      got.map((e) => e.event_id),
      [...first, ...live],
      "ids",
    );
    equal(
      got.map((e) => [e.envelope_version, e.event_type, e.payload.run, e.payload.i, e.visibility]),
      [0, 1, 2, 0, 1].map((i) => [1, "comment.posted", run, i, "public"]),
      "envelopes",
    );
    // Past an event once its handler is done.
    await new Promise((r) => setTimeout(r, 0));
    equal(s.lastEventId, live[1], "lastEventId");
    ok(states.includes("open"), `went open: ${states}`);
  } finally {
    s.close();
  }
  equal(s.state, "closed", "state after close");
}

/** A lost connection: the stream comes back by itself, from its last id. */
async function resumesAfterLostConnection(lib, env, transport) {
  const run = tag();
  const v = watch(lib, env, run, { transport });
  try {
    await v.w.until(() => v.opened === 1, "the stream to open");
    const before = await publishRun(env, run, 1);
    await v.w.until(() => v.got.length === 1, "the first event");
    await env.drop();
    // Published while the client is away.
    const away = await publishRun(env, run, 2);
    await v.w.until(() => v.opened === 2, "the stream to come back");
    const after = await publishRun(env, run, 1);
    await v.w.until(() => v.got.length >= 4, "every event");
    equal(v.got, [...before, ...away, ...after], "nothing missed, nothing twice");
  } finally {
    v.s.close();
  }
}

/** A resume point past the head: `system.replay_gap` reaches onGap, then live events flow. */
async function replayGap(lib, env, transport) {
  const run = tag();
  const head = (await env.deep()).head_event_id;
  const since = head + 1_000_000;
  const v = watch(lib, env, run, { since, transport });
  try {
    await v.w.until(() => v.gaps.length === 1, "the replay gap");
    const gap = v.gaps[0];
    ok(gap.requested === since && gap.head >= head && gap.available_from >= 1, `gap ${JSON.stringify(gap)}`);
    const live = await publishRun(env, run, 1);
    await v.w.until(() => v.got.length === 1, "a live event after the gap");
    equal(v.got, live, "the live event");
  } finally {
    v.s.close();
  }
}

/**
 * A client that stops taking events (its handler does not return) is
 * dropped by the server with `system.client_dropped_slow`; once the handler
 * returns, the client sees the notice, resumes from its last id and gets
 * every event exactly once, in order. Needs the server with the small queue.
 */
async function slowDropThenLosslessResume(lib, env) {
  const run = tag();
  let release;
  const blocked = new Promise((r) => (release = r));
  let calls = 0;
  const v = watch(lib, env, run, {
    transport: "fetch",
    onEvent: async () => {
      if (++calls === 1) await blocked;
    },
  });
  try {
    await v.w.until(() => v.opened === 1, "the stream to open");
    const published = await stallUntilDropped(env, run);
    const after = await publishRun(env, run, 2);
    release();
    await expectLosslessResume(v, [...published, ...after]);
  } finally {
    release();
    v.s.close();
  }
}

/** Publishes big events until the server has dropped its only stream; their ids. */
async function stallUntilDropped(env, run, published = []) {
  const blob = "x".repeat(60_000);
  // Enough bytes to fill every buffer between the server and the client.
  for (let i = 0; i < 400; i++) {
    published.push(...(await publishRun(env, run, 1, { blob })));
    if (i % 4 === 3 && (await env.deep()).events.in_flight_subscriptions === 0) break;
  }
  equal((await env.deep()).events.in_flight_subscriptions, 0, "the stalled stream was dropped");
  return published;
}

/** After a drop: the notice, a reconnect, and `expected` exactly once, in order. */
async function expectLosslessResume(v, expected) {
  await v.w.until(() => v.dropped.length === 1, "the drop notice");
  ok(["queue_full", "no_progress"].includes(v.dropped[0].reason), `reason ${v.dropped[0].reason}`);
  await v.w.until(() => v.got.length >= expected.length, "every event after the resume");
  equal(v.got, expected, "every event exactly once, in order");
  ok(v.opened >= 2, "the stream reconnected");
}

/**
 * A network too slow for the stream: the server drops the client with
 * `system.client_dropped_slow` while bytes are held back; once they flow,
 * the client sees what was sent, the notice, resumes from its last id and
 * gets every event exactly once, in order. Needs the server with the small
 * queue.
 */
async function slowNetworkDropThenLosslessResume(lib, env, transport) {
  const run = tag();
  const v = watch(lib, env, run, { transport });
  let stalled = false;
  try {
    await v.w.until(() => v.opened === 1, "the stream to open");
    const first = await publishRun(env, run, 1);
    await v.w.until(() => v.got.length === 1, "the first event");
    await env.stall();
    stalled = true;
    const published = await stallUntilDropped(env, run, first);
    const after = await publishRun(env, run, 2);
    await env.unstall();
    stalled = false;
    await expectLosslessResume(v, [...published, ...after]);
  } finally {
    if (stalled) await env.unstall();
    v.s.close();
  }
}

/** A refused filter: onError with the stable code, closed, no retry. */
async function refusedFilter(lib, env, transport) {
  const w = waiter();
  const errors = [];
  const before = await env.requests("GET /v1/stream");
  const s = lib.stream(
    { payload: { no_such_operator: [1] } },
    {
      url: env.url,
      transport,
      backoff: { initialMs: 10, maxMs: 10 },
      onEvent: () => fail("no event for a refused filter"),
      onError: (e) => {
        errors.push(e);
        w.signal();
      },
    },
  );
  await w.until(() => errors.length === 1, "the refusal");
  equal([errors[0].status, errors[0].code, s.state], [400, "invalid_filter", "closed"], "the refusal");
  const settled = await env.requests("GET /v1/stream");
  ok(settled > before, "the stream was asked for");
  // A retry would come within the 10 ms backoff.
  await new Promise((r) => setTimeout(r, 300));
  equal(await env.requests("GET /v1/stream"), settled, "no request after the refusal");
}

/**
 * The server behind the address is swapped for one whose log is shorter
 * (restored from an older backup, a new deployment): the stream's resume
 * point is past its head, so it gets `system.replay_gap`, and the events
 * the new server publishes, with ids at or below ones seen before, are
 * delivered, not taken for duplicates.
 */
async function resumePastTheHeadOfAnotherServer(lib, env, transport) {
  const run = tag();
  const otherHead = (await env.other.deep()).head_event_id;
  const v = watch(lib, env, run, { transport });
  try {
    await v.w.until(() => v.opened === 1, "the stream to open");
    // Ids on this server well past the other's head.
    let mine = [];
    while (!mine.length || mine[mine.length - 1] <= otherHead + 3) mine = [...mine, ...(await publishRun(env, run, 1))];
    await v.w.until(() => v.got.length === mine.length, "this server's events");
    await env.swap(true);
    await env.drop();
    await v.w.until(() => v.gaps.length === 1, "the replay gap from the other server");
    ok(v.gaps[0].requested > v.gaps[0].head, `past the head: ${JSON.stringify(v.gaps[0])}`);
    const theirs = [];
    for (let i = 0; i < 2; i++) theirs.push(...(await env.other.publish({ event_type: "comment.posted", payload: { run, i } })));
    ok(theirs[0] <= mine[mine.length - 1], `the other server's ids are low: ${theirs} vs ${mine}`);
    await v.w.until(() => v.got.length === mine.length + 2, "the other server's events");
    equal(v.got, [...mine, ...theirs], "both servers' events, each once");
  } finally {
    v.s.close();
    await env.swap(false);
  }
}

/** A handler that throws: on `fetch` the connection ends and the event comes again. */
async function throwingHandlerGetsTheEventAgain(lib, env) {
  const run = tag();
  const handled = [];
  let thrown = 0;
  const v = watch(lib, env, run, {
    transport: "fetch",
    onEvent: (e) => {
      if (e.payload.i === 1 && thrown++ === 0) throw new Error("the handler failed once (expected by the test)");
      handled.push(e.event_id);
    },
  });
  try {
    await v.w.until(() => v.opened === 1, "the stream to open");
    const ids = await publishRun(env, run, 3);
    await v.w.until(() => handled.length === 3, "every event handled");
    equal(handled, ids, "each event handled once, the failed one again");
    ok(v.opened >= 2, "the connection was restarted");
  } finally {
    v.s.close();
  }
}

/** Polls, and a durable consumer whose cursor moves only on ack. */
async function pollAndConsumer(lib, env) {
  const run = tag();
  const filter = byRun(run);
  const id = `js-${run}`;
  const c = new lib.Consumer(id, filter, { url: env.url });
  const empty = await c.next({ wait_ms: 0 });
  equal(empty.events, [], "a new consumer starts at the head");
  // A batch through the client's own publish.
  const ids = await lib.publish([0, 1, 2].map((i) => ({ event_type: "comment.posted", payload: { run, i } })), { url: env.url });
  equal(ids.length, 3, "a batch publish answers every id");
  const page = await c.next({ limit: 2 });
  equal(
    page.events.map((e) => e.event_id),
    ids.slice(0, 2),
    "the first page",
  );
  ok(page.has_more, "has_more");
  // Not acknowledged: the same page comes again.
  equal(
    (await c.next({ limit: 2 })).events.map((e) => e.event_id),
    ids.slice(0, 2),
    "unacknowledged page again",
  );
  equal(await c.ack(page.next_since), page.next_since, "ack");
  // Another worker with the same consumer id goes on from the cursor.
  const other = new lib.Consumer(id, filter, { url: env.url });
  const handled = [];
  const stop = new AbortController();
  const running = other.run(
    (e) => {
      handled.push(e.event_id);
      if (handled.length === 2) stop.abort();
    },
    { signal: stop.signal, wait_ms: 5_000 },
  );
  const later = await publishRun(env, run, 1);
  await running;
  equal(handled, [ids[2], later[0]], "the run loop from the stored cursor");
  equal(other.cursor, later[0], "the loop acknowledged what it handled");
  // Stateless polls: from `since`, and a long poll that an event ends.
  equal(
    (await lib.poll({ filter, since: ids[0] }, { url: env.url })).events.map((e) => e.event_id),
    [ids[1], ids[2], later[0]],
    "poll from since",
  );
  const waiting = lib.poll({ filter, since: later[0], wait_ms: 10_000 }, { url: env.url });
  const woke = await publishRun(env, run, 1);
  equal(
    (await waiting).events.map((e) => e.event_id),
    woke,
    "long poll",
  );
  await c.delete();
  try {
    await c.ack(1);
    fail("ack of a deleted consumer");
  } catch (e) {
    equal([e.status, e.code], [404, "consumer_not_found"], "ack after delete");
  }
}

/**
 * The WebSocket device: catch-up from a given cursor, realtime, acks; after
 * a lost connection it reconnects by itself and gets what it missed once;
 * a new connection of the same device (no local state at all) resumes from
 * the cursor the server stored from its acks.
 */
async function websocketResumesFromAckedCursor(lib, env) {
  const run = tag();
  const w = waiter();
  const { key, jwk } = await lib.createDeviceKey();
  const deviceId = `js-${run}`;
  const got = [];
  let opened = 0;
  const before = await publishRun(env, run, 2);
  const options = {
    url: env.url,
    deviceId,
    key,
    filter: byRun(run),
    backoff: { initialMs: 50, maxMs: 200 },
    onEvent: (seq, e) => {
      got.push([seq, e.event_id]);
      w.signal();
    },
    onAck: () => w.signal(),
    onState: (state) => {
      if (state === "open") opened++;
      w.signal();
    },
  };
  const c = lib.connect({ ...options, cursor: before[0] - 1 });
  try {
    await c.ready();
    await w.until(() => got.length === 2, "the catch-up");
    const live = await publishRun(env, run, 2);
    await w.until(() => got.length === 4, "the realtime events");
    equal(
      got.map(([seq, id]) => (seq === id ? seq : `${seq}!=${id}`)),
      [...before, ...live],
      "seq is the event id",
    );
    await w.until(() => c.cursor === live[1], "the acks");
    await env.drop();
    const away = await publishRun(env, run, 2);
    await w.until(() => opened >= 2 && got.length >= 6, "the reconnect and what it missed");
    equal(
      got.map(([seq]) => seq),
      [...before, ...live, ...away],
      "nothing missed, nothing twice",
    );
    await w.until(() => c.cursor === away[1], "the acks after the reconnect");
  } finally {
    c.close();
  }
  // The same device from scratch: no high-water mark, no cursor given.
  const later = await publishRun(env, run, 1);
  const fresh = [];
  const again = lib.connect({
    ...options,
    key: await lib.importDeviceKey(jwk),
    onEvent: (seq) => {
      fresh.push(seq);
      w.signal();
    },
  });
  try {
    await again.ready();
    await w.until(() => fresh.length >= 1, "the event after the stored cursor");
    equal(fresh, later, "resumed from the acknowledged cursor");
  } finally {
    again.close();
  }
}

/**
 * A device given `cursor: 0` catches up from the start of the log (0 is a
 * cursor like any other), not from the head: by `ready()` it has every
 * event its filter matches.
 */
async function websocketCursorZeroStartsAtTheBeginning(lib, env) {
  const run = tag();
  const { key } = await lib.createDeviceKey();
  const before = await publishRun(env, run, 2);
  const got = [];
  const c = lib.connect({ url: env.url, deviceId: `js-zero-${run}`, key, filter: byRun(run), cursor: 0, onEvent: (seq) => got.push(seq) });
  try {
    await c.ready();
    equal(got, before, "caught up from 0");
  } finally {
    c.close();
  }
}

/**
 * A handler that throws, in catch-up and in realtime: the connection ends,
 * nothing is acknowledged past the failure, and the next connection brings
 * the event again. `ready()` rejects once the connection is closed.
 */
async function websocketHandlerErrorRedelivers(lib, env) {
  const run = tag();
  const w = waiter();
  const { key } = await lib.createDeviceKey();
  const handled = [];
  const failures = new Set();
  let opened = 0;
  const before = await publishRun(env, run, 2);
  const c = lib.connect({
    url: env.url,
    deviceId: `js-${run}`,
    key,
    filter: byRun(run),
    cursor: before[0] - 1,
    backoff: { initialMs: 50, maxMs: 200 },
    onEvent: (seq, e) => {
      // The second event of the catch-up and the second live one fail once.
      const at = `${e.payload.live ? "live" : "history"}-${e.payload.i}`;
      if (e.payload.i === 1 && !failures.has(at)) {
        failures.add(at);
        throw new Error(`the handler failed once at ${at} (expected by the test)`);
      }
      handled.push(seq);
      w.signal();
    },
    onState: (state) => {
      if (state === "open") opened++;
      w.signal();
    },
  });
  try {
    await w.until(() => handled.length === 2 && opened >= 1, "the catch-up, the failed event again");
    const live = [];
    for (let i = 0; i < 2; i++) live.push(...(await env.publish({ event_type: "comment.posted", payload: { run, i, live: true } })));
    // The catch-up failure came before the first open, the live one after:
    // the second open follows the catch-up that brings the failed event.
    await w.until(() => handled.length === 4 && opened >= 2, "the live events, the failed one again, after a reconnect");
    equal(handled, [...before, ...live], "each event handled once");
  } finally {
    c.close();
  }
  let rejected = null;
  await c.ready().catch((e) => (rejected = e));
  ok(rejected instanceof Error, "ready() rejects once the connection is closed");
}

/** A refused handshake (an invalid filter): onRejected, closed, never retried. */
async function websocketRejectionIsNotRetried(lib, env) {
  const w = waiter();
  const { key } = await lib.createDeviceKey();
  const rejected = [];
  const before = await env.requests("GET /v1/ws");
  const c = lib.connect({
    url: env.url,
    deviceId: "js-rejected",
    key,
    filter: { payload: { no_such_operator: [1] } },
    backoff: { initialMs: 10, maxMs: 10 },
    onEvent: () => fail("no event"),
    onRejected: (e) => {
      rejected.push(e);
      w.signal();
    },
  });
  await w.until(() => rejected.length === 1, "the rejection");
  equal([rejected[0].code, c.state], ["invalid_filter", "closed"], "rejection");
  const settled = await env.requests("GET /v1/ws");
  await new Promise((r) => setTimeout(r, 300));
  equal(await env.requests("GET /v1/ws"), settled, "no reconnect after a rejection");
  equal(settled - before, 1, "one upgrade");
  let fromReady = null;
  await c.ready().catch((e) => (fromReady = e));
  equal(fromReady?.code, "invalid_filter", "ready() rejects with the rejection");
}

/**
 * A token function, on a server with tokens on: a stream whose token
 * expires is told (`system.token_expired`), ended, and comes back under a
 * fresh token from the function, missing and repeating nothing.
 */
async function streamTokenRefreshed(lib, env, transport) {
  const run = tag();
  let calls = 0;
  const notices = [];
  // Expires a second from now: the server ends the stream at exp plus its
  // 5 s leeway.
  const v = watch(lib, env, run, {
    transport,
    token: async () => {
      calls++;
      return env.mint(1);
    },
    onNotice: (type) => notices.push(type),
  });
  try {
    await v.w.until(() => v.opened === 1, "the stream to open");
    const before = await publishRun(env, run, 1);
    await v.w.until(() => v.got.length === 1, "the first event");
    await v.w.until(() => v.opened === 2, "the stream to come back under a fresh token");
    ok(calls >= 2, `the token function was asked again (${calls} calls)`);
    ok(notices.includes("system.token_expired"), `told why: ${notices}`);
    const after = await publishRun(env, run, 1);
    await v.w.until(() => v.got.length >= 2, "the event after the refresh");
    equal(v.got, [...before, ...after], "nothing missed, nothing twice");
  } finally {
    v.s.close();
  }
}

/**
 * A token function on a device connection: at `stream.token_expired` the
 * client sends `stream.reauth` with a fresh token, and the same connection
 * goes on delivering.
 */
async function deviceTokenRefreshed(lib, env) {
  const run = tag();
  const w = waiter();
  const got = [];
  let calls = 0;
  const { key } = await lib.createDeviceKey();
  const upgrades = await env.requests("GET /v1/ws");
  const c = lib.connect({
    url: env.url,
    deviceId: `js-${run}`,
    key,
    filter: byRun(run),
    backoff: { initialMs: 50, maxMs: 200 },
    token: async () => {
      calls++;
      w.signal();
      return env.mint(1);
    },
    onEvent: (seq) => {
      got.push(seq);
      w.signal();
    },
  });
  try {
    await c.ready();
    const before = await publishRun(env, run, 1);
    await w.until(() => got.length === 1, "the first event");
    await w.until(() => calls >= 2, "a fresh token at the expiry");
    const after = await publishRun(env, run, 1);
    await w.until(() => got.length === 2, "the event after the reauth");
    equal(got, [...before, ...after], "nothing missed, nothing twice");
    equal((await env.requests("GET /v1/ws")) - upgrades, 1, "the same connection: reauthenticated, not reconnected");
  } finally {
    c.close();
  }
}

/**
 * A proxy's passing refusals (408, 429 with Retry-After, 502, 504) are retried
 * under the same key, as the Python client retries them; a 400 is not.
 */
async function publishRetriesPassingRefusals(lib, env) {
  const run = tag();
  for (const status of [408, 429, 502, 504]) {
    const keys = [];
    const flaky = async (url, init) => {
      keys.push(init.headers["idempotency-key"]);
      if (keys.length === 1) return new Response(JSON.stringify({ error: "passing", message: "a proxy" }), { status, headers: { "retry-after": "0" } });
      return fetch(url, init);
    };
    const ids = await lib.publish({ event_type: "comment.posted", payload: { run, status } }, { url: env.url, fetch: flaky, backoff: { initialMs: 10, maxMs: 20 } });
    equal(keys.length, 2, `${status} is retried once`);
    equal(keys[1], keys[0], "under the same key");
    equal(ids.length, 1);
  }
  const keys = [];
  const refusing = async (url, init) => {
    keys.push(init.headers["idempotency-key"]);
    return new Response(JSON.stringify({ error: "invalid_body", message: "no" }), { status: 400 });
  };
  let refused;
  try {
    await lib.publish({ event_type: "comment.posted" }, { url: env.url, fetch: refusing });
  } catch (e) {
    refused = e;
  }
  ok(refused instanceof lib.TidingsError && refused.status === 400, `a refusal: ${refused}`);
  equal(keys.length, 1, "a 400 is not retried");
}

/** Canonical JSON as RFC 8785 has it (the form every proof signs). */
/**
 * A publish whose answer is lost after the server stored it is retried with
 * the same Idempotency-Key: the original ids, the event stored once. A
 * refusal is not retried.
 */
async function publishRetriesALostAnswer(lib, env) {
  const run = tag();
  const keys = [];
  let calls = 0;
  const lossy = async (url, init) => {
    keys.push(init.headers["idempotency-key"]);
    const response = await fetch(url, init);
    // Only the very first answer is lost.
    if (++calls > 1) return response;
    await response.arrayBuffer();
    throw new TypeError("the connection was lost before the answer");
  };
  const options = { url: env.url, fetch: lossy, backoff: { initialMs: 10, maxMs: 20 } };
  const ids = await lib.publish({ event_type: "comment.posted", payload: { run } }, options);
  equal(keys.length, 2, "one retry");
  ok(/^[0-9a-f]{32}$/.test(keys[0]) && keys[1] === keys[0], "the retry carried the first attempt's key");
  const page = await (await fetch(new URL(`/v1/poll?since=${ids[0] - 1}&types=comment.posted&limit=1000`, env.url))).json();
  const stored = page.events.filter((e) => e.payload.run === run).map((e) => e.event_id);
  equal(JSON.stringify(stored), JSON.stringify(ids), "stored once, under the ids the retry was answered");
  equal(ids.replayed, true, "the retry's answer says the first attempt stored it");
  equal((await lib.publish({ event_type: "comment.posted", payload: { run, fresh: true } }, { url: env.url })).replayed, false, "a first answer is no replay");
  keys.length = 0;
  let refused;
  try {
    await lib.publish({ event_type: "Not-A-Name" }, options);
  } catch (e) {
    refused = e;
  }
  ok(refused instanceof lib.TidingsError && refused.code === "invalid_event_name", `a refusal: ${refused}`);
  equal(keys.length, 1, "a refusal is not retried");
}

async function canonicalJson(lib) {
  equal(lib.canonicalJson({ b: [1, 2.5, "x"], a: { d: null, c: true }, "\u00e9": 1e21, "\u20ac": 1, "\ud83d\ude00": 0.1 }), '{"a":{"c":true,"d":null},"b":[1,2.5,"x"],"é":1e+21,"€":1,"😀":0.1}', "canonical");
}

// `browser: true`: Chromium only (Node has no EventSource); `node: true`:
// Node only.
export const scenarios = [
  { name: "canonical JSON follows RFC 8785", server: "main", run: (lib) => canonicalJson(lib) },
  { name: "publish retries a proxy's passing refusals, not a 400", server: "main", run: (lib, env) => publishRetriesPassingRefusals(lib, env) },
  { name: "stream (fetch): replay from since, then live, typed envelopes", server: "main", run: (lib, env) => replayThenLive(lib, env, "fetch") },
  { name: "stream (EventSource): replay from since, then live", server: "main", browser: true, run: (lib, env) => replayThenLive(lib, env, "eventsource") },
  { name: "stream (default transport): replay from since, then live", server: "main", run: (lib, env) => replayThenLive(lib, env, undefined) },
  { name: "stream (fetch): a lost connection resumes from the last id", server: "main", run: (lib, env) => resumesAfterLostConnection(lib, env, "fetch") },
  { name: "stream (EventSource): a lost connection resumes from the last id", server: "main", browser: true, run: (lib, env) => resumesAfterLostConnection(lib, env, "eventsource") },
  { name: "stream (fetch): a replay gap reaches onGap, then live", server: "main", run: (lib, env) => replayGap(lib, env, "fetch") },
  { name: "stream (EventSource): a replay gap reaches onGap, then live", server: "main", browser: true, run: (lib, env) => replayGap(lib, env, "eventsource") },
  // Chromium reads a fetch body into memory whether or not the page reads
  // it, so a handler that does not return slows only Node's reader.
  { name: "stream (fetch): a handler that does not return is dropped, then resumes losslessly", server: "slow", node: true, run: (lib, env) => slowDropThenLosslessResume(lib, env) },
  { name: "stream (fetch): a slow network is dropped, then resumes losslessly", server: "slow", run: (lib, env) => slowNetworkDropThenLosslessResume(lib, env, "fetch") },
  { name: "stream (EventSource): a slow network is dropped, then resumes losslessly", server: "slow", browser: true, run: (lib, env) => slowNetworkDropThenLosslessResume(lib, env, "eventsource") },
  { name: "stream (fetch): a refused filter is reported, not retried", server: "main", run: (lib, env) => refusedFilter(lib, env, "fetch") },
  { name: "stream (EventSource): a refused filter is reported, not retried", server: "main", browser: true, run: (lib, env) => refusedFilter(lib, env, "eventsource") },
  { name: "stream (fetch): a resume point past another server's head", server: "main", run: (lib, env) => resumePastTheHeadOfAnotherServer(lib, env, "fetch") },
  { name: "stream (EventSource): a resume point past another server's head", server: "main", browser: true, run: (lib, env) => resumePastTheHeadOfAnotherServer(lib, env, "eventsource") },
  { name: "stream (fetch): a handler that throws gets the event again", server: "main", run: (lib, env) => throwingHandlerGetsTheEventAgain(lib, env) },
  { name: "poll and a durable consumer", server: "main", run: (lib, env) => pollAndConsumer(lib, env) },
  { name: "publish: a lost answer is retried with its Idempotency-Key, stored once", server: "main", run: (lib, env) => publishRetriesALostAnswer(lib, env) },
  { name: "websocket: a reconnect resumes from the acked cursor", server: "main", run: (lib, env) => websocketResumesFromAckedCursor(lib, env) },
  { name: "websocket: cursor 0 starts at the beginning", server: "main", run: (lib, env) => websocketCursorZeroStartsAtTheBeginning(lib, env) },
  { name: "websocket: a handler that throws gets the event again", server: "main", run: (lib, env) => websocketHandlerErrorRedelivers(lib, env) },
  { name: "websocket: a rejection is not retried", server: "main", run: (lib, env) => websocketRejectionIsNotRetried(lib, env) },
  { name: "stream (fetch): an expired token is replaced through the token function", server: "auth", run: (lib, env) => streamTokenRefreshed(lib, env, "fetch") },
  { name: "stream (EventSource): an expired token is replaced through the token function", server: "auth", browser: true, run: (lib, env) => streamTokenRefreshed(lib, env, "eventsource") },
  { name: "websocket: an expired token is replaced with stream.reauth", server: "auth", run: (lib, env) => deviceTokenRefreshed(lib, env) },
];
