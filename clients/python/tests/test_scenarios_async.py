"""The client against real servers, written once for asyncio;
``tools/generate_sync.py`` writes ``test_scenarios_sync.py`` from it for
the blocking client, so both flavours meet the same scenarios: publishing
retried without storing twice, the same key answered with the first ids,
refusals not retried, an unreachable server, the trace context an event
was published in, a stream that resumes across a restart, a replay gap
raised or skipped, a durable consumer that acknowledges only what the loop
body finished, the WebSocket device (resuming, from cursor 0, with its
token in a header and in no log, refused for a bad filter), and an expired
token replaced through the `token` function. What only one flavour has
(a blocking iterator not read, an `async for` not awaited, a stop from
another thread or task, an async token function) is in ``test_client.py``
and ``test_async.py``."""

from __future__ import annotations

import logging

import httpx
import pytest
from _flavour_async import blocking, mark, result, start, take, until

import tidings
from conftest import Proxy, Server, event, free_port, mint, only, tag
from tidings import AsyncClient

pytestmark = mark


def ids(envelopes: list[tidings.Envelope]) -> list[int]:
    return [e.event_id for e in envelopes]


async def test_publish_retried_after_a_lost_answer_stores_once(main: Server) -> None:
    run = tag()
    proxy = Proxy(main.port, drop=1)
    try:
        async with AsyncClient(proxy.url) as client:
            published = await client.publish([event(run, i=0), event(run, i=1)])
            fresh = await client.publish(event(tag()))
        # The first answer was lost; the retry carried the same key, and
        # its answer says the first stored the events.
        assert proxy.count("POST /v1/events") == 3
        assert published.replayed and not fresh.replayed
    finally:
        proxy.close()
    async with AsyncClient(main.url) as client:
        page = await client.poll(only(run), since=0)
    assert ids(page.events) == published
    assert [e.payload["i"] for e in page.events] == [0, 1]


async def test_an_envelope_carries_the_trace_context_it_was_published_in(main: Server) -> None:
    run = tag()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    headers = {"traceparent": parent, "tracestate": "congo=t61rcWkgMzE"}
    answer = await blocking(lambda: httpx.post(f"{main.url}/v1/events", json={"events": [event(run, i=0)]}, headers=headers))
    assert answer.status_code == 201, answer.text
    async with AsyncClient(main.url) as client:
        await client.publish([event(run, i=1)])
        page = await client.poll(only(run), since=0)
    traced, plain = page.events
    assert (traced.traceparent, traced.tracestate) == (parent, "congo=t61rcWkgMzE")
    assert (plain.traceparent, plain.tracestate) == (None, None)


async def test_the_same_key_answers_with_the_first_ids(main: Server) -> None:
    run = tag()
    async with AsyncClient(main.url) as client:
        first = await client.publish(event(run), idempotency_key=f"order-{run}")
        again = await client.publish(event(run), idempotency_key=f"order-{run}")
        assert again == first and again.replayed
        with pytest.raises(tidings.Refused) as refused:
            await client.publish(event(run, other=True), idempotency_key=f"order-{run}")
        assert (refused.value.status, refused.value.code) == (422, "idempotency_key_reused")
        assert ids((await client.poll(only(run), since=0)).events) == first


async def test_refusals_are_raised_and_not_retried(main: Server) -> None:
    proxy = Proxy(main.port)
    try:
        async with AsyncClient(proxy.url) as client:
            with pytest.raises(tidings.Refused) as refused:
                await client.publish({"event_type": "Not A Name"})
            assert (refused.value.status, refused.value.code) == (422, "invalid_event_name")
            assert proxy.count("POST /v1/events") == 1
            stream = client.stream({"payload": {"no_such_operator": [1]}})
            with pytest.raises(tidings.Refused) as refused:
                await stream.__anext__()
            assert (refused.value.status, refused.value.code) == (400, "invalid_filter")
            assert proxy.count("GET /v1/stream") == 1
            with pytest.raises(tidings.Refused) as refused:
                await client.poll(since=-5)
            assert refused.value.code == "invalid_since"
    finally:
        proxy.close()


