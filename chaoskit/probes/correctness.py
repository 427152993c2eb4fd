"""correctness probe: greedy requests with fixed prompts, each answer compared with a recorded or golden one."""

from __future__ import annotations

import asyncio
import difflib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.model.types import Duration, StrictModel, Url, check_url
from chaoskit.probes.agent_tools import parse_object
from chaoskit.probes.base import Probe, ProbeSpecBase, RequestTarget, http_session

if TYPE_CHECKING:
    import aiohttp  # for types: fetch and http_session import it where they run (~0.1 s a process)

# a failed answer's kind (classify): error, empty, truncated, and against the expected answer: restarted (a prefix
# of it, then all of it: a failover that started the stream again), duplicated (a piece of it twice), gap (a piece
# of it missing), mismatch (anything else); schema: with `schema`, an answer that is not JSON or breaks it
KINDS = ("mismatch", "empty", "truncated", "error", "restarted", "duplicated", "gap", "schema")
_KEYS = ("requests", "ok", "failed", "failed_share", "recorded", "failures.", "failure_share.")
EXAMPLE = {"name": "answers", "type": "correctness", "url": "http://127.0.0.1:8000", "api": "openai-chat",
           "model": "my-model", "prompts": ["What is the capital of France?", {"prompt": "2 + 2 =", "answer": " 4"}],
           "stream": "both", "expect": {"failed": "== 0"}}


class GoldenPrompt(StrictModel):
    prompt: str = Field(min_length=1, description="the prompt (openai, triton) or the user message (openai-chat)")
    answer: str | None = Field(None, description="the golden answer, exactly; none: the first whole answer to "
                               "the prompt in the probe's first sample (its before phase) is recorded; a prompt "
                               "that got none there is judged on errors, empty and truncated answers only")


class CorrectnessProbeSpec(ProbeSpecBase):
    model_config = {"json_schema_extra": {"examples": [EXAMPLE]}}

    type: Literal["correctness"]
    url: Url = Field(pattern=r"^https?://", description="base URL of the endpoint (http://host:port)")
    record_url: str | None = Field(None, pattern=r"^https?://", description="where the answers are recorded "
                                   "from (the probe's first sample; default: url): the upstream itself when url "
                                   "is an llm.proxy that only listens while its fault is in effect")
    api: Literal["openai", "openai-chat", "triton"] = Field(
        "openai", description="openai: /v1/completions; openai-chat: /v1/chat/completions; triton: "
                              "/v2/models/MODEL/generate_stream (stream) or generate")
    model: str | None = Field(None, description="model name (openai: required; triton: default tiny_lm)")
    prompts: list[str | GoldenPrompt] = Field(default_factory=list, description="the prompts, sent in turn: "
                                              "text, or {prompt, answer} with a golden answer")
    prompts_file: str | None = Field(None, description="more prompts: one per line, or JSON lines "
                                     "{\"prompt\": ..., \"answer\": ...} (e.g. {experiment.dir}/prompts.jsonl)")
    stream: bool | Literal["both"] = Field(True, description="SSE streams (true), whole JSON answers (false), or "
                                           "both in turn (each prompt's answer is the same either way)")
    requests: int = Field(50, ge=1, description="requests per sample, the prompts in turn")
    concurrency: int = Field(8, ge=1, le=256, description="requests in flight at once")
    max_tokens: int = Field(16, gt=0, description="max_tokens of each request (temperature is always 0)")
    json_schema: dict[str, Any] | None = Field(
        None, alias="schema", description="openai-chat: structured answers; each request asks for them "
        "(response_format json_schema with this JSON Schema, an object's) and an answer that is not a JSON object "
        "fitting it (its required properties, the types and enums of its top-level ones) fails as `schema`")
    request_timeout: Duration = Field(10.0, gt=0, description="per request: no whole answer by then is an error")
    headers: dict[str, str] = Field(default_factory=dict, description="request headers (e.g. Authorization)")
    timeout: Duration | None = Field(None, description="the whole sample (default: request_timeout x the rounds "
                                     "of concurrency requests + 5s)")
    expect_keys: ClassVar[tuple[str, ...]] = _KEYS

    @field_validator("record_url")
    @classmethod
    def _record_url(cls, v: str | None) -> str | None:
        return v if v is None else check_url(v)

    def request_target(self) -> RequestTarget:
        return RequestTarget(self.url, self.request_timeout)

    @model_validator(mode="after")
    def _check_spec(self) -> CorrectnessProbeSpec:
        if self.timeout is None:
            rounds = math.ceil(self.requests / self.concurrency)
            object.__setattr__(self, "timeout", self.request_timeout * rounds + 5.0)
        if self.api != "triton" and not self.model:
            raise ValueError(f"api {self.api} needs model")
        if self.json_schema is not None and self.api != "openai-chat":
            raise ValueError(f"schema: structured answers need api openai-chat (response_format), not {self.api}")
        if not self.prompts and not self.prompts_file:
            raise ValueError("no prompts: give prompts, prompts_file or both")
        if "before" not in self.phases and self.prompts_file is None and not all_golden(self.prompts):
            raise ValueError(f"prompts without an answer are recorded in the before phase, but phases "
                             f"({', '.join(self.phases)}) leave it out: add before, or give each prompt its answer")
        for key in ("failures", "failure_share"):
            for kind in self.expect.get(key) or {}:  # type: ignore[union-attr]
                if kind not in KINDS:
                    close = difflib.get_close_matches(kind, KINDS, n=1)
                    raise ValueError(f"expect.{key}.{kind}: unknown kind" + (f" (did you mean '{close[0]}'?)"
                                     if close else "") + f"; kinds: {', '.join(KINDS)}")
        return self


