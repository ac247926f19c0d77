"""The blocking client against real servers: publishing that is retried
without storing twice, refusals that are not retried, streams that resume
across a restart, a slow drop and a replay gap, durable consumers that
acknowledge only what the loop body finished, the WebSocket device, and
tokens refreshed through the `token` function."""

from __future__ import annotations

import json
import logging
import socketserver
import threading
import time

import httpx
import pytest

import tidings
from conftest import Proxy, Reader, Server, event, free_port, mint, only, tag, take, until
from tidings._core import StreamState


def ids(envelopes: list[tidings.Envelope]) -> list[int]:
    return [e.event_id for e in envelopes]


def test_publish_retried_after_a_lost_answer_stores_once(main: Server) -> None:
    run = tag()
    proxy = Proxy(main.port, drop=1)
    try:
        with tidings.Client(proxy.url) as client:
            published = client.publish([event(run, i=0), event(run, i=1)])
            fresh = client.publish(event(tag()))
        # The first answer was lost; the retry carried the same key, and
        # its answer says the first stored the events.
        assert proxy.count("POST /v1/events") == 3
        assert published.replayed and not fresh.replayed
    finally:
        proxy.close()
    with tidings.Client(main.url) as client:
        page = client.poll(only(run), since=0)
    assert ids(page.events) == published
    assert [e.payload["i"] for e in page.events] == [0, 1]


def test_an_envelope_carries_the_trace_context_it_was_published_in(main: Server) -> None:
    run = tag()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    answer = httpx.post(
        f"{main.url}/v1/events",
        json={"events": [event(run, i=0)]},
        headers={"traceparent": parent, "tracestate": "congo=t61rcWkgMzE"},
    )
    assert answer.status_code == 201, answer.text
    with tidings.Client(main.url) as client:
        client.publish([event(run, i=1)])
        page = client.poll(only(run), since=0)
    traced, plain = page.events
    assert (traced.traceparent, traced.tracestate) == (parent, "congo=t61rcWkgMzE")
    assert (plain.traceparent, plain.tracestate) == (None, None)


def test_the_same_key_answers_with_the_first_ids(main: Server) -> None:
    run = tag()
    with tidings.Client(main.url) as client:
        first = client.publish(event(run), idempotency_key=f"order-{run}")
        again = client.publish(event(run), idempotency_key=f"order-{run}")
        assert again == first
        with pytest.raises(tidings.Refused) as refused:
            client.publish(event(run, other=True), idempotency_key=f"order-{run}")
        assert refused.value.status == 422
        assert refused.value.code == "idempotency_key_reused"
        assert ids(client.poll(only(run), since=0).events) == first


def test_refusals_are_raised_and_not_retried(main: Server) -> None:
    proxy = Proxy(main.port)
    try:
        with tidings.Client(proxy.url) as client:
            with pytest.raises(tidings.Refused) as refused:
                client.publish({"event_type": "Not A Name"})
            assert (refused.value.status, refused.value.code) == (422, "invalid_event_name")
            assert proxy.count("POST /v1/events") == 1
            stream = client.stream({"payload": {"no_such_operator": [1]}})
            with pytest.raises(tidings.Refused) as refused:
                next(stream)
            assert (refused.value.status, refused.value.code) == (400, "invalid_filter")
            assert proxy.count("GET /v1/stream") == 1
            with pytest.raises(tidings.Refused) as refused:
                client.poll(since=-5)
            assert refused.value.code == "invalid_since"
    finally:
        proxy.close()


