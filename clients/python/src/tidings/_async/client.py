"""The client, written once: :class:`AsyncClient` and what it hands out (a
resuming :class:`AsyncStream`, a durable :class:`AsyncConsumer`, a WebSocket
:class:`AsyncDevice`). ``tools/generate_sync.py`` writes the blocking
:class:`~tidings.Client` from this module (``_sync/client.py``, checked by
the suite); where the two differ in more than ``async`` and ``await`` they
call ``_io``, which each flavour has of its own."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote

import httpx
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .._core import (
    CLOSE_ABNORMAL,
    METHOD_ACK,
    METHOD_AUTH,
    METHOD_DELTA,
    METHOD_EVENT,
    METHOD_GAP,
    METHOD_HELLO,
    METHOD_TOKEN_EXPIRED,
    POLL_SLACK,
    REFUSING_CLOSES,
    RETRIED_STATUSES,
    STREAM_READ_TIMEOUT,
    Again,
    Backoff,
    DeviceKey,
    DeviceState,
    Lost,
    OnGap,
    Oversized,
    SseReader,
    Stop,
    StreamState,
    auth_headers,
    is_final,
    new_key,
    poll_body,
    publish_body,
    refusal,
    refusal_of_upgrade,
    retry_after,
    ws_connect_args,
)
from .._model import Deliveries, Envelope, Event, Filter, Gap, Page, Published, Refused, ReplayGap, Unavailable
from .._wire import AckBody, AckParams, AuthAnswer, AuthParams, DeltaPage, DeltaParams
from ._io import ClientConnection, Events, HttpClient, TokenSource, connect, recv, resolve, sleep, stopped_within


class AsyncClient:
    """A tidings server, reached over HTTP: `url`, and `token` (a bearer
    token, or a function returning one, asked before every request and
    reconnection). Use it as a context manager, or close it when done
    (README.md shows both flavours)."""

    def __init__(self, url: str, token: TokenSource = None, *, timeout: float = 30.0, http: HttpClient | None = None) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._http = http or HttpClient(timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the HTTP connections."""
        await self._http.aclose()

    async def token(self) -> str | None:
        """The token to send now: the fixed one, or a fresh one from the function."""
        return await resolve(self._token()) if callable(self._token) else self._token

    async def _request(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        for attempt in (0, 1):
            response = await self._http.request(
                method,
                self.url + path,
                content=None if body is None else json.dumps(body).encode(),
                headers=auth_headers(await self.token(), {"content-type": "application/json"} if body is not None else None),
                timeout=timeout if timeout is not None else self._timeout,
            )
            # An expired token: once more with a fresh one from the function.
            if response.status_code == 401 and callable(self._token) and attempt == 0:
                continue
            if response.is_error:
                raise refusal(response)
            return None if response.status_code == 204 else response.json()
        raise AssertionError("unreachable")

    async def publish(self, events: Event | Sequence[Event], idempotency_key: str | None = None, *, retries: int = 5) -> Published:
        """Publishes one event or a batch (all or nothing) and returns the
        assigned ids. A `503` or a lost connection may have stored the events
        or not; each retry carries the same `Idempotency-Key` (a new random
        one unless given), so the server stores them once and answers the
        retry with the original ids (:class:`Published`, ``replayed`` true).
        A refusal raises :class:`Refused` at once."""
        body = publish_body(events)
        key = idempotency_key or new_key()
        backoff = Backoff()
        fresh_token = callable(self._token)
        failure: Exception | None = None
        for attempt in range(retries + 1):
            at_least = 0.0
            try:
                response = await self._http.post(
                    self.url + "/v1/events",
                    content=body,
                    headers=auth_headers(await self.token(), {"content-type": "application/json", "idempotency-key": key}),
                )
                if response.is_success:
                    ids = [int(i) for i in response.json()["event_ids"]]
                    return Published(ids, response.headers.get("idempotent-replayed") == "true")
                refused = refusal(response)
                if response.status_code == 401 and fresh_token:
                    fresh_token = False
                    failure = refused
                    continue
                if response.status_code not in RETRIED_STATUSES:
                    raise refused
                failure, at_least = refused, retry_after(response)
            except httpx.TransportError as error:
                # A lost connection, or an answer cut short: the same key again.
                failure = error
            if attempt < retries:
                await sleep(max(backoff.take(), at_least))
        if isinstance(failure, Refused) and is_final(failure.status):
            raise failure
        raise Unavailable(f"publishing failed after {retries + 1} attempts: {failure}") from failure

    async def poll(
        self,
        filter: Filter | Mapping[str, Any] | None = None,
        since: int | None = None,
        *,
        consumer_id: str | None = None,
        wait: float | None = None,
        limit: int | None = None,
    ) -> Page:
        """One poll: events after `since` (or after a durable consumer's
        stored cursor, or from the head), holding the request open up to
        `wait` seconds until one matches."""
        timeout = self._timeout + (wait or 0) + POLL_SLACK
        body = poll_body(filter, since, consumer_id, wait, limit)
        return Page.from_json(await self._request("POST", "/v1/poll", body, timeout=timeout))

    async def deliveries(self, event_id: int) -> Deliveries:
        """Event `event_id` and who has it (``GET /v1/events/{id}``): which
        durable consumers (and, for an admin, which devices) have
        acknowledged it and which have not. An event the caller could not
        receive raises :class:`Refused` (`404 event_not_found`)."""
        if isinstance(event_id, bool) or not isinstance(event_id, int) or event_id < 1:
            raise ValueError(f"an event id is a positive integer, not {event_id!r}")
        return Deliveries.from_json(await self._request("GET", f"/v1/events/{event_id}"))

    def stream(self, filter: Filter | Mapping[str, Any] | None = None, since: int | None = None, *, on_gap: OnGap = "raise") -> AsyncStream:
        """The events that match `filter`, live (after `since`, replayed
        first, when given), as an iterator that resumes from the last event
        it handed out after any disconnect, slow drop or server restart:
        nothing missed, nothing twice."""
        return AsyncStream(self, StreamState(filter, since, on_gap))

    def consumer(self, consumer_id: str, filter: Filter | Mapping[str, Any] | None = None, *, on_gap: OnGap = "raise") -> AsyncConsumer:
        """A durable consumer: the server keeps its filter and a cursor that
        moves only when a page is acknowledged."""
        return AsyncConsumer(self, consumer_id, filter, on_gap)

    def device(self, device_id: str, key: DeviceKey, filter: Filter | Mapping[str, Any] | None = None, *, cursor: int | None = None) -> AsyncDevice:
        """A WebSocket device (docs/ref-websocket.md) whose cursor the server
        keeps for (`key`, `device_id`); `cursor` is where a new device
        starts."""
        return AsyncDevice(self, DeviceState(device_id, key, filter, high_water=cursor or 0, cursor_given=cursor is not None))


class AsyncStream:
    """An iterator of :class:`Envelope` over `GET /v1/stream` that resumes
    by itself. Not reading it holds the server's queue: past its limit (or
    30 s without progress) the server drops the connection as slow, and the
    next step of the loop resumes from the last event handed out, losing
    nothing."""

    def __init__(self, client: AsyncClient, state: StreamState) -> None:
        self._client = client
        self.state = state
        self._stop = Stop()
        self._events = self._run()

    @property
    def last_event_id(self) -> int | None:
        """The id of the last event handed out: where a reconnect resumes."""
        return self.state.last_event_id

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Envelope:
        return await self._events.__anext__()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Ends the stream and its connection (from the loop's own thread or task)."""
        await self._events.aclose()

    def stop(self) -> None:
        """Ends the stream from any thread or task: the loop iterating it
        ends at once (a step blocked on the connection ends the iteration),
        whether it waits for an event or between connections. (Cancelling
        the asyncio task that iterates also ends it.)"""
        self._stop()

    async def _run(self) -> Events[Envelope]:
        client, state, backoff = self._client, self.state, Backoff()
        fresh_token = callable(client._token)
        while not self._stop.is_set():
            try:
                async with client._http.stream(
                    "GET",
                    client.url + "/v1/stream",
                    params=state.params(),
                    headers=auth_headers(await client.token(), {"accept": "text/event-stream", "cache-control": "no-store"}),
                    timeout=httpx.Timeout(client._timeout, read=STREAM_READ_TIMEOUT),
                ) as response:
                    self._stop.response = response
                    if self._stop.is_set():
                        return
                    if response.status_code != 200:
                        await response.aread()
                        refused = refusal(response)
                        if response.status_code == 401 and fresh_token:
                            fresh_token = False
                            raise Again(0.0)
                        if is_final(response.status_code):
                            raise refused
                        raise Again(retry_after(response))
                    state.connections += 1
                    fresh_token = callable(client._token)
                    backoff.reset()
                    reader = SseReader()
                    async for text in response.aiter_text():
                        for sse in reader.feed(text):
                            if sse.retry is not None:
                                state.retry_ms = sse.retry
                            envelope = state.frame(sse.event, sse.data, sse.id)
                            if envelope is not None:
                                yield envelope
                # The server ended the stream (a drop, a shutdown, an expired
                # token): back after its `retry:` hint.
                wait = state.retry_ms / 1000 if state.retry_ms is not None else backoff.take()
                if state.token_expired:
                    state.token_expired, wait = False, 0.0
            except (httpx.TransportError, Oversized):
                # A lost connection, or a stream past the client's bounds
                # (a broken or hostile server): resume from the last event.
                wait = backoff.take()
            except Again as again:
                wait = max(backoff.take(), again.at_least)
            except Exception:
                # A stop shuts the connection under a read: whatever that
                # raised, the stream ends.
                if self._stop.is_set():
                    return
                raise
            if await stopped_within(self._stop, wait):
                return


class AsyncConsumer:
    """A durable consumer (`consumer_id`): a worker that stops resumes where
    its last acknowledgement left it. Iterating it long-polls and hands out
    every event; a page is acknowledged only once the loop body has finished
    with its last event (the next poll confirms it), so an exception or a
    crash in the body leaves the page to come again.

    The object carries its place from page to page (as `since`), so after a
    failover that rolled the server's cursor back it resumes where it is,
    and is told if that point was lost. A page that says a resume point
    could not be served whole raises :class:`ReplayGap` before its events
    (unless `on_gap="skip"`); iterating again goes on with them."""

    def __init__(self, client: AsyncClient, consumer_id: str, filter: Filter | Mapping[str, Any] | None, on_gap: OnGap = "raise") -> None:
        self._client = client
        self.id = consumer_id
        self.filter = filter
        self.on_gap: OnGap = on_gap
        #: Acknowledged up to here, as far as this object knows.
        self.cursor: int | None = None
        self.wait = 25.0
        self.limit: int | None = None
        self._since: int | None = None
        self._pending: Page | None = None
        self._stop = Stop()

    async def poll(self, wait: float | None = None, limit: int | None = None, *, since: int | None = None) -> Page:
        """The next page after the stored cursor (or after `since`, which also confirms it)."""
        page = await self._client.poll(self.filter, since, consumer_id=self.id, wait=wait, limit=limit)
        if since is not None:
            self.cursor = max(self.cursor or 0, min(since, page.next_since))
        return page

    async def ack(self, cursor: int) -> int:
        """Confirms everything up to `cursor`; the server never moves it
        backwards or past the head. Iterating goes on from there."""
        answer = await self._client._request("POST", f"/v1/consumers/{_quote(self.id)}/ack", {"cursor": cursor})
        self.cursor = int(answer["cursor"])
        # A place confirmed by hand is where iterating goes on (a page held
        # back for it that ends there is done with).
        if self._since is not None and self.cursor > self._since:
            self._since = self.cursor
            if self._pending is not None and self._pending.next_since <= self.cursor:
                self._pending = None
        return self.cursor

    async def delete(self) -> None:
        """Removes the consumer and its cursor from the server."""
        await self._client._request("DELETE", f"/v1/consumers/{_quote(self.id)}")

    def stop(self) -> None:
        """Ends the iteration from any thread or task (or from its own body):
        it ends before the next event it would hand out, or once the poll in
        flight answers (at most `wait` seconds). A page not finished is not
        acknowledged: it comes again to the next iteration."""
        self._stop()

    async def __aiter__(self) -> Events[Envelope]:
        backoff: Backoff = Backoff()
        while not self._stop.is_set():
            page, self._pending = self._pending, None
            if page is None:
                try:
                    page = await self.poll(self.wait, self.limit, since=self._since)
                except Refused as refused:
                    if is_final(refused.status):
                        raise
                    await stopped_within(self._stop, backoff.take())
                    continue
                except httpx.TransportError:
                    await stopped_within(self._stop, backoff.take())
                    continue
                backoff.reset()
                if page.gap is not None and self.on_gap == "raise":
                    # Its events come when the caller iterates again.
                    self._pending = page
                    raise ReplayGap(page.gap)
            for event in page.events:
                if self._stop.is_set():
                    # Not finished: the page comes again.
                    self._pending, self._stop = page, Stop()
                    return
                yield event
            # The body finished with the page: the next poll confirms it.
            self._since = page.next_since
        # Stopped: a later iteration starts afresh.
        self._stop = Stop()


class AsyncDevice:
    """The WebSocket device transport (`GET /v1/ws`, JSON-RPC 2.0):
    iterating yields `(seq, envelope)`, catching up from the server's
    cursor and then live; each event is acknowledged once the loop body has
    finished with it. Lost connections, slow-consumer closes and shutdowns
    reconnect with backoff; a rejection raises :class:`Refused`."""

    def __init__(self, client: AsyncClient, state: DeviceState) -> None:
        self._client = client
        self.state = state
        self._socket: ClientConnection | None = None
        self._session: _AsyncSession | None = None
        self._items = self._run()

    @property
    def cursor(self) -> int | None:
        return self.state.cursor

    @property
    def high_water(self) -> int:
        return self.state.high_water

    def __aiter__(self) -> AsyncDevice:
        return self

    async def __anext__(self) -> tuple[int, Envelope]:
        return await self._items.__anext__()

    async def __aenter__(self) -> AsyncDevice:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Ends the device and its connection."""
        await self._items.aclose()
        if self._socket is not None:
            await self._socket.close()

    async def ack(self, timeout: float = 30.0) -> int | None:
        """Confirms now what the loop body has finished (rather than before
        the next wait) and waits for the server's answer: the cursor it
        stored. Call it before stopping a device that will not read again."""
        if self._session is not None:
            await self._session.confirm(timeout)
        return self.state.cursor

    async def _run(self) -> Events[tuple[int, Envelope]]:
        backoff = Backoff()
        while True:
            try:
                token = await self._client.token()
                async with connect(**ws_connect_args(self._client.url, token, self._client._timeout)) as socket:
                    self._socket = socket
                    self._session = _AsyncSession(socket, self.state)
                    async for item in self._session.run(backoff):
                        yield item
            except InvalidStatus as error:
                status = error.response.status_code
                if status in (401, 403):
                    raise refusal_of_upgrade(status, error.response.body or b"") from error
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd is not None else CLOSE_ABNORMAL
                if code in REFUSING_CLOSES:
                    reason = closed.rcvd.reason if closed.rcvd is not None else ""
                    raise Refused(0, reason or "protocol_error", f"closed with {code}", close_code=code) from closed
            except (OSError, TimeoutError, Lost):
                pass
            finally:
                self._session = None
            await sleep(backoff.take())


class _AsyncSession:
    """One WebSocket connection of a device."""

    def __init__(self, socket: ClientConnection, state: DeviceState) -> None:
        self.socket = socket
        self.state = state
        self.nonce = ""
        self.next_id = 0
        self.inbox: deque[dict[str, Any]] = deque()
        self.acks_pending: set[int] = set()

    async def send(self, method: str, params: Any) -> int:
        self.next_id += 1
        await self.socket.send(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}))
        return self.next_id

    async def receive(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message that is not the answer to an ack."""
        while True:
            message = await self.receive_any(timeout)
            if message is not None:
                return message

    async def receive_any(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message, or None for the answer to an ack (which moves the cursor)."""
        return self.state.absorb(json.loads(await recv(self.socket, timeout)), self.acks_pending)

    async def call(self, method: str, params: Any) -> Any:
        request = await self.send(method, params)
        while True:
            message = await self.receive()
            if "method" in message:
                self.inbox.append(message)
                continue
            if message.get("id") == request:
                return self.state.answer(message)

    async def ack(self, seq: int) -> None:
        if seq <= (self.state.cursor or 0) or seq <= 0:
            return
        body: AckBody = {"seq": seq}
        params: AckParams = {"body": body, "origin_proof": self.state.key.proof(METHOD_ACK, body, self.nonce)}
        self.acks_pending.add(await self.send(METHOD_ACK, params))

    async def confirm(self, timeout: float) -> None:
        target = max(self.state.high_water, self.state.handed_out)
        await self.ack(target)
        while (self.state.cursor or 0) < target and self.acks_pending:
            message = await self.receive_any(timeout)
            if message is not None:
                self.inbox.append(message)

    async def run(self, backoff: Backoff) -> Events[tuple[int, Envelope]]:
        hello = await self.receive(timeout=30)
        if hello.get("method") != METHOD_HELLO:
            raise Lost()
        self.nonce = str(hello["params"]["nonce"])
        state = self.state
        body = state.auth_body()
        auth: AuthParams = {"body": body, "origin_proof": state.key.proof(METHOD_AUTH, body, self.nonce)}
        answer = cast(AuthAnswer, await self.call(METHOD_AUTH, auth))
        head, cursor = int(answer["head_seq"]), int(answer["cursor"])
        state.cursor = cursor
        state.connections += 1
        if state.high_water > head:
            state.high_water = min(cursor, head)
        since = max(cursor, 0)
        while since < head:
            delta: DeltaParams = {"device_id": state.device_id, "since": since, "limit": state.page_size}
            page = cast(DeltaPage, await self.call(METHOD_DELTA, delta))
            if isinstance(page.get("gap"), dict):
                state.gaps.append(Gap.from_json(page["gap"]))
            for item in page["items"]:
                seq = int(item["seq"])
                if seq <= state.high_water:
                    continue
                state.handed_out = seq
                yield seq, Envelope.from_json(item["event"])
                state.high_water = seq
            await self.ack(state.high_water)
            next_since = int(page["next_since"])
            if next_since <= since and not page["has_more"]:
                break
            since = next_since
            if not page["has_more"] and since >= head:
                break
        backoff.reset()
        while True:
            if self.inbox:
                message = self.inbox.popleft()
            else:
                # Nothing waiting: confirm what was handled before blocking.
                await self.ack(state.high_water)
                message = await self.receive()
            method = message.get("method")
            params = message.get("params") or {}
            if method == METHOD_EVENT:
                seq = int(params["seq"])
                if seq <= state.high_water:
                    continue
                state.handed_out = seq
                yield seq, Envelope.from_json(params["event"])
                state.high_water = seq
            elif method == METHOD_GAP:
                state.gaps.append(Gap.from_json(params))
            elif method == METHOD_TOKEN_EXPIRED:
                raise Lost()  # the next connection asks the token function again


def _quote(segment: str) -> str:
    return quote(segment, safe="")
