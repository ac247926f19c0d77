"""The asyncio client against real servers: the same guarantees as the
blocking one, and the slow-client drop (docs/streams.md): an `async for`
that is not awaited is closed by the server as slow, and the next `await`
resumes it losslessly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

import pytest

import tidings
from conftest import Proxy, Server, event, mint, only, tag

T = TypeVar("T")


async def take(items: AsyncIterator[T], n: int, timeout: float = 30.0) -> list[T]:
    async def run() -> list[T]:
        return [await items.__anext__() for _ in range(n)]

    return await asyncio.wait_for(run(), timeout)


def ids(envelopes: list[tidings.Envelope]) -> list[int]:
    return [e.event_id for e in envelopes]


def test_publish_retried_after_a_lost_answer_stores_once(main: Server) -> None:
    async def run() -> None:
        tagged = tag()
        proxy = Proxy(main.port, drop=1)
        try:
            async with tidings.AsyncClient(proxy.url) as client:
                published = await client.publish(event(tagged))
                fresh = await client.publish(event(tag()))
            assert proxy.count("POST /v1/events") == 3
            assert published.replayed, "the retry's answer says the first stored it"
            assert not fresh.replayed
        finally:
            proxy.close()
        async with tidings.AsyncClient(main.url) as client:
            assert ids((await client.poll(only(tagged), since=0)).events) == published
            with pytest.raises(tidings.Refused) as refused:
                await client.publish({"event_type": "Not A Name"})
            assert refused.value.code == "invalid_event_name"

    asyncio.run(run())


def test_a_stream_resumes_across_a_server_restart(main: Server) -> None:
    async def run() -> None:
        tagged = tag()
        async with tidings.AsyncClient(main.url) as client:
            before = await client.publish([event(tagged, i=i) for i in range(3)])
            async with client.stream(only(tagged), since=before[0] - 1) as stream:
                assert ids(await take(stream, 3)) == before
                await asyncio.to_thread(main.restart)
                after = await client.publish([event(tagged, i=3), event(tagged, i=4)])
                assert ids(await take(stream, 2, timeout=60)) == after
                assert stream.state.connections >= 2

    asyncio.run(run())


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


def test_a_consumer_acknowledges_a_page_only_once_the_body_finished_it(main: Server) -> None:
    async def run() -> None:
        tagged, name = tag(), f"py-async-{tag()}"
        async with tidings.AsyncClient(main.url) as client:
            consumer = client.consumer(name, only(tagged))
            assert (await consumer.poll()).events == []
            published = await client.publish([event(tagged, i=i) for i in range(4)])
            consumer.limit, consumer.wait = 2, 5.0
            seen: list[int] = []
            with pytest.raises(RuntimeError):
                async for envelope in consumer:
                    if envelope.payload["i"] == 2:
                        raise RuntimeError("the body failed on the third event")
                    seen.append(envelope.event_id)
            assert seen == published[:2]
            worker = client.consumer(name, only(tagged))
            worker.limit, worker.wait = 2, 5.0
            assert ids(await take(worker.__aiter__(), 2)) == published[2:]
            told = await client.deliveries(published[0])
            assert told.event.event_id == published[0]
            assert (told.consumer(name) or pytest.fail("the consumer is listed")).state == "acknowledged"
            later = (await client.deliveries(published[3])).consumer(name) or pytest.fail("the consumer is listed")
            assert (later.cursor, later.state) == (published[1], "pending")
            await worker.delete()

    asyncio.run(run())


def test_a_device_resumes_after_its_last_finished_event(main: Server) -> None:
    async def run() -> None:
        tagged = tag()
        key = tidings.DeviceKey.generate()
        async with tidings.AsyncClient(main.url) as client:
            start = await asyncio.to_thread(main.head)
            device = client.device(f"py-async-{tagged}", key, only(tagged), cursor=start)
            published = await client.publish([event(tagged, i=i) for i in range(2)])
            assert [seq for seq, _ in await take(device, 2)] == published
            assert await device.ack() == published[-1]
            await device.aclose()
            later = await client.publish(event(tagged, i=2))
            async with client.device(f"py-async-{tagged}", key, only(tagged)) as again:
                assert [seq for seq, _ in await take(again, 1)] == later

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
