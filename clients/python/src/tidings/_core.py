"""What the sync and async clients share, with no I/O of its own: URLs and
headers, reading refusals, the retry rules and backoff, idempotency keys,
the stream's frame handling and the device's signed proofs."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import random
import secrets
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

import httpx
import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ._model import Dropped, Envelope, Event, Filter, Gap, Refused, ReplayGap
from ._wire import AuthBody, Identity, OriginProof

OnGap = Literal["raise", "skip"]

#: Heartbeats come every 15 s: a stream silent for this long is gone.
STREAM_READ_TIMEOUT = 45.0
#: A long poll is held at most this long by the server, plus slack.
POLL_SLACK = 15.0


def new_key() -> str:
    """A new random `Idempotency-Key`: 32 hex digits."""
    return secrets.token_hex(16)


def publish_body(events: Event | Sequence[Event]) -> bytes:
    """The body of `POST /v1/events`: one event, or `{events: [...]}`."""
    if isinstance(events, Mapping):
        return json.dumps(dict(events)).encode()
    return json.dumps({"events": [dict(e) for e in events]}).encode()


def auth_headers(token: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    headers = dict(extra or {})
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def filter_param(flt: Filter | Mapping[str, Any] | None) -> str | None:
    return json.dumps(dict(flt), separators=(",", ":")) if flt else None


def refusal(response: httpx.Response) -> Refused:
    """A refusal's `{error, message}` body as a :class:`Refused` (a body
    that is not JSON, a proxy's page say, gives `http_<status>`)."""
    body: Any = None
    try:
        body = response.json()
    except (ValueError, httpx.ResponseNotRead):
        pass
    b = body if isinstance(body, dict) else {}
    code = b.get("error") if isinstance(b.get("error"), str) else f"http_{response.status_code}"
    message = b.get("message") if isinstance(b.get("message"), str) else response.reason_phrase
    return Refused(response.status_code, str(code), str(message), body)


def is_final(status: int) -> bool:
    """A refusal the same request would meet again: never retried."""
    return 400 <= status < 500 and status not in (408, 429)


#: Answers a retry may fix: the server (or a proxy before it) is not there now.
RETRIED_STATUSES = frozenset({408, 429, 502, 503, 504})


def retry_after(response: httpx.Response) -> float:
    """A `Retry-After` in seconds (at most 30), or 0."""
    try:
        return min(max(float(response.headers.get("retry-after", "0")), 0.0), 30.0)
    except ValueError:
        return 0.0


@dataclass
class Backoff:
    """Full jitter: each wait is anywhere in [0, ceiling], the ceiling
    doubling from `initial` up to `maximum` seconds, so clients a restart
    disconnected together come back spread over the whole window."""

    initial: float = 0.25
    maximum: float = 10.0
    _next: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        self._next = self.initial

    def take(self) -> float:
        wait = random.random() * self._next
        self._next = min(self._next * 2, self.maximum)
        return wait

    def reset(self) -> None:
        self._next = self.initial


class Again(Exception):
    """This attempt failed in a way a retry may fix, after at least `at_least` seconds."""

    def __init__(self, at_least: float) -> None:
        self.at_least = at_least


class Lost(Exception):
    """A device connection is over; the next one resumes from the cursor."""


@dataclass
class StreamState:
    """Where a stream is: what it has delivered, and what the server told it."""

    filter: Filter | Mapping[str, Any] | None
    since: int | None
    on_gap: OnGap
    last_event_id: int | None = None
    retry_ms: int | None = None
    connections: int = 0
    drops: list[Dropped] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    token_expired: bool = False

    def params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        flt = filter_param(self.filter)
        if flt is not None:
            params["filter"] = flt
        start = self.last_event_id if self.last_event_id is not None else self.since
        if start is not None:
            params["since"] = str(start)
        return params

    def frame(self, event: str, data: str, frame_id: str) -> Envelope | None:
        """One frame: the envelope to deliver, or None. Raises
        :class:`ReplayGap` for a gap unless `on_gap="skip"`."""
        if event in ("", "message"):
            if not data:
                return None  # a `retry:` or `id:` alone
            envelope = Envelope.from_json(json.loads(data))
            seq = int(frame_id) if frame_id else envelope.event_id
            if self.last_event_id is not None and seq <= self.last_event_id:
                return None
            self.last_event_id = seq
            return envelope
        if event == "system.replay_gap":
            gap = Gap.from_json(json.loads(data))
            self.gaps.append(gap)
            # A resume point past the head (a server that lost its log, or
            # another server's ids): what comes after the head is new.
            if self.last_event_id is not None and gap.requested > gap.head:
                self.last_event_id = gap.head
            # History after the fork was lost: the stream goes on after the
            # fork, and a later resume from there is told nothing again.
            if self.last_event_id is not None and gap.reason == "history_lost" and gap.fork is not None:
                self.last_event_id = gap.fork
            if self.on_gap == "raise":
                raise ReplayGap(gap)
        elif event == "system.client_dropped_slow":
            self.drops.append(Dropped.from_json(json.loads(data)))
        elif event == "system.token_expired":
            self.token_expired = True
        return None