def test_an_unreachable_server_is_unavailable_after_the_retries() -> None:
    with tidings.Client(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(tidings.Unavailable):
            client.publish({"event_type": "pyclient.step"}, retries=2)


def test_a_stream_resumes_across_a_server_restart(main: Server) -> None:
    run = tag()
    with tidings.Client(main.url) as client:
        before = client.publish([event(run, i=i) for i in range(3)])
        stream = client.stream(only(run), since=before[0] - 1)
        got = take(stream.__next__, 3)
        assert ids(got) == before
        main.restart()
        # Published before the stream has reconnected: it must still come.
        after = client.publish([event(run, i=3), event(run, i=4)])
        got = take(stream.__next__, 2, timeout=60)
        assert ids(got) == after
        assert stream.state.connections >= 2
        assert stream.last_event_id == after[-1]
        stream.close()


def test_a_stream_not_read_is_dropped_as_slow_and_resumes_losslessly(slow: Server) -> None:
    run = tag()
    with tidings.Client(slow.url) as client:
        stream = client.stream(only(run))
        # The stream is live once the server counts it.
        until(lambda: slow.deep()["events"]["in_flight_subscriptions"] == 0, "no other stream")
        first: list[tidings.Envelope] = []

        reader = threading.Thread(target=lambda: first.extend(take(stream.__next__, 1)), daemon=True)
        reader.start()
        until(lambda: slow.deep()["events"]["in_flight_subscriptions"] == 1, "the stream to open")
        published = client.publish(event(run, i=0))
        reader.join(30)
        assert ids(first) == published
        # Not read from now on: the server drops it once its queue is full.
        blob = "x" * 60_000
        for i in range(400):
            published += client.publish(event(run, i=i + 1, blob=blob))
            if i % 4 == 3 and slow.deep()["events"]["in_flight_subscriptions"] == 0:
                break
        assert slow.deep()["events"]["in_flight_subscriptions"] == 0, "the unread stream was dropped"
        published += client.publish([event(run, i=-1), event(run, i=-2)])
        rest = take(stream.__next__, len(published) - 1, timeout=60)
        assert ids(first + rest) == published
        assert [d.reason for d in stream.state.drops] in (["queue_full"], ["no_progress"])
        assert stream.state.connections >= 2
        stream.close()


def test_a_replay_gap_is_raised_or_skipped(main: Server) -> None:
    run = tag()
    with tidings.Client(main.url) as client:
        head = main.head()
        beyond = head + 1_000_000
        with pytest.raises(tidings.ReplayGap) as gap:
            next(client.stream(only(run), since=beyond))
        assert gap.value.requested == beyond
        assert gap.value.head >= head
        assert gap.value.reason == "beyond_head"
        # Skipped: the stream goes on from the head.
        stream = client.stream(only(run), since=beyond, on_gap="skip")
        reader = Reader(stream)
        until(lambda: len(stream.state.gaps) == 1, "the gap notice")
        published = client.publish(event(run))
        assert ids(reader.wait(1)) == published


def test_history_lost_goes_on_after_the_fork() -> None:
    # What the server sends a stream that saw history its store lost (the
    # server side is tests/api/epochs.rs): the gap is raised with its
    # reason and fork, and the stream's next resume point is the fork, so a
    # reconnect is not told again and every event after the fork comes.
    state = StreamState(None, None, "raise")
    state.last_event_id = 5
    data = '{"requested": 5, "available_from": 1001, "head": 1002, "reason": "history_lost", "fork": 3}'
    with pytest.raises(tidings.ReplayGap) as gap:
        state.frame("system.replay_gap", data, "")
    assert (gap.value.reason, gap.value.fork) == ("history_lost", 3)
    assert state.params()["since"] == "3"
    envelope = '{"envelope_version": 1, "event_id": 1001, "event_type": "a.b", "occurred_at": "2026-12-04T00:00:00Z", "payload": {}}'
    assert state.frame("", envelope, "1001") is not None


def test_a_consumer_carries_its_place_and_raises_a_loss_before_the_page() -> None:
    # A server whose store failed over while the consumer handled 1-5: it
    # kept ids up to 3 and its cursor of the consumer went back to 2. The
    # consumer resumes from where it is (`since=5`), not from the server's
    # cursor, so it is told that 4 and 5 are gone; the page's events come
    # when it iterates again, and are not asked for twice.
    asked: list[str | None] = []
    fork, base = 3, 1000

    def envelope(i: int) -> dict[str, object]:
        return {"envelope_version": 1, "event_id": i, "event_type": "a.b", "occurred_at": "2026-12-04T00:00:00Z", "payload": {}}

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        since = body.get("since")
        asked.append(None if since is None else str(since))
        if since is None:
            return httpx.Response(200, json={"events": [envelope(i) for i in range(1, 6)], "next_since": 5, "has_more": False})
        if since == 5:
            gap = {"requested": 5, "available_from": base + 1, "head": base + 1, "reason": "history_lost", "fork": fork}
            return httpx.Response(200, json={"events": [envelope(base + 1)], "next_since": base + 1, "has_more": False, "gap": gap})
        raise AssertionError(f"asked after {since}: past the page it was to be told about")

    client = tidings.Client("http://tidings.invalid", http=httpx.Client(transport=httpx.MockTransport(answer)))
    consumer = client.consumer("worker")
    seen: list[int] = []
    with pytest.raises(tidings.ReplayGap) as lost:
        for event in consumer:
            seen.append(event.event_id)
    assert seen == [1, 2, 3, 4, 5]
    assert (lost.value.reason, lost.value.fork, lost.value.requested) == ("history_lost", fork, 5)
    for event in consumer:
        seen.append(event.event_id)
        break
    assert seen[5:] == [base + 1]
    assert asked == [None, "5"]
    # Confirmed by hand between loops: the next loop goes on from there.
    asked.clear()
    ack = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"consumer_id": "worker", "cursor": base + 7})))
    polls, consumer._client._http = consumer._client._http, ack
    assert consumer.ack(base + 7) == base + 7
    assert consumer._since == base + 7
    consumer._client._http = polls
    # Skipped: the page's events come at once.
    asked.clear()
    skipping = client.consumer("worker", on_gap="skip")
    skipping._since = 5
    assert next(iter(skipping)).event_id == base + 1
    assert asked == ["5"]


