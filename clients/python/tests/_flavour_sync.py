"""What the blocking tests generated from the asyncio ones
(``test_unit_sync.py``, ``test_scenarios_sync.py``) run under: plain
pytest, and how they wait (``_flavour_async.py`` is the asyncio twin)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TypeVar

import pytest

import conftest

T = TypeVar("T")

#: The mark of every test in the module (registered in pyproject.toml).
mark = pytest.mark.blocking


def take(items: Iterator[T], n: int, timeout: float = 30.0) -> list[T]:
    """`n` items from `items`, within `timeout` or the test fails."""
    return conftest.take(items.__next__, n, timeout)


def start(items: Iterator[T], n: int, timeout: float = 30.0) -> Future[list[T]]:
    """Begins taking `n` items from `items` (on a daemon thread) while the test goes on."""
    taking: Future[list[T]] = Future()
    reader = conftest.Reader(items)

    def run() -> None:
        try:
            taking.set_result(reader.wait(n, timeout)[:n])
        except BaseException as error:
            taking.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return taking


def result(taking: Future[list[T]]) -> list[T]:
    """What a :func:`start` took."""
    return taking.result()


def blocking(call: Callable[[], T]) -> T:
    """`call()`."""
    return call()


def until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Waits until `check()` holds, within `timeout` or the test fails."""
    conftest.until(check, what, timeout)
