"""What the Python client costs: events per second (and client CPU seconds
per 1,000 events) that one `stream` and one `consumer` loop take, sync and
async, each beside a plain httpx loop doing the same reads in the same run,
and the MCP `poll` round trip (p50/p99) beside a plain httpx `POST /v1/poll`.

    python bench_client.py http://127.0.0.1:8080 --events 20000 --calls 300

The server should hold nothing else; the script publishes its own events
(type bench.step) first. Run by scripts/bench-python."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import httpx2
from httpx_sse import EventSource
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client

import tidings

FILTER = {"types": ["bench.*"]}


def measure(name: str, n: int, run: Callable[[], int]) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    got = run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert got == n, f"{name}: {got} of {n}"
    row = {"loop": name, "events": n, "events_per_s": round(n / wall), "client_cpu_s_per_1000": round(1000 * cpu / n, 4)}
    print(json.dumps(row), flush=True)
    return row


def ameasure(name: str, n: int, run: Callable[[], Coroutine[Any, Any, int]]) -> dict[str, Any]:
    return measure(name, n, lambda: asyncio.run(run()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    url, n = args.url.rstrip("/"), args.events

    with tidings.Client(url) as client:
        start = int(httpx.get(url + "/health/deep").json()["head_event_id"] or 0)
        for i in range(0, n, 500):
            client.publish([{"event_type": "bench.step", "payload": {"i": j}} for j in range(i, min(i + 500, n))])
    rows = []

    def plain_stream() -> int:
        got = 0
        with httpx.Client(timeout=60) as http:
            with http.stream("GET", url + "/v1/stream", params={"filter": json.dumps(FILTER), "since": str(start)}) as r:
                for sse in EventSource(r).iter_sse():
                    if sse.event in ("", "message") and sse.data:
                        json.loads(sse.data)
                        got += 1
                        if got == n:
                            return got
        return got

    def client_stream() -> int:
        got = 0
        with tidings.Client(url) as c:
            for _ in c.stream(FILTER, since=start):
                got += 1
                if got == n:
                    return got
        return got

    async def async_stream() -> int:
        got = 0
        async with tidings.AsyncClient(url) as c, c.stream(FILTER, since=start) as stream:
            async for _ in stream:
                got += 1
                if got == n:
                    return got
        return got

    def plain_poll() -> int:
        got, since = 0, start
        with httpx.Client(timeout=60) as http:
            while got < n:
                page = http.post(url + "/v1/poll", json={"filter": FILTER, "since": since, "limit": 500}).json()
                got += len(page["events"])
                since = page["next_since"]
        return got

    def client_consumer(name: str) -> int:
        got = 0
        with tidings.Client(url) as c:
            c.poll(FILTER, since=start, consumer_id=name)  # created at the start
            consumer = c.consumer(name, FILTER)
            consumer.limit = 500
            for _ in consumer:
                got += 1
                if got == n:
                    return got
        return got

    async def async_consumer(name: str) -> int:
        got = 0
        async with tidings.AsyncClient(url) as c:
            await c.poll(FILTER, since=start, consumer_id=name)
            consumer = c.consumer(name, FILTER)
            consumer.limit = 500
            async for _ in consumer:
                got += 1
                if got == n:
                    return got
        return got

    stamp = str(time.time_ns())
    rows.append(measure("plain httpx + httpx-sse stream", n, plain_stream))
    rows.append(measure("tidings.Client.stream", n, client_stream))
    rows.append(ameasure("tidings.AsyncClient.stream", n, async_stream))
    rows.append(measure("plain httpx poll loop (limit 500)", n, plain_poll))
    rows.append(measure("tidings.Client.consumer (limit 500)", n, lambda: client_consumer(f"bench-s-{stamp}")))
    rows.append(ameasure("tidings.AsyncClient.consumer (limit 500)", n, lambda: async_consumer(f"bench-a-{stamp}")))

    head = start + n
    calls = args.calls

    def percentiles(name: str, samples: list[float]) -> None:
        samples.sort()
        row = {
            "round_trip": name,
            "calls": len(samples),
            "p50_ms": round(statistics.median(samples) * 1000, 3),
            "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000, 3),
        }
        print(json.dumps(row), flush=True)

    with httpx.Client(timeout=30) as http:
        samples = []
        for _ in range(calls):
            t = time.perf_counter()
            http.post(url + "/v1/poll", json={"filter": FILTER, "since": head - 1, "limit": 1}).raise_for_status()
            samples.append(time.perf_counter() - t)
        percentiles("plain httpx POST /v1/poll", samples)

    async def mcp_round_trips() -> list[float]:
        out = []
        transport = streamable_http_client(url + "/mcp", http_client=httpx2.AsyncClient(timeout=30))
        async with McpClient(transport) as mcp:
            for _ in range(calls):
                t = time.perf_counter()
                result = await mcp.call_tool("poll", {"filter": FILTER, "since": head - 1, "limit": 1})
                out.append(time.perf_counter() - t)
                assert not result.is_error, result
        return out

    percentiles("MCP tools/call poll (official Python SDK)", asyncio.run(mcp_round_trips()))


if __name__ == "__main__":
    main()
