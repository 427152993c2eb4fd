"""Both senders (native C and asyncio) against a scripted HTTP server on real sockets: the same wire bytes give
the same outcome - chunked SSE cut at awkward places, usage counts, errors inside a 200 stream, HTTP errors,
a silent server, close-delimited bodies, non-streamed JSON."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chaoskit.errors import ChaoskitError
from chaoskit.load import native
from chaoskit.load.runner import run_load
from chaoskit.load.spec import LoadSpec
from tests.conftest import ROOT, native_sender_or_skip
from tests.helpers.netpair import serve_in_threads


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _chunked(body: bytes, size: int) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nX-Trailer: 1\r\n\r\n"


TOKENS = _sse(*({"choices": [{"text": f"t{i}", "index": 0}]} for i in range(3)),
              {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 5}})
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"

# name: (wire bytes of one response, piece size (0: whole), close after it, spec overrides, expected)
CASES: dict[str, tuple[bytes | None, int, bool, dict, dict]] = {
    "chunked SSE in 7-byte pieces, usage chunk": (
        SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(TOKENS, 23), 7, False, {},
        {"ok": 10, "output_tokens": 50, "errors": {}}),
    "error event inside a 200 stream": (
        SSE_HEAD + b"Content-Length: %d\r\n\r\n" % len(body := _sse({"choices": [{"text": "a"}]},
                                                                    {"error": {"message": "boom"}})) + body,
        0, False, {}, {"ok": 0, "errors": {"stream_error": 10}}),
    "HTTP 500": (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\noops!", 0, False, {},
                 {"ok": 0, "errors": {"http_status": 10}}),
    "silent server": (None, 0, False, {"timeout": 0.3}, {"ok": 0, "errors": {"timeout": 10}}),
    "close-delimited body": (SSE_HEAD + b"Connection: close\r\n\r\n" + _sse({"choices": [{"text": "a"}]},
                                                                          {"choices": [{"text": "b"}]}),
                             5, True, {}, {"ok": 10, "output_tokens": 20, "errors": {}}),
    "non-streamed JSON with usage": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(
            js := json.dumps({"choices": [{"text": "x" * 5000}], "usage": {"completion_tokens": 7}}).encode()) + js,
        1000, False, {"stream": False}, {"ok": 10, "output_tokens": 70, "errors": {}}),
    "chat: a role-only chunk is not a token": (
        SSE_HEAD + b"Content-Length: %d\r\n\r\n" % len(chat := _sse(
            {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
            *({"choices": [{"delta": {"content": c}}]} for c in "ab"))) + chat,
        0, False, {"api": "openai-chat"}, {"ok": 10, "output_tokens": 20, "errors": {}}),
    "a stream ending without data: [DONE]": (
        SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(TOKENS.removesuffix(b"data: [DONE]\n\n"), 40),
        0, False, {}, {"ok": 0, "errors": {"stream_truncated": 10}}),
    "a chunked stream cut by a close mid-chunk": (
        SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(TOKENS, 40)[:90], 0, True, {},
        {"ok": 0, "errors": {"stream_truncated": 10}}),
    "triton: a stream ends with its body, no [DONE]": (
        SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(b"".join(
            b"data: " + json.dumps({"text_output": c}).encode() + b"\n\n" for c in "abc"), 16),
        0, False, {"api": "triton", "model": "tiny_lm"}, {"ok": 10, "output_tokens": 30, "errors": {}}),
}


def _serve(response: bytes | None, piece: int, close: bool) -> tuple[int, Callable[[], None]]:
    """Answer each request on 127.0.0.1 with `response` (in `piece`-byte writes; None: never answer); returns
    the port and a shutdown that also closes the connections it accepted."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def handle(c: socket.socket) -> None:
        conns.append(c)
        buf = b""
        try:
            while data := c.recv(65536):
                buf += data
                while b"\r\n\r\n" in buf:
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    n = int(next((ln.split(b":")[1] for ln in head.lower().split(b"\r\n")
                                  if ln.startswith(b"content-length")), b"0"))
                    if len(rest) < n:
                        break
                    buf = rest[n:]
                    if response is None:
                        continue  # silent: never answers
                    for i in range(0, len(response), piece or len(response)):
                        c.sendall(response[i:i + (piece or len(response))])
                        if piece:
                            time.sleep(0.0005)
                    if close:
                        c.close()
                        return
        except OSError:
            return

    stop = serve_in_threads(srv, handle)

    def shutdown() -> None:
        stop()
        for c in conns:
            c.close()

    return srv.getsockname()[1], shutdown


