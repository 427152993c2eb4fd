"""llm.proxy: a chaoskit-run HTTP reverse proxy in front of an OpenAI-compatible or Triton generate endpoint
that breaks LLM traffic the way serving stacks break: aborts (503/429 + Retry-After), time to first byte,
inter-token gaps, mid-stream stalls, truncated streams (cut, or ended cleanly), malformed events, corrupted
token text, rate limits. One typed spec per fault; the server is chaoskit.injectors.llm_proxy.server; what each
fault did is in observe_details and /chaoskit/metrics."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from chaoskit.injectors.llm_proxy.faults import FaultJson, ProxyJson, ProxyStats
from chaoskit.injectors.proxy.fault import (
    ListenTls,
    ProxyHelper,
    ProxyRecord,
    UpstreamTls,
    check_host_port,
    check_named_faults,
    https_upstream,
    intercept_listen,
    stats_json,
)
from chaoskit.injectors.proxy.intercept import Intercept
from chaoskit.model.types import Duration, StrictModel

GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions", "/v2/models/*/generate", "/v2/models/*/generate_stream",
                  "/v2/models/*/infer", "/v2/models/*/versions/*/infer")


def _share(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a fraction 0..1 or a percentage like '20%'")
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            value = float(value.strip()[:-1]) / 100.0
        except ValueError:
            raise ValueError(f"expected a fraction 0..1 or a percentage like '20%' (got {value!r})") from None
    if not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a fraction 0..1 or a percentage like '20%' (got {value!r})")
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"expected a fraction 0..1 or a percentage like '20%' (got {value!r})") from None
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"share is a fraction 0..1 or a percentage like '20%' (got {value!r})")
    return v


Share = Annotated[float, BeforeValidator(_share), WithJsonSchema(
    {"type": ["string", "number"], "pattern": r"^\d+(\.\d+)?%$",
     "description": "fraction of matching requests: 0.2 or '20%'"})]


class Match(StrictModel):
    path: str | list[str] = Field(list(GENERATE_PATHS), description="glob(s) on the request path (default: the "
                                  "inference endpoints: /v1/completions, /v1/chat/completions, "
                                  "/v2/models/*/generate, /v2/models/*/generate_stream, /v2/models/*/infer and "
                                  "/v2/models/*/versions/*/infer; not health, metadata or metrics)")
    model: str | None = Field(None, description="glob on the model: the JSON body's \"model\" (OpenAI) or the "
                                                "/v2/models/NAME/ path segment (Triton)")
    headers: dict[str, str] = Field(default_factory=dict, description="request header name: glob of its value; "
                                    "all must match")

    def paths(self) -> list[str]:
        return [self.path] if isinstance(self.path, str) else list(self.path)


class _Fault(StrictModel):
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$", description="label in the proxy's metrics and "
                             "the X-Chaoskit-Fault response header (default: TYPE-INDEX)")
    share: Share = Field(1.0, description="fraction of the matching requests this fault takes (seeded draws: "
                         "the same seed gives the same requests)")
    match: Match = Field(default_factory=Match, description="which requests: path, model, headers")

    def wire(self, index: int) -> FaultJson:
        """The fault as the helper takes it: its type's parameters apart (the fields of faults.PARAMS[type])."""
        kind: str = self.type  # type: ignore[attr-defined]  # each subclass's Literal
        m = self.match
        return {"name": self.name or f"{kind}-{index}", "type": kind, "share": self.share,
                "match": {"path": m.paths(), "model": m.model, "headers": dict(m.headers)},
                "params": self.model_dump(exclude={"name", "type", "share", "match"})}


class AbortFault(_Fault):
    type: Literal["abort"]
    status: int = Field(503, ge=400, le=599, description="the HTTP status answered (503, 429, 500 ...); the "
                        "upstream is not contacted")
    retry_after: int | None = Field(None, ge=0, le=86400, description="seconds for a Retry-After header (none "
                                    "by default)")