def test_a_consumer_acknowledges_a_page_only_once_the_body_finished_it(main: Server) -> None:
    run, name = tag(), f"py-{tag()}"
    with tidings.Client(main.url) as client:
        consumer = client.consumer(name, only(run))
        assert consumer.poll().events == []  # created at the head
        published = client.publish([event(run, i=i) for i in range(5)])
        consumer.limit, consumer.wait = 2, 5.0
        seen: list[int] = []
        with pytest.raises(RuntimeError):
            for envelope in consumer:
                if envelope.payload["i"] == 3:
                    raise RuntimeError("the body failed on the fourth event")
                seen.append(envelope.event_id)
        assert seen == published[:3]
        # Who has which event, as the server says: the first page was
        # confirmed by the poll for the second; the second was not.
        states = {i: client.deliveries(i).consumer(name) for i in (published[1], published[3])}
        assert {i: d.state if d else None for i, d in states.items()} == {published[1]: "acknowledged", published[3]: "pending"}
        with pytest.raises(ValueError):
            client.deliveries(0)
        with pytest.raises(tidings.Refused) as missing:
            client.deliveries(10**15)
        assert (missing.value.status, missing.value.code) == (404, "event_not_found")
        # The second page (its body failed) comes again, to a new worker too.
        worker = tidings.Client(main.url).consumer(name, only(run))
        worker.limit, worker.wait = 2, 5.0
        again = take(iter(worker).__next__, 3)
        assert ids(again) == published[2:]
        page = worker.poll(since=published[-1])
        assert page.events == []
        assert worker.ack(published[-1]) == published[-1]
        last = client.deliveries(published[-1]).consumer(name) or pytest.fail("the consumer is listed")
        assert (last.cursor, last.state) == (published[-1], "acknowledged")
        worker.delete()


