"""What tidings sends and refuses, as typed values: envelopes, poll pages,
replay gaps and the errors a caller can catch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from typing_extensions import NotRequired

Visibility = Literal["public", "reviewer_only", "admin"]


class Published(list[int]):
    """The ids a publish was assigned, in order. ``replayed`` is true when
    the server had stored it before under the same ``Idempotency-Key`` (a
    retry whose first answer was lost, or the same key sent again) and
    stored nothing now."""

    replayed: bool

    def __init__(self, ids: list[int], replayed: bool) -> None:
        super().__init__(ids)
        self.replayed = replayed


@dataclass(frozen=True)
class Agent:
    """The agent an event is attributed to."""

    id: str
    kind: str | None = None


@dataclass(frozen=True)
class Link:
    """A typed relation from an event to something it concerns."""

    rel: str
    ref: str


@dataclass(frozen=True)
class Envelope:
    """An event as the server delivers it (envelope version 1)."""

    event_id: int
    """Assigned by the server: increasing, the resume point of every transport."""
    event_type: str
    occurred_at: str
    payload: dict[str, Any]
    visibility: str = "public"
    ref: str | None = None
    agent: Agent | None = None
    session_id: str | None = None
    links: list[Link] = field(default_factory=list)
    envelope_version: int = 1
    traceparent: str | None = None
    """The W3C trace context the event was published in, if any: continue the trace from it."""
    tracestate: str | None = None

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Envelope:
        """Reads an envelope the server sent; unknown fields are ignored."""
        agent = value.get("agent")
        return cls(
            event_id=int(value["event_id"]),
            event_type=str(value["event_type"]),
            occurred_at=str(value.get("occurred_at", "")),
            payload=dict(value.get("payload") or {}),
            visibility=str(value.get("visibility", "public")),
            ref=value.get("ref"),
            agent=Agent(id=str(agent["id"]), kind=None if agent.get("kind") is None else str(agent["kind"])) if isinstance(agent, Mapping) else None,
            session_id=value.get("session_id"),
            links=[Link(rel=str(link["rel"]), ref=str(link["ref"])) for link in value.get("links") or []],
            envelope_version=int(value.get("envelope_version", 1)),
            traceparent=_optional_str(value.get("traceparent")),
            tracestate=_optional_str(value.get("tracestate")),
        )


def _optional_str(value: Any) -> str | None:
    """A string field the server may leave out."""
    return value if isinstance(value, str) else None


class Filter(TypedDict, total=False):
    """What a client asks for: fields are AND-combined, values within one OR-combined."""

    types: list[str]
    """Globs over dotted event types: `*` is one segment, `**` one or more."""
    agents: list[str]
    targets: list[str]
    """Matches an event's `ref` or any of its `links[].ref`."""
    payload: Any
    """A JsonLogic rule over the payload, evaluated by the server."""


class NewEvent(TypedDict):
    """An event to publish: the server assigns the id (and the time, by default)."""

    event_type: str
    payload: NotRequired[dict[str, Any]]
    ref: NotRequired[str]
    agent: NotRequired[dict[str, str]]
    session_id: NotRequired[str]
    links: NotRequired[list[dict[str, str]]]
    visibility: NotRequired[Visibility]
    occurred_at: NotRequired[str]


Event = NewEvent | Mapping[str, Any]


@dataclass(frozen=True)
class Gap:
    """A resume point the server could not serve whole; `reason` says why:
    `pruned` (history before `available_from` was deleted), `replay_limit`
    (further back than one resume may replay), `beyond_head` (the point is
    past the `head`), or `history_lost` (the server's store lost the history
    after `fork` in a failover or a restore: events this client saw after
    the fork are gone, and every event after the fork follows)."""

    requested: int
    available_from: int
    head: int
    reason: str = "pruned"
    fork: int | None = None

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Gap:
        fork = value.get("fork")
        return cls(
            int(value["requested"]),
            int(value["available_from"]),
            int(value["head"]),
            str(value.get("reason", "pruned")),
            None if fork is None else int(fork),
        )


