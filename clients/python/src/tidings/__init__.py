"""The Python client of tidings: retry-safe publishing, streams that resume
after any disconnect, durable consumers acknowledged only once handled, and
the WebSocket device, as a blocking :class:`Client` and an asyncio
:class:`AsyncClient` with the same methods."""

from ._async._io import TokenSource as AsyncTokenSource
from ._async.client import AsyncClient, AsyncConsumer, AsyncDevice, AsyncStream
from ._core import Backoff, DeviceKey
from ._model import (
    Agent,
    ConsumerDelivery,
    Deliveries,
    DeviceDelivery,
    Dropped,
    Envelope,
    Event,
    Filter,
    Gap,
    Link,
    NewEvent,
    Page,
    Published,
    Refused,
    ReplayGap,
    TidingsError,
    Unavailable,
    Visibility,
)
from ._sync._io import TokenSource
from ._sync.client import Client, Consumer, Device, Stream

__all__ = [
    "Agent",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncDevice",
    "AsyncStream",
    "AsyncTokenSource",
    "Backoff",
    "Client",
    "Consumer",
    "ConsumerDelivery",
    "Deliveries",
    "Device",
    "DeviceDelivery",
    "DeviceKey",
    "Dropped",
    "Envelope",
    "Event",
    "Filter",
    "Gap",
    "Link",
    "NewEvent",
    "Page",
    "Published",
    "Refused",
    "ReplayGap",
    "Stream",
    "TidingsError",
    "TokenSource",
    "Unavailable",
    "Visibility",
]
