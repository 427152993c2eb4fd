"""mcp.proxy in front of a real tiny-mcp (the official `mcp` SDK's server), seen through the official `mcp`
client in both its connection modes (auto: the stateless protocol, JSON answers; legacy: the initialize
handshake, an Mcp-Session-Id, SSE answers): for each fault, exactly what the client raises or gets, what tiny-mcp
served (its own request log), the proxy's counters; and intercepting the server's port in its network namespace,
reverted from its record in a fresh process: no nft table, no proxy process left."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp.client
import pytest
from mcp.shared.exceptions import MCPError

from chaoskit.injectors.mcp_proxy.fault import McpProxy, stats_of
from chaoskit.probes.agent_tools import clock as tiny_clock
from chaoskit.targets.process import all_pids, cmdline
from tests.conftest import chaoskit, free_port, wait_for
from tests.helpers.agent_stack import answers

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
        wait_for(lambda: answers(port), timeout=20, every=0.1)
        yield port, log
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            pytest.fail("tiny-mcp did not stop on SIGTERM")


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
    for rec in records:  # (from its record in a fresh process: the intercept test below)
        McpProxy.revert(rec)
        McpProxy.revert(rec)  # again: idempotent
        assert not McpProxy.observe(rec)
        assert not [p for p in all_pids() if rec.token in cmdline(p)]


def revert_in_a_fresh_process(record: Any) -> None:
    """As the watchdog or `chaoskit rollback` does: a new interpreter given only the record's JSON."""
    code = ("import json, sys; from chaoskit.injectors import injector_class; cls = injector_class('mcp.proxy'); "
            "cls.revert(cls.read_record(json.loads(sys.argv[1])))")
    subprocess.run([sys.executable, "-c", code, json.dumps(record.to_json())], check=True, timeout=30)


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


CLIENT = """
import asyncio, json, sys
import mcp.client
from mcp.shared.exceptions import MCPError

async def main():
    out = []
    async with mcp.client.Client(sys.argv[1], read_timeout_seconds=5) as c:
        for name, args in (("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "UTC"})):
            try:
                out.append((await c.call_tool(name, args)).content[0].text)
            except MCPError as e:
                out.append([e.code, e.message])
    print(json.dumps(out))

asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nftables need root")
def test_intercepting_the_mcp_servers_port_then_nothing_left(tmp_path):
    """tiny-mcp in one namespace, the official client in another, unchanged (it talks to the server's address):
    the proxy intercepts the server's port, an nft table in the server's namespace redirecting to it; after the
    revert neither the table nor the proxy is left, and the client reaches the server directly again."""
    from tests.helpers.netpair import SERVER_IP, Pair

    net = Pair()
    log = tmp_path / "tiny-mcp.jsonl"
    server = subprocess.Popen(["ip", "netns", "exec", net.srv, sys.executable, "-m", "chaoskit.reference.tiny_mcp",
                               "--host", SERVER_IP, "--port", "8004", "--log", str(log)])
    rec = None
    try:
        url = f"http://{SERVER_IP}:8004/mcp"

        def client() -> list:
            p = subprocess.run(["ip", "netns", "exec", net.cli, sys.executable, "-c", CLIENT, url],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr[-2000:]
            return json.loads(p.stdout)

        wait_for(lambda: subprocess.run(["ip", "netns", "exec", net.cli, "curl", "-fs", f"http://{SERVER_IP}:8004/"
                                         "health"], capture_output=True).returncode == 0, timeout=20, every=0.2)
        inj = McpProxy(McpProxy.Spec(type="mcp.proxy", intercept={"port": 8004, "target": {"netns": net.srv}},
                                     faults=[{"type": "error", "name": "bad-time", "message": "no clock",
                                              "match": {"tool": ["get_time"]}}]))
        inj.ctx.lifetime_s = 120
        inj.preflight()
        rec = inj.apply(inj.prepare())
        assert [t["table"]["name"] for t in net.ruleset(net.srv) if "table" in t] == [rec.table]
        weather, clock = client()
        assert weather.startswith("Paris: 3 day(s)") and clock == [-32603, "no clock"]
        details = McpProxy.observe_details(rec)
        assert details["in_effect"] and details["faults"]["bad-time"]["applied"] == 1 and details["requests"] >= 3
        revert_in_a_fresh_process(rec)
        assert not McpProxy.observe(rec) and net.ruleset(net.srv) == []
        assert not [p for p in all_pids() if rec.token in cmdline(p)]
        weather, clock = client()  # straight to the server again
        assert weather.startswith("Paris") and clock == tiny_clock("UTC")
        assert [json.loads(line)["tool"] for line in log.read_text().splitlines()] == \
            ["get_weather", "get_weather", "get_time"]
    finally:
        try:
            if rec is not None:
                McpProxy.revert(rec)
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            net.close()


def test_a_run_killed_with_sigkill_leaves_no_proxy(tiny_mcp, tmp_path):
    """`chaoskit run` SIGKILLed while its mcp.proxy is in effect: its watchdog reverts it (no process with its
    token, the port closed) within seconds, long before the fault's duration."""
    port = free_port()
    f = tmp_path / "e.yaml"
    f.write_text(f"""apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: killed-mcp-proxy}}
steadyState:
  probes: [{{name: t, type: command, argv: ["true"], phases: [before]}}]
method:
  - inject:
      type: mcp.proxy
      listen: "127.0.0.1:{port}"
      upstream: "http://127.0.0.1:{tiny_mcp[0]}/mcp"
      faults: [{{type: timeout}}]
    duration: 60s
""")
    run = chaoskit("run", str(f), "--plain", "--out", str(tmp_path / "o"), state=tmp_path / "state")
    try:
        wait_for(lambda: stats_of(f"127.0.0.1:{port}", timeout=0.5) is not None, timeout=60, every=0.1)
        [helper] = [p for p in all_pids() if "chaoskit-mcp-proxy-" in (line := " ".join(cmdline(p)))
                    and f"127.0.0.1:{port}" in line]
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        took = wait_for(lambda: helper not in all_pids() and stats_of(f"127.0.0.1:{port}", timeout=0.5) is None,
                        timeout=20, every=0.1)
        assert took < 10
    finally:
        run.kill()
        run.communicate()