class DelayFault(_Fault):
    type: Literal["delay"]
    delay: Duration = Field(gt=0, description="hold the request this long before forwarding it (time to "
                            "first byte)")
    jitter: Duration = Field(0.0, ge=0, description="uniform +- this around delay")

    @model_validator(mode="after")
    def _jitter(self) -> DelayFault:
        if self.jitter > self.delay:
            raise ValueError(f"jitter ({self.jitter:g}s) is larger than delay ({self.delay:g}s): a hold cannot "
                             "be negative")
        return self


class TokenDelayFault(_Fault):
    type: Literal["token_delay"]
    delay: Duration = Field(gt=0, description="added before every token event after the first (inter-token "
                            "gap = the upstream's gap + this; TTFT unchanged)")
    jitter: Duration = Field(0.0, ge=0, description="uniform: +- this around delay; normal: the standard "
                             "deviation; exponential: not used")
    distribution: Literal["uniform", "normal", "exponential"] = Field(
        "uniform", description="how each gap is drawn (fixed when jitter is 0; exponential: mean = delay)")

    @model_validator(mode="after")
    def _spread(self) -> TokenDelayFault:
        if self.distribution == "uniform" and self.jitter > self.delay:
            raise ValueError(f"jitter ({self.jitter:g}s) is larger than delay ({self.delay:g}s): a uniform gap "
                             "would be negative")
        if self.distribution == "exponential" and self.jitter:
            raise ValueError("distribution exponential has one parameter, delay (its mean): drop jitter")
        return self


class StallFault(_Fault):
    type: Literal["stall"]
    after_tokens: int = Field(ge=0, description="forward this many token events, then stop")
    duration: Duration = Field(0.0, ge=0, description="stop forwarding this long, connection open, then go on "
                               "where it stopped (0: until the client gives up)")


class TruncateFault(_Fault):
    type: Literal["truncate"]
    after_tokens: int = Field(ge=0, description="forward this many token events, then close the connection: no "
                              "further event, no [DONE], no final chunk")
    clean: bool = Field(False, description="true: end the HTTP body properly instead (the last chunk of a "
                        "chunked body; the connection stays open), still with no further event, no final event "
                        "(finish_reason) and no [DONE]: a stream that looks complete to a client that does not "
                        "check for them")


class CorruptTokensFault(_Fault):
    type: Literal["corrupt_tokens"]
    token_share: Share = Field(1.0, description="fraction of the token events of a selected stream whose text is "
                               "replaced (seeded draws); the SSE framing and each event's JSON stay valid")
    text: str = Field("\ufffd", min_length=1, description="the text put in place of a token's (twice where the "
                      "token's text is this already, so it always differs)")


class MalformedFault(_Fault):
    type: Literal["malformed"]
    corrupt: Literal["bad_json", "missing_data", "error_object"] = Field(
        "bad_json", description="bad_json: the event's JSON loses its closing brace; missing_data: the event "
                                "loses its 'data:' field name; error_object: a 200 with an error object (in "
                                "the stream after after_tokens, or as the whole body of a non-streaming answer)")
    after_tokens: int = Field(0, ge=0, description="the token event after this many is the one corrupted")


class RateLimitFault(_Fault):
    type: Literal["rate_limit"]
    requests_per_s: float | None = Field(None, gt=0, description="token bucket of requests per second per key")
    tokens_per_s: float | None = Field(None, gt=0, description="token bucket of output tokens per second per "
                                       "key (a request is admitted while the bucket holds a token; each streamed "
                                       "token takes one)")
    burst: float | None = Field(None, ge=1, description="bucket size (default: one second of the rate, at least 1)")
    key: str = Field("client", pattern=r"^(client|header:[!#$%&'*+.^_`|~0-9A-Za-z-]+)$",
                     description="what a bucket belongs to: client (the peer address) or header:NAME (e.g. "
                                 "header:Authorization)")
    retry_after: bool = Field(True, description="send Retry-After (whole seconds until the bucket has a token)")

    @model_validator(mode="after")
    def _one(self) -> RateLimitFault:
        if (self.requests_per_s is None) == (self.tokens_per_s is None):
            raise ValueError("rate_limit needs exactly one of requests_per_s or tokens_per_s")
        return self


