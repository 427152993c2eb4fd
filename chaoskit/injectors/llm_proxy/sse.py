"""The SSE half of llm.proxy's server: chunked framing (incremental, under arbitrary cuts: ChunkedEnd finds where
a relayed body ends in C, Chunked also collects the contents) and EventStream, an SSE response under token-level
faults - taken apart into events, each released at arrival + the shift the faults added so far (token_delay per
token, a stall once), re-framed one chunk per event, cut or corrupted where a fault says, written in one transport
write per batch."""

from __future__ import annotations

import json
import math
import re
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import httptools

from chaoskit.injectors.llm_proxy.answers import Rewrite

if TYPE_CHECKING:
    from chaoskit.injectors.llm_proxy.faults import (
        CorruptTokensParams,
        ErrorEventParams,
        Fault,
        Plan,
        Request,
        StallParams,
    )


class Exchange(Protocol):
    """What an EventStream uses of the server's exchange (llm_proxy_server.Exchange): its downstream connection,
    request and response framing."""

    down: Any  # llm_proxy_server.Downstream
    req: Request
    framing: str
    left: int
    sent_any: bool

    def finish(self, close: bool = False) -> None: ...

TOKEN = re.compile(rb'"(?:text|content|text_output)"\s*:\s*"[^"]')  # a non-empty token text, as chaoskit load counts
ARGUMENTS = re.compile(rb'"arguments"\s*:\s*"[^"]')  # a tool call's non-empty argument fragment
DONE = re.compile(rb"^data:[ ]?\[DONE\]", re.MULTILINE)
_LENGTH_LINE = re.compile(rb"\r\n(?:content-length|transfer-encoding)[ \t]*:[^\r\n]*", re.IGNORECASE)
END, CUT = object(), object()  # event-queue markers: finish the response / close the connection


class ChunkedEnd:
    """Where a chunked body relayed as it is ends, found by llhttp (httptools): no Python runs per chunk, so a
    stream of one small chunk per token costs what its reads cost. `extra`: bytes came after the end (the
    upstream's connection is not to be reused)."""

    __slots__ = ("parser", "done", "extra")

    def __init__(self) -> None:
        self.done = self.extra = False
        self.parser = httptools.HttpResponseParser(self)
        self.parser.set_dangerous_leniencies(lenient_spaces_after_chunk_size=True)  # `3 ;ext` as Chunked takes it
        self.parser.feed_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")

    def on_message_begin(self) -> None:
        self.extra = self.done  # a second message: what came after the end

    def on_message_complete(self) -> None:
        self.done = True

    def feed(self, data: bytes) -> bool:
        """Whether the body (last chunk and trailer) has ended; ValueError where its framing is broken."""
        if self.done:
            self.extra = self.extra or bool(data)
            return True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if not self.done:
                raise ValueError(f"bad chunked framing: {e}") from None
            self.extra = True  # bytes after the end that are not even a response
        return self.done


class Chunked:
    """Incremental chunked-body framing: feed bytes, learn where the last chunk and its trailer end; with
    `collect`, also the chunk contents. A tight loop: an SSE stream is one small chunk per event."""

    __slots__ = ("left", "line", "trailer")

    def __init__(self) -> None:
        self.left = 0  # bytes of chunk data + its CRLF still to come
        self.line = b""  # a size (or trailer) line cut by the end of the previous feed
        self.trailer = False

    def feed(self, data: bytes, collect: bool = False) -> tuple[list[bytes], int]:
        """(contents when collecting, the offset in `data` just past the body's end or -1 if not there yet)."""
        out: list[bytes] = []
        shift = len(self.line)
        if shift:
            data, self.line = self.line + data, b""
        i, n, left, find = 0, len(data), self.left, data.find
        while True:
            if left:
                avail = n - i
                if collect and left > 2:
                    take = min(left - 2, avail)
                    if take:
                        out.append(data[i:i + take])
                if left >= avail:
                    self.left = left - avail
                    return out, -1
                i += left
                left = 0
            j = find(b"\n", i)
            if j < 0:
                self.line, self.left = data[i:], 0
                return out, -1
            line = data[i:j]
            i = j + 1
            if self.trailer:
                if not line.strip():
                    self.left = 0
                    return out, i - shift
                continue
            size = int(line.split(b";", 1)[0], 16)
            if size:
                left = size + 2
            else:
                self.trailer = True