@dataclass(frozen=True)
class Dropped:
    """The server closed a stream that fell behind; it resumed from `last_event_id`."""

    reason: str
    last_event_id: int | None
    queue: int

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Dropped:
        last = value.get("last_event_id")
        return cls(str(value.get("reason", "")), None if last is None else int(last), int(value.get("queue", 0)))


@dataclass(frozen=True)
class Page:
    """One page of a poll."""

    events: list[Envelope]
    next_since: int
    """Where the next poll starts, and what to acknowledge once these are handled."""
    has_more: bool
    gap: Gap | None = None

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Page:
        gap = value.get("gap")
        return cls(
            events=[Envelope.from_json(e) for e in value["events"]],
            next_since=int(value["next_since"]),
            has_more=bool(value["has_more"]),
            gap=Gap.from_json(gap) if isinstance(gap, Mapping) else None,
        )


@dataclass(frozen=True)
class ConsumerDelivery:
    """Where a durable consumer stands with one event: `acknowledged` (its
    filter takes the event and its cursor has passed it), `pending` (it
    takes the event, not acknowledged yet) or `not_matched`."""

    consumer_id: str
    owner: str
    cursor: int
    state: str


@dataclass(frozen=True)
class DeviceDelivery:
    """A stored device cursor (a WebSocket device, or a server's own lane)
    and whether it has passed one event."""

    owner: str
    device_id: str
    cursor: int
    acknowledged: bool
    updated_ms: int | None = None


@dataclass(frozen=True)
class Deliveries:
    """An event and who has it: every durable consumer the caller may see
    and, for an admin, every stored device cursor (at most 1,000;
    `devices_truncated` says there were more)."""

    event: Envelope
    consumers: list[ConsumerDelivery]
    devices: list[DeviceDelivery]
    devices_truncated: bool = False

    def consumer(self, consumer_id: str) -> ConsumerDelivery | None:
        """The consumer named `consumer_id`, if the caller may see it."""
        return next((c for c in self.consumers if c.consumer_id == consumer_id), None)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Deliveries:
        return cls(
            event=Envelope.from_json(value["event"]),
            consumers=[ConsumerDelivery(str(c["consumer_id"]), str(c["owner"]), int(c["cursor"]), str(c["state"])) for c in value.get("consumers") or []],
            devices=[
                DeviceDelivery(
                    str(d["owner"]),
                    str(d["device_id"]),
                    int(d["cursor"]),
                    bool(d["acknowledged"]),
                    None if d.get("updated_ms") is None else int(d["updated_ms"]),
                )
                for d in value.get("devices") or []
            ],
            devices_truncated=bool(value.get("devices_truncated", False)),
        )


class TidingsError(Exception):
    """Anything this client raises."""


class Refused(TidingsError):
    """A request the server refused, with its stable error code. The same
    request would be refused again, so it is never retried.

    `status` is the HTTP status (0 for a WebSocket refusal, where `rpc_code`
    or `close_code` says which)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str = "",
        body: Any = None,
        *,
        rpc_code: int | None = None,
        close_code: int | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        self.rpc_code = rpc_code
        self.close_code = close_code


class Unavailable(TidingsError):
    """The server could not be reached, or answered `503`, on every retry.
    A publish that ends here may have been stored or not: calling it again
    with the same `idempotency_key` stores it at most once."""


class ReplayGap(TidingsError):
    """A stream's resume point could not be served whole: the events between
    `requested` and `available_from` are gone (`reason` says why; with
    `history_lost`, what was seen after `fork` is gone). The stream's
    resume point has moved past what is gone (to the head, or the fork);
    pass `on_gap="skip"` to go on without the exception."""

    def __init__(self, gap: Gap) -> None:
        super().__init__(
            f"replay gap ({gap.reason}): asked after {gap.requested}, history starts at {gap.available_from} (head {gap.head})"
            + (f", history after {gap.fork} was lost" if gap.fork is not None else "")
        )
        self.gap = gap
        self.requested = gap.requested
        self.available_from = gap.available_from
        self.head = gap.head
        self.reason = gap.reason
        self.fork = gap.fork
