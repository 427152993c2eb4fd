"""The HTTP/1.1 proxy behind mcp.proxy, in front of an MCP server over streamable HTTP (asyncio streams): one
request per client connection (each answer says Connection: close; an MCP client's HTTP pool opens the next), its
JSON-RPC body read whole and its faults drawn (chaoskit.injectors.mcp_proxy.faults), then it is answered locally
(a JSON-RPC error, a 404 for a forgotten Mcp-Session-Id), held without an answer, held then forwarded, or
forwarded on a connection of its own to the upstream, whose answer is relayed byte for byte - or, for sse_cut,
event by event until the cut, and for tools_change read whole and rewritten.

Started by chaoskit.injectors.proxy.helper (`proxy/helper.py TOKEN chaoskit.injectors.mcp_proxy.server LISTEN
UPSTREAM CONFIG_JSON UNTIL_EPOCH`), which listens, says `ready` and calls helper_main with the socket.
`GET /chaoskit/stats` (JSON) is its own."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from typing import Any, NamedTuple

from chaoskit.injectors.mcp_proxy.faults import (
    SESSION_NOT_FOUND,
    Call,
    ErrorParams,
    Fault,
    FaultTable,
    Plan,
    SseCutParams,
    change_tools,
    error_body,
)
from chaoskit.injectors.proxy.server import ORIGINAL, original_dst, serve_helper, serve_until, split_addr

MAX_HEAD, MAX_BODY = 64 * 1024, 16 << 20
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large", 502: "Bad Gateway"}
_HOP = ("connection", "keep-alive", "proxy-connection", "transfer-encoding", "content-length")


class Head(NamedTuple):
    """A request's or response's head: its first line and its headers (names as sent)."""

    line: str
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    def chunked(self) -> bool:
        return "chunked" in (self.get("transfer-encoding") or "").lower()

    def encode(self, extra: list[tuple[str, str]]) -> bytes:
        """The head again, its framing and connection headers replaced by `extra` (and Connection: close)."""
        lines = [self.line, *(f"{k}: {v}" for k, v in self.headers if k.lower() not in _HOP),
                 *(f"{k}: {v}" for k, v in extra), "Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(raw: bytes) -> Head:
    lines = raw.decode("latin-1").split("\r\n")
    headers = [(k.strip(), v.strip()) for k, _, v in (x.partition(":") for x in lines[1:] if x)]
    return Head(lines[0], headers)


async def read_head(reader: asyncio.StreamReader) -> Head | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise ValueError("head too large") from None
    return parse_head(raw[:-4])


async def chunks(reader: asyncio.StreamReader) -> Any:
    """The pieces of a chunked body, in order, until its last chunk."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def read_body(reader: asyncio.StreamReader, head: Head, until_eof: bool = False) -> bytes:
    """A whole body (chunked, of a Content-Length, or, for an answer without either, to the end)."""
    if head.chunked():
        out = b""
        async for piece in chunks(reader):
            out += piece
            if len(out) > MAX_BODY:
                raise ValueError("body too large")
        return out
    length = head.get("content-length")
    if length is not None:
        if int(length) > MAX_BODY:
            raise ValueError("body too large")
        return await reader.readexactly(int(length))
    return await reader.read(MAX_BODY) if until_eof else b""


