"""agent probe: scripted multi-turn tasks (model -> tool call -> tool -> model -> answer) through the official
OpenAI SDK, the tools run locally or on an MCP server (the official mcp client); whether each task gets done."""

from __future__ import annotations

import asyncio
import difflib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from chaoskit.errors import PreflightError
from chaoskit.model.types import Duration, StrictModel, Url
from chaoskit.probes.agent_tools import LOCAL, openai_tool, parse_arguments, run_local
from chaoskit.probes.base import Probe, ProbeSpecBase, RequestTarget

# why a task failed: model_error (an API error: a status, an error event in the stream, the connection),
# truncated (a stream or answer without its finish_reason, or tool calls whose finish_reason is not tool_calls),
# bad_arguments (a tool call's arguments do not parse or fit the tool's schema, or are not the script's), wrong_tool
# (a tool not offered), no_tool_call (an answer before the script's tool was called), tool_error (the tool failed),
# empty_answer, wrong_answer (not the recorded or golden one, or none recorded), timeout (longer than task_timeout)
KINDS = ("model_error", "truncated", "bad_arguments", "wrong_tool", "no_tool_call", "tool_error", "empty_answer",
         "wrong_answer", "timeout")
RETRIED = ("model_error", "truncated", "bad_arguments", "wrong_tool")  # a turn that repair sends again
_KEYS = ("tasks", "succeeded", "failed", "success_rate", "turns", "tool_calls", "tool_errors", "retries", "task_s",
         "task_s_max", "tokens", "recorded", "failures.", "failure_share.")
WEATHER = "use get_weather for city=Paris days=3"
EXAMPLE = {"name": "agent", "type": "agent", "url": "http://127.0.0.1:8000", "model": "my-model",
           "mcp_url": "http://127.0.0.1:8004/mcp", "tasks": 10, "concurrency": 2,
           "scripts": [{"prompt": WEATHER, "tool": "get_weather", "arguments": {"city": "Paris", "days": 3}}],
           "expect": {"success_rate": "> 0.95"}}


class AgentScript(StrictModel):
    prompt: str = Field(min_length=1, description="the user message that starts the task")
    tool: str = Field(min_length=1, description="the tool the task must call (a local tool or one the MCP "
                      "server lists)")
    arguments: dict[str, Any] | None = Field(None, description="the arguments the call must have, exactly "
                                             "(none: any that fit the tool's schema)")
    answer: str | None = Field(None, description="the final answer, exactly; none: the first answer of the "
                               "probe's first sample (its before phase) is recorded and the later ones compared "
                               "with it (with tiny-openai it depends on the tool's result)")


