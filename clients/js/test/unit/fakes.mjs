// Fakes for the unit tests, which need no server: a `fetch` whose answers
// the test writes (event streams it feeds frame by frame), a `WebSocket`
// whose server side the test plays, and waiting with a deadline.

/** Resolves once `check()` is true; fails after `ms` with `what`. */
export async function until(check, what, ms = 5_000) {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

/** A JSON answer. */
export const json = (status, body, headers = {}) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });

/**
 * An event stream the test feeds: `send(text)` writes raw bytes, `event(e)`
 * writes an envelope frame with its id, `end()` ends the body the way a
 * server's close does. `aborted` says whether the client hung up.
 */
export function eventStream() {
  let controller;
  const body = new ReadableStream({ start: (c) => (controller = c) });
  const encoder = new TextEncoder();
  const s = {
    aborted: false,
    response: new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } }),
    send: (text) => controller.enqueue(encoder.encode(text)),
    event: (e) => s.send(`id: ${e.event_id}\ndata: ${JSON.stringify(e)}\n\n`),
    notice: (name, data) => s.send(`event: ${name}\ndata: ${JSON.stringify(data)}\n\n`),
    end: () => controller.close(),
    fail: () => controller.error(new TypeError("network error")),
  };
  return s;
}

/**
 * A `fetch` that records each request and answers with what `answer(request)`
 * returns (a Response, or a promise of one); a request's signal aborting
 * marks the stream it got as aborted.
 */
export function fakeFetch(answer) {
  const requests = [];
  const f = async (url, init = {}) => {
    const request = { url: new URL(String(url)), method: init.method ?? "GET", headers: { ...(init.headers ?? {}) }, body: init.body };
    requests.push(request);
    const response = await answer(request, requests.length - 1);
    const stream = response.stream;
    if (stream) {
      init.signal?.addEventListener("abort", () => {
        stream.aborted = true;
        try {
          stream.fail();
        } catch {
          // Already ended.
        }
      });
      return stream.response;
    }
    return response;
  };
  f.requests = requests;
  return f;
}

/**
 * A `fetch` that answers each request with a new event stream the test
 * feeds (`f.streams`, in order), unless `early(request, n)` answers first.
 */
export function streamingFetch(early = () => undefined) {
  const streams = [];
  const f = fakeFetch((request, n) => {
    const answer = early(request, n);
    if (answer) return answer;
    const s = eventStream();
    streams.push(s);
    return { stream: s };
  });
  f.streams = streams;
  return f;
}

/** An envelope with id `id`. */
export const envelope = (id, extra = {}) => ({
  envelope_version: 1,
  event_id: id,
  event_type: "unit.test",
  occurred_at: "2026-12-05T00:00:00Z",
  payload: { n: id },
  links: [],
  visibility: "public",
  ...extra,
});

/**
 * A `WebSocket` class whose sockets the test plays the server of: each new
 * socket is pushed to `FakeSocket.sockets`; `socket.fromServer(msg)` delivers
 * a JSON message, `socket.sent` holds what the client sent (parsed), and
 * `socket.serverClose(code)` closes it from the server's side.
 */
export function fakeWebSocket() {
  class FakeSocket {
    static CONNECTING = 0;
    static OPEN = 1;
    static CLOSING = 2;
    static CLOSED = 3;
    static sockets = [];
    readyState = 0;
    sent = [];
    onmessage = null;
    onclose = null;
    constructor(url) {
      this.url = new URL(url);
      FakeSocket.sockets.push(this);
      queueMicrotask(() => (this.readyState = 1));
    }
    send(text) {
      if (this.readyState !== 1) throw new Error("not open");
      this.sent.push(JSON.parse(text));
    }
    close(code = 1000) {
      this.serverClose(code);
    }
    fromServer(msg) {
      this.onmessage?.({ data: JSON.stringify(msg) });
    }
    serverClose(code, reason = "") {
      if (this.readyState === 3) return;
      this.readyState = 3;
      queueMicrotask(() => this.onclose?.({ code, reason }));
    }
  }
  return FakeSocket;
}
