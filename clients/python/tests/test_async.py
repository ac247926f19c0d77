"""What only the asyncio client has: the slow-client drop of an `async for`
that is not awaited (docs/streams.md), resumed losslessly by the next
`await`; an async token function; a stop from another task. The scenarios
both flavours meet are in ``test_scenarios_async.py`` and its generated
twin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

import tidings
from conftest import Server, event, mint, only, tag

T = TypeVar("T")


async def take(items: AsyncIterator[T], n: int, timeout: float = 30.0) -> list[T]:
    async def run() -> list[T]:
        return [await items.__anext__() for _ in range(n)]

    return await asyncio.wait_for(run(), timeout)


def ids(envelopes: list[tidings.Envelope]) -> list[int]:
    return [e.event_id for e in envelopes]


def test_an_async_for_not_awaited_is_dropped_and_resumes_losslessly(slow: Server) -> None:
    async def run() -> None:
        tagged = tag()
        async with tidings.AsyncClient(slow.url) as client:
            stream = client.stream(only(tagged))
            first_task = asyncio.ensure_future(take(stream, 1))
            while (await asyncio.to_thread(slow.deep))["events"]["in_flight_subscriptions"] != 1:
                await asyncio.sleep(0.02)
            published = await client.publish(event(tagged, i=0))
            first = await first_task
            assert ids(first) == published
            # Not awaited from now on: the server drops the stream as slow.
            blob = "x" * 60_000
            for i in range(400):
                published += await client.publish(event(tagged, i=i + 1, blob=blob))
                if i % 4 == 3 and (await asyncio.to_thread(slow.deep))["events"]["in_flight_subscriptions"] == 0:
                    break
            assert (await asyncio.to_thread(slow.deep))["events"]["in_flight_subscriptions"] == 0
            published += await client.publish([event(tagged, i=-1), event(tagged, i=-2)])
            rest = await take(stream, len(published) - 1, timeout=60)
            assert ids(first + rest) == published
            assert len(stream.state.drops) == 1
            assert stream.state.connections >= 2
            await stream.aclose()

    asyncio.run(run())


def test_an_async_token_function_replaces_an_expired_token(auth: Server) -> None:
    async def run() -> None:
        tagged = tag()
        calls = 0

        async def token() -> str:
            nonlocal calls
            calls += 1
            return mint(2)

        async with tidings.AsyncClient(auth.url, token=lambda: mint(600)) as publisher, tidings.AsyncClient(auth.url, token=token) as client:
            stream = client.stream(only(tagged))
            reading = asyncio.ensure_future(take(stream, 2, timeout=60))
            while stream.state.connections < 1:
                await asyncio.sleep(0.02)
            first = await publisher.publish(event(tagged, i=0))
            for _ in range(1500):
                if stream.state.connections >= 2:
                    break
                await asyncio.sleep(0.02)
            assert stream.state.connections >= 2, "the stream came back under a fresh token"
            second = await publisher.publish(event(tagged, i=1))
            assert ids(await reading) == first + second
            assert calls >= 2

    asyncio.run(run())


def test_a_stream_and_a_consumer_stop_from_another_task(main: Server) -> None:
    async def run() -> None:
        tagged = tag()
        async with tidings.AsyncClient(main.url) as client:
            stream = client.stream(only(tagged))

            async def drain() -> list[tidings.Envelope]:
                return [e async for e in stream]

            loop = asyncio.create_task(drain())
            while stream.state.connections < 1:
                await asyncio.sleep(0.02)
            stream.stop()
            assert await asyncio.wait_for(loop, 5) == []

            consumer = client.consumer(f"stopper-{tagged}", only(tagged))
            await consumer.poll()
            published = await client.publish([event(tagged, i=0), event(tagged, i=1)])
            consumer.wait = 1.0
            seen: list[int] = []

            async def body() -> None:
                async for envelope in consumer:
                    seen.append(envelope.event_id)
                    if len(seen) == 2:
                        asyncio.get_running_loop().call_soon(consumer.stop)

            await asyncio.wait_for(body(), 10)
            assert seen == published

    asyncio.run(asyncio.wait_for(run(), 60))