# ---------------------------------------------------------------------------
# The WebSocket device (docs/ref-websocket.md)


class DeviceKey:
    """A device's Ed25519 key: what signs its `stream.auth` and acks, and
    with the device id names its cursor on the server."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self.private_key = private_key
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.identity: dict[str, Any] = {
            "type": "system/identity",
            "data": {"algorithm": "ed25519", "public_key": base64.b64encode(raw).decode()},
        }

    @classmethod
    def generate(cls) -> DeviceKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes) -> DeviceKey:
        """A PKCS#8 PEM key (what `tidings listen --key` keeps)."""
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("tidings: a device key is an Ed25519 key")
        return cls(key)

    def to_pem(self) -> bytes:
        return self.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    def proof(self, method: str, body: Any, nonce: str) -> OriginProof:
        """The `origin_proof` of a signed call: the signature over
        `sha256:<hex>` of the RFC 8785 canonical `{method, body, nonce}`."""
        digest = hashlib.sha256(rfc8785.dumps({"method": method, "body": body, "nonce": nonce})).hexdigest()
        signature = self.private_key.sign(f"sha256:{digest}".encode())
        return {"identity": cast(Identity, self.identity), "signature": base64.b64encode(signature).decode()}


class Stop:
    """A stop asked from any thread or task: a flag, and the connection it
    shuts so that a read blocked on it ends at once (closing a connection
    from another thread does not wake a read; shutting its socket does)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.response: httpx.Response | None = None

    def __call__(self) -> None:
        self._event.set()
        stream = self.response.extensions.get("network_stream") if self.response is not None else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        # A socket, or asyncio's view of one (which allows shutdown too).
        shutdown = getattr(sock, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleeps `seconds` or until stopped: whether it was stopped."""
        return self._event.wait(seconds)


# generated from crates/protocol/src/ws.rs: TIDINGS_BLESS=1 cargo test ws_protocol:: rewrites it
METHOD_HELLO: Final = "stream.hello"
METHOD_AUTH: Final = "stream.auth"
METHOD_DELTA: Final = "sync.delta"
METHOD_ACK: Final = "stream.ack"
METHOD_REAUTH: Final = "stream.reauth"
METHOD_EVENT: Final = "stream.event"
METHOD_GAP: Final = "stream.gap"
METHOD_TOKEN_EXPIRED: Final = "stream.token_expired"
METHOD_FILTER_BUDGET_EXCEEDED: Final = "stream.filter_budget_exceeded"
RPC_INVALID_REQUEST: Final = -32600
RPC_METHOD_NOT_FOUND: Final = -32601
RPC_INVALID_PARAMS: Final = -32602
RPC_INTERNAL: Final = -32603
RPC_UNAUTHENTICATED: Final = -32001
RPC_FORBIDDEN: Final = -32003
RPC_NOT_FOUND: Final = -32004
RPC_CONFLICT: Final = -32009
RPC_TRY_LATER: Final = -32013
CLOSE_NORMAL: Final = 1000
CLOSE_GOING_AWAY: Final = 1001
CLOSE_PROTOCOL: Final = 1002
CLOSE_UNSUPPORTED: Final = 1003
CLOSE_ABNORMAL: Final = 1006
CLOSE_INVALID: Final = 1007
CLOSE_POLICY: Final = 1008
CLOSE_TOO_BIG: Final = 1009
CLOSE_INTERNAL: Final = 1011
CLOSE_RESTART: Final = 1012
CLOSE_TRY_LATER: Final = 1013
#: Close codes after which the same connection would be refused again: no reconnect.
REFUSING_CLOSES: Final = frozenset({1002, 1003, 1007, 1008, 1009})
#: JSON-RPC errors the same request would meet again: final. Others are retried.
FINAL_RPC_ERRORS: Final = frozenset({-32600, -32601, -32602, -32001, -32003})
# end of the generated protocol


