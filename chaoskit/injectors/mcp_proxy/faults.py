"""The faults of one mcp.proxy process, as data: which JSON-RPC requests each matches (method, tool name), the
seeded share draws, the sessions forgotten, what each fault did (counters), and the per-request Plan the server
carries out.

Wire format (from chaoskit.injectors.mcp_proxy.fault): a list of McpFaultJson, each with `name`, `type`, `share`,
`match` ({method: [globs], tool: [globs] | None}) and `params`, the type's parameters in seconds / counts, read
into the type's parameter record (PARAMS)."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from fnmatch import translate
from typing import Any, NamedTuple, TypedDict

from chaoskit.injectors.proxy.counts import CountsJson, FaultCounts

LOCAL = ("error", "timeout", "session_lost")  # answered (or held) by the proxy, the server never asked
MAX_FORGOTTEN = 100_000  # session ids kept (a client making sessions without end would otherwise grow this)


class Call(NamedTuple):
    """What matching needs of one HTTP request: its JSON-RPC method, id and tool name (None where the body is no
    JSON-RPC request: a notification, a response, a GET or DELETE) and its Mcp-Session-Id."""

    method: str | None
    id: Any
    tool: str | None
    session: str | None

    @classmethod
    def of(cls, body: bytes, session: str | None) -> Call:
        try:
            msg = json.loads(body) if body else None
        except ValueError:
            msg = None
        if not isinstance(msg, dict) or not isinstance(msg.get("method"), str) or "id" not in msg:
            return cls(None, None, None, session)
        params = msg.get("params")
        tool = params.get("name") if isinstance(params, dict) and msg["method"] == "tools/call" else None
        return cls(msg["method"], msg["id"], tool if isinstance(tool, str) else None, session)


class McpMatchJson(TypedDict):
    """A fault's `match` on the wire: globs on the JSON-RPC method, and on the tool name (None: any)."""

    method: list[str]
    tool: list[str] | None


class McpFaultJson(TypedDict):
    """One fault on the wire: its name, type, share and match, and its type's parameters (PARAMS[type]'s
    fields)."""

    name: str
    type: str
    share: float
    match: McpMatchJson
    params: dict[str, str | int | float | list[str]]


class McpProxyJson(TypedDict):
    """mcp.proxy's faults on the wire (McpProxySpec.wire): the seed of its draws and the faults in order."""

    seed: int
    faults: list[McpFaultJson]


@dataclass(frozen=True)
class ErrorParams:
    code: int = -32603
    message: str = "mcp.proxy: injected error"


@dataclass(frozen=True)
class DelayParams:
    delay: float
    jitter: float = 0.0


@dataclass(frozen=True)
class SseCutParams:
    after_events: int = 0


@dataclass(frozen=True)
class ToolsChangeParams:
    remove: tuple[str, ...]


@dataclass(frozen=True)
class NoParams:
    """timeout and session_lost: nothing to set."""


Params = ErrorParams | DelayParams | SseCutParams | ToolsChangeParams | NoParams
PARAMS: dict[str, type[Params]] = {"error": ErrorParams, "delay": DelayParams, "timeout": NoParams,
                                   "sse_cut": SseCutParams, "session_lost": NoParams,
                                   "tools_change": ToolsChangeParams}


def read_params(type_: str, wire: dict[str, str | int | float | list[str]]) -> Params:
    """The type's parameter record from its wire form (a list becomes a tuple: the record is frozen)."""
    return PARAMS[type_](**{k: tuple(v) if isinstance(v, list) else v for k, v in wire.items()})


def _globs(patterns: list[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns))


@dataclass
class Fault:
    name: str
    type: str
    share: float
    params: Params
    methods: re.Pattern[str]
    tools: re.Pattern[str] | None
    rng: random.Random
    matched: int = 0  # requests its match selected
    selected: int = 0  # ... of which its share drew this many
    applied: int = 0  # ... and on this many its effect really happened (an error sent, a stream cut, a list changed)

    def hit(self, call: Call) -> bool:
        if call.method is None or self.methods.match(call.method) is None:
            return False
        if self.type == "session_lost" and call.session is None:
            return False
        return self.tools is None or (call.tool is not None and self.tools.match(call.tool) is not None)

    def removes(self, tool: str) -> bool:
        """tools_change: whether a listed tool of this name is taken out of the list."""
        assert isinstance(self.params, ToolsChangeParams)
        return any(re.fullmatch(translate(p), tool) for p in self.params.remove)


