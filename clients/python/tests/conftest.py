"""Real tidings servers for the client's tests, started by PID and stopped
by PID. `tests/api/python_client.rs` (run by the project's `scripts/test`)
gives the binary (`TIDINGS_BIN`) and, per server, the environment that puts
it on the store under test (`TIDINGS_TEST_SERVERS`: `{"main": {...},
"slow": {...}, "auth": {...}}`); each server here may be restarted on its
port with the same store. `TIDINGS_AUTH_SECRET` is the `auth` server's
HS256 secret."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import jwt
import pytest

T = TypeVar("T")


_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port below the kernel's ephemeral range, where no outgoing
    connection is given a local port, so nothing takes it before the server
    binds it; never handed out twice here; free now."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_from = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_from = 32768
    low, high = max(ephemeral_from - 12000, 10000), ephemeral_from
    for _ in range(10000):
        port = random.randrange(low, high)
        if port in _GIVEN:
            continue
        _GIVEN.add(port)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free loopback port in {low}..{high}")


class Server:
    """A `tidings` process on a loopback port; `restart()` keeps port and store."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {"PATH": os.environ.get("PATH", ""), "TIDINGS_LISTEN": f"127.0.0.1:{self.port}", **env}
        self.process: subprocess.Popen[bytes] | None = None
        self.log = open(os.devnull, "wb")

    def start(self) -> None:
        self.process = subprocess.Popen([os.environ["TIDINGS_BIN"]], env=self.env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, f"{self.name} exited with {self.process.returncode}"
            time.sleep(0.05)
        raise AssertionError(f"{self.name} did not answer within 30 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def deep(self) -> dict[str, Any]:
        value: dict[str, Any] = httpx.get(self.url + "/health/deep", timeout=10).json()
        return value

    def head(self) -> int:
        return int(self.deep()["head_event_id"] or 0)


def _servers() -> dict[str, dict[str, str]]:
    raw = os.environ.get("TIDINGS_TEST_SERVERS")
    assert raw, "run through scripts/test (tests/api/python_client.rs gives TIDINGS_TEST_SERVERS)"
    servers: dict[str, dict[str, str]] = json.loads(raw)
    return servers


@pytest.fixture(scope="session")
def servers() -> Iterator[dict[str, Server]]:
    started = {name: Server(name, env) for name, env in _servers().items()}
    try:
        for server in started.values():
            server.start()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def main(servers: dict[str, Server]) -> Server:
    return servers["main"]


@pytest.fixture
def slow(servers: dict[str, Server]) -> Server:
    return servers["slow"]


@pytest.fixture
def auth(servers: dict[str, Server]) -> Server:
    return servers["auth"]


def mint(ttl: float, sub: str = "py-client", **claims: Any) -> str:
    """An HS256 token for the `auth` server that expires `ttl` seconds from now."""
    now = int(time.time())
    body = {"sub": sub, "iat": now, "exp": now + int(ttl), "publish": ["**"], "subscribe": ["**"], **claims}
    return jwt.encode(body, os.environ["TIDINGS_AUTH_SECRET"], algorithm="HS256")


def tag() -> str:
    """A run tag: a filter on it sees only this test's events."""
    return uuid.uuid4().hex[:12]


def only(run: str) -> dict[str, Any]:
    return {"types": ["pyclient.*"], "payload": {"==": [{"var": "run"}, run]}}


def event(run: str, **payload: Any) -> dict[str, Any]:
    return {"event_type": "pyclient.step", "payload": {"run": run, **payload}}


def take(next_item: Callable[[], T], n: int, timeout: float = 30.0) -> list[T]:
    """`n` items from `next_item`, which may block: within `timeout` or the test fails."""
    results: queue.Queue[tuple[bool, Any]] = queue.Queue()

    def run() -> None:
        try:
            for _ in range(n):
                results.put((True, next_item()))
        except BaseException as error:  # handed to the test's thread
            results.put((False, error))

    threading.Thread(target=run, daemon=True).start()
    out: list[T] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        try:
            ok, value = results.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise AssertionError(f"{len(out)} of {n} items within {timeout} s") from None
        if not ok:
            raise value
        out.append(value)
    return out


def until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.02)


class Proxy:
    """A loopback TCP proxy in front of a server: it counts the requests
    that begin with a given line, and can lose the answers of the first
    `drop` connections (the request reaches the server; the answer is cut)."""

    def __init__(self, upstream_port: int, drop: int = 0) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.drop = drop
        self.seen: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self, request_line_prefix: str) -> int:
        with self.lock:
            return sum(1 for line in self.seen if line.startswith(request_line_prefix.encode()))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                lose = self.drop > 0
                self.drop -= 1 if lose else 0
            threading.Thread(target=self._serve, args=(client, lose), daemon=True).start()

    def _serve(self, client: socket.socket, lose: bool) -> None:
        server = socket.create_connection(self.upstream)

        def upstream() -> None:
            try:
                while data := client.recv(65536):
                    for line in data.split(b"\r\n"):
                        if line[:4] in (b"GET ", b"POST", b"PUT ", b"DELE"):
                            with self.lock:
                                self.seen.append(line)
                    server.sendall(data)
            except OSError:
                pass

        threading.Thread(target=upstream, daemon=True).start()
        try:
            while data := server.recv(65536):
                if lose:
                    break  # the answer began: lose it, and the connection
                client.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.listener.close()


class Reader:
    """Iterates `items` on a daemon thread, keeping what it hands out (the
    thread ends with the iterator, or with the test process)."""

    def __init__(self, items: Iterator[Any]) -> None:
        self.items: list[Any] = []
        self.error: BaseException | None = None

        def run() -> None:
            try:
                for item in items:
                    self.items.append(item)
            except BaseException as error:
                self.error = error

        threading.Thread(target=run, daemon=True).start()

    def wait(self, n: int, timeout: float = 30.0) -> list[Any]:
        until(lambda: len(self.items) >= n or self.error is not None, f"{n} items", timeout)
        if self.error is not None:
            raise self.error
        return list(self.items)