async def test_an_unreachable_server_is_unavailable_after_the_retries() -> None:
    async with AsyncClient(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(tidings.Unavailable):
            await client.publish({"event_type": "pyclient.step"}, retries=2)


async def test_a_stream_resumes_across_a_server_restart(main: Server) -> None:
    run = tag()
    async with AsyncClient(main.url) as client:
        before = await client.publish([event(run, i=i) for i in range(3)])
        stream = client.stream(only(run), since=before[0] - 1)
        assert ids(await take(stream, 3)) == before
        await blocking(main.restart)
        # Published before the stream has reconnected: it must still come.
        after = await client.publish([event(run, i=3), event(run, i=4)])
        assert ids(await take(stream, 2, timeout=60)) == after
        assert stream.state.connections >= 2
        assert stream.last_event_id == after[-1]
        await stream.aclose()


async def test_a_replay_gap_is_raised_or_skipped(main: Server) -> None:
    run = tag()
    async with AsyncClient(main.url) as client:
        head = await blocking(main.head)
        beyond = head + 1_000_000
        with pytest.raises(tidings.ReplayGap) as gap:
            await client.stream(only(run), since=beyond).__anext__()
        assert gap.value.requested == beyond
        assert gap.value.head >= head
        assert gap.value.reason == "beyond_head"
        # Skipped: the stream goes on from the head.
        stream = client.stream(only(run), since=beyond, on_gap="skip")
        reading = start(stream, 1)
        await until(lambda: len(stream.state.gaps) == 1, "the gap notice")
        published = await client.publish(event(run))
        assert ids(await result(reading)) == published


async def test_a_consumer_acknowledges_a_page_only_once_the_body_finished_it(main: Server) -> None:
    run, name = tag(), f"py-{tag()}"
    async with AsyncClient(main.url) as client:
        consumer = client.consumer(name, only(run))
        assert (await consumer.poll()).events == []  # created at the head
        published = await client.publish([event(run, i=i) for i in range(5)])
        consumer.limit, consumer.wait = 2, 5.0
        seen: list[int] = []
        with pytest.raises(RuntimeError):
            async for envelope in consumer:
                if envelope.payload["i"] == 3:
                    raise RuntimeError("the body failed on the fourth event")
                seen.append(envelope.event_id)
        assert seen == published[:3]
        # Who has which event, as the server says: the first page was
        # confirmed by the poll for the second; the second was not.
        states = {i: (await client.deliveries(i)).consumer(name) for i in (published[1], published[3])}
        assert {i: d.state if d else None for i, d in states.items()} == {published[1]: "acknowledged", published[3]: "pending"}
        with pytest.raises(ValueError):
            await client.deliveries(0)
        with pytest.raises(tidings.Refused) as missing:
            await client.deliveries(10**15)
        assert (missing.value.status, missing.value.code) == (404, "event_not_found")
        # The second page (its body failed) comes again, to a new worker too.
        async with AsyncClient(main.url) as other:
            worker = other.consumer(name, only(run))
            worker.limit, worker.wait = 2, 5.0
            again = await take(worker.__aiter__(), 3)
            assert ids(again) == published[2:]
            page = await worker.poll(since=published[-1])
            assert page.events == []
            assert await worker.ack(published[-1]) == published[-1]
            last = (await client.deliveries(published[-1])).consumer(name) or pytest.fail("the consumer is listed")
            assert (last.cursor, last.state) == (published[-1], "acknowledged")
            await worker.delete()


async def test_a_device_resumes_after_its_last_finished_event(main: Server) -> None:
    run = tag()
    key = tidings.DeviceKey.generate()
    async with AsyncClient(main.url) as client:
        start_at = await blocking(main.head)
        device = client.device(f"py-{run}", key, only(run), cursor=start_at)
        published = await client.publish([event(run, i=i) for i in range(3)])
        got = await take(device, 3)
        assert [seq for seq, _ in got] == published
        assert [e.event_id for _, e in got] == published
        assert await device.ack() == published[-1]
        await device.aclose()
        later = await client.publish([event(run, i=3), event(run, i=4)])
        # The same key and id: the server's cursor, not a replay from the start.
        again = client.device(f"py-{run}", tidings.DeviceKey.from_pem(key.to_pem()), only(run))
        got = await take(again, 2)
        assert [seq for seq, _ in got] == later
        await again.aclose()


async def test_a_device_given_cursor_0_starts_at_the_beginning(main: Server) -> None:
    # 0 is a cursor like any other: the device catches up from the start of
    # the log, not from its head.
    run = tag()
    async with AsyncClient(main.url) as client:
        published = await client.publish([event(run, i=i) for i in range(2)])
        device = client.device(f"py-{run}", tidings.DeviceKey.generate(), only(run), cursor=0)
        got = await take(device, 2, timeout=15)
        assert [seq for seq, _ in got] == published
        await device.aclose()


async def test_a_device_sends_its_token_in_a_header_and_logs_none(auth: Server, caplog: pytest.LogCaptureFixture) -> None:
    # The token is in no URL and, with websockets' debug log on, in no log line.
    run = tag()
    token = mint(600)
    caplog.set_level(logging.DEBUG)
    async with AsyncClient(auth.url, token=token) as client:
        published = await client.publish([event(run, i=0)])
        device = client.device(f"py-{run}", tidings.DeviceKey.generate(), only(run), cursor=published[0] - 1)
        got = await take(device, 1, timeout=15)
        assert [seq for seq, _ in got] == published
        await device.aclose()
    assert "GET /v1/ws HTTP/1.1" in caplog.text, "the upgrade was logged, without a query"
    assert "Authorization: REDACTED" in caplog.text
    assert token not in caplog.text and token.rsplit(".", 1)[1] not in caplog.text


async def test_a_device_with_a_bad_filter_is_refused(main: Server) -> None:
    async with AsyncClient(main.url) as client:
        device = client.device("py-refused", tidings.DeviceKey.generate(), {"payload": {"no_such_operator": [1]}})
        with pytest.raises(tidings.Refused) as refused:
            await take(device, 1)
        assert refused.value.code == "invalid_filter"


async def test_an_expired_token_is_replaced_through_the_token_function(auth: Server) -> None:
    run = tag()
    calls = 0

    def token() -> str:
        nonlocal calls
        calls += 1
        return mint(2)

    async with AsyncClient(auth.url, token=lambda: mint(600)) as publisher, AsyncClient(auth.url, token=token) as client:
        stream = client.stream(only(run))
        reading = start(stream, 2, timeout=60)
        await until(lambda: stream.state.connections == 1, "the stream to open")
        first = await publisher.publish(event(run, i=0))
        # The token expires; the server ends the stream; the function gives another.
        await until(lambda: stream.state.connections >= 2, "the stream to come back under a fresh token")
        second = await publisher.publish(event(run, i=1))
        assert ids(await result(reading)) == first + second
        assert calls >= 2
    # A fixed token that expired is a refusal, not retried.
    async with AsyncClient(auth.url, token=mint(-60)) as stale:
        with pytest.raises(tidings.Refused) as refused:
            await stale.poll()
        assert refused.value.status == 401
