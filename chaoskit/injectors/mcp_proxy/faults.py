"""The faults of one mcp.proxy process, as data: which JSON-RPC requests each matches (method, tool name), the
seeded share draws, the sessions forgotten, what each fault did (counters), and the per-request Plan the server
carries out.

Wire format (from chaoskit.injectors.mcp_proxy.fault): a list of dicts, each with `name`, `type`, `share`, `match`
({method: [globs], tool: [globs] | None}) and the type's parameters in seconds / counts."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from fnmatch import translate
from typing import Any, NamedTuple

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


def _globs(patterns: list[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns))


@dataclass
class Fault:
    name: str
    type: str
    share: float
    params: dict[str, Any]
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
        return any(re.fullmatch(translate(p), tool) for p in self.params["remove"])


@dataclass
class Plan:
    """What the selected faults do to one request (None from FaultTable.plan: nothing)."""

    names: list[str] = field(default_factory=list)
    local: Fault | None = None  # error, timeout or session_lost: the proxy answers (or holds) it itself
    delay: Fault | None = None
    delay_s: float = 0.0
    sse_cut: Fault | None = None
    tools_change: Fault | None = None


class FaultCounts(NamedTuple):
    """What one fault did so far: its type and share; the requests its match selected, those its share drew, those
    its effect really happened on, and that as a share of the matched (None: none matched yet)."""

    type: str
    share: float
    matched: int
    selected: int
    applied: int
    applied_share: float | None

    def to_json(self) -> dict[str, str | float | None]:
        return dict(self._asdict())


StatsJson = dict[str, int | dict[str, dict[str, str | float | None]]]


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
    def from_json(cls, data: Any) -> McpStats:
        return cls(data["requests"], data["upstream_errors"], data["sessions_forgotten"], data["session_404s"],
                   {name: FaultCounts(**c) for name, c in data["faults"].items()})


class FaultTable:
    def __init__(self, wire: list[dict[str, Any]], seed: int):
        self.faults = [self._fault(i, f, seed) for i, f in enumerate(wire)]
        self.forgotten: set[str] = set()
        self.session_404s = 0

    @staticmethod
    def _fault(i: int, f: dict[str, Any], seed: int) -> Fault:
        match = f.get("match") or {}
        params = {k: v for k, v in f.items() if k not in ("name", "type", "share", "match")}
        return Fault(f["name"], f["type"], float(f.get("share", 1.0)), params, _globs(match.get("method") or ["*"]),
                     _globs(match["tool"]) if match.get("tool") else None, random.Random(f"{seed}:{i}:share"))

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
            elif f.type == "delay" and plan.delay is None:
                plan.delay = f
                j = f.params.get("jitter", 0.0)
                plan.delay_s = max(0.0, f.params["delay"] + (f.rng.uniform(-j, j) if j else 0.0))
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
