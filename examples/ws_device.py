#!/usr/bin/env python3
"""A tidings WebSocket device (GET /v1/ws, JSON-RPC 2.0), short enough to read.

    pip install websockets==17.4 cryptography==50.0.2
    python3 examples/ws_device.py ws://127.0.0.1:8080/v1/ws --device laptop --types 'comment.*'

It keeps an Ed25519 key in a file (PKCS#8 PEM, the format `tidings listen
--key` uses), signs `stream.auth` over the connection's nonce, catches up
with `sync.delta` from the server's cursor for (key, device), then prints
realtime `stream.event`s, acking each one it printed. `tidings listen` is
the same client with reconnects and backoff.
"""

import argparse
import asyncio
import base64
import hashlib
import json
import os
import sys

import websockets
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def load_key(path):
    """The device key: read from `path`, or created there (mode 0600)."""
    if os.path.exists(path):
        with open(path, "rb") as f:
            return serialization.load_pem_private_key(f.read(), password=None)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, pem)
    os.close(fd)
    return key


def canonical(value):
    # RFC 8785 for what a proof holds (strings, integers, arrays, objects).
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Device:
    def __init__(self, ws, key, nonce):
        self.ws, self.key, self.nonce, self.next_id = ws, key, nonce, 0
        self.early = []  # stream.event frames that came while an answer was awaited
        public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.identity = {"type": "system/identity", "data": {"algorithm": "ed25519", "public_key": base64.b64encode(public).decode()}}

    def proof(self, method, body):
        """origin_proof: Ed25519 over "sha256:<hex>" of {method, body, nonce}."""
        target = "sha256:" + hashlib.sha256(canonical({"method": method, "body": body, "nonce": self.nonce}).encode()).hexdigest()
        return {"identity": self.identity, "signature": base64.b64encode(self.key.sign(target.encode())).decode()}

    async def send(self, method, params):
        self.next_id += 1
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}))
        return self.next_id

    async def answer(self, request_id):
        """Reads up to the answer of `request_id`, keeping the realtime events that come first
        (a device whose cursor is at the head is live from its auth on)."""
        while True:
            frame = json.loads(await self.ws.recv())
            if frame.get("method") == "stream.event":
                self.early.append(frame)
            elif frame.get("id") in (request_id, None) and ("result" in frame or "error" in frame):
                if "error" in frame:
                    sys.exit(f"rejected: {frame['error']['data']['code']}: {frame['error']['message']}")
                return frame["result"]

    async def call(self, method, params):
        return await self.answer(await self.send(method, params))

    async def ack(self, seq):
        body = {"seq": seq}
        return await self.send("stream.ack", {"body": body, "origin_proof": self.proof("stream.ack", body)})


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="ws://host:port/v1/ws (add ?access_token=... with tokens on)")
    parser.add_argument("--key", default="tidings-device.key")
    parser.add_argument("--device", default="example")
    parser.add_argument("--types", help="comma list of type globs")
    parser.add_argument("--since", type=int, help="catch up from here this time only")
    parser.add_argument("--count", type=int, help="stop after this many events")
    args = parser.parse_args()

    key = load_key(args.key)
    async with websockets.connect(args.url) as ws:
        hello = json.loads(await ws.recv())  # the server speaks first
        device = Device(ws, key, hello["params"]["nonce"])
        body = {"device_id": args.device}
        if args.types:
            body["filter"] = {"types": [t.strip() for t in args.types.split(",")]}
        auth = await device.call("stream.auth", {"body": body, "origin_proof": device.proof("stream.auth", body)})
        head, cursor = auth["head_seq"], auth["cursor"]
        printed, since, last = 0, cursor if args.since is None else args.since, 0

        def show(seq, event):
            nonlocal last
            last = seq
            print(json.dumps(event), flush=True)
            return args.count is not None and printed + 1 >= args.count

        # Catch up to the head given at auth; realtime starts after that page.
        while since < head or cursor < head:
            page = await device.call("sync.delta", {"device_id": args.device, "since": since, "limit": 100})
            for item in page["items"]:
                done = show(item["seq"], item["event"])
                printed += 1
                if done:
                    await device.answer(await device.ack(item["seq"]))
                    return
            if page["items"]:
                await device.ack(page["items"][-1]["seq"])
            since = page["next_since"]
            if not page["has_more"] and since >= head:
                break

        async def frames():
            while device.early:
                yield device.early.pop(0)
            async for message in ws:
                yield json.loads(message)

        async for frame in frames():
            # What a catch-up page showed may also come live: once is enough.
            if frame.get("method") == "stream.event" and frame["params"]["seq"] > last:
                done = show(frame["params"]["seq"], frame["params"]["event"])
                printed += 1
                ack = await device.ack(frame["params"]["seq"])
                if done:
                    await device.answer(ack)  # the cursor is stored before we go
                    return


asyncio.run(main())