@dataclass
class Plan:
    """What the selected faults do to one request (None from FaultTable.plan: nothing)."""

    names: list[str] = field(default_factory=list)
    local: Fault | None = None  # error, timeout or session_lost: the proxy answers (or holds) it itself
    delay: Fault | None = None
    delay_s: float = 0.0
    sse_cut: Fault | None = None
    tools_change: Fault | None = None


StatsJson = dict[str, int | dict[str, CountsJson]]


class McpStats(NamedTuple):
    """The proxy's /chaoskit/stats answer: the requests it received (its own endpoints aside), those answered 502
    (the upstream could not be reached), the sessions forgotten and the requests answered 404 for one, each
    fault's counts by name."""

    requests: int
    upstream_errors: int
    sessions_forgotten: int
    session_404s: int
    faults: dict[str, FaultCounts]

    def to_json(self) -> StatsJson:
        return {"requests": self.requests, "upstream_errors": self.upstream_errors,
                "sessions_forgotten": self.sessions_forgotten, "session_404s": self.session_404s,
                "faults": {name: c.to_json() for name, c in self.faults.items()}}

    @classmethod
    def read(cls, data: Any) -> McpStats | None:
        """From a /chaoskit/stats answer; None for what is not one of ours (no answer, another server's)."""
        try:
            return cls.from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    @classmethod
    def from_json(cls, data: Any) -> McpStats:
        return cls(data["requests"], data["upstream_errors"], data["sessions_forgotten"], data["session_404s"],
                   {name: FaultCounts(**c) for name, c in data["faults"].items()})


class FaultTable:
    def __init__(self, wire: list[McpFaultJson], seed: int):
        self.faults = [self._fault(i, f, seed) for i, f in enumerate(wire)]
        self.forgotten: set[str] = set()
        self.session_404s = 0

    @staticmethod
    def _fault(i: int, f: McpFaultJson, seed: int) -> Fault:
        match, tools = f["match"], f["match"]["tool"]
        return Fault(f["name"], f["type"], float(f["share"]), read_params(f["type"], f["params"]),
                     _globs(match["method"] or ["*"]), _globs(tools) if tools else None,
                     random.Random(f"{seed}:{i}:share"))

    def lost(self, session: str | None) -> bool:
        """Whether this session was forgotten (every request naming it is answered 404)."""
        return session is not None and session in self.forgotten

    def forget(self, session: str) -> None:
        if len(self.forgotten) >= MAX_FORGOTTEN:
            self.forgotten.clear()
        self.forgotten.add(session)

    def plan(self, call: Call) -> Plan | None:
        """Draw every matching fault's share for this request (each fault's own seeded stream: the k-th request a
        fault matches gets the same draw in every run with that seed) and combine what was selected: the first
        local answer wins, one delay, one stream cut, one list change."""
        plan: Plan | None = None
        for f in self.faults:
            if not f.hit(call):
                continue
            f.matched += 1
            if f.share < 1.0 and (f.share <= 0.0 or f.rng.random() >= f.share):
                continue
            f.selected += 1
            plan = plan or Plan()
            plan.names.append(f.name)
            if plan.local is not None:
                continue  # answered already by an earlier fault: selected, not applied
            if f.type in LOCAL:
                plan.local = f
            elif isinstance(f.params, DelayParams) and plan.delay is None:
                plan.delay = f
                j = f.params.jitter
                plan.delay_s = max(0.0, f.params.delay + (f.rng.uniform(-j, j) if j else 0.0))
            elif f.type in ("sse_cut", "tools_change") and getattr(plan, f.type) is None:
                setattr(plan, f.type, f)
        return plan

    def stats(self, requests: int, upstream_errors: int) -> McpStats:
        return McpStats(requests, upstream_errors, len(self.forgotten), self.session_404s, {
            f.name: FaultCounts(f.type, f.share, f.matched, f.selected, f.applied,
                                round(f.applied / f.matched, 6) if f.matched else None)
            for f in self.faults})


def error_body(call_id: Any, code: int, message: str) -> bytes:
    """A JSON-RPC error response to the request `call_id`."""
    return json.dumps({"jsonrpc": "2.0", "id": call_id, "error": {"code": code, "message": message}}).encode()


SESSION_NOT_FOUND = error_body(None, -32600, "Session not found")  # what the mcp SDK's server answers with its 404


def change_tools(message: Any, fault: Fault) -> bool:
    """tools_change: take the tools the fault removes out of a tools/list result (in place); whether any was."""
    result = message.get("result") if isinstance(message, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list):
        return False
    kept = [t for t in tools if not (isinstance(t, dict) and fault.removes(str(t.get("name"))))]
    result["tools"] = kept
    return len(kept) < len(tools)
