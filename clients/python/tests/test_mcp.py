"""The server's `/mcp` endpoint through the official MCP Python SDK (run by
`tests/api/mcp.rs`, on both stores): the handshake and the tool list, a
publish that a poll then sees, a durable consumer acknowledged across two
sessions, a compare-and-set conflict as a tool error, tools hidden from a
token whose grants cannot use them (and refused when called anyway, with
nothing stored), and bad calls answered without storing anything."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from conftest import Server, event, mint, only, tag

ALL_TOOLS = {"publish", "poll", "ack", "event_types", "tree_get", "tree_list", "tree_put"}


def client(server: Server, token: str | None = None, **options: Any) -> Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    transport = streamable_http_client(server.url + "/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=30))
    return Client(transport, **options)


def structured(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, result
    value: dict[str, Any] = dict(result.structured_content)
    return value


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result
    return structured(result)


def refused(result: CallToolResult) -> str:
    assert result.is_error, result
    body = structured(result)
    assert isinstance(body.get("message"), str) and body["message"]
    return str(body["error"])


def test_the_handshake_lists_every_tool_with_schemas(main: Server) -> None:
    async def run() -> None:
        async with client(main, mode="legacy") as mcp:
            assert mcp.server_info is not None and mcp.server_info.name == "tidings"
            assert mcp.server_capabilities.tools is not None
            assert mcp.instructions and "publish" in mcp.instructions
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert set(tools) == ALL_TOOLS
            for t in tools.values():
                assert t.input_schema["type"] == "object"
                assert t.output_schema is not None and t.output_schema["type"] == "object"
            assert tools["publish"].input_schema["required"] == ["events"]

    asyncio.run(run())


def test_a_publish_is_seen_by_a_poll_and_by_http(main: Server) -> None:
    async def run() -> None:
        run_tag = tag()
        async with client(main) as mcp:
            published = ok(await mcp.call_tool("publish", {"events": [event(run_tag, i=0), event(run_tag, i=1)]}))["event_ids"]
            assert len(published) == 2
            page = ok(await mcp.call_tool("poll", {"filter": only(run_tag), "since": published[0] - 1}))
            assert [e["event_id"] for e in page["events"]] == published
            assert page["next_since"] == published[-1]
            # A retry under the same key stores nothing more.
            key = f"mcp-{run_tag}"
            first = ok(await mcp.call_tool("publish", {"events": [event(run_tag, i=2)], "idempotency_key": key}))
            again = ok(await mcp.call_tool("publish", {"events": [event(run_tag, i=2)], "idempotency_key": key}))
            assert again["event_ids"] == first["event_ids"] and again["replayed"] is True
            types = ok(await mcp.call_tool("event_types", {}))
            assert any(t["name"] == "comment.posted" for t in types["types"])
        http = httpx.post(main.url + "/v1/poll", json={"filter": only(run_tag), "since": 0}, timeout=10).json()
        assert [e["event_id"] for e in http["events"]] == published + first["event_ids"]

    asyncio.run(run())


def test_a_publish_carries_the_trace_context_of_its_meta(main: Server) -> None:
    async def run() -> None:
        run_tag = tag()
        parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        traced: Any = {"traceparent": parent, "tracestate": "congo=t61rcWkgMzE"}
        malformed: Any = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736"}
        async with client(main) as mcp:
            published = ok(await mcp.call_tool("publish", {"events": [event(run_tag, i=0)]}, meta=traced))["event_ids"]
            bad = await mcp.call_tool("publish", {"events": [event(run_tag, i=1)]}, meta=malformed)
            assert refused(bad) == "invalid_traceparent"
            note = {"path": f"notes/{run_tag}", "entity": {"type": "note", "data": {}}}
            written = ok(await mcp.call_tool("tree_put", note, meta=traced))
        http = httpx.post(main.url + "/v1/poll", json={"filter": only(run_tag), "since": 0}, timeout=10).json()
        assert [e["event_id"] for e in http["events"]] == published, "the refused publish stored nothing"
        assert (http["events"][0]["traceparent"], http["events"][0]["tracestate"]) == (parent, "congo=t61rcWkgMzE")
        change = httpx.get(f"{main.url}/v1/poll?types=tree.created&since={written['event_id'] - 1}&limit=1", timeout=10).json()
        assert change["events"][0]["ref"] == f"tree:notes/{run_tag}" and change["events"][0]["traceparent"] == parent

    asyncio.run(run())


def test_a_durable_consumer_is_acknowledged_across_two_sessions(main: Server) -> None:
    async def run() -> None:
        run_tag, name = tag(), f"mcp-{tag()}"
        async with client(main) as mcp:
            assert ok(await mcp.call_tool("poll", {"consumer_id": name, "filter": only(run_tag)}))["events"] == []
            published = ok(await mcp.call_tool("publish", {"events": [event(run_tag, i=i) for i in range(3)]}))["event_ids"]
            page = ok(await mcp.call_tool("poll", {"consumer_id": name, "filter": only(run_tag), "wait_ms": 5000}))
            assert [e["event_id"] for e in page["events"]] == published
            assert ok(await mcp.call_tool("ack", {"consumer_id": name, "cursor": page["next_since"]}))["cursor"] == published[-1]
        later = httpx.post(main.url + "/v1/events", json=event(run_tag, i=3), timeout=10).json()["event_ids"]
        async with client(main) as mcp:
            page = ok(await mcp.call_tool("poll", {"consumer_id": name, "filter": only(run_tag), "wait_ms": 5000}))
            assert [e["event_id"] for e in page["events"]] == later
            assert refused(await mcp.call_tool("ack", {"consumer_id": name, "cursor": "soon"})) == "invalid_cursor"

    asyncio.run(run())


def test_a_compare_and_set_conflict_is_a_tool_error(main: Server) -> None:
    async def run() -> None:
        path = f"notes/mcp-{tag()}"
        async with client(main) as mcp:
            first = ok(await mcp.call_tool("tree_put", {"path": path, "entity": {"type": "note", "data": {"v": 1}}}))["hash"]
            second = ok(await mcp.call_tool("tree_put", {"path": path, "entity": {"type": "note", "data": {"v": 2}}, "if_match": first}))
            assert second["previous_hash"] == first
            stale = await mcp.call_tool("tree_put", {"path": path, "entity": {"type": "note", "data": {"v": 3}}, "if_match": first})
            assert refused(stale) == "hash_mismatch"
            # What the HTTP answer adds comes along: the hash to retry with.
            assert structured(stale)["current_hash"] == second["hash"]
            got = ok(await mcp.call_tool("tree_get", {"path": path}))
            assert got["hash"] == second["hash"] and got["entity"]["data"] == {"v": 2}
            listing = ok(await mcp.call_tool("tree_list", {"path": "notes/"}))
            assert any(c["path"] == path for c in listing["children"])
            assert refused(await mcp.call_tool("tree_get", {"path": f"{path}-absent"})) == "entity_not_found"

    asyncio.run(run())


def test_tools_follow_the_token_grants(auth: Server) -> None:
    async def run() -> None:
        head = auth.head()
        nothing = mint(600, sub="mcp-no-grants", publish=[], subscribe=[])
        async with client(auth, nothing) as mcp:
            assert {t.name for t in (await mcp.list_tools()).tools} == {"event_types"}
            # Called anyway: refused, and nothing is stored.
            assert refused(await mcp.call_tool("publish", {"events": [{"event_type": "pyclient.step"}]})) == "forbidden_tool"
            assert refused(await mcp.call_tool("tree_put", {"path": "notes/x", "entity": {"type": "note", "data": {}}})) == "forbidden_tool"
        assert auth.head() == head
        readers = mint(600, sub="mcp-reader", publish=[], subscribe=["pyclient.*"])
        async with client(auth, readers) as mcp:
            assert {t.name for t in (await mcp.list_tools()).tools} == {"event_types", "poll", "ack"}
        narrow = mint(600, sub="mcp-narrow", publish=["pyclient.*"], subscribe=["**"])
        async with client(auth, narrow) as mcp:
            assert "publish" in {t.name for t in (await mcp.list_tools()).tools}
            # A type outside the grant: the same refusal as over HTTP.
            assert refused(await mcp.call_tool("publish", {"events": [{"event_type": "comment.posted"}]})) == "forbidden_event_type"
        assert auth.head() == head
        # No token: refused before the protocol starts, as every route.
        answer = httpx.post(
            auth.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers={"accept": "application/json, text/event-stream"}, timeout=10
        )
        assert answer.status_code == 401 and answer.json()["error"] == "unauthorized"

    asyncio.run(run())


def test_bad_calls_store_nothing_and_the_server_keeps_serving(main: Server) -> None:
    async def run() -> None:
        head = main.head()
        async with client(main) as mcp:
            assert refused(await mcp.call_tool("publish", {"events": [{"event_type": "Not A Name"}]})) == "invalid_event_name"
            assert refused(await mcp.call_tool("publish", {"events": [], "extra": 1})) == "invalid_arguments"
            assert refused(await mcp.call_tool("poll", {"filter": {"payload": {"no_such_operator": [1]}}})) == "invalid_filter"
            assert refused(await mcp.call_tool("tree_put", {"path": "../up", "entity": {"type": "note", "data": {}}})) == "invalid_path"
            with pytest.raises(MCPError):
                await mcp.call_tool("no_such_tool", {})
        assert main.head() == head
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        for body in (b"{", b"[]", b'{"jsonrpc": "2.0", "id": 1, "method": 7}'):
            answer = httpx.post(main.url + "/mcp", content=body, headers=headers, timeout=10)
            assert answer.status_code == 400, (body, answer.status_code, answer.text)
            assert answer.json()["error"] in ("invalid_mcp_message", "malformed_json") or "jsonrpc" in answer.json(), answer.text
        too_large = httpx.post(main.url + "/mcp", content=b"x" * (2 << 20), headers=headers, timeout=10)
        assert too_large.status_code == 413 and too_large.json()["error"] == "body_too_large"
        # What the transport refuses has tidings' JSON error body and code.
        plain = httpx.post(main.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=10)
        assert plain.status_code == 406 and plain.json()["error"] == "not_acceptable"
        text = httpx.post(main.url + "/mcp", content=b"hello", headers={**headers, "content-type": "text/plain"}, timeout=10)
        assert text.status_code == 415 and text.json()["error"] == "unsupported_media_type"
        assert main.head() == head
        async with client(main) as mcp:
            assert "publish" in {t.name for t in (await mcp.list_tools()).tools}

    asyncio.run(run())
