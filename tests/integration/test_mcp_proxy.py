"""mcp.proxy in front of a real tiny-mcp (the official `mcp` SDK's server), seen through the official `mcp`
client in both its connection modes (auto: the stateless protocol, JSON answers; legacy: the initialize
handshake, an Mcp-Session-Id, SSE answers): for each fault, exactly what the client raises or gets, what tiny-mcp
served (its own request log), the proxy's counters; the proxy reverted from its record in a fresh process, and
nothing of it left."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.client
import pytest
from mcp.shared.exceptions import MCPError

from chaoskit.injectors.mcp_proxy.fault import McpProxy, stats_of
from chaoskit.targets.process import all_pids, cmdline
from tests.conftest import free_port, wait_for

PARIS = {"city": "Paris", "days": 3}
TOOLS = ["get_weather", "get_time", "slow_lookup"]


@pytest.fixture(scope="module")
def tiny_mcp(tmp_path_factory) -> Iterator[tuple[int, Path]]:
    """(tiny-mcp's port, its request log: a line per tool call it served)."""
    log = tmp_path_factory.mktemp("mcp") / "tiny-mcp.jsonl"
    log.touch()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "chaoskit.reference.tiny_mcp", "--port", str(port),
                               "--log", str(log)])
    try:
        wait_for(lambda: _answers(port), timeout=20, every=0.1)
        yield port, log
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            pytest.fail("tiny-mcp did not stop on SIGTERM")


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def proxy(tiny_mcp) -> Iterator[Any]:
    """proxy(faults) -> the proxy's port; each reverted at the end from its record in a fresh process."""
    records = []

    def start(faults: list[dict]) -> int:
        port = free_port()
        inj = McpProxy(McpProxy.Spec(type="mcp.proxy", listen=f"127.0.0.1:{port}",
                                     upstream=f"http://127.0.0.1:{tiny_mcp[0]}/mcp", faults=faults, seed=4))
        inj.ctx.lifetime_s = 120
        inj.preflight()
        records.append(inj.apply(inj.prepare()))
        return port

    yield start
    code = ("import json, sys; from chaoskit.injectors import injector_class; cls = injector_class('mcp.proxy'); "
            "cls.revert(cls.read_record(json.loads(sys.argv[1])))")
    for rec in records:
        subprocess.run([sys.executable, "-c", code, json.dumps(rec.to_json())], check=True, timeout=30)
        McpProxy.revert(rec)  # again: idempotent
        assert not McpProxy.observe(rec)
        assert not [p for p in all_pids() if rec.token in cmdline(p)]


def served(log: Path) -> list[str]:
    return [json.loads(line)["tool"] for line in log.read_text().splitlines()]


def applied(port: int) -> dict[str, int]:
    return {name: f.applied for name, f in stats_of(f"127.0.0.1:{port}").faults.items()}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def call(port: int, mode: str, *calls: tuple[str, dict], timeout: float = 5) -> list[Any]:
    """Each call's text, or the MCPError it raised, on one session."""
    out: list[Any] = []
    async with mcp.client.Client(f"http://127.0.0.1:{port}/mcp", mode=mode, read_timeout_seconds=timeout) as c:
        for name, args in calls:
            try:
                out.append((await c.call_tool(name, args)).content[0].text)
            except MCPError as e:
                out.append(e)
    return out


def error(e: Any) -> tuple[int, str]:
    assert isinstance(e, MCPError), e
    return e.code, e.message


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_error_for_a_chosen_tool_and_the_others_untouched(tiny_mcp, proxy, mode):
    port = proxy([{"type": "error", "name": "bad-time", "code": -32602, "message": "zone unknown",
                   "match": {"tool": ["get_time"]}}])
    before = len(served(tiny_mcp[1]))
    weather, clock, again = run(call(port, mode, ("get_weather", PARIS), ("get_time", {"zone": "UTC"}),
                                     ("get_weather", PARIS)))
    assert weather == again == "Paris: 3 day(s), 22 C, sunny"
    assert error(clock) == (-32602, "zone unknown")
    assert served(tiny_mcp[1])[before:] == ["get_weather", "get_weather"]  # the failed call never reached it
    s = stats_of(f"127.0.0.1:{port}")
    assert (s.faults["bad-time"].matched, s.faults["bad-time"].applied) == (1, 1)


