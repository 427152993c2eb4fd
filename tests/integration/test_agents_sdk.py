"""What a real agent framework, the OpenAI Agents SDK (PyPI openai-agents), makes of each of llm.proxy's
agent-traffic faults in front of a real tiny-openai replica: an agent with one function tool (or a structured
output type) run whole and streamed; what it returns or raises, and the tool calls it made, counted by the tool
itself. The docs' table (docs/details/injectors.md, "What a real agent framework does") is this test's table."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import agents
import openai
import pydantic
import pytest

from chaoskit.reference.tiny_openai import SERVED_NAME
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
