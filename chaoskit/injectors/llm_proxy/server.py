"""The HTTP/1.1 reverse proxy behind llm.proxy, on asyncio protocols (no per-request task or HTTP library on
the hot path): each client connection is paired with one keep-alive upstream connection; a request is read
whole, its faults drawn (chaoskit.injectors.llm_proxy.faults), then it is answered locally, held, or forwarded.
A response no token-level fault touches is relayed byte for byte (only its framing is tracked, to know where
it ends: a chunked body's end by llhttp, in C); an SSE response that one does is taken apart into events and
re-framed (one chunk per event), each event leaving at its own time on a timerfd (asyncio's timers round to
1 ms): chaoskit.injectors.llm_proxy.sse.

Started by chaoskit.injectors.proxy.helper (`proxy/helper.py TOKEN chaoskit.injectors.llm_proxy.server LISTEN UPSTREAM
CONFIG_JSON UNTIL_EPOCH`), which listens, says `ready` and calls helper_main with the socket. `GET /chaoskit/metrics` (Prometheus text) and `/chaoskit/stats` (JSON) are its own.
In a traced run (CHAOSKIT_OTLP_ENDPOINT set) a request with faults drawn and a sampled traceparent gets a child
span with one per fault under it, and goes upstream with that span as its parent (chaoskit.injectors.
llm_proxy_trace, imported only then; the SDK in a thread of its own). With a `tls` configuration it speaks HTTPS
to its clients and/or its upstream (chaoskit.injectors.proxy.tls, imported only then); a refused upstream
certificate is a 502 naming the reason, and /chaoskit/stats' upstream_error."""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import re
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from chaoskit.injectors.llm_proxy.answers import Rewrite
from chaoskit.injectors.llm_proxy.faults import FaultTable, Local, Plan, Request
from chaoskit.injectors.llm_proxy.sse import Chunked, ChunkedEnd, EventStream, length_line
from chaoskit.injectors.proxy.server import ORIGINAL, original_dst, serve_helper, serve_until, split_addr
from chaoskit.load.timer import Alarm

if TYPE_CHECKING:
    from chaoskit.injectors.llm_proxy.trace import LlmTracer, RequestTrace
    from chaoskit.injectors.proxy.tls import Tls, TlsJson

MAX_HEAD, MAX_BODY = 64 * 1024, 64 << 20
_CL = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*(\d+)")
_TE_CHUNKED = re.compile(rb"\r\ntransfer-encoding[ \t]*:[^\r\n]*chunked")
_CLOSE = re.compile(rb"\r\nconnection[ \t]*:[^\r\n]*close")
_EXPECT = re.compile(rb"\r\nexpect[ \t]*:[^\r\n]*100-continue", re.IGNORECASE)
_SSE = re.compile(rb"\r\ncontent-type[ \t]*:[ \t]*text/event-stream")
_JSON = re.compile(rb"\r\ncontent-type[ \t]*:[ \t]*application/json")
REASONS = {200: "OK", 400: "Bad Request", 413: "Payload Too Large", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 502: "Bad Gateway",
           503: "Service Unavailable", 504: "Gateway Timeout"}