def answer(status: int, body: bytes, headers: list[tuple[str, str]] = (), ctype: str = "application/json") -> bytes:
    head = Head(f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", [("Content-Type", ctype), *headers])
    return head.encode([("Content-Length", str(len(body)))]) + body


class Proxy:
    """Process-wide state: the upstream, the faults, counters."""

    def __init__(self, upstream: str, faults: FaultTable):
        self.intercept = upstream == ORIGINAL  # each connection goes to its own original destination
        self.upstream = None if self.intercept else split_addr(upstream)
        self.faults = faults
        self.requests = self.upstream_errors = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self.exchange(reader, writer)
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client or upstream gone, or bytes that are no HTTP: that connection ends
        finally:
            writer.close()

    async def exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dst = self.upstream
        if self.intercept:
            dst = original_dst(writer.get_extra_info("socket"))
        head = await read_head(reader)
        if head is None:
            return
        body = await read_body(reader, head)
        path = head.line.split(" ")[1] if head.line.count(" ") >= 2 else "/"
        if path.startswith("/chaoskit/") or dst is None:  # its own, or (intercept) not a redirected connection
            writer.write(self.own(path))
            return
        self.requests += 1
        call = Call.of(body, head.get("mcp-session-id"))
        if self.faults.lost(call.session):
            self.faults.session_404s += 1
            writer.write(answer(404, SESSION_NOT_FOUND))
            return
        plan = self.faults.plan(call) if self.faults.faults else None
        if plan is not None and plan.local is not None:
            await self.local(plan.local, call, reader, writer)
            return
        if plan is not None and plan.delay is not None:
            if await client_gone(reader, plan.delay_s):
                return  # the client gave up while it was held: the server never sees the request
            plan.delay.applied += 1
        await self.forward(dst, head, body, plan, writer)

    def own(self, path: str) -> bytes:
        if path == "/chaoskit/stats":
            return answer(200, json.dumps(self.faults.stats(self.requests, self.upstream_errors).to_json()).encode())
        return answer(404, b'{"error": "mcp.proxy: /chaoskit/stats"}')

    async def local(self, f: Fault, call: Call, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        f.applied += 1
        if isinstance(f.params, ErrorParams):
            writer.write(answer(200, error_body(call.id, f.params.code, f.params.message)))
        elif f.type == "session_lost":
            self.faults.forget(call.session or "")
            self.faults.session_404s += 1
            writer.write(answer(404, SESSION_NOT_FOUND))
        else:  # timeout: no answer; the connection is held until the client closes it (or the proxy ends)
            await client_gone(reader, None)

    async def forward(self, dst: tuple[str, int], head: Head, body: bytes, plan: Plan | None,
                      writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*dst)
        except OSError as e:
            self.upstream_errors += 1
            writer.write(answer(502, json.dumps({"error": f"mcp.proxy: upstream {dst[0]}:{dst[1]}: "
                                                          f"{e.strerror or e}"}).encode()))
            return
        try:
            up_w.write(head.encode([("Content-Length", str(len(body)))] if body or head.get("content-length")
                                   else []) + body)
            resp = await read_head(up_r)
            if resp is None:
                return
            if plan is not None and plan.tools_change is not None:
                await rewritten(resp, up_r, writer, plan.tools_change)
            elif plan is not None and plan.sse_cut is not None and _sse(resp):
                await cut(resp, up_r, writer, plan.sse_cut)
            else:
                await relay(resp, up_r, writer)
        finally:
            up_w.close()


def _sse(head: Head) -> bool:
    return (head.get("content-type") or "").lower().startswith("text/event-stream")


async def relay(resp: Head, up: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The answer as it comes: its head (Connection: close), its body's bytes until the upstream ends it."""
    writer.write(resp.encode([("Transfer-Encoding", "chunked")] if resp.chunked() else
                             [("Content-Length", v)] if (v := resp.get("content-length")) is not None else []))
    while data := await up.read(65536):
        writer.write(data)
        await writer.drain()


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


async def cut(resp: Head, up: asyncio.StreamReader, writer: asyncio.StreamWriter, f: Fault) -> None:
    """sse_cut: the stream's first after_events events relayed (a chunk each), then the connection dropped: no
    further event, no last chunk."""
    writer.write(resp.encode([("Transfer-Encoding", "chunked")]))
    assert isinstance(f.params, SseCutParams)
    left, buf = f.params.after_events, b""
    pieces = chunks(up) if resp.chunked() else _reads(up)
    while left > 0:
        m = _EVENT_END.search(buf)
        if m is None:
            try:
                buf += await anext(pieces)
            except StopAsyncIteration:
                return await _end(writer)  # the stream ended first: not cut
            continue
        event, buf = buf[:m.end()], buf[m.end():]
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        left -= 1
    await writer.drain()
    f.applied += 1
    writer.transport.abort()


async def _reads(up: asyncio.StreamReader) -> Any:
    while data := await up.read(65536):
        yield data


async def _end(writer: asyncio.StreamWriter) -> None:
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def rewritten(resp: Head, up: asyncio.StreamReader, writer: asyncio.StreamWriter, f: Fault) -> None:
    """tools_change: the answer read whole; a tools/list result (a JSON body, or an SSE event's data) loses the
    tools the fault removes; sent with its length."""
    body = await read_body(up, resp, until_eof=True)
    changed = False
    if _sse(resp):
        lines = body.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"data:"):
                msg = _json(line[5:])
                if msg is not None and change_tools(msg, f):
                    lines[i], changed = b"data: " + json.dumps(msg).encode(), True
        body = b"\n".join(lines)
    elif (msg := _json(body)) is not None and change_tools(msg, f):
        body, changed = json.dumps(msg).encode(), True
    f.applied += changed
    writer.write(resp.encode([("Content-Length", str(len(body)))]) + body)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


async def client_gone(reader: asyncio.StreamReader, wait_s: float | None) -> bool:
    """Wait `wait_s` (None: for ever) watching the client's side; True when it closed it meanwhile."""
    try:
        async with asyncio.timeout(wait_s):
            while await reader.read(65536):
                pass  # a client sends nothing more on a one-request connection; ignore it
            return True
    except TimeoutError:
        return False
    except OSError:
        return True


class McpConfig(NamedTuple):
    """mcp.proxy's helper configuration: its faults (their seeded table)."""

    faults: FaultTable

    @classmethod
    def from_json(cls, data: Any) -> McpConfig:
        """From its argv's JSON: McpProxySpec.wire()."""
        return cls(FaultTable(data["faults"], data.get("seed", 0)))


async def serve(sock: socket.socket, upstream: str, config: McpConfig, until: float) -> None:
    px = Proxy(upstream, config.faults)
    server = await asyncio.start_server(px.handle, sock=sock, backlog=1024, limit=MAX_HEAD)
    await serve_until(server, until)


def helper_main(sock: socket.socket, argv: list[str]) -> int:
    """Called by proxy_proc with its listening socket."""
    return serve_helper(sock, argv, serve, McpConfig.from_json)
