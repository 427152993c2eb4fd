"""A lean HTTP/1.1 keep-alive client on asyncio protocols for plain-http load: prebuilt request bytes, an
incremental response parser (Content-Length or chunked), SSE events timed as their bytes arrive.
(aiohttp spends ~150 us per request in Python; this spends a fraction of that.)"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from chaoskit.load.clients import (
    MalformedEvent,
    Outcome,
    error_body,
    needs_done,
    scan_stream,
    status_error,
    usage_tokens,
)

_HEADER = re.compile(rb"\n(content-length|transfer-encoding|connection|retry-after)[ \t]*:[ \t]*([^\r\n]*)")


def group_header(name: str | None) -> re.Pattern[bytes] | None:
    """The pattern that finds header `name`'s value in a response head (case-insensitive name), for group_by."""
    if name is None:
        return None
    return re.compile(rb"\n" + re.escape(name.encode("ascii")) + rb"[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)


class _Conn(asyncio.Protocol):
    def __init__(self, group: re.Pattern[bytes] | None = None) -> None:
        self.group = group  # group_by: the header whose value each outcome carries
        self.transport: asyncio.Transport | None = None
        self.on_done: Callable[[Outcome], None] | None = None  # set while a request is in flight
        self.deadline = 0.0
        self.stall_at = float("inf")  # stall_timeout: a streamed answer with no token by then is stalled
        self.closed = False

    # -- per request --------------------------------------------------------------------------------

    def start(self, payload: bytes, api: str, stream: bool, on_done: Callable[[Outcome], None],
              deadline: float, stall_timeout: float | None = None) -> None:
        self.api, self.sse_tokens = api, stream and api != "http"
        self.stall_timeout, self.stall_at = stall_timeout, float("inf")
        self.out = Outcome()
        self.buf = self.sse = self.body_head = b""
        self.headers_done, self.keep_alive, self.done_seen = False, True, False
        self.on_done, self.deadline = on_done, deadline
        assert self.transport is not None
        self.transport.write(payload)

    def _complete(self) -> None:
        done, self.on_done = self.on_done, None
        if done is not None:
            done(self.out)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.on_done is not None:
            if self.headers_done and self.length is None and not self.chunked:
                self._finish()  # body delimited by close
            else:  # a stream cut before its end is truncated; a connection lost before any answer is other
                self.out.error = self.out.error or ("stream_truncated" if self.headers_done and self.sse_tokens
                                                    else "other")
                self._complete()

    def data_received(self, data: bytes) -> None:
        if self.on_done is None:
            return
        now = time.monotonic()
        self.buf += data
        try:
            if not self.headers_done and not self._headers():
                return
            self._body(now)
        except MalformedEvent:
            self._fail("stream_malformed")
        except (ValueError, KeyError, IndexError):
            self._fail("stream_error")

    def _fail(self, kind: str) -> None:
        self.out.error = kind
        self.keep_alive = False
        self._finish()

    # -- parsing ------------------------------------------------------------------------------------

    def _headers(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        raw, self.buf = self.buf[:end + 2], self.buf[end + 4:]
        head = raw.lower()
        if self.group is not None and (m := self.group.search(raw)):
            self.out.group = m.group(1).strip().decode("latin-1")
        self.out.status = status = int(head[:head.find(b"\r\n")].split(None, 2)[1])
        self.length, self.chunked, retry_after = None, False, False
        for name, value in _HEADER.findall(head):
            if name == b"content-length":
                self.length = int(value)
            elif name == b"transfer-encoding":
                self.chunked = b"chunked" in value
            elif name == b"retry-after":
                retry_after = True
            elif value.strip() == b"close":
                self.keep_alive = False
        self.cstate, self.chunk_left, self.body_seen = "size", 0, 0
        self.headers_done = True
        if status >= 400:
            self.out.error = status_error(status, retry_after)
        elif self.sse_tokens and self.stall_timeout is not None:
            self.stall_at = time.monotonic() + self.stall_timeout
        return True

    def _body(self, now: float) -> None:
        if not self.chunked:
            take, self.buf = self.buf, b""
            self._content(take, now)
            self.body_seen += len(take)
            if self.length is not None and self.body_seen >= self.length:
                self._finish()
            return
        while True:  # chunked: size line, data, CRLF ... then a zero size and an empty trailer line
            if self.cstate in ("size", "trailer"):
                nl = self.buf.find(b"\r\n")
                if nl < 0:
                    return
                line, self.buf = self.buf[:nl], self.buf[nl + 2:]
                if self.cstate == "trailer":
                    if not line:
                        self._finish()
                        return
                    continue
                self.chunk_left = int(line.split(b";")[0], 16)
                self.cstate = "data" if self.chunk_left else "trailer"
            elif self.cstate == "data":
                if not self.buf:
                    return
                take = self.buf[:self.chunk_left]
                self.buf = self.buf[len(take):]
                self.chunk_left -= len(take)
                self._content(take, now)
                if self.chunk_left == 0:
                    self.cstate = "crlf"
            else:  # crlf
                if len(self.buf) < 2:
                    return
                self.buf = self.buf[2:]
                self.cstate = "size"

    def _content(self, data: bytes, now: float) -> None:
        if self.out.error:
            return
        if not self.sse_tokens:
            if self.api != "http":  # a JSON body: its usage object is at the end, an error object at the start
                if len(self.body_head) < 256:
                    self.body_head += data[:256]
                self.sse = (self.sse + data)[-4096:]
            return
        sse = self.sse + data
        cut = sse.rfind(b"\n") + 1  # whole lines now, the rest waits for more bytes
        self.sse = sse[cut:]
        if cut:
            n, usage, done = scan_stream(self.api, sse[:cut])
            self.done_seen = self.done_seen or done
            if usage is not None:
                self.out.usage_tokens = usage
            if n:
                self.out.token_times.extend([now] * n)
                self.out.tokens += n
                if self.stall_timeout is not None:
                    self.stall_at = now + self.stall_timeout

    def _finish(self) -> None:
        out = self.out
        if not out.error and self.sse_tokens and not self.done_seen and needs_done(self.api):
            out.error = "stream_truncated"  # ended cleanly, but without data: [DONE]
        if not self.sse_tokens and self.api != "http" and not out.error:
            if out.status < 400 and error_body(self.body_head):
                out.error = "stream_error"
            out.usage_tokens = usage_tokens(self.sse)
        if out.usage_tokens is not None:
            out.tokens = out.usage_tokens
        if not out.error and not self.sse_tokens:
            out.token_times.append(time.monotonic())
            out.tokens = max(out.tokens, 1)
        if not self.keep_alive and self.transport is not None:
            self.transport.close()
        self._complete()


def request_bytes(method: str, url: str, body: object, headers: Mapping[str, str] | None = None) -> bytes:
    """One whole HTTP/1.1 request (keep-alive), JSON body when given, `headers` added (a traceparent)."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port or 80}\r\nAccept: */*\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return head.encode() + b"\r\n" + data


def _expire(conn: _Conn, kind: str = "timeout") -> None:
    if conn.on_done is not None:
        conn.out.error = kind
        conn.keep_alive = False
        if conn.transport is not None:
            conn.transport.close()
        conn._complete()


class Pool:
    """Keep-alive connections to one host:port."""

    def __init__(self, url: str, group_by: str | None = None):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.group = group_header(group_by)
        self.idle: list[_Conn] = []
        self.busy: set[_Conn] = set()

    async def _get(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: _Conn(self.group), self.host, self.port)
        return conn

    async def warm(self, n: int, timeout: float = 1.0) -> None:
        """Open up to n idle connections now, as benchmark tools do before the clock starts; what fails or
        takes longer than `timeout` is left to the send path (which counts connect errors)."""
        tasks = [asyncio.ensure_future(self._get()) for _ in range(n)]
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        self.idle.extend(t.result() for t in done if not t.exception())

    def take_idle(self) -> _Conn | None:
        while self.idle:
            c = self.idle.pop()
            if not c.closed and c.transport is not None and not c.transport.is_closing():
                return c
        return None

    def release(self, conn: _Conn, out: Outcome) -> None:
        if conn.keep_alive and not conn.closed and not out.error:
            self.idle.append(conn)
        elif conn.transport is not None and not conn.closed:
            conn.transport.close()

    def fire(self, conn: _Conn, payload: bytes, api: str, stream: bool, timeout: float,
             on_done: Callable[[Outcome], None], stall_timeout: float | None = None) -> None:
        """Send on an idle connection without a task: `on_done` runs from the protocol callback."""
        def done(out: Outcome) -> None:
            self.busy.discard(conn)
            self.release(conn, out)
            on_done(out)

        self.busy.add(conn)
        conn.start(payload, api, stream, done, time.monotonic() + timeout, stall_timeout)

    async def sweep_timeouts(self, every: float = 0.05) -> None:
        """One timer for every in-flight request instead of one per request (timeouts and stalls)."""
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for conn in [c for c in self.busy if c.deadline < now or c.stall_at < now]:
                _expire(conn, "timeout" if conn.deadline < now else "stream_stalled")

    async def send(self, payload: bytes, api: str, stream: bool, timeout: float,
                   stall_timeout: float | None = None) -> Outcome:
        """The awaitable path (a connection may need opening first)."""
        try:
            conn = self.take_idle()
            if conn is None:
                async with asyncio.timeout(timeout):
                    conn = await self._get()
        except (OSError, TimeoutError):
            return Outcome(error="connect")
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.fire(conn, payload, api, stream, timeout, fut.set_result, stall_timeout)
        return await fut

    def close(self) -> None:
        for c in self.idle:
            if c.transport is not None:
                c.transport.close()
        self.idle.clear()
