"""What the server sends besides envelopes and pages, and what a device
sends it, as ``TypedDict``s: a stream's other notices and the WebSocket
device protocol's messages both ways.
Each matches the protocol crate's schema of the same name
(``crates/protocol/src/wire.rs``): tests/api/schemas.rs checks the required
and optional keys of every one.

(No ``from __future__ import annotations`` here: a ``TypedDict`` knows its
optional keys only from annotations evaluated at runtime.)"""

from typing import Any, TypedDict

from typing_extensions import NotRequired

__all__ = [
    "AckAnswer",
    "AckBody",
    "AckParams",
    "AuthAnswer",
    "AuthBody",
    "AuthParams",
    "DeltaPage",
    "DeltaParams",
    "DeviceEvent",
    "DeviceTokenExpired",
    "FilterBudgetExceeded",
    "Hello",
    "Identity",
    "OriginProof",
    "ReauthParams",
    "TokenExpiredNotice",
]


class TokenExpiredNotice(TypedDict):
    """``system.token_expired``: the stream ends; resume under a fresh token."""

    last_event_id: int | None


class FilterBudgetExceeded(TypedDict):
    """Once per stream: the payload rule went over its budget on an event."""

    budget: int


class Hello(TypedDict):
    """``stream.hello``'s params: the server's first message."""

    server_did: str
    head_seq: int
    profiles: list[str]
    nonce: str


class AuthAnswer(TypedDict):
    """``stream.auth``'s result: catch up from ``cursor`` to ``head_seq``."""

    head_seq: int
    cursor: int


class DeviceEvent(TypedDict):
    """One event of a catch-up page, and ``stream.event``'s params."""

    seq: int
    event: dict[str, Any]


class DeltaPage(TypedDict):
    """``sync.delta``'s result: one catch-up page."""

    items: list[DeviceEvent]
    next_since: int
    has_more: bool
    gap: NotRequired[dict[str, Any]]


class AckAnswer(TypedDict):
    """``stream.ack``'s result: the cursor the server stored."""

    cursor: int


class DeviceTokenExpired(TypedDict):
    """``stream.token_expired``'s params: live delivery stops until ``stream.reauth``."""

    last_seq: int
    reauth_by_ms: int


class IdentityData(TypedDict):
    """The public half of a device key."""

    algorithm: str
    public_key: str


class Identity(TypedDict):
    """A ``system/identity`` entity: who a device is."""

    type: str
    data: IdentityData


class OriginProof(TypedDict):
    """A device's signature over one call."""

    identity: Identity
    signature: str


class AuthBody(TypedDict):
    """What a device's ``stream.auth`` signs."""

    device_id: str
    cursor: NotRequired[int]
    filter: NotRequired[dict[str, Any]]


class AuthParams(TypedDict):
    """``stream.auth``'s params."""

    body: AuthBody
    origin_proof: OriginProof


class DeltaParams(TypedDict):
    """``sync.delta``'s params: the page after ``since``."""

    device_id: str
    since: int
    limit: NotRequired[int]


class AckBody(TypedDict):
    """What a device's ``stream.ack`` signs."""

    seq: int


class AckParams(TypedDict):
    """``stream.ack``'s params."""

    body: AckBody
    origin_proof: OriginProof


class ReauthParams(TypedDict):
    """``stream.reauth``'s params: a fresh token for the same subject."""

    token: str