class ToolArgsFault(_Fault):
    type: Literal["tool_args"]
    mode: Literal["cut", "invalid_json", "bad_escape", "wrong_tool_name", "duplicate_call", "finish_stop"] = Field(
        description="how a chat answer's tool call breaks (streamed or whole; answers without one pass unchanged): "
                    "cut: its arguments lose the second half of their last fragment (at least the closing brace); "
                    "invalid_json: their double quotes become single quotes; bad_escape: \\x41 (no JSON escape) "
                    "after their first double quote; wrong_tool_name: '_unknown' appended to the function's name; "
                    "duplicate_call: the call comes twice (the copy's id ends in '-2'); finish_stop: finish_reason "
                    "'stop' instead of 'tool_calls'")


class ErrorEventFault(_Fault):
    type: Literal["error_event"]
    after_tokens: int = Field(0, ge=0, description="the error event replaces the rest of the stream after this "
                              "many token events (text or tool-call argument fragments); a stream with no more "
                              "gets it in place of its [DONE]. Streams only: a JSON answer passes unchanged")
    done: bool = Field(True, description="send data: [DONE] after the error event (as vLLM does), or end the "
                       "stream right after it")
    message: str = Field("llm.proxy: injected error", min_length=1, description="the error's message")
    error_type: str = Field("InternalServerError", min_length=1, description="the error's type")
    code: int = Field(500, ge=400, le=599, description="the error's code (the HTTP status stays 200)")


class SchemaBreakFault(_Fault):
    type: Literal["schema_break"]
    mode: Literal["drop_required", "wrong_type"] = Field(
        "drop_required", description="how a structured answer (a request with response_format json_schema) "
                                     "breaks its schema while still parsing: drop_required: its first required "
                                     "property is removed; wrong_type: that property (else its first) gets a value "
                                     "of another type (a string becomes its length, anything else the string "
                                     "'wrong type'). A streamed answer's content is held back and sent as one delta "
                                     "before its final event")


LlmFault = Annotated[AbortFault | DelayFault | TokenDelayFault | StallFault | TruncateFault | MalformedFault
                     | RateLimitFault | CorruptTokensFault | ToolArgsFault | ErrorEventFault | SchemaBreakFault,
                     Field(discriminator="type")]


class LlmProxySpec(StrictModel):
    type: Literal["llm.proxy"]
    listen: str = Field("", description="host:port clients connect to (127.0.0.1 when only ':port'); required "
                        "unless intercept (then :PORT in the namespace, default a free port)")
    upstream: str | None = Field(None, description="the real endpoint: http://host:port or https://host:port (no "
                                 "path: request paths are forwarded as they are) or host:port (plain HTTP); "
                                 "required unless intercept")
    upstream_tls: UpstreamTls | None = Field(None, description="with an https:// upstream (set by it, checked by "
                                             "default): how the upstream's certificate is checked")
    listen_tls: ListenTls | None = Field(None, description="clients connect with TLS (HTTPS) using this "
                                         "certificate and key")
    intercept: Intercept | None = Field(None, description="transparent: the proxy runs in target's namespace and "
                                        "an nftables redirect sends port's new incoming connections to it, each "
                                        "forwarded to its original destination (no upstream; clients unchanged; "
                                        "root)")
    seed: int = Field(0, description="seed of the share and gap draws: the same seed and requests, the same faults")
    faults: list[LlmFault] = Field(default_factory=list, description="each with match and share; on one request "
                                   "the first local answer (abort, rate_limit 429, error_object) wins, delays and "
                                   "token-level faults combine (one of each type)")

    @field_validator("upstream", mode="before")
    @classmethod
    def _url(cls, v: object) -> object:
        if isinstance(v, str) and "://" in v:
            url = urlsplit(v)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"expected http(s)://host:port or host:port (got {v!r}); the proxy speaks "
                                 "HTTP/1.1 to its upstream")
            if url.path not in ("", "/") or url.query:
                raise ValueError(f"expected no path in the upstream URL (got {v!r}): the proxy forwards request "
                                 "paths unchanged, so give the server's root (http://host:port)")
            host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
            return f"{host}:{url.port or (443 if url.scheme == 'https' else 80)}"
        return v

    @model_validator(mode="before")
    @classmethod
    def _https(cls, data: Any) -> Any:
        return intercept_listen(https_upstream(data))

    @field_validator("listen", "upstream")
    @classmethod
    def _addr(cls, v: str | None) -> str | None:
        return check_host_port(v, zero=True) if v else v

    @model_validator(mode="after")
    def _names(self) -> LlmProxySpec:
        check_named_faults(self)
        return self

    def wire(self) -> ProxyJson:
        """The faults as the helper takes them (the TLS part is the injector's tls_wire)."""
        return {"seed": self.seed, "faults": [f.wire(i) for i, f in enumerate(self.faults)]}


