"""`chaoskit ref up --engine tiny-openai --mcp`: the reference with its MCP tool server (tiny-mcp, streamable
HTTP, the official `mcp` SDK), driven through one agent turn by the official SDKs - the model's tool call
(tiny-openai, given the tools tiny-mcp lists) carried out on tiny-mcp, its result back to the model, a text
answer - each tool call counted by tiny-mcp's own log; `ref status` checks it, `ref down` leaves no process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mcp.client as mcp_client
import openai

from chaoskit.reference.scenario import free_port_block
from chaoskit.reference.tiny_openai import SERVED_NAME
from chaoskit.reference.tiny_tools import tokens
from chaoskit.targets.facts import MCP_FACTS
from chaoskit.targets.process import group_members


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaoskit", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NO_COLOR": "1"})


async def mcp_turn(url: str, calls: list[tuple[str, dict]]) -> tuple[list, list[str]]:
    """tiny-mcp's tools (as OpenAI tools) and the text of each call's result."""
    async with mcp_client.Client(url) as c:
        listed = (await c.list_tools()).tools
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                   "parameters": t.input_schema}} for t in listed]
        texts = []
        for name, args in calls:
            result = await c.call_tool(name, args)
            assert not result.is_error, result
            texts.append(result.content[0].text)
        return tools, texts


def test_an_agent_turn_through_tiny_openai_and_tiny_mcp(tmp_path: Path) -> None:
    port = free_port_block(2)  # the gateway, a replica's 3 ports and tiny-mcp's: 5 of the 7 checked free
    state = tmp_path / "ref"
    up = cli("ref", "up", "--engine", "tiny-openai", "--replicas", "1", "--mcp", "--port", str(port),
             "--dir", str(state), "--json")
    assert up.returncode == 0, up.stderr[-2000:]
    facts = json.loads(up.stdout)
    mcp = facts["mcp"]
    pids = [facts["gateway_pid"], *facts["replica_pids"], mcp["pid"]]
    try:
        assert mcp["url"] == f"http://127.0.0.1:{port + 4}/mcp" and facts["settings"]["mcp"] is True
        assert sorted(mcp) == sorted(MCP_FACTS)  # what an experiment may name before the deployment runs
        tools, _ = asyncio.run(mcp_turn(mcp["url"], []))
        assert [t["function"]["name"] for t in tools] == ["get_weather", "get_time", "slow_lookup"]
        model = openai.OpenAI(base_url=f"{facts['url']}/v1", api_key="none", max_retries=0, timeout=10)
        ask = [{"role": "user", "content": "use get_weather for city=Paris days=3"}]
        first = model.chat.completions.create(model=SERVED_NAME, messages=ask, tools=tools)
        call = first.choices[0].message.tool_calls[0]
        args = json.loads(call.function.arguments)
        assert (call.function.name, args) == ("get_weather", {"city": "Paris", "days": 3})

        t0 = time.monotonic()
        _, texts = asyncio.run(mcp_turn(mcp["url"], [("get_weather", args), ("get_weather", args),
                                                     ("slow_lookup", {"key": "k", "seconds": 0.3})]))
        assert time.monotonic() - t0 >= 0.3
        assert texts[0] == texts[1] and texts[0].startswith("Paris: 3 day(s), ") and texts[2].startswith("k: ")
        turn = [*ask, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": texts[0]}]
        answer = model.chat.completions.create(model=SERVED_NAME, messages=turn, tools=tools, max_tokens=4)
        assert answer.choices[0].message.content == "".join(tokens("\n".join([ask[0]["content"], "", texts[0]]), 4))

        logged = [json.loads(line) for line in Path(mcp["request_log"]).read_text().splitlines()]
        assert [(x["tool"], x["outcome"]) for x in logged] == \
            [("get_weather", "complete")] * 2 + [("slow_lookup", "complete")]
        status = cli("ref", "status", "--dir", str(state), "--json")
        rows = {r["name"]: r for r in json.loads(status.stdout)["processes"]}
        assert rows["tiny-mcp"]["ready"] and rows["tiny-mcp"]["check"] == "GET /health: answered"
    finally:
        down = cli("ref", "down", "--dir", str(state))
    assert down.returncode == 0, down.stderr
    for pid in pids:
        assert not group_members(pid), f"process group {pid} still has live processes"