def test_a_device_resumes_after_its_last_finished_event(main: Server) -> None:
    run = tag()
    key = tidings.DeviceKey.generate()
    with tidings.Client(main.url) as client:
        start = main.head()
        device = client.device(f"py-{run}", key, only(run), cursor=start)
        published = client.publish([event(run, i=i) for i in range(3)])
        got = take(device.__next__, 3)
        assert [seq for seq, _ in got] == published
        assert [e.event_id for _, e in got] == published
        assert device.ack() == published[-1]
        device.close()
        later = client.publish([event(run, i=3), event(run, i=4)])
        # The same key and id: the server's cursor, not a replay from the start.
        again = client.device(f"py-{run}", tidings.DeviceKey.from_pem(key.to_pem()), only(run))
        got = take(again.__next__, 2)
        assert [seq for seq, _ in got] == later
        again.close()


def test_a_device_given_cursor_0_starts_at_the_beginning(main: Server) -> None:
    # 0 is a cursor like any other: the device catches up from the start of
    # the log, not from its head.
    run = tag()
    with tidings.Client(main.url) as client:
        published = client.publish([event(run, i=i) for i in range(2)])
        device = client.device(f"py-{run}", tidings.DeviceKey.generate(), only(run), cursor=0)
        got = take(device.__next__, 2, timeout=15)
        assert [seq for seq, _ in got] == published
        device.close()


def test_a_device_sends_its_token_in_a_header_and_logs_none(auth: Server, caplog: pytest.LogCaptureFixture) -> None:
    # The token is in no URL and, with websockets' debug log on, in no log line.
    run = tag()
    token = mint(600)
    caplog.set_level(logging.DEBUG)
    with tidings.Client(auth.url, token=token) as client:
        published = client.publish([event(run, i=0)])
        device = client.device(f"py-{run}", tidings.DeviceKey.generate(), only(run), cursor=published[0] - 1)
        got = take(device.__next__, 1, timeout=15)
        assert [seq for seq, _ in got] == published
        device.close()
    assert "GET /v1/ws HTTP/1.1" in caplog.text, "the upgrade was logged, without a query"
    assert "Authorization: REDACTED" in caplog.text
    assert token not in caplog.text and token.rsplit(".", 1)[1] not in caplog.text


def test_a_device_with_a_bad_filter_is_refused(main: Server) -> None:
    with tidings.Client(main.url) as client:
        device = client.device("py-refused", tidings.DeviceKey.generate(), {"payload": {"no_such_operator": [1]}})
        with pytest.raises(tidings.Refused) as refused:
            take(device.__next__, 1)
        assert refused.value.code == "invalid_filter"


def test_an_expired_token_is_replaced_through_the_token_function(auth: Server) -> None:
    run = tag()
    calls = 0

    def token() -> str:
        nonlocal calls
        calls += 1
        return mint(2)

    publisher = tidings.Client(auth.url, token=lambda: mint(600))
    with tidings.Client(auth.url, token=token) as client:
        stream = client.stream(only(run))
        reader = Reader(stream)
        until(lambda: stream.state.connections == 1, "the stream to open")
        first = publisher.publish(event(run, i=0))
        reader.wait(1)
        # The token expires; the server ends the stream; the function gives another.
        until(lambda: stream.state.connections >= 2, "the stream to come back under a fresh token")
        second = publisher.publish(event(run, i=1))
        assert ids(reader.wait(2)) == first + second
        assert calls >= 2
    # A fixed token that expired is a refusal, not retried.
    with tidings.Client(auth.url, token=mint(-60)) as stale:
        with pytest.raises(tidings.Refused) as refused:
            stale.poll()
        assert refused.value.status == 401
    publisher.close()