def answer(status: int, headers: list[tuple[str, str]], body: bytes, close: bool,
           content_type: str = "application/json") -> bytes:
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers)]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class Scheduler:
    """Callbacks at monotonic times from one timerfd."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.alarm = Alarm(loop, self._fire)

    def at(self, when: float, cb: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (when, self.seq, cb))
        if self.heap[0][1] == self.seq:
            self.alarm.at(when)

    def _fire(self) -> None:
        heap = self.heap
        while heap and heap[0][0] <= time.monotonic() + 20e-6:
            heapq.heappop(heap)[2]()
        if heap:
            self.alarm.at(heap[0][0])


class Proxy:
    """Process-wide state: the upstream, the faults, the scheduler, counters."""

    def __init__(self, upstream: str, faults: FaultTable, loop: asyncio.AbstractEventLoop,
                 tracer: LlmTracer | None = None, tls: Tls | None = None):
        self.intercept = upstream == ORIGINAL  # each connection goes to its own original destination
        self.host, self.port = ("", 0) if self.intercept else split_addr(upstream)
        self.faults, self.loop, self.tracer = faults, loop, tracer
        self.up_ssl, self.server_name = (tls.upstream, tls.server_name) if tls is not None else (None, None)
        self.any_faults = bool(faults.faults)
        self.sched = Scheduler(loop)
        self.requests = self.upstream_errors = self.connections = 0
        self.upstream_error = ""  # the latest failure to reach the upstream, in words (a refused certificate ...)


class Downstream(asyncio.Protocol):
    """A client connection (and the one upstream connection paired with it)."""

    def __init__(self, px: Proxy):
        self.px = px
        self.buf = b""
        self.ex: Exchange | None = None
        self.up: Upstream | None = None
        self.closed = self.continued = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        _nodelay(self.t)
        peer = self.t.get_extra_info("peername")
        self.client = str(peer[0]).removeprefix("::ffff:") if peer else ""  # an IPv4 client on a dual-stack socket
        # intercept: where the client was going (None: it came to the proxy's port itself; /chaoskit/ only)
        self.dst = original_dst(self.t.get_extra_info("socket")) if self.px.intercept else None
        self.px.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.px.connections -= 1
        if self.up is not None:
            self.up.t.close()
            self.up = None
        if self.ex is not None and self.ex.trace is not None:
            self.ex.traced_end(client_gone=True)
        self.ex = None

    def pause_writing(self) -> None:
        if self.up is not None:
            self.up.t.pause_reading()

    def resume_writing(self) -> None:
        if self.up is not None:
            self.up.t.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if self.ex is None:
            self.next()

    def next(self) -> None:
        while self.ex is None and self.buf and not self.closed:
            req = self._parse()
            if req is None:
                return
            self._dispatch(*req)

    def _parse(self) -> tuple[Request, bytes, bool] | None:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self.refuse(431)
            return None
        head = buf[:end + 4]
        lower = head.lower()
        if _TE_CHUNKED.search(lower):
            size = Chunked().feed(buf[end + 4:])[1]  # re-read from the start until whole (rare: LLM APIs send lengths)
            if size < 0:
                return None
        else:
            m = _CL.search(lower)
            size = int(m.group(1)) if m else 0
        if size > MAX_BODY:
            self.refuse(413)
            return None
        total = end + 4 + size
        if len(buf) < total:
            if not self.continued and _EXPECT.search(head):
                self.continued = True
                self.t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return None
        raw, self.buf = buf[:total], buf[total:]
        body = raw[end + 4:]
        if self.continued:  # we said 100 Continue: the upstream must not be asked to say it again
            self.continued = False
            raw = _EXPECT.sub(b"", head) + body
        try:
            method, target, version = head[:head.find(b"\r\n")].split(b" ", 2)
        except ValueError:
            self.refuse(400)
            return None
        keep = version.strip() == b"HTTP/1.1" and not _CLOSE.search(lower)
        path = target.split(b"?", 1)[0].decode("latin-1")
        return Request(method, path, head, body, self.client), raw, keep

    def refuse(self, status: int) -> None:
        self.t.write(answer(status, [], b"", close=True))
        self.buf = b""
        self.t.close()

    def _dispatch(self, req: Request, raw: bytes, keep: bool) -> None:
        px = self.px
        if req.path.startswith("/chaoskit/"):
            self._own(req, keep)
            return
        px.requests += 1
        plan = px.faults.plan(req) if px.any_faults else None
        ex = self.ex = Exchange(self, req, raw, keep, plan)
        if plan is not None:
            if px.tracer is not None and (trace := px.tracer.begin(req, plan)) is not None:
                ex.trace, ex.raw = trace, trace.propagate(raw)
            if plan.local is not None:
                ex.local(plan.local)
                return
            if plan.delay is not None:
                px.sched.at(time.monotonic() + plan.delay_s, ex.forward_delayed)
                return
        ex.forward()

    def _own(self, req: Request, keep: bool) -> None:
        px, status = self.px, 200
        if req.path == "/chaoskit/metrics":
            body, ctype = px.faults.metrics(px.requests, px.upstream_errors, px.connections), "text/plain"
        elif req.path == "/chaoskit/stats":
            stats = px.faults.stats(px.requests, px.upstream_errors)._replace(
                upstream_error=px.upstream_error or None,
                otlp=px.tracer.sink.stats() if px.tracer is not None else None)  # a traced run: what its spans did
            body, ctype = json.dumps(stats.to_json()).encode(), "application/json"
        else:
            status, body, ctype = 404, b'{"error": "llm.proxy: /chaoskit/metrics or /chaoskit/stats"}', "application/json"
        self.t.write(answer(status, [], body, not keep, ctype))
        if not keep:
            self.t.close()

    def done(self, close: bool, drop_upstream: bool) -> None:
        """The current exchange is over: take the next request, or close."""
        if self.ex is not None and self.ex.trace is not None:
            self.ex.traced_end(client_gone=False)
        self.ex = None
        if drop_upstream and self.up is not None:
            self.up.t.close()
            self.up = None
        if close:
            self.t.close()
            return
        if self.buf:
            self.next()


class Upstream(asyncio.Protocol):
    def __init__(self, down: Downstream):
        self.down = down
        self.closed = False
        self.uses = 0  # requests written on it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        _nodelay(self.t)

    def data_received(self, data: bytes) -> None:
        ex = self.down.ex
        if ex is not None and ex.up is self:
            ex.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.down.up is self:
            self.down.up = None
        ex = self.down.ex
        if ex is not None and ex.up is self:
            ex.upstream_lost()


class Exchange:
    """One request and its response."""

    __slots__ = ("down", "req", "raw", "keep", "plan", "up", "hbuf", "head_done", "framing", "left", "chunks",
                 "events", "up_close", "sent_any", "retried", "trace", "whole")

    def __init__(self, down: Downstream, req: Request, raw: bytes, keep: bool, plan: Plan | None):
        self.down, self.req, self.raw, self.keep, self.plan = down, req, raw, keep, plan
        self.up: Upstream | None = None
        self.hbuf = b""
        self.head_done = self.up_close = self.sent_any = self.retried = False
        self.framing = ""  # length | chunked | close | none
        self.left = 0
        self.chunks: ChunkedEnd | None = None  # a chunked body relayed as it is: where it ends
        self.events: EventStream | None = None
        self.trace: RequestTrace | None = None  # a traced request's (llm_proxy_trace): its fault spans at the end
        self.whole: Whole | None = None  # a JSON answer read in full to be rewritten (tool_args, schema_break)

    def traced_end(self, client_gone: bool) -> None:
        trace, self.trace = self.trace, None
        tracer = self.down.px.tracer
        if trace is not None and tracer is not None and self.plan is not None:
            try:
                tracer.end(trace, self.req, self.plan, self.events, client_gone)
            except Exception:  # a span is never worth a broken answer
                pass

    # ---------------------------------------------------------------- request side

    def local(self, loc: Local) -> None:
        loc.fault.applied += 1
        headers = [*loc.headers, ("X-Chaoskit-Fault", ",".join(self.plan.names if self.plan else []))]
        self.down.t.write(answer(loc.status, headers, loc.body, not self.keep))
        self.down.done(close=not self.keep, drop_upstream=False)

    def forward_delayed(self) -> None:
        if self.down.closed or self.down.ex is not self:
            return
        assert self.plan is not None and self.plan.delay is not None
        self.plan.delay.applied += 1
        self.forward()

    def forward(self) -> None:
        d = self.down
        up = d.up
        if up is None or up.closed:
            d.px.loop.create_task(self._connect())
            return
        self.up = up
        up.uses += 1
        up.t.write(self.raw)

    async def _connect(self) -> None:
        d, px = self.down, self.down.px
        host, port = d.dst or (px.host, px.port)
        try:
            if px.intercept and d.dst is None:
                raise OSError(0, "a connection to the intercepting proxy's own port has no upstream")
            _, up = await px.loop.create_connection(lambda: Upstream(d), host, port, ssl=px.up_ssl,
                                                    server_hostname=px.server_name if px.up_ssl else None)
        except OSError as e:  # ssl.SSLError (a refused certificate) is one
            px.upstream_errors += 1
            px.upstream_error = why = _why(e)
            if not d.closed and d.ex is self:
                body = json.dumps({"error": f"llm.proxy: upstream {host}:{port}: {why}"}).encode()
                d.t.write(answer(502, [], body, not self.keep))
                d.done(close=not self.keep, drop_upstream=False)
            return
        if d.closed or d.ex is not self:
            up.t.close()
            return
        d.up = self.up = up  # type: ignore[assignment]
        up.uses += 1  # type: ignore[attr-defined]
        up.t.write(self.raw)  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- response side

    def feed(self, data: bytes) -> None:
        if not self.head_done:
            self._head(data)
        elif self.events is not None:
            self.events.feed(data)
        elif self.whole is not None:
            if self.whole.feed(data):
                self._rewritten()
        else:
            self._relay(data)

    def _relay(self, data: bytes, head: bytes = b"") -> None:
        """Body bytes no token-level fault touches: on to the client as they are (after the head, in one write:
        a small answer is one segment, one syscall), until the body's end."""
        self.down.t.write(head + data if head else data)
        if self.framing == "length":
            self.left -= len(data)
            if self.left <= 0:
                self.finish()
        elif self.chunks is not None:
            try:
                ended = self.chunks.feed(data)
            except ValueError:  # the client has what came; the rest of this response cannot be delimited
                self.down.done(close=True, drop_upstream=True)
                return
            if ended:
                self.finish()

    def _head(self, data: bytes) -> None:
        buf = self.hbuf + data if self.hbuf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.hbuf = buf
                return
            head, rest = buf[:end + 4], buf[end + 4:]
            status = int(head[9:12])
            if 100 <= status < 200 and status != 101:  # interim (100 Continue): pass on, the real head follows
                self.down.t.write(head)
                buf = rest
                continue
            break
        self.hbuf = b""
        self.head_done = True
        lower = head.lower()
        self.up_close = _CLOSE.search(lower) is not None
        if self.req.method == b"HEAD" or status in (204, 304):
            self.framing = "none"
        elif _TE_CHUNKED.search(lower):
            self.framing = "chunked"
        elif m := _CL.search(lower):
            self.framing, self.left = "length", int(m.group(1))
        else:
            self.framing = "close"
        plan = self.plan
        if plan is not None:
            head = head[:-2] + f"X-Chaoskit-Fault: {','.join(plan.names)}\r\n\r\n".encode("latin-1")
            if plan.on_events() and status == 200 and _SSE.search(lower):
                self.events = EventStream(self, plan, Chunked() if self.framing == "chunked" else None)
                self.events.start(head)
                if rest:
                    self.events.feed(rest)
                return
            if plan.rewrites() and status == 200 and _JSON.search(lower) and self.framing != "none":
                self.whole = Whole(head, self.framing, self.left)
                if self.whole.feed(rest):
                    self._rewritten()
                return
        self.sent_any = True
        if self.framing == "chunked":
            self.chunks = ChunkedEnd()
        if not rest or self.framing == "none":
            self.down.t.write(head)
            if self.framing == "none" or (self.framing == "length" and self.left == 0):
                self.finish()
            return
        self._relay(rest, head)

    def _rewritten(self) -> None:
        """The whole JSON answer is in: on to the client with tool_args / schema_break's effects."""
        w, plan = self.whole, self.plan
        assert w is not None and plan is not None
        self.whole = None
        if w.over:  # too large to hold: relayed as it came (with the rest), no fault applied on it
            self.sent_any = True
            self.chunks = ChunkedEnd() if self.framing == "chunked" else None
            self._relay(b"".join(w.raw), w.head)
            return
        body = Rewrite(plan.tool_args, plan.schema_break, self.req.body).whole(w.body())
        self.down.t.write(length_line(w.head, len(body)) + body)
        self.sent_any = True
        self.finish()

    def finish(self, close: bool = False) -> None:
        if self.down.ex is not self:
            return
        drop = (self.up_close or self.framing == "close" or (self.events is not None and self.events.stopped)
                or (self.chunks is not None and self.chunks.extra))  # the upstream said more than its answer
        self.down.done(close=close or not self.keep or self.framing == "close", drop_upstream=drop)

    def upstream_lost(self) -> None:
        if self.events is not None:
            self.events.upstream_lost()
        elif self.whole is not None and self.framing == "close":  # its end: the upstream's close
            self._rewritten()
        elif self.head_done and self.framing == "close":
            self.finish(close=True)
        elif not self.head_done and not self.hbuf and not self.retried and self.up is not None and self.up.uses > 1:
            self.retried = True  # a kept-alive connection the upstream closed as we reused it: once more, afresh
            self.up = None
            self.forward()
        elif not self.head_done and not self.sent_any:
            self.down.px.upstream_errors += 1
            body = json.dumps({"error": "llm.proxy: the upstream closed the connection before answering"}).encode()
            self.down.t.write(answer(502, [], body, True))
            self.down.done(close=True, drop_upstream=True)
        else:  # mid-body: the client sees the same cut the upstream made
            self.down.done(close=True, drop_upstream=True)


