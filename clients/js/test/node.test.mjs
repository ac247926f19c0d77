// The scenarios of test/scenarios.mjs in Node's test runner, against the
// compiled client (dist/tidings.js). The servers come from the environment:
// TIDINGS_URL (a tidings server), TIDINGS_SLOW_URL (one with a small client
// queue and a short slow-client timeout) and TIDINGS_OTHER_URL (one that
// only the server-swap scenarios publish to); tests/api/js_client.rs starts
// them, on each store, and runs this file.
import { test, after } from "node:test";
import * as lib from "../dist/tidings.js";
import { scenarios } from "./scenarios.mjs";
import { proxy } from "./proxy.mjs";
import { mint } from "./auth.mjs";

const servers = { main: process.env.TIDINGS_URL, slow: process.env.TIDINGS_SLOW_URL, other: process.env.TIDINGS_OTHER_URL, auth: process.env.TIDINGS_AUTH_URL };
const secret = process.env.TIDINGS_AUTH_SECRET;
if (!servers.main || !servers.slow || !servers.other || !servers.auth || !secret) {
  throw new Error("set TIDINGS_URL, TIDINGS_SLOW_URL, TIDINGS_OTHER_URL, TIDINGS_AUTH_URL and TIDINGS_AUTH_SECRET, or run `scripts/test -- js_client` from the repository root, which starts the servers");
}
const proxies = { main: await proxy(servers.main), slow: await proxy(servers.slow), auth: await proxy(servers.auth) };
after(() => Promise.all(Object.values(proxies).map((p) => p.close())));

/** What the runner does for a scenario, straight against the server. */
export function direct(url) {
  // The server with tokens on takes the runner's publishes with a token.
  const token = url === servers.auth ? () => mint(secret, 60) : undefined;
  return {
    publish: (event) => lib.publish(event, { url, token }),
    deep: async () => (await fetch(new URL("/health/deep", url))).json(),
  };
}

for (const s of scenarios.filter((s) => !s.browser)) {
  test(s.name, { timeout: 60_000 }, () => {
    const p = proxies[s.server];
    return s.run(lib, {
      url: p.url,
      drop: () => p.drop(),
      stall: () => p.stall(),
      unstall: () => p.unstall(),
      swap: (toOther) => p.retarget(toOther ? servers.other : servers[s.server]),
      requests: (prefix) => p.requests(prefix),
      ...direct(servers[s.server]),
      other: direct(servers.other),
      mint: (ttlSeconds) => mint(secret, ttlSeconds),
      runtime: "node",
    });
  });
}

// A stream line that never ends (a broken or hostile server): the parser
// refuses it past its bound, at once, instead of holding it all and
// rescanning it on every chunk; the stream then resumes (32 MiB of one line
// in 64 KiB chunks cost 12 s of CPU before the bound).
test("the stream parser bounds a line that never ends, in linear time", () => {
  const parser = new lib.SseParser();
  const chunk = new TextEncoder().encode("x".repeat(65536));
  parser.push(new TextEncoder().encode("data: "));
  let fed = 0;
  let refused = null;
  try {
    for (; fed < 512; fed++) parser.push(chunk);
  } catch (error) {
    refused = error;
  }
  if (!refused || !/past \d+ characters/.test(String(refused))) throw new Error(`no refusal after ${fed} chunks: ${refused}`);
  if (fed > 70) throw new Error(`refused only after ${fed} chunks of 64 KiB`);
  // Frames around it still parse.
  const ok = new lib.SseParser();
  const frames = ok.push(new TextEncoder().encode("id: 7\r\ndata: a\r\ndata: b\r\n\r\n"));
  if (frames.length !== 1 || frames[0].data !== "a\nb" || frames[0].id !== "7") throw new Error(JSON.stringify(frames));
});

// A server whose store failed over while the consumer handled 1-5: it kept
// ids up to 3, and its cursor of the consumer went back to 2 (the acks were
// lost with the primary). The consumer sees the survivors handed again,
// asks from the last id it handled, and is told that 4 and 5 are gone
// before the new epoch's first event; nothing is handled twice.
test("a durable consumer whose cursor went back says where it is and is told of the loss", async () => {
  const { createServer } = await import("node:http");
  const fork = 3, base = 1000;
  const envelope = (i) => ({ envelope_version: 1, event_id: i, event_type: "a.b", occurred_at: "2026-12-04T00:00:00Z", payload: {} });
  const asked = [];
  let polls = 0;
  const server = createServer(async (req, res) => {
    let body = "";
    for await (const chunk of req) body += chunk;
    const answer = (json) => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(json));
    if (req.url.endsWith("/ack")) return answer({ consumer_id: "worker", cursor: JSON.parse(body).cursor });
    const since = JSON.parse(body).since;
    asked.push(since ?? null);
    polls += 1;
    if (polls === 1) return answer({ events: [1, 2, 3, 4, 5].map(envelope), next_since: 5, has_more: false });
    // The failover: the cursor went back to 2, at the fork; the server
    // tells it once, with this page (handed again: the consumer asks anew).
    if (since === undefined) {
      const gap = { requested: 3, available_from: base + 1, head: base + 1, reason: "history_lost", fork };
      return answer({ events: [3, base + 1].map(envelope), next_since: base + 1, has_more: false, gap });
    }
    if (since === 5) {
      const gap = { requested: 5, available_from: base + 1, head: base + 1, reason: "history_lost", fork };
      return answer({ events: [envelope(base + 1)], next_since: base + 1, has_more: false, gap });
    }
    res.writeHead(500).end();
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}`;
  const stop = new AbortController();
  const handled = [];
  const told = [];
  try {
    await new lib.Consumer("worker", {}, { url }).run(
      (event) => {
        handled.push(event.event_id);
        if (event.event_id === base + 1) stop.abort();
      },
      { signal: stop.signal, wait_ms: 0, onGap: (gap) => told.push([gap.reason, gap.fork, handled.length]) },
    );
  } finally {
    server.close();
  }
  if (JSON.stringify(handled) !== JSON.stringify([1, 2, 3, 4, 5, base + 1])) throw new Error(`handled ${handled}`);
  // Told twice: with the page handed again (the server's one notice of the
  // new epoch), and with the page from where it is.
  if (JSON.stringify(told) !== JSON.stringify([["history_lost", fork, 5], ["history_lost", fork, 5]])) throw new Error(`told ${JSON.stringify(told)}`);
  if (JSON.stringify(asked) !== JSON.stringify([null, null, 5])) throw new Error(`asked ${asked}`);
});
