"""llm.proxy's agent-traffic faults (tool_args, error_event, schema_break) in front of a real tiny-openai
replica, seen through the official OpenAI SDK: for each mode, exactly what a client gets streamed and whole,
next to the same request answered directly; the proxy's counters equal to what the clients saw; and no proxy
process or replica left at the end."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pydantic
import pytest

from chaoskit.injectors.llm_proxy.fault import stats_of
from chaoskit.reference.tiny_openai import SERVED_NAME
from tests.helpers.agent_stack import agent_stack

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city", "days"],
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
ASK = [{"role": "user", "content": "use get_weather for city=Paris days=3"}]
ARGS = '{"city": "Paris", "days": 3}'  # what tiny-openai answers ASK (checked against it directly below)
MODES = ("cut", "invalid_json", "bad_escape", "wrong_tool_name", "duplicate_call", "finish_stop")


class Forecast(pydantic.BaseModel):
    city: str
    days: int


def by_header(faults: dict[str, dict]) -> list[dict]:
    return [{"name": name, **f, "match": {"headers": {"X-Fault": name}}} for name, f in faults.items()]


FAULTS = by_header({
    **{f"tool-{m}": {"type": "tool_args", "mode": m} for m in MODES},
    "error": {"type": "error_event", "after_tokens": 2, "message": "pop from empty list"},
    "error-no-done": {"type": "error_event", "after_tokens": 0, "done": False, "code": 503},
    "drop": {"type": "schema_break", "mode": "drop_required"},
    "mistype": {"type": "schema_break", "mode": "wrong_type"},
    "some": {"type": "tool_args", "mode": "finish_stop", "share": 0.5},
})


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[int, int, Path]]:
    """(tiny-openai's port, the proxy's port in front of it, the replica's request log)."""
    with agent_stack(tmp_path_factory.mktemp("agents"), FAULTS, seed=3) as st:
        yield st.up, st.proxy, st.logs / "replica.jsonl"


def client(port: int, fault: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=10,
                         default_headers={"X-Fault": fault} if fault else None)


def streamed_call(c: openai.OpenAI) -> tuple[list[tuple[str, str, str]], str | None]:
    """The tool calls a client assembles from the chunks ((id, name, arguments) by index) and the finish_reason."""
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in c.chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[WEATHER], stream=True):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for tc in choice.delta.tool_calls or ():
            got = calls.setdefault(tc.index, ["", "", ""])
            got[0] += tc.id or ""
            got[1] += tc.function.name or ""
            got[2] += tc.function.arguments or ""
    return [tuple(calls[i]) for i in sorted(calls)], finish  # type: ignore[misc]


def applied(port: int) -> dict[str, int]:
    return {name: f.applied for name, f in stats_of(f"127.0.0.1:{port}").faults.items()}


@pytest.mark.parametrize("mode, name, arguments, whole_arguments, finish, copies", [
    ("cut", "get_weather", '{"city": "Paris", "days": ', '{"city": "Pari', "tool_calls", 1),
    ("invalid_json", "get_weather", "{'city': 'Paris', 'days': 3}", None, "tool_calls", 1),
    ("bad_escape", "get_weather", '{"\\x41city": "Paris", "days": 3}', None, "tool_calls", 1),
    ("wrong_tool_name", "get_weather_unknown", ARGS, None, "tool_calls", 1),
    ("duplicate_call", "get_weather", ARGS, None, "tool_calls", 2),
    ("finish_stop", "get_weather", ARGS, None, "stop", 1),
])
def test_tool_args_as_the_sdk_sees_them(stack, mode, name, arguments, whole_arguments, finish, copies):
    up, port, _ = stack
    direct = client(up).chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[WEATHER])
    call_id = direct.choices[0].message.tool_calls[0].id
    assert direct.choices[0].message.tool_calls[0].function.arguments == ARGS
    before = applied(port)[f"tool-{mode}"]
    c = client(port, f"tool-{mode}")

    calls, fin = streamed_call(c)
    want = [(call_id, name, arguments)] + ([(f"{call_id}-2", "get_weather", ARGS)] if copies == 2 else [])
    assert (calls, fin) == (want, finish)

    with c.beta.chat.completions.stream(model=SERVED_NAME, messages=ASK, tools=[WEATHER]) as s:
        final = s.get_final_completion()
    assert [(t.id, t.function.name, t.function.arguments) for t in final.choices[0].message.tool_calls] == want
    assert final.choices[0].finish_reason == finish

    whole = c.chat.completions.create(model=SERVED_NAME, messages=ASK, tools=[WEATHER])
    got = [(t.id, t.function.name, t.function.arguments) for t in whole.choices[0].message.tool_calls]
    assert got == [(call_id, name, whole_arguments or arguments)] + want[1:]
    assert whole.choices[0].finish_reason == finish
    if mode in ("cut", "invalid_json", "bad_escape"):
        for args in (arguments, whole_arguments or arguments):
            with pytest.raises(json.JSONDecodeError):
                json.loads(args)

    text = c.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": "hello"}],
                                     tools=[WEATHER], max_tokens=4)  # no tool call: nothing to break
    assert text.choices[0].message.content and text.choices[0].finish_reason == "length"
    assert applied(port)[f"tool-{mode}"] == before + 3


