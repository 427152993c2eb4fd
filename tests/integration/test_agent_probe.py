"""agent probe against a real tiny-openai replica and tiny-mcp: it holds when nothing is wrong; behind an llm.proxy
that breaks tool-call arguments or sends an error event inside the stream it deviates, and the tasks it counts as
done are exactly the tool calls tiny-mcp's own request log shows (a task whose tool call was refused never calls
the tool); repair sends the broken turns again. The model requests it sent match tiny-openai's request log. The
correctness probe's `schema` catches the structured answers llm.proxy's schema_break breaks, exactly those."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaoskit.injectors.llm_proxy.fault import stats_of
from chaoskit.probes.agent import AgentProbe, AgentProbeSpec
from chaoskit.probes.agent_tools import weather
from chaoskit.probes.correctness import CorrectnessProbe, CorrectnessProbeSpec
from chaoskit.reference.tiny_tools import tokens
from tests.conftest import free_port
from tests.helpers.agent_stack import agent_stack

PROMPT = "use get_weather for city=Paris days=3"
ANSWER = "".join(tokens("\n".join([PROMPT, "", weather("Paris", 3)]), 16))  # what tiny-openai answers the result
FAULTS = [{"name": "args", "type": "tool_args", "mode": "invalid_json", "share": 0.5,
           "match": {"headers": {"X-Fault": "args"}}},
          {"name": "error", "type": "error_event", "after_tokens": 2, "message": "pop from empty list", "share": 0.5,
           "match": {"headers": {"X-Fault": "error", "x-request-id": "*-t1-*"}}},  # the tool-call turn only
          {"name": "schema", "type": "schema_break", "mode": "wrong_type", "share": 0.5,
           "match": {"headers": {"X-Fault": "schema"}}}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """tiny-openai, tiny-mcp (each logging its requests) and an llm.proxy in front of tiny-openai."""
    with agent_stack(tmp_path_factory.mktemp("agent-probe"), FAULTS, seed=5, mcp=True) as st:
        yield {"up": st.up, "proxy": st.proxy, "mcp": st.mcp, "logs": st.logs}


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def measure(stack: dict, port: int, fault: str | None = None, **kw: Any) -> tuple[dict, list[dict], list[dict]]:
    """One sample of 20 tasks; what tiny-mcp and tiny-openai logged while it ran."""
    mcp0, rep0 = len(lines(stack["logs"] / "mcp.jsonl")), len(lines(stack["logs"] / "replica.jsonl"))
    spec = AgentProbeSpec.model_validate({
        "type": "agent", "name": "agent", "url": f"http://127.0.0.1:{port}", "model": "tiny-openai",
        "mcp_url": stack["mcp"], "tasks": 20, "concurrency": 4, "headers": {"X-Fault": fault} if fault else {},
        "scripts": [{"prompt": PROMPT, "tool": "get_weather", "arguments": {"city": "Paris", "days": 3},
                     "answer": ANSWER}], **kw})
    probe = AgentProbe(spec)
    probe.preflight()

    async def go() -> dict:
        try:
            return await probe.measure()
        finally:
            await probe.close()

    out = asyncio.run(go())
    return (out, lines(stack["logs"] / "mcp.jsonl")[mcp0:], lines(stack["logs"] / "replica.jsonl")[rep0:])


def test_the_agent_probe_holds_against_tiny_openai_and_tiny_mcp(stack):
    out, calls, requests = measure(stack, stack["up"])
    assert {k: out[k] for k in ("tasks", "succeeded", "failed", "success_rate", "turns", "tool_calls",
                                "tool_errors", "retries", "tokens")} == \
        {"tasks": 20, "succeeded": 20, "failed": 0, "success_rate": 1.0, "turns": 2.0, "tool_calls": 20,
         "tool_errors": 0, "retries": 0, "tokens": 20 * (5 + 16)}  # 5 argument fragments, 16 answer tokens
    assert [(c["tool"], c["outcome"]) for c in calls] == [("get_weather", "complete")] * 20
    assert sorted(r["rid"] for r in requests) == sorted(f"agent-1-{i}-t{t}-a1" for i in range(20) for t in (1, 2))
    assert {(r["answer"], r["outcome"]) for r in requests} == {("tool_call", "complete"), ("text", "complete")}


@pytest.mark.parametrize("fault, kind", [("args", "bad_arguments"), ("error", "model_error")])
def test_broken_tool_calls_and_error_events_fail_tasks_as_tiny_mcp_counts(stack, fault, kind):
    before = stats_of(f"127.0.0.1:{stack['proxy']}").faults[fault].applied
    out, calls, requests = measure(stack, stack["proxy"], fault)
    applied = stats_of(f"127.0.0.1:{stack['proxy']}").faults[fault].applied - before
    print(f"\n{fault}: {out['succeeded']} of 20 tasks done, tiny-mcp served {len(calls)} calls, the proxy "
          f"broke {applied} turns; {out.get('first_failure')}")
    assert 0 < out["succeeded"] < 20
    assert out["succeeded"] == len(calls) == 20 - applied  # the independent count: tiny-mcp's own log
    assert out["failed"] == out[f"failures.{kind}"] == applied
    assert len(requests) == round(out["turns"] * 20)  # tiny-openai served every model turn the probe sent

    fixed, calls, requests = measure(stack, stack["proxy"], fault, repair=True, retries=3)
    applied = stats_of(f"127.0.0.1:{stack['proxy']}").faults[fault].applied - before - applied
    print(f"{fault} with repair: {fixed['succeeded']} of 20 done after {fixed['retries']} retries")
    assert fixed["succeeded"] == len(calls) and fixed["succeeded"] > out["succeeded"]
    assert applied == fixed["retries"] + fixed["failed"]  # each broken turn sent again, or the 4th fails its task
    assert len(requests) == round(fixed["turns"] * 20) == 2 * fixed["succeeded"] + applied  # a failed task: 4 tries


def test_the_correctness_probe_with_a_schema_counts_the_answers_schema_break_broke(stack):
    schema = {"type": "object", "required": ["city", "days"],
              "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}

    def sample(port: int, fault: str | None) -> dict:
        probe = CorrectnessProbe(CorrectnessProbeSpec.model_validate({
            "type": "correctness", "name": "answers", "url": f"http://127.0.0.1:{port}", "api": "openai-chat",
            "model": "tiny-openai", "schema": schema, "stream": "both", "requests": 20, "concurrency": 4,
            "headers": {"X-Fault": fault} if fault else {},
            "prompts": [{"prompt": "a forecast for city=Paris days=3", "answer": '{"city": "Paris", "days": 3}'}]}))

        async def go() -> dict:
            try:
                return await probe.measure()
            finally:
                await probe.close()

        return asyncio.run(go())

    assert sample(stack["up"], None)["failed"] == 0  # tiny-openai's structured answers fit the schema
    before = stats_of(f"127.0.0.1:{stack['proxy']}").faults["schema"].applied
    out = sample(stack["proxy"], "schema")
    applied = stats_of(f"127.0.0.1:{stack['proxy']}").faults["schema"].applied - before
    print(f"\nschema_break: {out['failures.schema']} of 20 answers broke the schema; {out.get('first_failure')}")
    assert 0 < out["failures.schema"] == out["failed"] == applied < 20


def test_no_mcp_server_fails_every_task_as_a_tool_error():
    port = free_port()  # nothing listens there
    probe = AgentProbe(AgentProbeSpec.model_validate({"type": "agent", "name": "agent", "url": "http://127.0.0.1:1",
                                                      "model": "m", "mcp_url": f"http://127.0.0.1:{port}/mcp",
                                                      "tasks": 3}))

    async def go() -> dict:
        try:
            return await probe.measure()
        finally:
            await probe.close()

    out = asyncio.run(go())
    assert (out["succeeded"], out["failures.tool_error"], out["tool_errors"], out["turns"]) == (0, 3, 3, 0.0)
    assert out["first_failure"] == (f"tool_error: MCP server http://127.0.0.1:{port}/mcp: ConnectError: All "
                                    "connection attempts failed")
