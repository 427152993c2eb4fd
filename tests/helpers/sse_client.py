"""A raw HTTP/1.1 client for proxy tests: one request on a socket, the answer taken apart independently of the
code under test - status, headers, each SSE event with the time its last byte arrived, whether the body
reached its end (final chunk / Content-Length) or the connection was closed first, or the client gave up."""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass, field


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""  # the decoded body
    events: list[bytes] = field(default_factory=list)  # each SSE event as sent, blank line included
    times: list[float] = field(default_factory=list)  # seconds after the send at which each event was whole
    head_s: float | None = None  # seconds to the response head
    complete: bool = False  # the body ended as its framing says (final chunk, Content-Length)
    closed: bool = False  # the server closed the connection
    gave_up: bool = False  # the client's own timeout ended it

    def tokens(self) -> list[bytes]:
        """Events that carry a token (a non-empty text / content / text_output), as chaoskit load counts them."""
        return [e for e in self.events if re.search(rb'"(?:text|content|text_output)"\s*:\s*"[^"]', e)]

    def token_positions(self) -> list[int]:
        """Indices in `events` of the token events."""
        return [i for i, e in enumerate(self.events) if re.search(rb'"(?:text|content|text_output)"\s*:\s*"[^"]', e)]

    def token_times(self) -> list[float]:
        return [self.times[i] for i in self.token_positions()]

    def json(self) -> object:
        return json.loads(self.body)


def request_bytes(path: str, body: object, headers: dict[str, str] | None = None, method: str = "POST") -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: test\r\n" + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return head.encode() + b"\r\n" + data


def call(port: int, path: str, body: object = None, headers: dict[str, str] | None = None, timeout: float = 10.0,
         method: str = "POST", sock: socket.socket | None = None) -> Answer:
    """One request (on `sock` if given, kept open; else a new connection closed after)."""
    s = sock or socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.settimeout(timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    a, t0 = Answer(), time.monotonic()
    deadline = t0 + timeout
    s.sendall(request_bytes(path, body, headers, method))
    raw, content = b"", b""
    length: int | None = None
    chunked, pos = False, 0
    try:
        while not a.complete:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                data = s.recv(65536)
            except TimeoutError:
                a.gave_up = True
                break
            now = time.monotonic() - t0
            if not data:
                a.closed = True
                break
            raw += data
            if a.head_s is None:
                end = raw.find(b"\r\n\r\n")
                if end < 0:
                    continue
                head, raw = raw[:end].decode("latin-1").split("\r\n"), raw[end + 4:]
                a.status, a.head_s = int(head[0].split()[1]), now
                a.headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in head[1:])}
                chunked = "chunked" in a.headers.get("transfer-encoding", "")
                length = int(a.headers["content-length"]) if "content-length" in a.headers else None
            if chunked:
                while True:  # whole chunks only
                    nl = raw.find(b"\r\n", pos)
                    if nl < 0:
                        break
                    size = int(raw[pos:nl].split(b";")[0], 16)
                    if size == 0:
                        if raw.find(b"\r\n\r\n", nl) >= 0 or raw[nl:nl + 4] == b"\r\n\r\n":
                            a.complete = True
                        break
                    if len(raw) < nl + 2 + size + 2:
                        break
                    content += raw[nl + 2:nl + 2 + size]
                    pos = nl + 2 + size + 2
            else:
                content = raw
                if length is not None and len(content) >= length:
                    a.complete = True
            while (cut := content.find(b"\n\n", sum(len(e) for e in a.events))) >= 0:
                start = sum(len(e) for e in a.events)
                a.events.append(content[start:cut + 2])
                a.times.append(now)
    finally:
        if sock is None:
            s.close()
    a.body = content
    if not a.headers.get("content-type", "").startswith("text/event-stream"):
        a.events, a.times = [], []
    return a
