// The device connection over a fake `WebSocket` the test plays the server
// of: a handshake whose proof verifies under the device's key, catch-up,
// realtime, acknowledgements, a reconnection that carries the high-water
// mark, and a refusal that is never retried.
import { mock, test } from "node:test";
import assert from "node:assert/strict";
import { canonicalJson, createClient, createDeviceKey, METHOD } from "../../dist/tidings.js";
import { envelope, fakeWebSocket, until } from "./fakes.mjs";

mock.method(console, "warn", () => {});
const url = "http://tidings.test";
const fast = { initialMs: 1, maxMs: 1 };

const b64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
const hex = (bytes) => [...new Uint8Array(bytes)].map((b) => b.toString(16).padStart(2, "0")).join("");

/** Whether `proof` signs `{method, body, nonce}` under the identity it names. */
async function verifies(proof, method, body, nonce) {
  const key = await crypto.subtle.importKey("raw", b64(proof.identity.data.public_key), { name: "Ed25519" }, false, ["verify"]);
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(canonicalJson({ method, body, nonce })));
  return crypto.subtle.verify({ name: "Ed25519" }, key, b64(proof.signature), new TextEncoder().encode(`sha256:${hex(digest)}`));
}

/** The next request the client sent with `method`, after the `n` already seen. */
async function request(socket, method, n = 0) {
  await until(() => socket.sent.filter((m) => m.method === method).length > n, method);
  return socket.sent.filter((m) => m.method === method)[n];
}

const answer = (socket, req, result) => socket.fromServer({ jsonrpc: "2.0", id: req.id, result });

test("a device authenticates with a signed proof, catches up, follows, acknowledges and resumes with its cursor", async () => {
  const WS = fakeWebSocket();
  const { key } = await createDeviceKey();
  const seen = [];
  const acks = [];
  const c = createClient({ url, token: () => "tok" }).connect({
    deviceId: "kiosk-1", key, WebSocket: WS, backoff: fast, filter: { types: ["unit.*"] },
    onEvent: (seq, e) => void seen.push([seq, e.event_id]),
    onAck: (cursor) => void acks.push(cursor),
  });
  await until(() => WS.sockets.length === 1, "the socket");
  const s0 = WS.sockets[0];
  assert.equal(s0.url.protocol, "ws:");
  assert.equal(s0.url.pathname, "/v1/ws");
  assert.equal(s0.url.searchParams.get("access_token"), "tok");
  s0.fromServer({ jsonrpc: "2.0", method: METHOD.HELLO, params: { nonce: "nonce-1" } });
  const auth = await request(s0, METHOD.AUTH);
  assert.deepEqual(auth.params.body, { device_id: "kiosk-1", filter: { types: ["unit.*"] } });
  assert.equal(await verifies(auth.params.origin_proof, METHOD.AUTH, auth.params.body, "nonce-1"), true);
  assert.deepEqual(auth.params.origin_proof.identity, key.identity);
  answer(s0, auth, { head_seq: 2, cursor: 0 });
  const delta = await request(s0, METHOD.DELTA);
  assert.deepEqual(delta.params, { device_id: "kiosk-1", since: 0, limit: 500 });
  answer(s0, delta, { items: [{ seq: 1, event: envelope(11) }, { seq: 2, event: envelope(12) }], next_since: 2, has_more: false });
  await c.ready();
  assert.equal(c.state, "open");
  const ack = await request(s0, METHOD.ACK);
  assert.deepEqual(ack.params.body, { seq: 2 });
  assert.equal(await verifies(ack.params.origin_proof, METHOD.ACK, { seq: 2 }, "nonce-1"), true);
  answer(s0, ack, { cursor: 2 });
  await until(() => acks.length === 1, "the ack's answer");
  // Realtime; one the device has is dropped.
  s0.fromServer({ jsonrpc: "2.0", method: METHOD.EVENT, params: { seq: 2, event: envelope(12) } });
  s0.fromServer({ jsonrpc: "2.0", method: METHOD.EVENT, params: { seq: 3, event: envelope(13) } });
  await until(() => seen.length === 3, "the realtime event");
  assert.deepEqual(seen, [[1, 11], [2, 12], [3, 13]]);
  assert.equal(c.highWater, 3);
  // A lost connection: the next one carries the high-water mark.
  s0.serverClose(1006);
  await until(() => WS.sockets.length === 2, "the reconnection");
  const s1 = WS.sockets[1];
  s1.fromServer({ jsonrpc: "2.0", method: METHOD.HELLO, params: { nonce: "nonce-2" } });
  const again = await request(s1, METHOD.AUTH);
  assert.equal(again.params.body.cursor, 3);
  assert.equal(await verifies(again.params.origin_proof, METHOD.AUTH, again.params.body, "nonce-2"), true);
  c.close();
  assert.equal(c.state, "closed");
});

test("a refusing close ends the connection for good, and a refused proof too", async () => {
  for (const refuse of [
    (s) => s.serverClose(1008, "forbidden"),
    async (s) => {
      const auth = await request(s, METHOD.AUTH);
      s.fromServer({ jsonrpc: "2.0", id: auth.id, error: { code: -32001, message: "bad proof", data: { code: "unauthorized" } } });
    },
  ]) {
    const WS = fakeWebSocket();
    const { key } = await createDeviceKey();
    const rejected = [];
    const c = createClient({ url }).connect({ deviceId: "d", key, WebSocket: WS, backoff: fast, onEvent: () => {}, onRejected: (e) => void rejected.push(e) });
    await until(() => WS.sockets.length === 1, "the socket");
    WS.sockets[0].fromServer({ jsonrpc: "2.0", method: METHOD.HELLO, params: { nonce: "n" } });
    await refuse(WS.sockets[0]);
    await until(() => rejected.length === 1, "the rejection");
    await assert.rejects(c.ready());
    assert.equal(c.state, "closed");
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(WS.sockets.length, 1, "never reconnected");
  }
});

test("canonical JSON sorts keys by code unit and writes no whitespace", () => {
  assert.equal(canonicalJson({ b: [1, "x", null], a: { d: true, c: 1.5 }, é: 0, Z: "" }), '{"Z":"","a":{"c":1.5,"d":true},"b":[1,"x",null],"é":0}');
  assert.throws(() => canonicalJson({ n: NaN }), /non-finite/);
});