def rpc_refusal(error: Mapping[str, Any]) -> Refused:
    data = error.get("data")
    code = data.get("code") if isinstance(data, Mapping) else None
    return Refused(0, str(code or "rpc_error"), str(error.get("message", "")), dict(error), rpc_code=int(error.get("code", 0)))


MAX_LINE = 4 * 1024 * 1024
"""The longest line of an event stream the client holds: a server's
envelopes are far smaller (TIDINGS_MAX_PAYLOAD, 64 KiB by default). A
longer one is a broken stream: the client resumes from its last event."""
MAX_EVENT = 8 * 1024 * 1024
"""The most data one event may gather over its `data:` lines."""
MAX_WS_MESSAGE = 16 * 1024 * 1024
"""The largest WebSocket message a device takes (a `sync.delta` page is at
most TIDINGS_POLL_MAX_BYTES, 4 MiB by default, plus its framing)."""


class Oversized(Exception):
    """A line or an event past :data:`MAX_LINE` / :data:`MAX_EVENT`."""


@dataclass
class SseEvent:
    """One dispatched event-stream frame."""

    event: str
    data: str
    id: str
    retry: int | None


def _split_lines(buffer: str) -> tuple[list[str], str]:
    """`buffer`'s complete lines (ended by CR, LF or CRLF) and its rest; a
    CR at the very end stays in the rest (it may be half a CRLF). One pass."""
    lines: list[str] = []
    start = i = 0
    n = len(buffer)
    while i < n:
        c = buffer[i]
        if c == "\n" or c == "\r":
            if c == "\r" and i == n - 1:
                break
            lines.append(buffer[start:i])
            i += 2 if c == "\r" and buffer[i + 1] == "\n" else 1
            start = i
        else:
            i += 1
    return lines, buffer[start:]


class SseReader:
    """The event-stream parser of the HTML standard, fed text, bounded: a
    line or an event past the bounds raises :class:`Oversized` rather than
    growing without end. Finds line ends only in text it has not scanned."""

    def __init__(self) -> None:
        # The unterminated rest of the stream: pieces, joined only once a
        # line end arrives (appending to one string copies it every time).
        self._parts: list[str] = []
        self._parts_len = 0
        self._started = False
        self._data: list[str] = []
        self._data_len = 0
        self._event = ""
        self._id: str | None = None
        self._last_id = ""
        self._retry: int | None = None

    def feed(self, text: str) -> list[SseEvent]:
        if not self._started and text:
            self._started = True
            if text.startswith("\ufeff"):
                text = text[1:]
        pending_cr = bool(self._parts) and self._parts[-1].endswith("\r")
        if "\n" not in text and "\r" not in text and not pending_cr:
            self._parts.append(text)
            self._parts_len += len(text)
            if self._parts_len > MAX_LINE:
                raise Oversized(f"a line of more than {MAX_LINE} characters")
            return []
        buffer = "".join(self._parts) + text
        self._parts, self._parts_len = [], 0
        out: list[SseEvent] = []
        if "\r" not in buffer:
            # Lines end with LF alone (what tidings sends): split once.
            lines = buffer.split("\n")
            rest = lines.pop()
        else:
            lines, rest = _split_lines(buffer)
        for line in lines:
            frame = self._line(line)
            if frame is not None:
                out.append(frame)
        if rest:
            self._parts, self._parts_len = [rest], len(rest)
        if self._parts_len > MAX_LINE:
            raise Oversized(f"a line of more than {MAX_LINE} characters")
        return out

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            frame = None
            if self._data:
                frame = SseEvent(self._event or "message", "\n".join(self._data), self._id if self._id is not None else self._last_id, self._retry)
            if self._id is not None:
                self._last_id = self._id
            self._data, self._data_len, self._event, self._id, self._retry = [], 0, "", None, None
            return frame
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data_len += len(value) + 1
            if self._data_len > MAX_EVENT:
                raise Oversized(f"an event of more than {MAX_EVENT} characters")
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        elif field == "retry" and value.isascii() and value.isdigit() and len(value) <= 9:
            self._retry = int(value)
        return None


def ws_url(base: str) -> str:
    """The WebSocket URL of `/v1/ws` on `base`. The token goes in a header
    (:func:`ws_headers`), never in the URL: URLs reach proxies' logs and
    the websockets library's debug log."""
    url = httpx.URL(base).join("/v1/ws")
    scheme = "wss" if url.scheme == "https" else "ws"
    return str(url.copy_with(scheme=scheme))


