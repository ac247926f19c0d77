"""The client's logic with no server: every request answered by an
``httpx.MockTransport`` the test writes. Written once for the asyncio
client; ``tools/generate_sync.py`` writes ``test_unit_sync.py`` from it for
the blocking one, so both flavours meet the same scenarios: publishing
retried under one key and whether it was replayed, refusals not retried,
a stream that resumes from the last event it handed out and drops what it
had, gaps (raised, or skipped after moving past a fork), a 401 that asks the
token function once more, and a consumer that confirms a page only when
asking for the next."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from _flavour_async import mark

import tidings
from tidings import AsyncClient

pytestmark = mark

URL = "http://tidings.test"
Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff draws 0: full jitter waits nothing, so retries go at once."""
    monkeypatch.setattr("tidings._core.random.random", lambda: 0.0)


def client(handler: Handler, token: Any = None) -> AsyncClient:
    return AsyncClient(URL, token, http=httpx.AsyncClient(transport=httpx.MockTransport(handler)))


def envelope(event_id: int) -> dict[str, Any]:
    return {
        "envelope_version": 1,
        "event_id": event_id,
        "event_type": "unit.test",
        "occurred_at": "2026-12-05T00:00:00Z",
        "payload": {"n": event_id},
        "links": [],
        "visibility": "public",
    }


def sse(*frames: str) -> httpx.Response:
    """An event-stream answer that ends after `frames` (with a 1 ms retry hint)."""
    body = "retry: 1\n\n" + "".join(frames)
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body.encode())


def event(event_id: int) -> str:
    return f"id: {event_id}\ndata: {json.dumps(envelope(event_id))}\n\n"


