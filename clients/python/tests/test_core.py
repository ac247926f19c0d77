"""The shared core with no server: reconnection waits."""

from __future__ import annotations

import pytest

from tidings import Backoff


@pytest.mark.parametrize(("draw", "waits"), [(0.0, [0, 0, 0, 0]), (0.999, [1, 2, 4, 4])])
def test_waits_are_full_jitter_under_a_ceiling_that_doubles(monkeypatch: pytest.MonkeyPatch, draw: float, waits: list[int]) -> None:
    monkeypatch.setattr("tidings._core.random.random", lambda: draw)
    backoff = Backoff(initial=1.0, maximum=4.0)
    assert [round(backoff.take()) for _ in range(4)] == waits
    backoff.reset()
    assert round(backoff.take()) == waits[0]