class AgentProbeSpec(ProbeSpecBase):
    model_config = {"json_schema_extra": {"examples": [EXAMPLE]}}

    type: Literal["agent"]
    url: Url = Field(pattern=r"^https?://", description="base URL of the OpenAI-compatible endpoint "
                     "(http://host:port; /v1 is added)")
    model: str = Field(min_length=1, description="model name")
    mcp_url: Url | None = Field(None, pattern=r"^https?://", description="an MCP server (streamable HTTP, e.g. "
                                "{target.mcp.url}) whose listed tools the model is offered and which runs them; "
                                "none: the probe's local tools (get_weather, get_time)")
    scripts: list[AgentScript] = Field(default_factory=lambda: [AgentScript(
        prompt=WEATHER, tool="get_weather", arguments={"city": "Paris", "days": 3})],
        min_length=1, description="the tasks, run in turn (default: one get_weather task)")
    tasks: int = Field(10, ge=1, description="tasks per sample, the scripts in turn")
    rate: float | None = Field(None, gt=0, description="tasks started per second (none: as concurrency allows)")
    concurrency: int = Field(4, ge=1, le=256, description="tasks in flight at once")
    stream: bool = Field(True, description="stream each model turn (SSE) or take whole answers")
    max_turns: int = Field(4, ge=2, le=32, description="model turns a task may take")
    max_tokens: int = Field(16, gt=0, description="max_tokens of each model turn")
    repair: bool = Field(False, description="what a well-built agent does: a model turn whose answer is unusable "
                         "(an API error or an error event, a stream cut short, a tool call whose arguments do not "
                         "parse or fit the schema, a tool not offered) is sent again, up to `retries` times; "
                         "without it that task fails")
    retries: int = Field(2, ge=1, le=10, description="with repair: how many times a model turn is sent again")
    request_timeout: Duration = Field(10.0, gt=0, description="per model turn")
    tool_timeout: Duration = Field(10.0, gt=0, description="per tool call")
    mcp_mode: Literal["auto", "legacy"] = Field("auto", description="how the MCP client connects: auto (the "
                                                "client's default: server/discover, the stateless protocol, JSON "
                                                "answers; the initialize handshake where the server has no "
                                                "discover) or legacy (the initialize handshake: a session named by "
                                                "Mcp-Session-Id, answers as SSE streams)")
    tool_retries: int = Field(0, ge=0, le=10, description="a tool call that fails (an error, a timeout, its session "
                              "lost) is sent again up to this many times (each counted in retries)")
    mcp_reconnect: bool = Field(False, description="a tool call whose session the server no longer knows (HTTP "
                                "404, 'Session not found' or 'Session terminated', as after a server restart) first "
                                "opens a new session (the handshake again) and is sent again on it (with "
                                "tool_retries); without it every later call on the lost session fails too")
    keep_toolset: bool = Field(True, description="false: what some agents do (hermes-agent #88661): the first tool "
                               "call that times out drops the MCP server's whole toolset, every later model turn "
                               "of the sample is offered no tools (its task fails no_tool_call) and that call is "
                               "not retried; true: a timeout is that call's failure alone (retried with "
                               "tool_retries)")
    task_timeout: Duration = Field(30.0, gt=0, description="per task: longer is a failure (timeout)")
    headers: dict[str, str] = Field(default_factory=dict, description="request headers (e.g. Authorization); "
                                    "each model turn also sends x-request-id NAME-SAMPLE-TASK-tTURN-aATTEMPT")
    timeout: Duration | None = Field(None, description="the whole sample (default: task_timeout x the rounds of "
                                     "concurrency tasks + the start spread at rate + 5s)")
    expect_keys: ClassVar[tuple[str, ...]] = _KEYS

    def request_target(self) -> RequestTarget:
        return RequestTarget(self.url, self.request_timeout)

    @model_validator(mode="after")
    def _check_spec(self) -> AgentProbeSpec:
        if self.timeout is None:
            spread = (self.tasks - 1) / self.rate if self.rate else 0.0
            rounds = math.ceil(self.tasks / self.concurrency)
            object.__setattr__(self, "timeout", self.task_timeout * rounds + spread + 5.0)
        if self.mcp_url is None:
            for key, default in (("mcp_mode", "auto"), ("mcp_reconnect", False), ("keep_toolset", True)):
                if getattr(self, key) != default:
                    raise ValueError(f"{key}: the MCP client's behaviour, and without mcp_url the tools are local")
            for i, s in enumerate(self.scripts):
                if s.tool not in LOCAL:
                    raise ValueError(f"scripts[{i}].tool: '{s.tool}' is not a local tool (local tools: "
                                     f"{', '.join(LOCAL)}); give mcp_url for an MCP server's tools")
                if s.arguments is not None:
                    args, why = parse_arguments(json.dumps(s.arguments), LOCAL[s.tool][1])
                    if args is None:
                        raise ValueError(f"scripts[{i}].arguments: {s.tool} would never accept them: {why}")
        if self.mcp_reconnect and self.tool_retries == 0:
            raise ValueError("mcp_reconnect sends a call again on a new session: give tool_retries (1 or more)")
        if "before" not in self.phases and any(s.answer is None for s in self.scripts):
            raise ValueError(f"scripts without an answer are recorded in the before phase, but phases "
                             f"({', '.join(self.phases)}) leave it out: add before, or give each script its answer")
        for key in ("failures", "failure_share"):
            for kind in self.expect.get(key) or {}:  # type: ignore[union-attr]
                if kind not in KINDS:
                    close = difflib.get_close_matches(kind, KINDS, n=1)
                    raise ValueError(f"expect.{key}.{kind}: unknown kind" + (f" (did you mean '{close[0]}'?)"
                                     if close else "") + f"; kinds: {', '.join(KINDS)}")
        return self


