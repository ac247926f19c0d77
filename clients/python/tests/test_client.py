"""What only the blocking client has, or what sits below both flavours:
a stream not read that the server drops as slow and that resumes
losslessly, a stop from another thread, a hostile server's endless line,
the event-stream reader's bounds, and the shared core's handling of lost
history for streams and consumers. The scenarios both flavours meet are in
``test_scenarios_async.py`` and its generated twin."""

from __future__ import annotations

import json
import socketserver
import threading
import time

import httpx
import pytest

import tidings
from conftest import Reader, Server, event, free_port, only, tag, take, until
from tidings._core import StreamState


def ids(envelopes: list[tidings.Envelope]) -> list[int]:
    return [e.event_id for e in envelopes]


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


def compressed_streams(server: Server) -> float:
    """The server's ``tidings_streams_compressed_total``."""
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("tidings_streams_compressed_total "):
            return float(line.split()[1])
    return 0.0


def test_a_compressed_stream_reads_as_a_plain_one(main: Server) -> None:
    # The main server compresses streams (TIDINGS_COMPRESSION=on, in
    # tests/api/python_client.rs) and httpx asks for gzip: the stream is
    # sent compressed, and its events arrive through it, live.
    before = compressed_streams(main)
    run = tag()
    with tidings.Client(main.url) as client:
        stream = client.stream(only(run), since=main.head())
        got: list[tidings.Envelope] = []
        reader = threading.Thread(target=lambda: got.extend(take(stream.__next__, 2)), daemon=True)
        reader.start()
        until(lambda: compressed_streams(main) > before, "the stream to open compressed")
        published = client.publish(event(run, i=0))
        published += client.publish(event(run, i=1))
        reader.join(30)
        assert ids(got) == published
        stream.close()


def test_a_device_connection_negotiates_compression(main: Server) -> None:
    # The device's library (websockets) offers permessage-deflate, and the
    # compressing main server takes it: every device scenario on it runs
    # compressed both ways.
    from websockets.sync.client import connect

    from tidings._core import ws_connect_args

    before = compressed_streams(main)
    with connect(**ws_connect_args(main.url, None, 10)) as socket:
        assert socket.response is not None
        answer = socket.response.headers.get("Sec-WebSocket-Extensions", "")
        assert answer.startswith("permessage-deflate"), answer
        assert "client_no_context_takeover" in answer
        socket.recv(timeout=10)  # stream.hello
    assert compressed_streams(main) > before


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