def ws_headers(token: str | None) -> dict[str, str] | None:
    """The upgrade's headers: the bearer token, when there is one."""
    return {"Authorization": f"Bearer {token}"} if token else None


class _RedactAuthorization(logging.Filter):
    """websockets logs every header of the upgrade at debug: not the token."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 2 and str(args[0]).lower() == "authorization":
            record.args = (args[0], "REDACTED")
        return True


def ws_connect_args(base: str, token: str | None, timeout: float | None) -> dict[str, Any]:
    """The arguments of websockets' `connect` (sync or asyncio) for a device
    connection to `base`."""
    return {
        "uri": ws_url(base),
        "additional_headers": ws_headers(token),
        "logger": WS_LOGGER,
        "open_timeout": timeout,
        "max_size": MAX_WS_MESSAGE,
    }


WS_LOGGER = logging.getLogger("tidings.websocket")
"""The logger the device's connections log to (websockets' debug lines,
with the Authorization header redacted)."""
WS_LOGGER.addFilter(_RedactAuthorization())


@dataclass
class DeviceState:
    """A device connection's progress, kept across reconnects."""

    device_id: str
    key: DeviceKey
    filter: Filter | Mapping[str, Any] | None
    high_water: int = 0
    """The highest seq the loop body has finished (acknowledged automatically)."""
    cursor_given: bool = False
    """A starting cursor was given (0 included): it goes along even at 0."""
    handed_out: int = 0
    """The highest seq handed out (acknowledged by an explicit `ack()`)."""
    cursor: int | None = None
    """The cursor the server confirmed last."""
    page_size: int = 500
    gaps: list[Gap] = field(default_factory=list)
    connections: int = 0

    def absorb(self, message: Any, acks_pending: set[int]) -> dict[str, Any] | None:
        """A message read on the connection: None for the answer to an ack
        (which moves the cursor) or for anything that is not an object.
        An error about the connection raises: :class:`Refused` when final,
        else :class:`Lost`."""
        if not isinstance(message, dict):
            return None
        if "method" not in message:
            if message.get("id") in acks_pending:
                acks_pending.discard(message["id"])
                if isinstance(message.get("result"), dict):
                    self.cursor = max(self.cursor or 0, int(message["result"]["cursor"]))
                return None
            if message.get("id") is None and isinstance(message.get("error"), dict):
                # About the connection: a refused token is final.
                error = rpc_refusal(message["error"])
                if error.rpc_code in FINAL_RPC_ERRORS:
                    raise error
                raise Lost()
        return message

    def answer(self, message: dict[str, Any]) -> Any:
        """The result of an answer, or its error raised (final or :class:`Lost`)."""
        if "error" in message:
            error = rpc_refusal(message["error"])
            if error.rpc_code in FINAL_RPC_ERRORS:
                raise error
            raise Lost()
        return message["result"]

    def auth_body(self) -> AuthBody:
        body: AuthBody = {"device_id": self.device_id}
        if self.filter:
            body["filter"] = dict(self.filter)
        # The high-water mark goes along: a device whose acks never landed
        # would otherwise start at the head, past what came meanwhile.
        # A cursor given as 0 goes too: the device starts at the beginning,
        # not at the head.
        if self.high_water > 0 or self.cursor_given:
            body["cursor"] = self.high_water
        return body


def poll_body(flt: Filter | Mapping[str, Any] | None, since: int | None, consumer_id: str | None, wait: float | None, limit: int | None) -> dict[str, Any]:
    """The body of `POST /v1/poll`; `wait` is in seconds."""
    body: dict[str, Any] = {}
    if flt:
        body["filter"] = dict(flt)
    if since is not None:
        body["since"] = since
    if consumer_id is not None:
        body["consumer_id"] = consumer_id
    if wait is not None:
        body["wait_ms"] = int(wait * 1000)
    if limit is not None:
        body["limit"] = limit
    return body


def refusal_of_upgrade(status: int, body: bytes | bytearray) -> Refused:
    """A WebSocket upgrade refused with `status` and an `{error, message}` body."""
    try:
        value = json.loads(body)
    except ValueError:
        value = {}
    value = value if isinstance(value, dict) else {}
    return Refused(status, str(value.get("error", f"http_{status}")), str(value.get("message", "")), value)