class TaskFailed(Exception):
    def __init__(self, kind: str, why: str):
        super().__init__(why)
        self.kind = kind


@dataclass
class Turn:
    """One model turn as the client read it: text, tool calls (id, name, arguments), finish_reason, tokens."""

    text: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)
    finish: str | None = None
    tokens: int = 0

    def message(self) -> dict[str, Any]:
        """The assistant message replayed on the next turn."""
        calls = [{"id": c[0], "type": "function", "function": {"name": c[1], "arguments": c[2]}}
                 for _, c in sorted(self.calls.items())]
        return {"role": "assistant", "content": self.text or None, **({"tool_calls": calls} if calls else {})}


@dataclass
class Task:
    """What one task did."""

    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    retries: int = 0
    tokens: int = 0
    answer: str = ""
    failure: TaskFailed | None = None


class ToolFailed(TaskFailed):
    """A tool call's failure (kind tool_error), and its cause: error, timeout or session (the server no longer
    knows the MCP session)."""

    def __init__(self, cause: str, why: str):
        super().__init__("tool_error", why)
        self.cause = cause


class Tools:
    """The tools offered to the model and how each runs: locally, or on the MCP server of an open session (a new
    one opened by reconnect where the server lost it)."""

    def __init__(self, session: Any = None, listed: list[Any] | None = None, opened: list[Any] | None = None):
        self.session = session
        self.opened = opened if opened is not None else []  # every MCP client opened for the sample, to end
        self.lock = asyncio.Lock()
        if session is None:
            self.schemas = {n: p for n, (_, p, _) in LOCAL.items()}
            self.offered = [openai_tool(n, d, p) for n, (d, p, _) in LOCAL.items()]
        else:
            self.schemas = {t.name: t.input_schema for t in listed or ()}
            self.offered = [openai_tool(t.name, t.description or "", t.input_schema) for t in listed or ()]

    def drop(self) -> None:
        """The whole toolset gone: later model turns are offered no tools."""
        self.schemas, self.offered = {}, []

    async def reconnect(self, lost: Any, client: Any) -> None:
        """A new MCP session, its tools listed, in place of `lost` (once: a task that finds it replaced already
        uses the new one)."""
        async with self.lock:
            if self.session is not lost:
                return
            try:
                session = await client.__aenter__()
            except Exception as e:  # noqa: BLE001 - whatever the MCP client raises
                raise ToolFailed("session", f"a new MCP session: {leaf(e)}") from None
            self.opened.append(client)
            try:  # as at the start: the client keeps the tools' output schemas (each result is checked against its tool's)
                await session.list_tools()
            except Exception as e:  # noqa: BLE001 - whatever the MCP client raises
                raise ToolFailed("session", f"tools/list on a new MCP session: {leaf(e)}") from None
            self.session = session

    async def run(self, name: str, args: dict[str, Any], timeout: float) -> str:
        if self.session is None:
            try:
                return run_local(name, args)
            except TypeError as e:
                raise TaskFailed("tool_error", f"{name}: {e}") from None
        try:
            async with asyncio.timeout(timeout):
                result = await self.session.call_tool(name, args)
        except TimeoutError:
            raise ToolFailed("timeout", f"{name}: no result within {timeout:g}s") from None
        except Exception as e:  # noqa: BLE001 - whatever the MCP client raises is this tool call's failure
            raise ToolFailed(cause(e), f"{name}: {leaf(e)}") from None
        text = "".join(getattr(c, "text", "") for c in result.content)
        if result.is_error:
            raise ToolFailed("error", f"{name}: error result: {text[:120]}")
        return text