def all_golden(prompts: list[str | GoldenPrompt]) -> bool:
    return all(isinstance(p, GoldenPrompt) and p.answer is not None for p in prompts)


def read_prompts(path: str) -> list[GoldenPrompt]:
    """A prompts file: one prompt per line, or JSON lines {"prompt": ..., "answer": ...}."""
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError as e:
        raise PreflightError(f"prompts file {path}: {e.strerror}") from None
    out: list[GoldenPrompt] = []
    for n, line in enumerate(lines, 1):
        if not line.lstrip().startswith("{"):
            out.append(GoldenPrompt(prompt=line))
            continue
        try:
            out.append(GoldenPrompt.model_validate_json(line))
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise PreflightError(f"prompts file {path}, line {n}: {where + ': ' if where else ''}{err['msg']}") from None
    if not out:
        raise PreflightError(f"prompts file {path}: no prompts")
    return out


@dataclass(frozen=True)
class Answer:
    """One answer as the client saw it."""

    text: str = ""
    finished: bool = False  # the server said it was whole: a finish_reason (and [DONE] for OpenAI streams)
    error: str | None = None  # no answer: the connection, a timeout, a status, an error object, bad JSON


def classify(a: Answer, expected: str | None, schema: dict[str, Any] | None = None) -> str | None:
    """The failure kind of an answer (None: correct, or the first answer of a prompt yet to be recorded). A
    stream cut, ended without its end markers, or a strict prefix of the expected answer is truncated; a whole
    answer that does not fit the schema asked for is schema."""
    if a.error is not None:
        return "error"
    if not a.text:
        return "empty"
    if not a.finished or (expected is not None and len(a.text) < len(expected) and expected.startswith(a.text)):
        return "truncated"
    if schema is not None and parse_object(a.text, schema)[0] is None:
        return "schema"
    if expected is not None and a.text != expected:
        return against(a.text, expected)
    return None


def against(text: str, expected: str) -> str:
    """How a whole answer differs from the expected one: restarted, duplicated, gap or mismatch."""
    head = len(os.path.commonprefix([text, expected]))
    tail = len(os.path.commonprefix([text[::-1], expected[::-1]]))
    if len(text) > len(expected):
        start = len(text) - len(expected)
        if text.endswith(expected) and expected.startswith(text[:start]):
            return "restarted"
        if head + tail >= len(expected):  # the expected answer with a piece of it repeated
            return "duplicated"
    elif head + tail >= len(text) and head < len(text):  # the expected answer with a piece of it cut out
        return "gap"
    return "mismatch"


def request_for(s: CorrectnessProbeSpec, base: str, prompt: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """(URL, JSON body) of one greedy request."""
    base = base.rstrip("/")
    if s.api == "triton":
        name = s.model or "tiny_lm"
        return (f"{base}/v2/models/{name}/generate_stream" if stream else f"{base}/v2/models/{name}/generate",
                {"text_input": prompt, "max_tokens": s.max_tokens})
    body: dict[str, Any] = {"model": s.model, "max_tokens": s.max_tokens, "temperature": 0, "stream": stream}
    if s.api == "openai-chat":
        if s.json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer",
                                                                              "schema": s.json_schema}}
        return f"{base}/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    return f"{base}/v1/completions", {**body, "prompt": prompt}


@dataclass
class _Reader:
    """What the events (or the whole JSON answer) of one response said."""

    api: str
    max_tokens: int
    text: str = ""
    finish: str | None = None
    done: bool = False  # [DONE]
    tokens: int | None = None  # usage.completion_tokens
    error: str | None = None

    def take(self, doc: Any, stream: bool) -> None:
        if not isinstance(doc, dict):
            self.error = f"not a JSON object: {str(doc)[:80]}"
            return
        if "error" in doc:
            self.error = f"error object: {json.dumps(doc['error'])[:200]}"
            return
        if self.api == "triton":
            self.text += str(doc.get("text_output") or "")
            return
        usage = doc.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.tokens = usage["completion_tokens"]
        path = ("text",) if self.api == "openai" else ("delta" if stream else "message", "content")
        for choice in doc.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            part: Any = choice
            for key in path:
                part = part.get(key) if isinstance(part, dict) else None
            self.text += part if isinstance(part, str) else ""
            self.finish = choice.get("finish_reason") or self.finish

    def answer(self, stream: bool) -> Answer:
        if self.error is not None:
            return Answer(self.text, False, self.error)
        if self.api == "triton":
            return Answer(self.text, True)
        short = self.finish == "length" and self.tokens is not None and self.tokens < self.max_tokens
        return Answer(self.text, self.finish is not None and not short and (self.done or not stream))


