"""What a real agent framework, the OpenAI Agents SDK (PyPI openai-agents), makes of each of llm.proxy's
agent-traffic faults in front of a real tiny-openai replica: an agent with one function tool (or a structured
output type) run whole and streamed; what it returns or raises, and the tool calls it made, counted by the tool
itself. Then mcp.proxy's faults in front of tiny-mcp, the agent's tools on it through the SDK's own MCP client:
what the run returns, and the calls tiny-mcp's log shows. The docs' tables (docs/details/injectors.md, "What a
real agent framework does") are this test's tables."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import agents
import openai
import pydantic
import pytest
from agents.mcp import MCPServerStreamableHttp

from chaoskit.injectors.mcp_proxy.fault import McpProxy, stats_of
from chaoskit.reference.tiny_openai import SERVED_NAME
from chaoskit.targets.process import all_pids, cmdline
from tests.conftest import free_port
from tests.helpers.agent_stack import AgentStack, agent_stack

PROMPT = "use get_weather for city=Paris days=3"
FAULTS = [{"name": name, **f, "match": {"headers": {"X-Fault": name}}} for name, f in {
    **{f"tool-{m}": {"type": "tool_args", "mode": m} for m in (
        "cut", "invalid_json", "bad_escape", "wrong_tool_name", "duplicate_call", "finish_stop")},
    "error": {"type": "error_event", "after_tokens": 2, "message": "pop from empty list"},
    "error-no-done": {"type": "error_event", "after_tokens": 0, "done": False, "code": 503},
    "drop": {"type": "schema_break", "mode": "drop_required"},
    "mistype": {"type": "schema_break", "mode": "wrong_type"}}.items()]
SDK_ERROR = "An error occurred while running the tool. Please try again."  # what the SDK tells the model


class Forecast(pydantic.BaseModel):
    city: str
    days: int


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[AgentStack]:
    agents.set_tracing_disabled(True)  # no export to a tracing service (nothing outside this host is reachable)
    with agent_stack(tmp_path_factory.mktemp("agents-sdk"), FAULTS, seed=7) as st:
        yield st


def run(st: AgentStack, fault: str | None, streamed: bool, output_type: type | None = None) -> tuple[Any, ...]:
    """(outcome, the tool's own calls, the tool outputs the SDK gave the model, the final output): outcome is
    "ok" or the exception's type and message."""
    calls: list[tuple[str, int]] = []

    @agents.function_tool
    def get_weather(city: str, days: int) -> str:
        """The weather forecast for a city."""
        calls.append((city, days))
        return f"sunny in {city} for {days} days"

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{st.proxy}/v1", api_key="none", max_retries=0,
                                timeout=10)
    agent = agents.Agent(name="weather", instructions="", tools=[] if output_type else [get_weather],
                         output_type=output_type,
                         model=agents.OpenAIChatCompletionsModel(model=SERVED_NAME, openai_client=client),
                         model_settings=agents.ModelSettings(extra_headers={"X-Fault": fault} if fault else None,
                                                             max_tokens=16))
    prompt = "city=Oslo forecast" if output_type else PROMPT

    async def go() -> Any:
        if not streamed:
            return await agents.Runner.run(agent, prompt, max_turns=4)
        result = agents.Runner.run_streamed(agent, prompt, max_turns=4)
        async for _ in result.stream_events():
            pass
        return result

    try:
        result = asyncio.run(go())
    except Exception as e:  # what the framework raises is the finding
        return f"{type(e).__name__}: {e}", calls, [], None
    outputs = [i.output for i in result.new_items if isinstance(i, agents.ToolCallOutputItem)]
    return "ok", calls, outputs, result.final_output


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fault, outcome, calls, outputs", [
    (None, "ok", [("Paris", 3)], ["sunny in Paris for 3 days"]),
    # broken arguments: the tool is not called, the model is told a generic error, and the run ends "ok"
    ("tool-cut", "ok", [], [SDK_ERROR]),
    ("tool-invalid_json", "ok", [], [SDK_ERROR]),
    ("tool-bad_escape", "ok", [], [SDK_ERROR]),
    ("tool-wrong_tool_name", "ModelBehaviorError: Tool get_weather_unknown not found in agent weather", [], []),
    # the same call twice: both run (a tool with side effects does them twice)
    ("tool-duplicate_call", "ok", [("Paris", 3)] * 2, ["sunny in Paris for 3 days"] * 2),
    ("tool-finish_stop", "ok", [("Paris", 3)], ["sunny in Paris for 3 days"]),  # finish_reason not looked at
])
def test_tool_call_faults_as_the_agents_sdk_runs_them(stack, fault, outcome, calls, outputs, streamed):
    assert run(stack, fault, streamed)[:3] == (outcome, calls, outputs)