def test_an_error_event_inside_a_200_stream(stack):
    up, port, _ = stack
    ask = [{"role": "user", "content": "tell me"}]
    direct = [ch.choices[0].delta.content for ch in client(up).chat.completions.create(
        model=SERVED_NAME, messages=ask, max_tokens=6, stream=True)]
    got: list[str | None] = []
    with pytest.raises(openai.APIError, match="^pop from empty list$") as e:
        for ch in client(port, "error").chat.completions.create(model=SERVED_NAME, messages=ask, max_tokens=6,
                                                                  stream=True):
            got.append(ch.choices[0].delta.content)
    assert got == direct[:2] and e.value.body == {"message": "pop from empty list", "type": "InternalServerError",
                                                   "param": None, "code": 500}
    with pytest.raises(openai.APIError, match="^llm.proxy: injected error$"):  # before any token; a tool call too
        list(client(port, "error-no-done").chat.completions.create(model=SERVED_NAME, messages=ASK,
                                                                     tools=[WEATHER], stream=True))
    tail = {}
    for fault in ("error", "error-no-done"):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", headers={
            "X-Fault": fault, "Content-Type": "application/json"}, data=json.dumps(
            {"model": SERVED_NAME, "messages": ask, "max_tokens": 6, "stream": True}).encode())
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
            tail[fault] = r.read().decode().split("\n\n")[-3:]
    assert tail["error"][1:] == ["data: [DONE]", ""] and json.loads(tail["error"][0][6:])["error"]["code"] == 500
    assert tail["error-no-done"][-1] == "" and json.loads(tail["error-no-done"][-2][6:]) == {"error": {
        "message": "llm.proxy: injected error", "type": "InternalServerError", "param": None, "code": 503}}
    whole = client(port, "error").chat.completions.create(model=SERVED_NAME, messages=ask, max_tokens=6)
    assert whole.choices[0].message.content == "".join(direct)  # a JSON answer passes unchanged
    assert (applied(port)["error"], applied(port)["error-no-done"]) == (2, 2)


@pytest.mark.parametrize("fault, broken", [("drop", {"days"}), ("mistype", {"city": 4})])
def test_schema_break_parses_as_json_but_not_as_the_model(stack, fault, broken):
    up, port, _ = stack
    ask = [{"role": "user", "content": "city=Oslo forecast"}]
    direct = client(up).beta.chat.completions.parse(model=SERVED_NAME, messages=ask, response_format=Forecast)
    good = direct.choices[0].message.parsed.model_dump()
    assert good["city"] == "Oslo"  # NAME=VALUE: the answer's city (its length: 4)
    want = {k: v for k, v in good.items() if k in broken} if isinstance(broken, set) else {**good, **broken}
    before = applied(port)[fault]
    c = client(port, fault)
    with pytest.raises(pydantic.ValidationError):
        c.beta.chat.completions.parse(model=SERVED_NAME, messages=ask, response_format=Forecast)
    with pytest.raises(pydantic.ValidationError), \
            c.beta.chat.completions.stream(model=SERVED_NAME, messages=ask, response_format=Forecast) as s:
        s.get_final_completion()
    schema = {"type": "json_schema", "json_schema": {"name": "Forecast", "schema": Forecast.model_json_schema()}}
    raw = c.chat.completions.create(model=SERVED_NAME, messages=ask, response_format=schema)
    assert json.loads(raw.choices[0].message.content) == want and raw.choices[0].finish_reason == "stop"
    pieces = [ch.choices[0].delta.content for ch in c.chat.completions.create(
        model=SERVED_NAME, messages=ask, response_format=schema, stream=True)]
    assert json.loads(pieces[0]) == want and pieces[1:] == [None]  # held back, sent whole before the final event
    assert applied(port)[fault] == before + 4


def test_a_share_is_counted_as_the_clients_saw_it(stack):
    _, port, log = stack
    c = client(port, "some")
    seen = [streamed_call(c)[1] for _ in range(20)]
    stats = stats_of(f"127.0.0.1:{port}").faults["some"]
    assert stats.matched == 20 and stats.selected == stats.applied == seen.count("stop")
    assert 0 < seen.count("stop") < 20 and seen.count("stop") + seen.count("tool_calls") == 20
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert sum(x.get("tool") == "get_weather" and x["outcome"] == "complete" for x in lines[-20:]) == 20
