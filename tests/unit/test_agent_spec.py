"""agent probe: its spec's refusals, the checks of a tool call's arguments, how a streamed turn is read."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from pydantic import ValidationError

from chaoskit.probes.agent import (
    AgentProbe,
    AgentProbeSpec,
    AgentScript,
    Task,
    TaskFailed,
    ToolFailed,
    Tools,
    Turn,
    check_calls,
    read_chunk,
)
from chaoskit.probes.agent_tools import LOCAL, parse_arguments, run_local


def spec(**kw) -> AgentProbeSpec:
    return AgentProbeSpec.model_validate({"type": "agent", "name": "agent", "url": "http://h:1", "model": "m", **kw})


@pytest.mark.parametrize("kw, message", [
    ({"scripts": [{"prompt": "hi", "tool": "search"}]}, "scripts[0].tool: 'search' is not a local tool (local tools: "
                                                         "get_weather, get_time); give mcp_url"),
    ({"scripts": []}, "at least 1 item"),
    ({"phases": ["during"]}, "scripts without an answer are recorded in the before phase"),
    ({"expect": {"failures": {"bad_args": "== 0"}}}, "expect.failures.bad_args: unknown kind (did you mean "
                                                     "'bad_arguments'?)"),
    ({"expect": {"success": "> 0.95"}}, "unknown key 'success' for this probe (did you mean 'success_rate'?)"),
    ({"tasks": 0}, "greater than or equal to 1"),
    ({"max_turns": 1}, "greater than or equal to 2"),
    ({"url": "h:1"}, "should match pattern"),
    ({"repair": "sometimes"}, "Input should be a valid boolean"),
    ({"scripts": [{"prompt": "hi", "tool": "get_time", "answr": "x"}]}, "Extra inputs are not permitted"),
    ({"scripts": [{"prompt": "hi", "tool": "get_weather", "arguments": {"days": 3}}]},
     "scripts[0].arguments: get_weather would never accept them: arguments: required city missing"),
    ({"scripts": [{"prompt": "hi", "tool": "get_time"}, {"prompt": "hi", "tool": "get_weather",
                                                          "arguments": {"city": "Paris", "days": "3"}}]},
     'scripts[1].arguments: get_weather would never accept them: argument days: "3" is not integer'),
])
def test_invalid_specs(kw, message):
    with pytest.raises(ValidationError) as e:
        spec(**kw)
    assert message in str(e.value)


@pytest.mark.parametrize("kw, message", [
    ({"mcp_mode": "legacy"}, "mcp_mode: the MCP client's behaviour, and without mcp_url the tools are local"),
    ({"keep_toolset": False}, "keep_toolset: the MCP client's behaviour"),
    ({"mcp_url": "http://h:2/mcp", "mcp_reconnect": True}, "mcp_reconnect sends a call again on a new session: give "
                                                           "tool_retries"),
    ({"mcp_url": "http://h:2/mcp", "mcp_mode": "stateless"}, "Input should be 'auto' or 'legacy'"),
    ({"tool_retries": 11}, "less than or equal to 10"),
])
def test_invalid_mcp_client_knobs(kw, message):
    with pytest.raises(ValidationError) as e:
        spec(**kw)
    assert message in str(e.value)


def test_defaults_an_mcp_tool_and_the_timeout_follows_rounds_and_rate():
    s = spec(expect={"success_rate": "> 0.95", "failure_share": {"bad_arguments": "== 0"}})
    assert (s.tasks, s.concurrency, s.repair, s.scripts[0].tool, s.scripts[0].arguments) == \
        (10, 4, False, "get_weather", {"city": "Paris", "days": 3})
    assert s.timeout == 30.0 * 3 + 5.0  # 10 tasks, 4 at a time: 3 rounds of task_timeout
    assert spec(tasks=5, rate=2, concurrency=5, task_timeout="2s").timeout == 2.0 + 2.0 + 5.0
    assert spec(mcp_url="http://h:2/mcp", scripts=[{"prompt": "p", "tool": "slow_lookup", "answer": "a"}],
                phases=["during"]).scripts[0].tool == "slow_lookup"


SCHEMA = LOCAL["get_weather"][1]


@pytest.mark.parametrize("text, why", [
    ('{"city": "Paris", "days": 3}', None),
    ('{"city": "Paris"}', None),
    ('{"city": "Paris", "days": 3', "arguments: not JSON"),
    ('{"city": "Pa\\qris"}', "arguments: not JSON"),
    ('["Paris"]', "arguments: not a JSON object"),
    ('{"days": 3}', "arguments: required city missing"),
    ('{"city": "Paris", "days": "3"}', 'argument days: "3" is not integer'),
    ('{"city": "Paris", "days": true}', "argument days: true is not integer"),
])
def test_arguments_parse_and_fit_the_schema(text, why):
    args, got = parse_arguments(text, SCHEMA)
    assert (got is None if why is None else got.startswith(why)), got
    assert (args is None) == (why is not None)
    strict = {**SCHEMA, "additionalProperties": False}
    assert parse_arguments('{"city": "P", "x": 1}', strict)[1] == "argument x is not in the schema"


def turn(*calls: tuple[str, str], finish: str = "tool_calls") -> Turn:
    return Turn(calls={i: [f"id{i}", n, a] for i, (n, a) in enumerate(calls)}, finish=finish)


SCRIPT = AgentScript(prompt="p", tool="get_weather", arguments={"city": "Paris", "days": 3})


@pytest.mark.parametrize("t, kind", [
    (turn(("get_weather", '{"city": "Paris", "days": 3}')), None),
    (turn(("get_weathr", '{"city": "Paris", "days": 3}')), "wrong_tool"),
    (turn(("get_weather", '{"city": "Paris", "days": 3')), "bad_arguments"),
    (turn(("get_weather", '{"city": "Lyon", "days": 3}')), "bad_arguments"),  # fits the schema, not the script
    (turn(("get_weather", '{"city": "Paris", "days": 3}'), finish="stop"), "truncated"),
])
def test_tool_calls_are_checked_strictly(t, kind):
    if kind is None:
        assert check_calls(t, Tools(), SCRIPT) == [{"city": "Paris", "days": 3}]
        return
    with pytest.raises(TaskFailed) as e:
        check_calls(t, Tools(), SCRIPT)
    assert e.value.kind == kind


def chunk(delta: dict, finish: str | None = None) -> NS:
    calls = [NS(index=c["index"], id=c.get("id"), function=NS(name=c.get("name"), arguments=c.get("arguments")))
             for c in delta.get("tool_calls", ())]
    return NS(choices=[NS(delta=NS(content=delta.get("content"), tool_calls=calls or None), finish_reason=finish)])


def test_a_streamed_tool_call_is_put_together_and_replayed():
    t = Turn()
    for c in (chunk({"tool_calls": [{"index": 0, "id": "c1", "name": "get_weather", "arguments": ""}]}),
              chunk({"tool_calls": [{"index": 0, "arguments": '{"city": '}]}),
              chunk({"tool_calls": [{"index": 0, "arguments": '"Paris"}'}]}), chunk({}, "tool_calls")):
        read_chunk(t, c)
    assert (t.finish, t.tokens) == ("tool_calls", 2)
    assert t.message() == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert run_local("get_weather", {"city": "Paris", "days": 3}).startswith("Paris: 3 day(s), ")


def test_the_bundled_agents_scenarios_validate_with_tiny_mcp_facts(tmp_path, monkeypatch):
    """Their {target.mcp.url} is a fact the deployment publishes with mcp: true, checked before it runs; without
    mcp the same placeholder is refused."""
    from chaoskit.errors import SpecError
    from chaoskit.experiment.loader import load_experiment

    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(tmp_path / "none"))
    files = sorted(Path(__file__).resolve().parents[2].glob("experiments/agents/*.yaml"))
    assert [f.stem for f in files] == ["error-event-mid-stream", "mcp-session-forgotten", "mcp-slow-tool",
                                       "tool-args-broken"]
    for f in files:
        loaded = load_experiment(f, strict=False)
        assert [p.type for p in loaded.experiment.steady_state.probes] == ["agent", "agent"], f
        (tmp_path / f.name).write_text(f.read_text().replace("mcp: true, ", ""))
        line = next(n for n, text in enumerate(f.read_text().splitlines(), 1) if "mcp_url:" in text)
        with pytest.raises(SpecError, match=rf"{f.name}:{line}:7: steadyState.probes\[0\].mcp_url: unknown "
                                            r"substitution \{target.mcp.url\}"):
            load_experiment(tmp_path / f.name, strict=False)


def test_arguments_a_local_tool_never_accepts_name_file_line_and_field_exit_2(tmp_path):
    from chaoskit.errors import ChaoskitError
    from chaoskit.experiment.loader import load_experiment

    f = tmp_path / "e.yaml"
    f.write_text("apiVersion: chaoskit/v1\nkind: Experiment\nmetadata: {name: bad-args}\nsteadyState:\n"
                 "  probes:\n    - {name: a, type: agent, url: 'http://127.0.0.1:1', model: m,\n"
                 "       scripts: [{prompt: p, tool: get_time, arguments: {zone: 3}}]}\nmethod: []\n")
    with pytest.raises(ChaoskitError) as e:
        load_experiment(f)
    assert e.value.exit_code == 2
    assert re.search(r"e\.yaml:6:\d+: steadyState\.probes\[0\]\.agent: scripts\[0\]\.arguments: get_time would never "
                     r"accept them: argument zone: 3 is not string", str(e.value)), str(e.value)


def test_without_a_recorded_answer_later_answers_fail_as_wrong_answer():
    """A script none of whose tasks answered in the first sample: its later answers are judged, and fail."""
    probe = AgentProbe(spec(scripts=[{"prompt": "p", "tool": "get_time"}, {"prompt": "q", "tool": "get_time"}]))
    probe.judge(0, Task(), "12:00 UTC", recording=True)  # scripts[1]: every task failed before its answer
    with pytest.raises(TaskFailed) as e:
        probe.judge(1, Task(), "13:00 UTC", recording=False)
    assert (e.value.kind, str(e.value)) == ("wrong_answer", "answered '13:00 UTC', but no answer recorded for "
                                            "scripts[1] (every task of it failed in the first sample)")
    probe.judge(0, Task(), "12:00 UTC", recording=False)
    with pytest.raises(TaskFailed, match="expected '12:00 UTC'"):
        probe.judge(0, Task(), "12:01 UTC", recording=False)


class FakeClient:
    """An MCP client's steps as the probe calls them: the session's start, tools/list, its end."""

    def __init__(self, fail_at: str | None = None):
        self.fail_at, self.ended = fail_at, 0

    async def __aenter__(self):
        if self.fail_at == "start":
            raise ConnectionError("refused")
        return self

    async def list_tools(self):
        if self.fail_at == "list":
            raise ConnectionError("reset")
        return NS(tools=[])

    async def __aexit__(self, *exc):
        self.ended += 1
        if self.fail_at == "end":
            raise ConnectionError("gone")


@pytest.mark.parametrize("fail_at", ["start", "list"])
def test_only_the_mcp_clients_own_failures_become_tool_errors(fail_at):
    import asyncio

    probe = AgentProbe(spec(mcp_url="http://127.0.0.1:1/mcp", tasks=3,
                            scripts=[{"prompt": "p", "tool": "t", "answer": "a"}]))
    client = FakeClient(fail_at)
    done = asyncio.run(probe.with_mcp(client, recording=True))
    why = "refused" if fail_at == "start" else "reset"
    assert [(t.failure.kind, str(t.failure)) for t, _ in done] == \
        [("tool_error", f"MCP server http://127.0.0.1:1/mcp: ConnectionError: {why}")] * 3
    assert client.ended == (fail_at == "list")


def test_an_error_in_the_probes_own_code_propagates_and_the_session_still_ends(monkeypatch):
    import asyncio

    probe = AgentProbe(spec(mcp_url="http://127.0.0.1:1/mcp", scripts=[{"prompt": "p", "tool": "t", "answer": "a"}]))

    async def broken(tools, recording):
        raise KeyError("a bug of ours")

    monkeypatch.setattr(probe, "run_all", broken)
    for client in (FakeClient(), FakeClient("end")):
        with pytest.raises(KeyError, match="a bug of ours"):
            asyncio.run(probe.with_mcp(client, recording=True))
        assert client.ended == 1


class FlakyTools(Tools):
    """An MCP session's tool calls failing with the causes given, in order, then answering; reconnect counted."""

    def __init__(self, causes: list[str]):
        super().__init__(session="s0", listed=[NS(name="get_weather", description="", input_schema={})])
        self.causes, self.reconnects, self.sessions = list(causes), 0, []

    async def run(self, name, args, timeout):
        self.sessions.append(self.session)
        if self.causes:
            raise ToolFailed(self.causes.pop(0), f"{name}: failed")
        return "sunny"

    async def reconnect(self, lost, client):
        if self.session is lost:
            self.reconnects += 1
            self.session = f"s{self.reconnects}"