class AgentProbe(Probe):
    type: ClassVar[str] = "agent"
    summary: ClassVar[str] = ("scripted agent tasks (model, tool call, MCP or local tool, answer) through the "
                              "OpenAI SDK: task success, turns, tool errors, retries, time, tokens")
    Spec = AgentProbeSpec
    spec: AgentProbeSpec

    def __init__(self, spec: AgentProbeSpec):
        super().__init__(spec)
        self._client: Any = None
        self._expected = {i: s.answer for i, s in enumerate(spec.scripts) if s.answer is not None}
        self._samples = 0

    def preflight(self) -> None:
        try:
            import openai  # noqa: F401
            if self.spec.mcp_url is not None:
                import mcp.client  # noqa: F401
        except ImportError as e:
            raise PreflightError(f"agent probe {self.spec.name}: {e.name} is not installed (install the agents "
                                 f"extra of the chaoskit wheel, e.g. pip install "
                                 f"'chaoskit-0.1.0-py3-none-any.whl[agents]', or pip install 'mcp==2.3.0' "
                                 f"'openai>=1.40')") from None

    async def measure(self) -> dict[str, Any]:
        s = self.spec
        if self._client is None:
            import openai
            self._client = openai.AsyncOpenAI(base_url=s.url.rstrip("/") + "/v1", api_key="none", max_retries=0,
                                              timeout=s.request_timeout, default_headers=s.headers)
        recording = self._samples == 0
        self._samples += 1
        if s.mcp_url is None:
            return self.summarize(await self.run_all(Tools(), recording))
        return self.summarize(await self.with_mcp(self.mcp_client(), recording))

    def mcp_client(self) -> Any:
        import mcp.client
        return mcp.client.Client(self.spec.mcp_url, mode=self.spec.mcp_mode,
                                 read_timeout_seconds=self.spec.tool_timeout)

    async def with_mcp(self, client: Any, recording: bool) -> list[tuple[Task, float]]:
        """The tasks on an MCP session; only the MCP client's own steps (the session's start, tools/list, its end)
        are caught: without a session no task can call a tool, and a failed end changes no task's outcome."""
        try:
            session = await client.__aenter__()
        except Exception as e:  # noqa: BLE001 - whatever the MCP client raises
            return self.unreachable(e)
        try:
            listed = (await session.list_tools()).tools
        except Exception as e:  # noqa: BLE001 - whatever the MCP client raises
            await end_quietly(client)
            return self.unreachable(e)
        tools = Tools(session, listed, [client])
        try:
            return await self.run_all(tools, recording)
        finally:
            for opened in tools.opened:  # its own, and any a reconnect opened
                await end_quietly(opened)

    def unreachable(self, e: BaseException) -> list[tuple[Task, float]]:
        failed = TaskFailed("tool_error", f"MCP server {self.spec.mcp_url}: {leaf(e)}")
        return [(Task(tool_errors=1, failure=failed), 0.0) for _ in range(self.spec.tasks)]

    async def run_all(self, tools: Tools, recording: bool) -> list[tuple[Task, float]]:
        s, gate, t0 = self.spec, asyncio.Semaphore(self.spec.concurrency), time.monotonic()

        async def one(i: int) -> tuple[Task, float]:
            if s.rate:
                await asyncio.sleep(max(0.0, t0 + i / s.rate - time.monotonic()))
            async with gate:
                started, task = time.monotonic(), Task()
                try:
                    async with asyncio.timeout(s.task_timeout):
                        await self.run_task(i, task, tools, recording)
                except TimeoutError:
                    task.failure = TaskFailed("timeout", f"no answer within {s.task_timeout:g}s")
                except TaskFailed as e:
                    task.failure = e
                return task, time.monotonic() - started

        return await asyncio.gather(*(one(i) for i in range(s.tasks)))

    async def run_task(self, i: int, task: Task, tools: Tools, recording: bool) -> None:
        """The script's loop: model turns until an answer, each tool call run and its result sent back."""
        k = i % len(self.spec.scripts)
        script = self.spec.scripts[k]
        messages: list[dict[str, Any]] = [{"role": "user", "content": script.prompt}]
        called = False
        for turn in range(1, self.spec.max_turns + 1):
            reply, args = await self.usable_turn(f"{self._samples}-{i}-t{turn}", task, messages, tools, script)
            if not reply.calls:
                if not called:
                    raise TaskFailed("no_tool_call", f"answered {reply.text[:60]!r} before calling {script.tool}")
                return self.judge(k, task, reply.text, recording)
            messages.append(reply.message())
            for (call_id, name, _), a in zip((c for _, c in sorted(reply.calls.items())), args, strict=True):
                result = await self.tool_call(task, tools, name, a)
                called = called or name == script.tool
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        raise TaskFailed("no_tool_call" if not called else "empty_answer", f"no answer in {self.spec.max_turns} turns")

    async def tool_call(self, task: Task, tools: Tools, name: str, args: dict[str, Any]) -> str:
        """One tool call, sent again (tool_retries) while it fails: on a new session first where its was lost
        (mcp_reconnect); a timeout drops the whole toolset instead where keep_toolset is false."""
        s = self.spec
        for attempt in range(s.tool_retries + 1):
            task.tool_calls += 1
            task.retries += attempt > 0
            session = tools.session
            try:
                return await tools.run(name, args, s.tool_timeout)
            except TaskFailed as e:
                task.tool_errors += 1
                why = getattr(e, "cause", "error")
                if why == "timeout" and not s.keep_toolset:
                    tools.drop()
                    raise
                if attempt == s.tool_retries:
                    raise
                if why == "session" and s.mcp_reconnect:
                    await tools.reconnect(session, self.mcp_client())
        raise AssertionError("unreachable")  # the last attempt returns or raises

    def judge(self, k: int, task: Task, text: str, recording: bool) -> None:
        if not text:
            raise TaskFailed("empty_answer", "an empty answer")
        expected = self._expected.get(k)
        if expected is None and recording:
            self._expected[k] = text
        elif expected is None:
            raise TaskFailed("wrong_answer", f"answered {text[:60]!r}, but no answer recorded for scripts[{k}] "
                             f"(every task of it failed in the first sample)")
        elif text != expected:
            raise TaskFailed("wrong_answer", f"answered {text[:60]!r}, expected {expected[:60]!r}")
        task.answer = text

    async def usable_turn(self, rid: str, task: Task, messages: list[dict[str, Any]], tools: Tools,
                          script: AgentScript) -> tuple[Turn, list[dict[str, Any]]]:
        """A model turn and its calls' arguments, sent again (repair) while it is unusable."""
        attempts, attempt = 1 + (self.spec.retries if self.spec.repair else 0), 1
        while True:
            task.turns += 1
            task.retries += attempt > 1
            try:
                reply = await self.model_turn(f"{self.spec.name}-{rid}-a{attempt}", messages, tools)
                task.tokens += reply.tokens
                return reply, check_calls(reply, tools, script)
            except TaskFailed as e:
                if e.kind not in RETRIED or attempt == attempts:
                    raise
            attempt += 1

    async def model_turn(self, rid: str, messages: list[dict[str, Any]], tools: Tools) -> Turn:
        import openai
        s, turn = self.spec, Turn()
        kw: dict[str, Any] = {"model": s.model, "messages": messages, "temperature": 0, "max_tokens": s.max_tokens,
                              "extra_headers": {"x-request-id": rid}}
        if tools.offered:  # none where the toolset was dropped (keep_toolset: false)
            kw["tools"] = tools.offered
        try:
            if not s.stream:
                read_whole(turn, await self._client.chat.completions.create(**kw))
            else:
                async for chunk in await self._client.chat.completions.create(**kw, stream=True):
                    read_chunk(turn, chunk)
        except openai.APIError as e:
            raise TaskFailed("model_error", f"{type(e).__name__}: {e}"[:200]) from None
        if turn.finish is None:
            raise TaskFailed("truncated", "the answer ended without a finish_reason")
        return turn

    def summarize(self, done: list[tuple[Task, float]]) -> dict[str, Any]:
        counts = dict.fromkeys(KINDS, 0)
        for task, _ in done:
            if task.failure is not None:
                counts[task.failure.kind] += 1
        n, failed = len(done), sum(counts.values())
        out: dict[str, Any] = {
            "tasks": n, "succeeded": n - failed, "failed": failed, "success_rate": (n - failed) / n,
            "turns": sum(t.turns for t, _ in done) / n, "tool_calls": sum(t.tool_calls for t, _ in done),
            "tool_errors": sum(t.tool_errors for t, _ in done), "retries": sum(t.retries for t, _ in done),
            "task_s": sum(d for _, d in done) / n, "task_s_max": max(d for _, d in done),
            "tokens": sum(t.tokens for t, _ in done), "recorded": len(self._expected)}
        for kind, c in counts.items():
            out[f"failures.{kind}"] = c
            out[f"failure_share.{kind}"] = c / n
        first = next((t.failure for t, _ in done if t.failure is not None), None)
        if first is not None:
            out["first_failure"] = f"{first.kind}: {first}"
        return out

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