class Whole:
    """A JSON answer's body read in full (length-framed, chunked, or up to the upstream's close), up to `limit`
    bytes: beyond it `over` is set and `raw` holds the bytes as they came, to be relayed unchanged."""

    __slots__ = ("head", "framing", "left", "parts", "chunks", "raw", "size", "limit", "over")

    def __init__(self, head: bytes, framing: str, left: int, limit: int | None = None):
        self.head, self.framing, self.left = head, framing, left
        self.limit = MAX_BODY if limit is None else limit
        self.parts: list[bytes] = []
        self.chunks = Chunked() if framing == "chunked" else None
        self.raw: list[bytes] = []
        self.size, self.over = 0, False

    def feed(self, data: bytes) -> bool:
        """Whether the body is complete, or over the limit (`over`)."""
        self.raw.append(data)
        self.size += len(data)
        if self.size > self.limit:
            self.over = True
            return True
        if self.chunks is not None:
            parts, at = self.chunks.feed(data, collect=True)
            self.parts += parts
            return at >= 0
        self.parts.append(data)
        self.left -= len(data)
        return self.framing == "length" and self.left <= 0

    def body(self) -> bytes:
        return b"".join(self.parts)


def _why(e: OSError) -> str:
    if e.__class__.__module__ == "ssl":  # only a TLS upstream raises these: its module is loaded
        from chaoskit.injectors.proxy.tls import why

        return why(e)
    return str(e.strerror or e)