@pytest.mark.parametrize("kw, causes, result, sessions, counts", [
    # the session lost: without mcp_reconnect every retry goes to the dead session; with it, to a new one
    ({"tool_retries": 2}, ["session"] * 3, "tool_error", ["s0"] * 3, (3, 3, 2)),
    ({"tool_retries": 2, "mcp_reconnect": True}, ["session"], "sunny", ["s0", "s1"], (2, 1, 1)),
    ({"tool_retries": 2, "mcp_reconnect": True}, ["session", "error"], "sunny", ["s0", "s1", "s1"], (3, 2, 2)),
    # a timeout: the toolset dropped and no retry where keep_toolset is false; retried where it is kept
    ({"tool_retries": 2, "keep_toolset": False}, ["timeout"], "tool_error", ["s0"], (1, 1, 0)),
    ({"tool_retries": 2}, ["timeout", "timeout"], "sunny", ["s0"] * 3, (3, 2, 2)),
    ({}, ["error"], "tool_error", ["s0"], (1, 1, 0)),
])
def test_a_tool_call_is_retried_reconnected_or_takes_the_toolset(kw, causes, result, sessions, counts):
    import asyncio

    probe = AgentProbe(spec(mcp_url="http://127.0.0.1:1/mcp", scripts=[{"prompt": "p", "tool": "get_weather",
                                                                         "answer": "a"}], **kw))
    tools, task = FlakyTools(causes), Task()
    try:
        got = asyncio.run(probe.tool_call(task, tools, "get_weather", {}))
    except TaskFailed as e:
        got = e.kind
    assert (got, tools.sessions, (task.tool_calls, task.tool_errors, task.retries)) == (result, sessions, counts)
    assert bool(tools.offered) == (kw.get("keep_toolset", True) or "timeout" not in causes)


@pytest.mark.parametrize("error, cause", [
    (NS(code=-32600, message="Session not found"), "session"),  # the server's 404 body
    (NS(code=-32600, message="Session terminated"), "session"),  # the client's own, for a 404 without one
    (NS(code=-32001, message="Timed out while waiting for response"), "timeout"),
    (NS(code=-32600, message="Invalid request"), "error"),
    (NS(code=-32603, message="Session not found"), "error"),
])
def test_why_the_mcp_client_failed_a_call(error, cause):
    from chaoskit.probes.agent import cause as why

    class McpErr(Exception):
        code, message = error.code, error.message

    assert why(McpErr()) == why(BaseExceptionGroup("g", [McpErr()])) == cause