class _Endless(socketserver.ThreadingTCPServer):
    """A hostile server: every stream it answers is one `data:` line that
    never ends (`size` characters, then silence). Counts its connections."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, size: int) -> None:
        self.size, self.connections = size, 0
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                outer.connections += 1
                self.rfile.readline()
                head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 999999999\r\n\r\n"
                try:
                    self.wfile.write(head.encode() + b"data: ")
                    chunk = b"x" * 65536
                    for _ in range(outer.size // len(chunk)):
                        self.wfile.write(chunk)
                    time.sleep(30)
                except OSError:
                    pass

        super().__init__(("127.0.0.1", free_port()), Handler)


def test_a_stream_whose_line_never_ends_is_resumed_not_buffered() -> None:
    # 6 MiB of one line, past the client's 4 MiB bound: the client drops the
    # connection and comes back (resuming), rather than holding it all.
    server = _Endless(6 * 1024 * 1024)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with tidings.Client(f"http://127.0.0.1:{server.server_address[1]}") as client:
            stream = client.stream({"types": ["probe.*"]})
            Reader(stream)
            until(lambda: server.connections >= 2, "the client to drop the endless line and resume", timeout=30)
    finally:
        server.shutdown()
        server.server_close()


def test_the_reader_bounds_lines_and_events() -> None:
    from tidings._core import MAX_EVENT, MAX_LINE, Oversized, SseReader

    odd = SseReader()
    # A BOM at the start is dropped; a retry that is not plain digits (or is
    # absurdly long) is ignored, never a crash.
    events = odd.feed("\ufeffretry: \u00b2\nretry: " + "9" * 5000 + "\ndata: x\n\n")
    assert [(e.data, e.retry) for e in events] == [("x", None)]
    reader = SseReader()
    events = reader.feed("id: 1\ndata: a\r\ndata: b\r")
    assert events == []
    events = reader.feed("\n\r\n: comment\nretry: 20\nevent: system.x\ndata: y\n\n")
    assert [(e.event, e.data, e.id) for e in events] == [("message", "a\nb", "1"), ("system.x", "y", "1")]
    with pytest.raises(Oversized):
        for _ in range(MAX_LINE // 65536 + 2):
            SseReader.feed(reader, "z" * 65536)
    with pytest.raises(Oversized):
        many = SseReader()
        line = "data: " + "w" * 65536 + "\n"
        for _ in range(MAX_EVENT // 65536 + 2):
            many.feed(line)


def test_a_stream_and_a_consumer_stop_from_another_thread(main: Server) -> None:
    """`stop()` from another thread ends a loop blocked on a quiet stream at
    once, and a consumer's loop once its poll answers; a page the body did
    not finish comes again to the next loop."""
    run = tag()
    with tidings.Client(main.url) as client:
        stream = client.stream(only(run))
        got: list[list[tidings.Envelope]] = []
        loop = threading.Thread(target=lambda: got.append(list(stream)))
        loop.start()
        until(lambda: stream.state.connections >= 1, "the stream is open")
        started = time.monotonic()
        stream.stop()
        loop.join(10)
        assert not loop.is_alive() and got == [[]], "the loop ended with nothing handed out"
        assert time.monotonic() - started < 5, "at once, not at the next heartbeat"

        consumer = client.consumer(f"stopper-{run}", only(run))
        consumer.poll()  # created at the head, before what it should see
        published = client.publish([event(run, i=0), event(run, i=1)])
        consumer.wait = 1.0
        seen: list[int] = []

        def body() -> None:
            for envelope in consumer:
                seen.append(envelope.event_id)
                consumer.stop()  # from its own body: the page is not finished

        worker = threading.Thread(target=body)
        worker.start()
        worker.join(10)
        assert not worker.is_alive() and seen == published[:1]
        # Stopped from another thread while it waits for more.
        again: list[int] = []

        def more() -> None:
            for envelope in consumer:
                again.append(envelope.event_id)

        worker = threading.Thread(target=more)
        worker.start()
        until(lambda: len(again) == 2, "the unfinished page comes again")
        consumer.stop()
        worker.join(10)
        assert not worker.is_alive() and again == published