class EventStream:
    """An SSE response under token-level faults: events in, events out at their release times."""

    def __init__(self, ex: Exchange, plan: Plan, chunks: Chunked | None):
        self.ex, self.plan, self.chunks = ex, plan, chunks
        self.chunked_out = ex.framing in ("chunked", "length")
        self.left = ex.left  # length-framed input
        self.buf = b""
        self.q: deque[tuple[float, Any]] = deque()
        self.shift = 0.0  # what token_delay and stall have added so far (release = arrival + shift)
        self.tokens = 0
        self.stopped = False  # cut, or an error injected: the rest of the upstream's stream is dropped
        self.ended = False  # the upstream's response is complete
        self.frozen = False  # stall until the client gives up: nothing more leaves
        self.scheduled = False
        self.corrupted = False  # corrupt_tokens replaced a token's text in this stream
        self.pieces = 0  # error_event: token events and argument fragments so far
        self.rewrite = (Rewrite(plan.tool_args, plan.schema_break, ex.req.body)
                        if plan.tool_args is not None or plan.schema_break is not None else None)
        self.out: list[bytes] = []

    def start(self, head: bytes) -> None:
        if self.ex.framing == "length":  # events change size: send it chunked
            head = _LENGTH_LINE.sub(b"", head)[:-2] + b"Transfer-Encoding: chunked\r\n\r\n"
        self.ex.down.t.write(head)
        self.ex.sent_any = True
        if self.plan.stall is not None and self.plan.stall.params.after_tokens == 0:
            self._stall(self.plan.stall)

    def feed(self, data: bytes) -> None:
        done = False
        if self.chunks is not None:
            parts, at = self.chunks.feed(data, collect=True)
            data, done = b"".join(parts), at >= 0
        elif self.ex.framing == "length":
            self.left -= len(data)
            done = self.left <= 0
        buf = self.buf + data if self.buf else data
        i, find, crlf = 0, buf.find, b"\r\n\r\n" in buf
        while True:
            cut = find(b"\n\n", i)
            alt = find(b"\r\n\r\n", i) if crlf else -1
            if alt >= 0 and (cut < 0 or alt < cut):
                cut = alt + 2
            if cut < 0:
                break
            self.event(buf[i:cut + 2])
            i = cut + 2
        buf = self.buf = buf[i:]
        if done:
            if buf:
                self.event(buf)
                self.buf = b""
            self.end()
        self._send()

    def event(self, ev: bytes) -> None:
        if self.rewrite is None or self.stopped:
            self._event(ev)
            return
        for out in self.rewrite.event(ev):  # tool_args, schema_break: events changed, held back or added
            self._event(out)

    def _event(self, ev: bytes) -> None:
        if self.stopped:
            return
        if self.frozen:  # stalled until the client gives up: nothing more happens to this stream
            self.q.append((math.inf, ev))
            return
        p, now = self.plan, time.monotonic()
        if p.error_event is not None:
            piece = TOKEN.search(ev) is not None or ARGUMENTS.search(ev) is not None
            if DONE.search(ev) is not None or (piece and self.pieces >= p.error_event.params.after_tokens):
                self._error(now, p.error_event)
                return
            self.pieces += piece
        if p.truncate is not None and self.tokens >= p.truncate.params.after_tokens:
            p.truncate.applied += 1
            self._stop(now, END if p.truncate.params.clean else CUT)
            return
        token = TOKEN.search(ev) is not None
        if token:
            self.tokens += 1
            if p.tokens is not None:
                p.tokens.refill(now)
                p.tokens.level -= 1.0
            if p.corrupt_tokens is not None and p.corrupt_tokens.corrupts():
                ev = self._corrupt(ev, p.corrupt_tokens)
            if p.malformed is not None and self.tokens == p.malformed.params.after_tokens + 1:
                p.malformed.applied += 1
                corrupt = p.malformed.params.corrupt
                if corrupt == "error_object":
                    self._push(now + self.shift, b"data: " + error_event() + b"\n\n")
                    if not self.ex.req.path.startswith("/v2/"):
                        self._push(now + self.shift, b"data: [DONE]\n\n")
                    self._stop(now, END)
                    return
                ev = corrupt_event(ev, corrupt)
            if p.token_delay is not None and self.tokens > 1:
                if self.tokens == 2:
                    p.token_delay.applied += 1
                self.shift += p.token_delay.gap_s()
        self._push(now + self.shift, ev)
        if token and p.stall is not None and self.tokens == p.stall.params.after_tokens:
            self._stall(p.stall)

    def _corrupt(self, ev: bytes, f: Fault[CorruptTokensParams]) -> bytes:
        out = replace_text(ev, f.params.text)
        if out is None:
            return ev
        if not self.corrupted:  # applied: once per stream
            self.corrupted = True
            f.applied += 1
        return out

    def _stall(self, f: Fault[StallParams]) -> None:
        f.applied += 1
        if f.params.duration <= 0:
            self.frozen = True
        else:
            self.shift += f.params.duration

    def _error(self, now: float, f: Fault[ErrorEventParams]) -> None:
        """error_event: the error chunk (then [DONE] where asked, on OpenAI paths) in place of the rest."""
        f.applied += 1
        self._push(now + self.shift, b"data: " + error_event(self.ex.req.path, f.params) + b"\n\n")
        if f.params.done and not self.ex.req.path.startswith("/v2/"):
            self._push(now + self.shift, b"data: [DONE]\n\n")
        self._stop(now, END)

    def _stop(self, now: float, marker: object) -> None:
        self.stopped = True
        self._push(now + self.shift, marker)

    def end(self) -> None:
        if self.rewrite is not None and not self.stopped and not self.frozen:
            for out in self.rewrite.flush():
                self._event(out)
        if self.stopped or self.frozen:
            return
        if self.plan.error_event is not None:  # a stream with no [DONE] (Triton's): the error ends it
            self._error(time.monotonic(), self.plan.error_event)
            return
        self.ended = True
        t = self.plan.truncate
        if t is not None and self.tokens >= t.params.after_tokens:  # the final chunk is what gets cut
            t.applied += 1
            self._stop(time.monotonic(), END if t.params.clean else CUT)
        else:
            self._push(time.monotonic() + self.shift, END)

    def upstream_lost(self) -> None:
        if not self.stopped and not self.ended:
            self.stopped = True  # the upstream cut it: pass the cut on (after what is queued)
            self._push(time.monotonic() + self.shift, END if self.ex.framing == "close" else CUT)

    # ---------------------------------------------------------------- release

    def _push(self, when: float, item: Any) -> None:
        if self.frozen:
            self.q.append((math.inf, item))
            return
        if not self.q and when <= time.monotonic():
            self._write(item)
            return
        self.q.append((when, item))
        if not self.scheduled:
            self.scheduled = True
            self.ex.down.px.sched.at(self.q[0][0], self._flush)

    def _flush(self) -> None:
        self.scheduled = False
        if self.ex.down.closed:
            self.q.clear()
            return
        q = self.q
        now = time.monotonic() + 20e-6
        while q and q[0][0] <= now:
            self._write(q.popleft()[1])
        self._send()
        if q and q[0][0] != math.inf:
            self.scheduled = True
            self.ex.down.px.sched.at(q[0][0], self._flush)

    def _write(self, item: Any) -> None:
        """Out now: events gather in `out` (one transport write per feed or flush, not one per event)."""
        ex = self.ex
        if ex.down.closed or ex.down.ex is not ex:
            return
        if item is END or item is CUT:
            if item is END and self.chunked_out:
                self.out.append(b"0\r\n\r\n")
            self._send()
            ex.finish(close=item is CUT or ex.framing == "close")
        elif self.chunked_out:
            self.out.append(b"%x\r\n%b\r\n" % (len(item), item))
        else:
            self.out.append(item)

    def _send(self) -> None:
        if self.out:
            if not self.ex.down.closed:
                self.ex.down.t.write(b"".join(self.out))
            self.out.clear()


