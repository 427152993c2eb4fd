"""The faults of one llm.proxy process, as data: which requests each matches, the seeded share draws, the
token buckets of rate_limit, what each fault did (counters), and the per-request Plan the server carries out.

Wire format (from chaoskit.injectors.llm_proxy.fault): a list of FaultJson, each with `name`, `type`, `share`,
`match` ({path: [globs], model: glob|None, headers: {name: glob}}) and `params`, the type's parameters in seconds /
counts, read into the type's parameter record (PARAMS)."""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from fnmatch import translate
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, NotRequired, TypedDict, TypeVar

from chaoskit.injectors.proxy.counts import CountsJson, FaultCounts

LOCAL = ("abort", "rate_limit")
RESPONSE = ("token_delay", "stall", "truncate", "malformed", "corrupt_tokens", "tool_args", "error_event",
            "schema_break")
MAX_KEYS = 10_000  # rate_limit buckets kept per fault (a per-request key would otherwise grow without end)
_MODEL = re.compile(rb'"model"\s*:\s*"([^"]*)"')
_STREAM = re.compile(rb'"stream"\s*:\s*true')
_TRITON_MODEL = re.compile(r"^/v2/models/([^/]+)/")

if TYPE_CHECKING:
    from chaoskit.injectors.proxy.trace import SinkStats


Scalar = str | int | float | bool | None


class MatchJson(TypedDict, total=False):
    """A fault's `match` on the wire (each part left out: any)."""

    path: list[str]
    model: str | None
    headers: dict[str, str]


class FaultJson(TypedDict):
    """One fault on the wire: its name and type, share and match, and its type's parameters (PARAMS[type]'s
    fields, scalars)."""

    name: str
    type: str
    share: NotRequired[float]
    match: NotRequired[MatchJson]
    params: NotRequired[dict[str, Scalar]]


class ProxyJson(TypedDict):
    """llm.proxy's faults on the wire (LlmProxySpec.wire): the seed of its draws and the faults in order."""

    seed: int
    faults: list[FaultJson]


# ---------------------------------------------------------------- each type's parameters (fault.py's specs' fields)

@dataclass(frozen=True)
class AbortParams:
    status: int = 503
    retry_after: int | None = None


@dataclass(frozen=True)
class DelayParams:
    delay: float
    jitter: float = 0.0


@dataclass(frozen=True)
class TokenDelayParams:
    delay: float
    jitter: float = 0.0
    distribution: Literal["uniform", "normal", "exponential"] = "uniform"

    def gap_s(self, draws: random.Random) -> float:
        """One gap: fixed, or drawn from its distribution (never negative)."""
        d, j = self.delay, self.jitter
        if self.distribution == "exponential":
            return draws.expovariate(1.0 / d)
        if not j:
            return d
        g = draws.uniform(d - j, d + j) if self.distribution == "uniform" else draws.gauss(d, j)
        return max(0.0, g)


@dataclass(frozen=True)
class StallParams:
    after_tokens: int
    duration: float = 0.0


@dataclass(frozen=True)
class TruncateParams:
    after_tokens: int
    clean: bool = False


@dataclass(frozen=True)
class CorruptTokensParams:
    token_share: float = 1.0
    text: str = "\ufffd"


@dataclass(frozen=True)
class MalformedParams:
    corrupt: Literal["bad_json", "missing_data", "error_object"] = "bad_json"
    after_tokens: int = 0


@dataclass(frozen=True)
class RateLimitParams:
    requests_per_s: float | None = None
    tokens_per_s: float | None = None
    burst: float | None = None
    key: str = "client"  # client, or header:NAME
    retry_after: bool = True


@dataclass(frozen=True)
class ToolArgsParams:
    mode: Literal["cut", "invalid_json", "bad_escape", "wrong_tool_name", "duplicate_call", "finish_stop"]


@dataclass(frozen=True)
class ErrorEventParams:
    after_tokens: int = 0
    done: bool = True
    message: str = "llm.proxy: injected error"
    error_type: str = "InternalServerError"
    code: int = 500


@dataclass(frozen=True)
class SchemaBreakParams:
    mode: Literal["drop_required", "wrong_type"] = "drop_required"