def _nodelay(t: asyncio.BaseTransport) -> None:
    sock = t.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class LlmConfig(NamedTuple):
    """llm.proxy's helper configuration: its faults (their seeded table), and where it speaks HTTPS, proxy.tls's
    TlsConfig JSON (None: plain HTTP both ways; that module is imported only when there is one)."""

    faults: FaultTable
    tls: TlsJson | None = None

    @classmethod
    def from_json(cls, data: Any) -> LlmConfig:
        """From its argv's JSON: LlmProxySpec.wire() (faults.ProxyJson), with "tls" beside."""
        return cls(FaultTable(data["faults"], data.get("seed", 0)), data.get("tls"))


async def serve(sock: socket.socket, upstream: str, config: LlmConfig, until: float) -> None:
    loop = asyncio.get_running_loop()
    faults = config.faults
    tracer = None
    if os.environ.get("CHAOSKIT_OTLP_ENDPOINT"):  # a traced run: the fault spans' module, only now
        from chaoskit.injectors.llm_proxy.trace import LlmTracer

        tracer = LlmTracer.from_env(faults)
    tls = None
    if config.tls:  # HTTPS on either side: the ssl contexts' module, only now
        from chaoskit.injectors.proxy.tls import Tls, TlsConfig, quiet_handshakes

        tls = Tls.of(TlsConfig.from_json(config.tls), alpn=["http/1.1"])
        quiet_handshakes(loop)
    px = Proxy(upstream, faults, loop, tracer, tls)
    server = await loop.create_server(lambda: Downstream(px), sock=sock, backlog=1024,
                                      ssl=tls.listen if tls is not None else None)
    await serve_until(server, until, tracer.sink.close if tracer is not None else None)


def helper_main(sock: socket.socket, argv: list[str]) -> int:
    """Called by proxy_proc with its listening socket."""
    return serve_helper(sock, argv, serve, LlmConfig.from_json)
