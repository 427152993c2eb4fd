"""tiny-openai's agent side driven by the official OpenAI SDK: a tool call (streamed as vLLM streams it, and
whole) that the SDK assembles into the name and JSON arguments tiny_tools promises, a text answer after the
tool's result, a json_schema answer the SDK parses into its pydantic model, and the request log saying which."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pydantic
import pytest

from chaoskit.reference.tiny_openai import SERVED_NAME
from chaoskit.reference.tiny_tools import tokens
from tests.conftest import free_port, wait_for

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "required": ["city", "days"], "properties": {
               "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
               "unit": {"type": "string", "enum": ["c", "f"]}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "use get_weather for city=Paris days=3"}]


class Forecast(pydantic.BaseModel):
    city: str
    days: int
    warm: bool
    tags: list[str]


@pytest.fixture(scope="module")
def replica(tmp_path_factory) -> Iterator[tuple[openai.OpenAI, Path]]:
    log = tmp_path_factory.mktemp("tiny-openai") / "requests.jsonl"
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "chaoskit.reference.tiny_openai", "--port", str(port),
                          "--token-rate", "500", "--log", str(log)])
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=10)
        wait_for(lambda: _up(client), timeout=20, every=0.1)
        yield client, log
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)
        assert not os.path.exists(f"/proc/{p.pid}")


def _up(client: openai.OpenAI) -> bool:
    try:
        return [m.id for m in client.models.list()] == [SERVED_NAME]
    except openai.APIConnectionError:
        return False


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_tool_call_streamed_and_whole_is_what_the_sdk_assembles(replica):
    client, log = replica
    logged = len(_log(log))
    whole = client.chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[CLOCK, WEATHER])
    call = whole.choices[0].message.tool_calls[0]
    assert whole.choices[0].finish_reason == "tool_calls" and whole.choices[0].message.content is None
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert args["city"] == "Paris" and args["days"] == 3 and args["unit"] in ("c", "f") and len(args) == 3

    chunks = list(client.chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[CLOCK, WEATHER],
                                                 stream=True))
    first = chunks[0].choices[0].delta.tool_calls[0]
    assert (first.id, first.type, first.function.name, first.function.arguments) == \
        (call.id, "function", "get_weather", "")
    frags = [c.choices[0].delta.tool_calls[0].function.arguments for c in chunks[1:-1]]
    assert len(frags) > 3 and "".join(frags) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["tool_calls"]

    with client.beta.chat.completions.stream(model=SERVED_NAME, messages=ASK, tools=[CLOCK, WEATHER]) as s:
        final = s.get_final_completion()
    assembled = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in assembled] == \
        [(call.id, "get_weather", call.function.arguments)]
    # the replica logs a request once its answer is sent: the client may have read the last one before that
    wait_for(lambda: len(_log(log)) >= logged + 3, timeout=10)
    assert [(x["answer"], x.get("tool"), x["stream"], x["tokens"]) for x in _log(log)[-3:]] == \
        [("tool_call", "get_weather", False, len(frags)), ("tool_call", "get_weather", True, len(frags)),
         ("tool_call", "get_weather", True, len(frags))]


def test_tool_choice_decides_and_a_tool_result_gets_text(replica):
    client, _ = replica
    forced = client.chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[CLOCK, WEATHER],
                                            tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert forced.choices[0].message.tool_calls[0].function.name == "get_time"
    unnamed = [{"role": "user", "content": "what now?"}]
    assert client.chat.completions.create(model=SERVED_NAME, messages=unnamed,
                                          tools=[CLOCK]).choices[0].message.tool_calls is None
    required = client.chat.completions.create(model=SERVED_NAME, messages=unnamed, tools=[CLOCK, WEATHER],
                                              tool_choice="required")
    assert required.choices[0].message.tool_calls[0].function.name == "get_time"
    assert client.chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[WEATHER],
                                          tool_choice="none").choices[0].message.tool_calls is None

    call = client.chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[WEATHER]).choices[0].message
    turn = [*ASK, call.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "sunny, 21 C"}]
    text = client.chat.completions.create(model=SERVED_NAME, messages=turn, tools=[WEATHER], max_tokens=5)
    prompt = "\n".join([ASK[0]["content"], "", "sunny, 21 C"])
    assert text.choices[0].message.content == "".join(tokens(prompt, 5))
    assert text.choices[0].finish_reason == "length" and text.choices[0].message.tool_calls is None

    with pytest.raises(openai.BadRequestError, match="tool_choice names 'nope', not one of the tools offered"):
        client.chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})


def test_a_json_schema_answer_is_what_the_sdk_parses(replica):
    client, log = replica
    ask = [{"role": "user", "content": "a forecast, please"}]
    whole = client.beta.chat.completions.parse(model=SERVED_NAME, messages=ask, response_format=Forecast)
    parsed = whole.choices[0].message.parsed
    assert isinstance(parsed, Forecast) and whole.choices[0].finish_reason == "stop" and len(parsed.tags) == 1
    with client.beta.chat.completions.stream(model=SERVED_NAME, messages=ask, response_format=Forecast) as s:
        streamed = s.get_final_completion()
    assert streamed.choices[0].message.parsed == parsed
    again = client.chat.completions.create(model=SERVED_NAME, messages=ask, response_format={
        "type": "json_schema", "json_schema": {"name": "Forecast", "schema": Forecast.model_json_schema()}})
    assert Forecast.model_validate_json(again.choices[0].message.content) == parsed  # the prompt decides it
    assert [x["answer"] for x in _log(log)[-3:]] == ["json"] * 3
