"""What the asyncio tests written once (``test_unit_async.py``,
``test_scenarios_async.py``) run under: anyio's pytest plugin on asyncio,
and how they wait. ``_flavour_sync.py`` is the blocking twin the generated
tests import instead (``tools/generate_sync.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

#: The mark of every test in the module.
mark = pytest.mark.anyio


async def take(items: AsyncIterator[T], n: int, timeout: float = 30.0) -> list[T]:
    """`n` items from `items`, within `timeout` or the test fails."""

    async def run() -> list[T]:
        return [await items.__anext__() for _ in range(n)]

    try:
        return await asyncio.wait_for(run(), timeout)
    except TimeoutError:
        raise AssertionError(f"{n} items within {timeout} s") from None


def start(items: AsyncIterator[T], n: int, timeout: float = 30.0) -> asyncio.Task[list[T]]:
    """Begins taking `n` items from `items` while the test goes on."""
    return asyncio.ensure_future(take(items, n, timeout))


async def result(taking: asyncio.Task[list[T]]) -> list[T]:
    """What a :func:`start` took."""
    return await taking


async def blocking(call: Callable[[], T]) -> T:
    """`call()`, which blocks (a server's restart, its health), off the loop."""
    return await asyncio.to_thread(call)


async def until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Waits until `check()` holds, within `timeout` or the test fails."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        await asyncio.sleep(0.02)