async def fetch(session: aiohttp.ClientSession, s: CorrectnessProbeSpec, base: str, prompt: str,
                stream: bool) -> Answer:
    """One request, read whole: a connection cut mid-stream is a truncated answer (what came before it)."""
    import aiohttp

    url, body = request_for(s, base, prompt, stream)
    r = _Reader(s.api, s.max_tokens)
    try:
        async with asyncio.timeout(s.request_timeout):
            async with session.post(url, json=body, headers=s.headers) as resp:
                if resp.status != 200:
                    return Answer(error=f"HTTP {resp.status}")
                if not stream:
                    r.take(json.loads(await resp.read()), stream)
                    return r.answer(stream)
                try:
                    async for line in resp.content:
                        _event_line(r, line)
                        if r.error is not None:
                            break
                except aiohttp.ClientPayloadError:  # cut: truncated, or no answer at all before the cut
                    return Answer(r.text, False, r.error or (None if r.text else "cut before any token"))
                return r.answer(stream)
    except TimeoutError:
        return Answer(error=f"no whole answer within {s.request_timeout:g}s")
    except (aiohttp.ClientError, OSError, ValueError) as e:
        return Answer(error=f"{type(e).__name__}: {e}"[:200])


def _event_line(r: _Reader, line: bytes) -> None:
    if not line.startswith(b"data:"):
        return
    data = line[5:].strip()
    if data == b"[DONE]":
        r.done = True
        return
    try:
        r.take(json.loads(data), stream=True)
    except ValueError:
        r.error = f"malformed event: {data[:80]!r}"


class CorrectnessProbe(Probe):
    type: ClassVar[str] = "correctness"
    summary: ClassVar[str] = ("greedy answers to fixed prompts vs recorded/golden ones: mismatch, empty, "
                              "truncated, error")
    Spec = CorrectnessProbeSpec
    spec: CorrectnessProbeSpec

    def __init__(self, spec: CorrectnessProbeSpec):
        super().__init__(spec)
        self._session: aiohttp.ClientSession | None = None
        self._prompts: list[GoldenPrompt] | None = None
        self._expected: dict[int, str] = {}  # prompt index: its golden or recorded answer
        self._samples = 0

    def preflight(self) -> None:
        prompts = self.prompts()
        missing = [p.prompt for p in prompts if p.answer is None]
        if missing and "before" not in self.spec.phases:
            raise PreflightError(f"correctness probe {self.spec.name}: {len(missing)} prompt(s) without an answer "
                                 f"(e.g. {missing[0][:60]!r}) and phases without before, where they are recorded")

    def prompts(self) -> list[GoldenPrompt]:
        if self._prompts is None:
            inline = [p if isinstance(p, GoldenPrompt) else GoldenPrompt(prompt=p) for p in self.spec.prompts]
            self._prompts = inline + (read_prompts(self.spec.prompts_file) if self.spec.prompts_file else [])
            self._expected = {i: p.answer for i, p in enumerate(self._prompts) if p.answer is not None}
        return self._prompts

    async def measure(self) -> dict[str, Any]:
        s, prompts = self.spec, self.prompts()
        if self._session is None:
            self._session = http_session()
        recording = self._samples == 0  # only the first sample (the before phase) records answers
        base = s.record_url if recording and s.record_url else s.url
        self._samples += 1
        gate = asyncio.Semaphore(s.concurrency)
        counts = dict.fromkeys(KINDS, 0)
        first: list[str] = []

        async def one(i: int) -> None:
            k = i % len(prompts)
            stream = s.stream if isinstance(s.stream, bool) else (i // len(prompts)) % 2 == 0
            async with gate:
                a = await fetch(self._session, s, base, prompts[k].prompt, stream)  # type: ignore[arg-type]
            kind = classify(a, self._expected.get(k), s.json_schema)
            if kind is None:
                if recording:
                    self._expected.setdefault(k, a.text)  # the first whole answer of a prompt is its record
                return
            counts[kind] += 1
            if not first:
                first.append(f"prompt {k} ({'stream' if stream else 'json'}): {kind}: "
                             + (a.error or (parse_object(a.text, s.json_schema)[1] if kind == "schema" else None)
                                or f"got {a.text[:60]!r}, expected {self._expected.get(k, '')[:60]!r}"))

        await asyncio.gather(*(one(i) for i in range(s.requests)))
        failed = sum(counts.values())
        out: dict[str, Any] = {"requests": s.requests, "ok": s.requests - failed, "failed": failed,
                               "failed_share": failed / s.requests, "recorded": len(self._expected)}
        for kind, n in counts.items():
            out[f"failures.{kind}"] = n
            out[f"failure_share.{kind}"] = n / s.requests
        if first:
            out["first_failure"] = first[0]
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
