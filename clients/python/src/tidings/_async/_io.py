"""What waiting and connecting are under asyncio: the one place the asyncio
client differs from the blocking one in more than ``async`` and ``await``
(``_sync/_io.py`` says the same for threads). The client module beside this
one is the source of both; ``tools/generate_sync.py`` writes the blocking one."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

import httpx
from websockets.asyncio.client import ClientConnection, connect

from .._core import Stop

__all__ = ["ClientConnection", "Events", "HttpClient", "TokenSource", "connect", "recv", "resolve", "sleep", "stopped_within"]

T = TypeVar("T")

#: What a stream or device hands out, as a generator of this flavour.
Events = AsyncGenerator[T, None]

#: The HTTP client of this flavour.
HttpClient = httpx.AsyncClient

#: A bearer token, or a function (plain or async) returning one, called
#: before every request and (re)connect, so that a stream whose token
#: expired goes on under a fresh one.
TokenSource = str | Callable[[], str | Awaitable[str]] | None


async def resolve(value: str | Awaitable[str]) -> str:
    """A token function's answer: awaited when it is awaitable."""
    return await value if inspect.isawaitable(value) else value


async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def recv(socket: ClientConnection, timeout: float | None) -> str | bytes:
    """The next WebSocket message, waiting at most `timeout` seconds."""
    return await asyncio.wait_for(socket.recv(), timeout)


async def stopped_within(stop: Stop, seconds: float) -> bool:
    """Sleeps `seconds` or until `stop` (looked at every 50 ms, as a stop
    may come from another thread): whether it was stopped."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not stop.is_set():
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return False
        await asyncio.sleep(min(left, 0.05))
    return True