async def end_quietly(client: Any) -> None:
    try:
        await client.__aexit__(None, None, None)
    except Exception:  # noqa: BLE001, S110 - the session's end; the tasks' outcomes are already known
        pass


def cause(e: BaseException) -> str:
    """Why the MCP client failed a call: timeout (its own read timeout, -32001), session (HTTP 404 to the
    session's id: -32600 'Session not found' from the server, or the client's 'Session terminated'), error."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    code, message = getattr(e, "code", None), str(getattr(e, "message", ""))
    if code == -32001:
        return "timeout"
    return "session" if code == -32600 and message.startswith("Session ") else "error"


def leaf(e: BaseException) -> str:
    """What went wrong, out of the exception groups the MCP client's task groups wrap it in."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"[:200]


def read_chunk(turn: Turn, chunk: Any) -> None:
    """One streamed chunk: text and tool-call fragments added (by the call's index), the finish_reason kept."""
    for choice in chunk.choices or ():
        delta = choice.delta
        if delta is not None and delta.content:
            turn.text += delta.content
            turn.tokens += 1
        for tc in (delta.tool_calls if delta is not None else None) or ():
            call = turn.calls.setdefault(tc.index, ["", "", ""])
            fn = tc.function
            call[0] = tc.id or call[0]
            call[1] = (fn.name if fn is not None and fn.name else "") or call[1]
            if fn is not None and fn.arguments:
                call[2] += fn.arguments
                turn.tokens += 1
        turn.finish = choice.finish_reason or turn.finish