def notice(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


class Recorder:
    """A handler that answers with `answers` in turn (the last one again
    once they run out) and keeps every request."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def since(self, n: int) -> str | None:
        since: str | None = self.requests[n].url.params.get("since")
        return since


async def test_a_publish_is_retried_under_one_key_and_says_it_was_replayed() -> None:
    lost = httpx.ConnectError("connection reset")
    server = Recorder(
        lost,
        httpx.Response(503, json={"error": "store_unavailable", "message": "later"}),
        httpx.Response(502),
        httpx.Response(200, json={"event_ids": [41, 42]}, headers={"idempotent-replayed": "true"}),
    )
    async with client(server, token="tok") as c:
        published = await c.publish([{"event_type": "a.b"}, {"event_type": "a.c"}])
    assert list(published) == [41, 42]
    assert published.replayed
    assert len(server.requests) == 4
    assert len({r.headers["idempotency-key"] for r in server.requests}) == 1, "one key for the call and its retries"
    for request in server.requests:
        assert (request.method, request.url.path) == ("POST", "/v1/events")
        assert request.headers["authorization"] == "Bearer tok"
        assert json.loads(request.content) == {"events": [{"event_type": "a.b"}, {"event_type": "a.c"}]}


async def test_a_first_publish_is_not_replayed_and_two_calls_have_two_keys() -> None:
    server = Recorder(httpx.Response(201, json={"event_ids": [1]}))
    async with client(server) as c:
        first = await c.publish({"event_type": "a.b"})
        await c.publish({"event_type": "a.b"}, idempotency_key="mine")
    assert not first.replayed
    keys = [r.headers["idempotency-key"] for r in server.requests]
    assert keys[0] != keys[1] and keys[1] == "mine"
    assert "authorization" not in server.requests[0].headers


@pytest.mark.parametrize(("status", "code"), [(400, "invalid_event"), (401, "unauthorized"), (409, "conflict"), (422, "invalid_event_name")])
async def test_a_refusal_is_raised_at_once_and_not_retried(status: int, code: str) -> None:
    server = Recorder(httpx.Response(status, json={"error": code, "message": "no"}))
    async with client(server) as c:
        with pytest.raises(tidings.Refused) as refused:
            await c.publish({"event_type": "a.b"})
    assert (refused.value.status, refused.value.code) == (status, code)
    assert len(server.requests) == 1


async def test_a_publish_that_never_lands_is_unavailable_after_its_retries() -> None:
    server = Recorder(httpx.Response(504, text="<html>gateway timeout</html>"))
    async with client(server) as c:
        with pytest.raises(tidings.Unavailable):
            await c.publish({"event_type": "a.b"}, retries=2)
    assert len(server.requests) == 3


async def test_a_stream_resumes_from_the_last_event_it_handed_out_and_drops_repeats() -> None:
    server = Recorder(sse(event(11), event(12)), sse(event(12), event(13)), sse())
    async with client(server) as c:
        stream = c.stream({"types": ["unit.*"]}, since=10)
        got = [(await stream.__anext__()).event_id for _ in range(3)]
        await stream.aclose()
    assert got == [11, 12, 13]
    assert server.since(0) == "10"
    assert json.loads(server.requests[0].url.params["filter"]) == {"types": ["unit.*"]}
    assert server.since(1) == "12", "resumed after the last event handed out"
    assert stream.last_event_id == 13


async def test_a_gap_is_raised_then_the_stream_goes_on_after_the_fork() -> None:
    gap = {"requested": 40, "available_from": 31, "head": 35, "reason": "history_lost", "fork": 30}
    server = Recorder(sse(event(40), notice("system.replay_gap", gap)), sse(event(31)))
    async with client(server) as c:
        stream = c.stream()
        assert (await stream.__anext__()).event_id == 40
        with pytest.raises(tidings.ReplayGap) as raised:
            await stream.__anext__()
        assert (raised.value.gap.reason, raised.value.gap.fork) == ("history_lost", 30)
        assert stream.last_event_id == 30
    skipping = Recorder(sse(event(40), notice("system.replay_gap", gap), event(31)))
    async with client(skipping) as c:
        stream = c.stream(on_gap="skip")
        got = [(await stream.__anext__()).event_id for _ in range(2)]
        await stream.aclose()
    assert got == [40, 31], "the event after the fork is new, and handed out"


async def test_a_401_asks_the_token_function_once_more_and_the_stream_keeps_its_place() -> None:
    tokens = iter(f"t{n}" for n in range(1, 10))
    unauthorized = httpx.Response(401, json={"error": "unauthorized", "message": "expired"})
    server = Recorder(sse(event(7), notice("system.token_expired", {})), unauthorized, sse(event(8)))
    async with client(server, token=lambda: next(tokens)) as c:
        stream = c.stream()
        got = [(await stream.__anext__()).event_id for _ in range(2)]
        await stream.aclose()
    assert got == [7, 8]
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer t1", "Bearer t2", "Bearer t3"]
    assert server.since(2) == "7"


async def test_a_second_401_in_a_row_is_final_and_so_is_a_fixed_tokens_first() -> None:
    unauthorized = httpx.Response(401, json={"error": "unauthorized", "message": "no"})
    server = Recorder(unauthorized)
    async with client(server, token=lambda: "stale") as c:
        with pytest.raises(tidings.Refused):
            await c.stream().__anext__()
    assert len(server.requests) == 2
    fixed = Recorder(unauthorized)
    async with client(fixed, token="stale") as c:
        with pytest.raises(tidings.Refused):
            await c.stream().__anext__()
    assert len(fixed.requests) == 1


async def test_a_consumer_confirms_a_page_by_asking_for_the_next_from_its_end() -> None:
    pages = Recorder(
        httpx.Response(200, json={"events": [envelope(1), envelope(2)], "next_since": 2, "has_more": True}),
        httpx.Response(200, json={"events": [envelope(3)], "next_since": 3, "has_more": False}),
    )
    async with client(pages) as c:
        consumer = c.consumer("worker-1", {"types": ["unit.*"]})
        seen = []
        async for e in consumer:
            seen.append(e.event_id)
            if e.event_id == 3:
                break
    bodies = [json.loads(r.content) for r in pages.requests]
    assert seen == [1, 2, 3]
    assert bodies[0]["consumer_id"] == "worker-1" and "since" not in bodies[0]
    assert bodies[1]["since"] == 2, "the page was finished: the next poll confirms it"
    assert len(pages.requests) == 2, "the page in hand when the loop left is not confirmed"