def _describe(f: Any) -> str:
    share = f"{f.share * 100:g}% of matching requests"
    what = {
        "abort": lambda: f"answer {f.status}" + (f" with Retry-After: {f.retry_after}" if f.retry_after is not None
                                                  else ""),
        "delay": lambda: f"hold {f.delay * 1e3:g} ms" + (f" +- {f.jitter * 1e3:g} ms" if f.jitter else "")
                         + " before forwarding",
        "token_delay": lambda: f"add {f.delay * 1e3:g} ms ({f.distribution}"
                               + (f", jitter {f.jitter * 1e3:g} ms" if f.jitter else "") + ") between tokens",
        "stall": lambda: f"stop after {f.after_tokens} tokens for "
                         + (f"{f.duration:g}s" if f.duration else "as long as the client waits"),
        "truncate": lambda: (f"end the stream cleanly (no final event, no [DONE]) after {f.after_tokens} tokens"
                             if f.clean else f"close the connection after {f.after_tokens} tokens"),
        "corrupt_tokens": lambda: f"replace the text of {f.token_share * 100:g}% of token events with {f.text!r}",
        "malformed": lambda: f"{f.corrupt} after {f.after_tokens} tokens",
        "rate_limit": lambda: f"429 beyond {f.requests_per_s or f.tokens_per_s:g} "
                              f"{'requests' if f.requests_per_s else 'tokens'}/s per {f.key}",
        "tool_args": lambda: f"break tool calls ({f.mode})",
        "error_event": lambda: f"an error event ({f.code}) after {f.after_tokens} tokens"
                               + (", then [DONE]" if f.done else ", no [DONE]"),
        "schema_break": lambda: f"break structured answers' schema ({f.mode})",
    }[f.type]()
    return f"{what} on {share}"


class LlmProxy(ProxyHelper[ProxyRecord]):
    type: ClassVar[str] = "llm.proxy"
    server: ClassVar[str] = "chaoskit.injectors.llm_proxy.server"
    what: ClassVar[str] = "LLM proxy"
    token_prefix: ClassVar[str] = "chaoskit-llm-proxy-"
    stats_type: ClassVar[type[ProxyStats]] = ProxyStats  # what each fault did so far (matched, selected, applied)
    summary: ClassVar[str] = ("LLM-aware HTTP proxy: abort (503/429 + Retry-After), delay, token_delay, stall, "
                              "truncate (cut or clean), malformed SSE, corrupt_tokens, rate_limit, tool_args, "
                              "error_event, schema_break")
    Spec = LlmProxySpec
    spec: LlmProxySpec


    def effects(self) -> str:
        faults = "; ".join(f"{w['name']}: {_describe(f)}" for f, w in zip(self.spec.faults, self.spec.wire()["faults"],
                                                                          strict=True))
        return f"(seed {self.spec.seed}) with faults: {faults or 'none'}"

    def plan(self) -> list[str]:
        where, revert = self.intercept_plan()
        return [f"start an LLM proxy{where or f' {self.spec.listen} -> {self.spec.upstream}'}{self.tls_plan()} "
                f"{self.effects()}; "
                + (revert or f"revert: stop it (it also exits by itself after {self.ctx.lifetime_s:g}s)")]

    def config(self) -> Any:
        tls = self.tls_wire()
        return self.spec.wire() if tls is None else {**self.spec.wire(), "tls": tls.to_json()}


def stats_of(listen: str, timeout: float = 2.0, tls: bool = False) -> ProxyStats | None:
    """The proxy's own counters (GET /chaoskit/stats); None when it does not answer."""
    return ProxyStats.read(stats_json(listen, timeout, tls))