def read_whole(turn: Turn, answer: Any) -> None:
    for choice in answer.choices or ():
        msg = choice.message
        turn.text += msg.content or ""
        for i, tc in enumerate(msg.tool_calls or ()):
            turn.calls[i] = [tc.id, tc.function.name, tc.function.arguments or ""]
        turn.finish = choice.finish_reason or turn.finish
    usage = getattr(answer, "usage", None)
    turn.tokens = usage.completion_tokens if usage is not None and usage.completion_tokens else 0


def check_calls(turn: Turn, tools: Tools, script: AgentScript) -> list[dict[str, Any]]:
    """The arguments of each tool call (strict: a tool offered, arguments that parse and fit its schema, the
    script's where it gives them, finish_reason tool_calls), or TaskFailed."""
    out: list[dict[str, Any]] = []
    for _, (_, name, text) in sorted(turn.calls.items()):
        if name not in tools.schemas:
            raise TaskFailed("wrong_tool", f"a call of {name!r}, not a tool offered")
        args, why = parse_arguments(text, tools.schemas[name])
        if args is None:
            raise TaskFailed("bad_arguments", f"{name}: {why}")
        if name == script.tool and script.arguments is not None and args != script.arguments:
            raise TaskFailed("bad_arguments", f"{name}: arguments {args}, the script's are {script.arguments}")
        out.append(args)
    if turn.calls and turn.finish != "tool_calls":
        raise TaskFailed("truncated", f"tool calls with finish_reason {turn.finish!r}, not 'tool_calls'")
    return out