@pytest.mark.parametrize("case", list(CASES))
def test_same_wire_bytes_same_outcome(load_sender, case):
    response, piece, close, overrides, expected = CASES[case]
    port, shutdown = _serve(response, piece, close)
    try:
        spec = LoadSpec(**{"url": f"http://127.0.0.1:{port}", "api": "openai", "model": "m", "rate": 20,
                           "duration": 0.5, "arrival": "constant", "timeout": 2, "sender": load_sender, **overrides})
        s = asyncio.run(run_load(spec))
    finally:
        shutdown()
    assert s["sender"] == load_sender
    assert {k: s[k] for k in expected} == expected, case
    if expected["ok"] and spec.stream:
        assert s["ttft_p50_ms"] > 0 and s["itl_p50_ms"] is not None


def test_native_refuses_https_and_auto_uses_python_there():
    with pytest.raises(ChaoskitError, match="plain http"):
        native.choose(LoadSpec(url="https://example.invalid", rate=1, duration=1, sender="native"))
    assert native.choose(LoadSpec(url="https://example.invalid", rate=1, duration=1)) == "python"


def test_native_unresolvable_host_is_a_clear_error():
    native_sender_or_skip()
    r = subprocess.run([sys.executable, "-m", "chaoskit", "load", "http://no-such-host.invalid/", "--rate", "5",
                        "--duration", "1s", "--sender", "native"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "cannot resolve no-such-host.invalid" in r.stderr and "Traceback" not in r.stderr


def test_a_request_larger_than_the_socket_buffer_is_sent_whole(load_sender, tmp_path):
    """An 8 MB prompt: the send returns short and the rest goes out as the server reads (EPOLLOUT / drain)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("x" * 8_000_000 + "\n")
    body = _sse({"choices": [{"text": "a"}]})
    port, shutdown = _serve(SSE_HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body, 0, False)
    try:
        s = asyncio.run(run_load(LoadSpec(url=f"http://127.0.0.1:{port}", api="openai", model="m", rate=4,
                                          duration=0.5, arrival="constant", timeout=10, prompts_file=str(prompts),
                                          sender=load_sender)))
    finally:
        shutdown()
    assert s["ok"] == 2 and s["errors"] == {} and s["output_tokens"] == 2


def _sockets() -> set[str]:
    out = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def test_native_warm_opens_each_connection_once_and_close_leaves_none():
    """warm(n) opens n connections the sender then uses; an earlier ck_warm dialled one connection struct n times
    and leaked n - 1 connected sockets that stayed in its epoll set, writable, so every poll returned them (15
    spurious events a poll at 10k req/s, most of the sender's CPU)."""
    native_sender_or_skip()
    srv = socket.create_server(("127.0.0.1", 0), backlog=64)
    port = srv.getsockname()[1]
    from chaoskit.load.recorder import Recorder

    before = _sockets()
    sender = native.Sender(LoadSpec(url=f"http://127.0.0.1:{port}", rate=1, duration=1),
                           [b"GET / HTTP/1.1\r\n\r\n"], Recorder())
    try:
        sender.warm(8)
        accepted = []
        srv.settimeout(2)
        for _ in range(8):
            accepted.append(srv.accept()[0])
        srv.settimeout(0.2)
        with pytest.raises(TimeoutError):
            accepted.append(srv.accept()[0])  # no ninth connection
        opened = _sockets() - before - {f"socket:[{os.stat(f'/proc/self/fd/{s.fileno()}').st_ino}]"
                                        for s in [srv, *accepted]}
        assert len(opened) == 8, opened  # the sender's 8 (its epoll and timer fds are anon inodes)
    finally:
        sender.close()
        for s in accepted:
            s.close()
        srv.close()
    assert not (_sockets() - before), "the sender left sockets open"
