"""mcp.proxy: a chaoskit-run HTTP proxy in front of an MCP server over streamable HTTP that breaks tool traffic
the way MCP servers break: JSON-RPC errors for chosen tools or methods, latency, no answer at all (the client's
timeout), an SSE answer cut mid-stream, a session the server forgot (404 to its Mcp-Session-Id, as after a
restart), tools/list changing under the client. One typed spec per fault; the server is
chaoskit.injectors.mcp_proxy.server; what each fault did is in observe_details and /chaoskit/stats."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from chaoskit.injectors.llm_proxy.fault import Share
from chaoskit.injectors.mcp_proxy.faults import McpFaultJson, McpProxyJson, McpStats
from chaoskit.injectors.proxy.fault import (
    ProxyHelper,
    ProxyRecord,
    check_host_port,
    check_named_faults,
    intercept_listen,
    stats_json,
)
from chaoskit.injectors.proxy.intercept import Intercept
from chaoskit.model.types import Duration, StrictModel


class McpMatch(StrictModel):
    method: list[str] | None = Field(None, min_length=1, description="globs on the JSON-RPC method (default: "
                                     "tools/call; tools/list for tools_change); only requests match, never "
                                     "notifications, responses, GET or DELETE")
    tool: list[str] | None = Field(None, min_length=1, description="globs on the tool name of a tools/call "
                                   "(default: any; given, only tools/call requests naming one match)")

    @field_validator("method", "tool")
    @classmethod
    def _globs(cls, v: list[str] | None) -> list[str] | None:
        for g in v or ():
            if not g or any(c.isspace() for c in g):
                raise ValueError(f"expected a glob without spaces (got {g!r})")
        return v


class _Fault(StrictModel):
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$", description="label in the proxy's stats "
                             "(default: TYPE-INDEX)")
    share: Share = Field(1.0, description="fraction of the matching requests this fault takes (seeded draws: the "
                         "same seed gives the same requests)")
    match: McpMatch = Field(default_factory=McpMatch, description="which requests: JSON-RPC method, tool name")
    default_method: ClassVar[str] = "tools/call"

    def wire(self, index: int) -> McpFaultJson:
        kind: str = self.type  # type: ignore[attr-defined]
        return {"name": self.name or f"{kind}-{index}", "type": kind, "share": self.share,
                "match": {"method": self.match.method or [self.default_method], "tool": self.match.tool},
                "params": self.model_dump(exclude={"name", "type", "share", "match"})}


class McpErrorFault(_Fault):
    type: Literal["error"]
    code: int = Field(-32603, ge=-2**31, le=2**31 - 1, description="the JSON-RPC error's code (-32603: internal "
                      "error; -32601 method not found, -32602 invalid params ...)")
    message: str = Field("mcp.proxy: injected error", min_length=1, description="the JSON-RPC error's message")


class McpDelayFault(_Fault):
    type: Literal["delay"]
    delay: Duration = Field(gt=0, description="hold the request this long, then forward it (not at all if the "
                            "client gave up meanwhile: the server never sees it)")
    jitter: Duration = Field(0.0, ge=0, description="uniform +- this around delay")

    @model_validator(mode="after")
    def _jitter(self) -> McpDelayFault:
        if self.jitter > self.delay:
            raise ValueError(f"jitter ({self.jitter:g}s) is larger than delay ({self.delay:g}s): a hold cannot "
                             "be negative")
        return self


class McpTimeoutFault(_Fault):
    type: Literal["timeout"]


class McpSseCutFault(_Fault):
    type: Literal["sse_cut"]
    after_events: int = Field(0, ge=0, description="relay this many events of an SSE answer, then drop the "
                              "connection (no further event, no last chunk); a JSON answer passes unchanged")


class McpSessionLostFault(_Fault):
    type: Literal["session_lost"]


class McpToolsChangeFault(_Fault):
    type: Literal["tools_change"]
    default_method: ClassVar[str] = "tools/list"
    remove: list[str] = Field(min_length=1, description="globs on tool names: tools/list answers lose these tools "
                              "(a tools/call naming one still reaches the server)")

    @model_validator(mode="after")
    def _list(self) -> McpToolsChangeFault:
        if self.match.method is not None and not any(m in ("tools/list", "*", "tools/*") for m in self.match.method):
            raise ValueError("tools_change rewrites tools/list answers: match.method must include tools/list")
        return self


McpFault = Annotated[McpErrorFault | McpDelayFault | McpTimeoutFault | McpSseCutFault | McpSessionLostFault
                     | McpToolsChangeFault, Field(discriminator="type")]


class McpProxySpec(StrictModel):
    type: Literal["mcp.proxy"]
    listen: str = Field("", description="host:port clients connect to (127.0.0.1 when only ':port'); required "
                        "unless intercept (then :PORT in the namespace, default a free port)")
    upstream: str | None = Field(None, description="the MCP server: http://host:port[/path] or host:port (plain "
                                 "HTTP; a path such as /mcp is dropped: requests keep their own, so clients use "
                                 "the proxy's address with the server's path); required unless intercept")
    intercept: Intercept | None = Field(None, description="transparent: the proxy runs in target's namespace and "
                                        "an nftables redirect sends port's new incoming connections to it, each "
                                        "forwarded to its original destination (no upstream; clients unchanged; "
                                        "root)")
    seed: int = Field(0, description="seed of the share draws: the same seed and requests, the same faults")
    faults: list[McpFault] = Field(default_factory=list, description="each with match and share; on one request "
                                   "the first of error, timeout and session_lost selected wins, a delay and "
                                   "sse_cut or tools_change combine with each other. A request naming a forgotten "
                                   "session is answered 404 whatever it matches")
    listen_tls: ClassVar[None] = None  # the proxy speaks plain HTTP both ways
    upstream_tls: ClassVar[None] = None

    @field_validator("upstream", mode="before")
    @classmethod
    def _url(cls, v: object) -> object:
        if isinstance(v, str) and "://" in v:
            url = urlsplit(v)
            if url.scheme != "http" or not url.hostname:
                raise ValueError(f"expected http://host:port[/path] or host:port (got {v!r}); the proxy speaks "
                                 "plain HTTP/1.1 to its upstream")
            host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
            return f"{host}:{url.port or 80}"
        return v

    @model_validator(mode="before")
    @classmethod
    def _intercept_listen(cls, data: Any) -> Any:
        return intercept_listen(data)

    @field_validator("listen", "upstream")
    @classmethod
    def _addr(cls, v: str | None) -> str | None:
        return check_host_port(v, zero=True) if v else v

    @model_validator(mode="after")
    def _names(self) -> McpProxySpec:
        check_named_faults(self)
        return self

    def wire(self) -> McpProxyJson:
        """The faults as the helper takes them."""
        return {"seed": self.seed, "faults": [f.wire(i) for i, f in enumerate(self.faults)]}


def _describe(f: Any, wire: McpFaultJson) -> str:
    what = {
        "error": lambda: f"answer JSON-RPC error {f.code} ({f.message!r})",
        "delay": lambda: f"hold {f.delay * 1e3:g} ms" + (f" +- {f.jitter * 1e3:g} ms" if f.jitter else "")
                         + " before forwarding",
        "timeout": lambda: "hold without an answer until the client gives up",
        "sse_cut": lambda: f"drop an SSE answer after {f.after_events} events",
        "session_lost": lambda: "forget the request's Mcp-Session-Id (404 to it from then on)",
        "tools_change": lambda: f"remove {', '.join(f.remove)} from tools/list answers",
    }[f.type]()
    tools = f" naming {', '.join(wire['match']['tool'])}" if wire["match"]["tool"] else ""
    return f"{what} on {f.share * 100:g}% of {', '.join(wire['match']['method'])} requests{tools}"


class McpProxy(ProxyHelper[ProxyRecord]):
    type: ClassVar[str] = "mcp.proxy"
    server: ClassVar[str] = "chaoskit.injectors.mcp_proxy.server"
    what: ClassVar[str] = "MCP proxy"
    token_prefix: ClassVar[str] = "chaoskit-mcp-proxy-"
    stats_type: ClassVar[type[McpStats]] = McpStats  # what each fault did so far (matched, selected, applied)
    summary: ClassVar[str] = ("MCP (streamable HTTP) proxy: JSON-RPC errors by tool or method, delay, timeout, "
                              "sse_cut, session_lost (404 to a known Mcp-Session-Id), tools_change")
    Spec = McpProxySpec
    spec: McpProxySpec

    def effects(self) -> str:
        faults = "; ".join(f"{w['name']}: {_describe(f, w)}" for f, w in zip(self.spec.faults, self.spec.wire()["faults"],
                                                                             strict=True))
        return f"(seed {self.spec.seed}) with faults: {faults or 'none'}"

    def plan(self) -> list[str]:
        where, revert = self.intercept_plan()
        return [f"start an MCP proxy{where or f' {self.spec.listen} -> {self.spec.upstream}'} {self.effects()}; "
                + (revert or f"revert: stop it (it also exits by itself after {self.ctx.lifetime_s:g}s)")]

    def config(self) -> Any:
        return self.spec.wire()


def stats_of(listen: str, timeout: float = 2.0) -> McpStats | None:
    """The proxy's own counters (GET /chaoskit/stats); None when it does not answer."""
    return McpStats.read(stats_json(listen, timeout))