@pytest.mark.parametrize("fault, streamed, outcome", [
    ("error", False, "ok"),  # error_event changes streams only: a whole answer passes unchanged
    ("error", True, "APIError: pop from empty list"),
    ("error-no-done", True, "APIError: llm.proxy: injected error"),
])
def test_an_error_event_as_the_agents_sdk_runs_it(stack, fault, streamed, outcome):
    got, calls, _, _ = run(stack, fault, streamed)
    assert (got, calls) == (outcome, [("Paris", 3)] if outcome == "ok" else [])


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_schema_break_as_the_agents_sdk_parses_it(stack, streamed):
    outcome, _, _, parsed = run(stack, None, streamed, Forecast)
    assert outcome == "ok" and isinstance(parsed, Forecast) and parsed.city == "Oslo"
    for fault in ("drop", "mistype"):  # parses as JSON, not as the output type
        assert run(stack, fault, streamed, Forecast)[0] == "ModelBehaviorError: Invalid JSON when parsing model output"


@pytest.fixture(scope="module")
def mcp_stack(tmp_path_factory) -> Iterator[AgentStack]:
    agents.set_tracing_disabled(True)
    with agent_stack(tmp_path_factory.mktemp("agents-sdk-mcp"), [], seed=7, mcp=True) as st:
        yield st


def mcp_run(st: AgentStack, faults: list[dict], prompt: str) -> tuple[str, list[Any], list[str], dict[str, int]]:
    """An agent whose tools are tiny-mcp's, reached through an mcp.proxy with `faults` (the SDK's MCP client: its
    default mode, 1 s per call, no retry): (outcome, the tool outputs the SDK gave the model, the tools tiny-mcp
    logged for this run, each fault's applied count); the proxy reverted and checked gone."""
    port = free_port()
    assert st.mcp is not None
    inj = McpProxy(McpProxy.Spec(type="mcp.proxy", listen=f"127.0.0.1:{port}", upstream=st.mcp, faults=faults))
    inj.ctx.lifetime_s = 60
    inj.preflight()
    rec = inj.apply(inj.prepare())
    log = st.logs / "mcp.jsonl"
    before = len(log.read_text().splitlines()) if log.exists() else 0
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{st.up}/v1", api_key="none", max_retries=0, timeout=10)

    async def go() -> Any:
        async with MCPServerStreamableHttp(params={"url": f"http://127.0.0.1:{port}/mcp", "timeout": 2},
                                           client_session_timeout_seconds=1, max_retry_attempts=0) as server:
            agent = agents.Agent(name="weather", instructions="", mcp_servers=[server],
                                 model=agents.OpenAIChatCompletionsModel(model=SERVED_NAME, openai_client=client),
                                 model_settings=agents.ModelSettings(max_tokens=16))
            return await agents.Runner.run(agent, prompt, max_turns=4)

    try:
        try:
            result = asyncio.run(go())
            outcome, outputs = "ok", [o["text"] if isinstance(o, dict) else o for o in (
                i.output for i in result.new_items if isinstance(i, agents.ToolCallOutputItem))]
        except Exception as e:  # what the framework raises is the finding
            outcome, outputs = f"{type(e).__name__}: {e}", []
        stats = stats_of(f"127.0.0.1:{port}")
    finally:
        McpProxy.revert(rec)
    assert not McpProxy.observe(rec) and not [p for p in all_pids() if rec.token in cmdline(p)]
    served = [json.loads(x)["tool"] for x in log.read_text().splitlines()[before:]]
    return outcome, outputs, served, {n: f.applied for n, f in stats.faults.items()} if stats else {}


WEATHER = "use get_weather for city=Paris days=3"


@pytest.mark.parametrize("faults, prompt, outputs, served", [
    ([], WEATHER, ["Paris: 3 day(s), 22 C, sunny"], ["get_weather"]),
    # a JSON-RPC error, and a call never answered (the client's 1 s): the model is told a generic error, the
    # run ends with an answer
    ([{"type": "error", "code": -32602, "message": "city unknown", "match": {"tool": ["get_weather"]}}], WEATHER,
     [SDK_ERROR], []),
    ([{"type": "timeout", "match": {"tool": ["get_time"]}}], "use get_time for zone=UTC", [SDK_ERROR], []),
    # the tool gone from tools/list: the model is not offered it and answers without it
    ([{"type": "tools_change", "remove": ["get_weather"]}], WEATHER, [], []),
], ids=["none", "error", "timeout", "tools_change"])
def test_mcp_faults_as_the_agents_sdk_runs_them(mcp_stack, faults, prompt, outputs, served):
    outcome, got, logged, applied = mcp_run(mcp_stack, faults, prompt)
    assert (outcome, got, logged) == ("ok", outputs, served)
    assert list(applied.values()) == [1] * len(faults)  # the proxy's own count: each fault acted once