Params = (AbortParams | DelayParams | TokenDelayParams | StallParams | TruncateParams | CorruptTokensParams
          | MalformedParams | RateLimitParams | ToolArgsParams | ErrorEventParams | SchemaBreakParams)
PARAMS: dict[str, type[Params]] = {
    "abort": AbortParams, "delay": DelayParams, "token_delay": TokenDelayParams, "stall": StallParams,
    "truncate": TruncateParams, "corrupt_tokens": CorruptTokensParams, "malformed": MalformedParams,
    "rate_limit": RateLimitParams, "tool_args": ToolArgsParams, "error_event": ErrorEventParams,
    "schema_break": SchemaBreakParams}
P = TypeVar("P", bound=Params)


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(translate(pattern))


class Request:
    """One parsed request: what matching needs, extracted lazily (most requests never need the body)."""

    __slots__ = ("method", "path", "raw_head", "body", "client", "_model", "_headers")

    def __init__(self, method: bytes, path: str, raw_head: bytes, body: bytes, client: str):
        self.method, self.path, self.raw_head, self.body, self.client = method, path, raw_head, body, client
        self._model: str | None | bool = False
        self._headers: dict[str, str | None] = {}

    def model(self) -> str | None:
        if self._model is False:
            m = _TRITON_MODEL.match(self.path)
            if m:
                self._model = m.group(1)
            else:
                b = _MODEL.search(self.body)
                self._model = b.group(1).decode("utf-8", "replace") if b else None
        return self._model  # type: ignore[return-value]

    def header(self, name: str) -> str | None:
        if name not in self._headers:
            m = re.search(rb"\r\n" + re.escape(name.encode()) + rb"[ \t]*:[ \t]*([^\r\n]*)", self.raw_head,
                          re.IGNORECASE)
            self._headers[name] = m.group(1).strip().decode("latin-1") if m else None
        return self._headers[name]

    def streaming(self) -> bool:
        return self.path.endswith("/generate_stream") or _STREAM.search(self.body) is not None


class Bucket:
    """A token bucket: `rate` per second up to `burst`."""

    __slots__ = ("rate", "burst", "level", "at")

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst, self.level, self.at = rate, burst, burst, time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self) -> float:
        """Seconds until one whole unit is available (0: now)."""
        return max(0.0, (1.0 - self.level) / self.rate)


@dataclass
class Fault(Generic[P]):
    name: str
    type: str
    share: float
    params: P  # its type's parameter record
    paths: re.Pattern[str]
    model: re.Pattern[str] | None
    headers: list[tuple[str, re.Pattern[str]]]
    rng: random.Random
    gaps: random.Random  # token_delay's draws: their own stream, so the share draws never depend on stream lengths
    buckets: dict[str, Bucket] = field(default_factory=dict)
    matched: int = 0  # requests its match selected
    selected: int = 0  # ... of which its share drew this many
    applied: int = 0  # ... and on this many its effect really happened (a cut made, a 429 sent, a gap added)

    def hit(self, req: Request) -> bool:
        if self.paths.match(req.path) is None:
            return False
        if self.model is not None and ((m := req.model()) is None or self.model.match(m) is None):
            return False
        for name, pattern in self.headers:
            v = req.header(name)
            if v is None or pattern.match(v) is None:
                return False
        return True

    def gap_s(self: Fault[TokenDelayParams]) -> float:
        """One token_delay gap (its own seeded stream)."""
        return self.params.gap_s(self.gaps)

    def corrupts(self: Fault[CorruptTokensParams]) -> bool:
        """corrupt_tokens: whether this token event's text is replaced (its own seeded stream, like the gaps)."""
        share = self.params.token_share
        return share >= 1.0 or (share > 0.0 and self.gaps.random() < share)

    def bucket(self: Fault[RateLimitParams], req: Request) -> Bucket:
        p = self.params
        key = req.client if p.key == "client" else (req.header(p.key[7:]) or "")
        b = self.buckets.get(key)
        if b is None:
            if len(self.buckets) >= MAX_KEYS:
                self.buckets.clear()
            rate = p.requests_per_s or p.tokens_per_s or 1.0
            b = self.buckets[key] = Bucket(rate, p.burst or max(1.0, rate))
        return b