def test_latency_then_a_timeout_the_server_never_sees(tiny_mcp, proxy):
    port = proxy([{"type": "delay", "name": "slow", "delay": "300ms", "match": {"tool": ["get_weather"]}},
                  {"type": "timeout", "name": "hang", "match": {"tool": ["get_time"]}}])
    before = len(served(tiny_mcp[1]))
    t0 = time.monotonic()
    [weather] = run(call(port, "auto", ("get_weather", PARIS)))
    took = time.monotonic() - t0
    assert weather.startswith("Paris: 3 day(s)") and took >= 0.3
    t0 = time.monotonic()
    [clock] = run(call(port, "auto", ("get_time", {"zone": "UTC"}), timeout=0.5))
    assert error(clock)[0] == -32001 and 0.5 <= time.monotonic() - t0 < 3  # REQUEST_TIMEOUT: the client's own
    assert served(tiny_mcp[1])[before:] == ["get_weather"]
    assert applied(port) == {"slow": 1, "hang": 1}


def test_an_sse_answer_cut_mid_stream(tiny_mcp, proxy):
    port = proxy([{"type": "sse_cut", "name": "cut", "match": {"tool": ["get_weather"]}}])
    before = len(served(tiny_mcp[1]))
    [legacy] = run(call(port, "legacy", ("get_weather", PARIS)))
    assert error(legacy) == (-32000, "SSE stream ended without a response")  # CONNECTION_CLOSED
    [auto] = run(call(port, "auto", ("get_weather", PARIS)))  # a JSON answer: passes unchanged
    assert auto.startswith("Paris: 3 day(s)")
    assert served(tiny_mcp[1])[before:] == ["get_weather", "get_weather"]  # the server answered both
    s = stats_of(f"127.0.0.1:{port}").faults["cut"]
    assert (s.selected, s.applied) == (2, 1)


def test_a_session_forgotten_under_the_client(tiny_mcp, proxy):
    port = proxy([{"type": "session_lost", "name": "restart", "match": {"tool": ["get_time"]}}])
    before = len(served(tiny_mcp[1]))

    async def session() -> list[Any]:
        out: list[Any] = []
        async with mcp.client.Client(f"http://127.0.0.1:{port}/mcp", mode="legacy", read_timeout_seconds=5) as c:
            out.append((await c.call_tool("get_weather", PARIS)).content[0].text)
            for name, args in (("get_time", {"zone": "UTC"}), ("get_weather", PARIS)):
                try:
                    await c.call_tool(name, args)
                except MCPError as e:
                    out.append(e)
            try:
                await c.list_tools()
            except MCPError as e:
                out.append(e)
        return out

    weather, lost, after, listing = run(session())
    assert weather.startswith("Paris")
    # the mcp SDK's server's own 404 answer: the client surfaces its JSON-RPC error
    assert error(lost) == error(after) == error(listing) == (-32600, "Session not found")
    [fresh] = run(call(port, "legacy", ("get_weather", PARIS)))  # a new session (initialize) works
    assert fresh.startswith("Paris")
    assert served(tiny_mcp[1])[before:] == ["get_weather", "get_weather"]
    s = stats_of(f"127.0.0.1:{port}")
    assert (s.sessions_forgotten, s.faults["restart"].applied) == (1, 1)
    assert s.session_404s >= 3  # get_time, get_weather, tools/list (and the session's GET stream, its DELETE)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_tools_list_changing_under_the_client(tiny_mcp, proxy, mode):
    port = proxy([{"type": "tools_change", "name": "shrink", "remove": ["slow_*", "get_time"], "share": 0.5}])

    async def lists() -> list[list[str]]:
        async with mcp.client.Client(f"http://127.0.0.1:{port}/mcp", mode=mode, read_timeout_seconds=5) as c:
            return [[t.name for t in (await c.list_tools()).tools] for _ in range(8)]

    seen = run(lists())
    s = stats_of(f"127.0.0.1:{port}").faults["shrink"]
    assert sorted(map(tuple, seen)) == sorted([("get_weather",)] * s.applied + [tuple(TOOLS)] * (8 - s.applied))
    assert 0 < s.applied == s.selected < 8 and s.matched == 8
