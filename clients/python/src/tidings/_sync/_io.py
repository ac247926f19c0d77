"""What waiting and connecting are in the blocking client: the one place it
differs from the asyncio one in more than ``async`` and ``await``
(``_async/_io.py`` says the same for asyncio). Its client module is written
by ``tools/generate_sync.py`` from the asyncio one."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from typing import TypeVar

import httpx
from websockets.sync.client import ClientConnection, connect

from .._core import Stop

__all__ = ["ClientConnection", "Events", "HttpClient", "TokenSource", "connect", "recv", "resolve", "sleep", "stopped_within"]

T = TypeVar("T")

#: What a stream or device hands out, as a generator of this flavour.
Events = Generator[T, None, None]

#: The HTTP client of this flavour.
HttpClient = httpx.Client

#: A bearer token, or a function returning one, called before every request
#: and (re)connect, so that a stream whose token expired goes on under a
#: fresh one.
TokenSource = str | Callable[[], str] | None


def resolve(value: str) -> str:
    """A token function's answer."""
    return value


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def recv(socket: ClientConnection, timeout: float | None) -> str | bytes:
    """The next WebSocket message, waiting at most `timeout` seconds."""
    return socket.recv(timeout=timeout)


def stopped_within(stop: Stop, seconds: float) -> bool:
    """Sleeps `seconds` or until `stop` (from any thread): whether it was stopped."""
    return stop.wait(seconds)