@dataclass
class Local:
    """An answer the proxy gives itself, without the upstream."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    fault: Fault[Params]


@dataclass
class Plan:
    """What the selected faults do to one request (None from FaultTable.plan: nothing, the fast path)."""

    names: list[str] = field(default_factory=list)
    local: Local | None = None
    delay: Fault[DelayParams] | None = None
    delay_s: float = 0.0
    token_delay: Fault[TokenDelayParams] | None = None
    stall: Fault[StallParams] | None = None
    truncate: Fault[TruncateParams] | None = None
    malformed: Fault[MalformedParams] | None = None  # in-stream corruption (a non-streaming error_object: `local`)
    corrupt_tokens: Fault[CorruptTokensParams] | None = None  # token text replaced (SSE only; JSON passes unchanged)
    tokens: Bucket | None = None  # rate_limit tokens_per_s: the bucket each forwarded token is taken from
    tool_args: Fault[ToolArgsParams] | None = None  # tool calls broken (llm_proxy.answers; streamed or whole)
    error_event: Fault[ErrorEventParams] | None = None  # an error event inside a 200 stream (SSE streams only)
    schema_break: Fault[SchemaBreakParams] | None = None  # a json_schema answer breaking its schema (either form)

    def on_events(self) -> bool:
        return bool(self.token_delay or self.stall or self.truncate or self.malformed or self.corrupt_tokens
                    or self.tokens or self.tool_args or self.error_event or self.schema_break)

    def rewrites(self) -> bool:
        """Whether a whole (non-streamed) JSON answer is read in full and rewritten."""
        return bool(self.tool_args or self.schema_break)


def error_body(path: str, message: str, code: int) -> bytes:
    """An error object as the API would send it: Triton's {"error": "..."}, OpenAI's {"error": {...}}."""
    if path.startswith("/v2/"):
        return json.dumps({"error": message}).encode()
    return json.dumps({"error": {"message": message, "type": "chaoskit_fault", "code": code}}).encode()


StatsJson = dict[str, int | str | dict[str, CountsJson] | dict[str, str | int | None]]  # ProxyStats.to_json


class ProxyStats(NamedTuple):
    """The proxy's /chaoskit/stats answer: the requests it received (its own endpoints aside), those answered 502
    (the upstream could not be reached), each fault's counts by name; why the latest upstream connection failed
    and, in a traced run, what its spans did (None: neither)."""

    requests: int
    upstream_errors: int
    faults: dict[str, FaultCounts]
    upstream_error: str | None = None
    otlp: SinkStats | None = None

    def to_json(self) -> StatsJson:
        """Its JSON (and the journal's fault_observed details): upstream_error and otlp only where set."""
        out: StatsJson = {
            "requests": self.requests, "upstream_errors": self.upstream_errors,
            "faults": {name: c.to_json() for name, c in self.faults.items()}}
        if self.upstream_error:
            out["upstream_error"] = self.upstream_error
        if self.otlp is not None:
            out["otlp"] = self.otlp.to_json()
        return out

    @classmethod
    def read(cls, data: Any) -> ProxyStats | None:
        """From a /chaoskit/stats answer; None for what is not one of ours (no answer, another server's)."""
        try:
            return cls.from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    @classmethod
    def from_json(cls, data: Any) -> ProxyStats:
        """From the proxy's answer (to_json's form)."""
        from chaoskit.injectors.proxy.trace import SinkStats

        otlp = data.get("otlp")
        return cls(data["requests"], data["upstream_errors"],
                   {name: FaultCounts(**c) for name, c in data["faults"].items()}, data.get("upstream_error"),
                   SinkStats(**otlp) if otlp is not None else None)


class FaultTable:
    def __init__(self, wire: list[FaultJson], seed: int):
        self.faults = [self._fault(i, f, seed) for i, f in enumerate(wire)]

    @staticmethod
    def _fault(i: int, f: FaultJson, seed: int) -> Fault[Params]:
        match = f.get("match") or {}
        paths = match.get("path") or ["*"]
        params = PARAMS[f["type"]](**f.get("params", {}))  # type: ignore[arg-type]  # the spec's own fields
        return Fault(f["name"], f["type"], float(f.get("share", 1.0)), params,
                     re.compile("|".join(f"(?:{translate(p)})" for p in paths)),
                     _glob(match["model"]) if match.get("model") else None,
                     [(k, _glob(v)) for k, v in (match.get("headers") or {}).items()],
                     random.Random(f"{seed}:{i}:share"), random.Random(f"{seed}:{i}:gaps"))

    def plan(self, req: Request) -> Plan | None:
        """Draw every matching fault's share for this request (each fault's own seeded stream: the k-th request a
        fault matches gets the same draw in every run with that seed) and combine what was selected."""
        plan: Plan | None = None
        for f in self.faults:
            if not f.hit(req):
                continue
            f.matched += 1
            if f.share < 1.0 and (f.share <= 0.0 or f.rng.random() >= f.share):
                continue
            f.selected += 1
            if plan is None:
                plan = Plan()
            plan.names.append(f.name)
            self._add(plan, f, req)
        return plan

    @staticmethod
    def _add(plan: Plan, f: Fault[Any], req: Request) -> None:
        if plan.local is not None:
            return  # answered already by an earlier fault: selected, not applied
        p, t = f.params, f.type
        if isinstance(p, AbortParams):
            headers = [("Retry-After", str(p.retry_after))] if p.retry_after is not None else []
            plan.local = Local(p.status, headers, error_body(req.path, f"llm.proxy fault {f.name}: HTTP "
                                                                       f"{p.status}", p.status), f)
        elif isinstance(p, RateLimitParams):
            b = f.bucket(req)
            b.refill(time.monotonic())
            if b.level >= 1.0:
                if p.requests_per_s:
                    b.level -= 1.0
                else:
                    plan.tokens = b
                return
            headers = [("Retry-After", str(max(1, math.ceil(b.wait_s()))))] if p.retry_after else []
            plan.local = Local(429, headers, error_body(req.path, f"llm.proxy fault {f.name}: rate limit", 429), f)
        elif isinstance(p, MalformedParams) and p.corrupt == "error_object" and not req.streaming():
            plan.local = Local(200, [], error_body(req.path, f"llm.proxy fault {f.name}: injected error", 500), f)
        elif isinstance(p, DelayParams):
            if plan.delay is None:
                plan.delay = f
                j = p.jitter
                plan.delay_s = max(0.0, p.delay + (f.gaps.uniform(-j, j) if j else 0.0))
        elif t in RESPONSE and getattr(plan, t) is None:
            setattr(plan, t, f)

    # ---------------------------------------------------------------- what it did

    def stats(self, requests: int, upstream_errors: int) -> ProxyStats:
        return ProxyStats(requests, upstream_errors, {
            f.name: FaultCounts(f.type, f.share, f.matched, f.selected, f.applied,
                                round(f.applied / f.matched, 6) if f.matched else None)
            for f in self.faults})

    def metrics(self, requests: int, upstream_errors: int, connections: int) -> bytes:
        out = ["# HELP llm_proxy_requests_total requests the proxy received (its own /chaoskit/ endpoints aside)",
               "# TYPE llm_proxy_requests_total counter", f"llm_proxy_requests_total {requests}",
               "# HELP llm_proxy_upstream_errors_total requests answered 502: the upstream could not be reached",
               "# TYPE llm_proxy_upstream_errors_total counter", f"llm_proxy_upstream_errors_total {upstream_errors}",
               "# HELP llm_proxy_connections client connections open now",
               "# TYPE llm_proxy_connections gauge", f"llm_proxy_connections {connections}"]
        for what, doc in (("matched", "requests the fault's match selected"),
                          ("selected", "matched requests its share drew"),
                          ("applied", "selected requests on which its effect really happened")):
            out += [f"# HELP llm_proxy_fault_{what}_total {doc}", f"# TYPE llm_proxy_fault_{what}_total counter"]
            out += [f'llm_proxy_fault_{what}_total{{fault="{f.name}",type="{f.type}"}} {getattr(f, what)}'
                    for f in self.faults]
        return ("\n".join(out) + "\n").encode()