def length_line(head: bytes, n: int) -> bytes:
    """A response head with its framing replaced by Content-Length: n."""
    return _LENGTH_LINE.sub(b"", head)[:-2] + b"Content-Length: %d\r\n\r\n" % n


def error_event(path: str = "", params: ErrorEventParams | None = None) -> bytes:
    """An error chunk's JSON: malformed error_object's, or error_event's as vLLM words one (Triton's: a string)."""
    if params is None:
        return json.dumps({"error": {"message": "llm.proxy: injected error", "type": "chaoskit_fault",
                                     "code": 500}}).encode()
    if path.startswith("/v2/"):
        return json.dumps({"error": params.message}).encode()
    return json.dumps({"error": {"message": params.message, "type": params.error_type, "param": None,
                                 "code": params.code}}).encode()


def replace_text(ev: bytes, text: str) -> bytes | None:
    """corrupt_tokens: the event with each non-empty token text (a choice's text or delta.content, Triton's
    text_output) replaced by `text` (twice where it is that already), its JSON re-encoded; None if it has none."""
    lines, hit = ev.split(b"\n"), False
    for i, line in enumerate(lines):
        if not line.startswith(b"data:"):
            continue
        try:
            doc = json.loads(line[5:])
        except ValueError:
            continue
        if isinstance(doc, dict) and _replace_in(doc, text):
            lines[i], hit = b"data: " + json.dumps(doc).encode(), True
    return b"\n".join(lines) if hit else None


def _replace_in(doc: dict[str, Any], text: str) -> bool:
    holders = [doc] + [c for c in doc.get("choices") or () if isinstance(c, dict)]
    holders += [c["delta"] for c in holders[1:] if isinstance(c.get("delta"), dict)]
    hit = False
    for h in holders:
        for key in ("text", "content", "text_output"):
            old = h.get(key)
            if isinstance(old, str) and old:
                h[key], hit = text * 2 if old == text else text, True
    return hit


def corrupt_event(ev: bytes, how: str) -> bytes:
    """bad_json: the event's JSON loses its closing brace; missing_data: its `data:` field name is gone."""
    if how == "missing_data":
        return re.sub(rb"^data:[ ]?", b"", ev, count=1, flags=re.MULTILINE)
    body = ev.rstrip(b"\r\n")
    return body[:body.rfind(b"}")] + b"\n\n" if b"}" in body else b"data: {\n\n"
