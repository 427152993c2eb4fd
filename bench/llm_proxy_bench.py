"""llm.proxy benchmark, in one run against the same upstream (a lean OpenAI-style server in a subprocess that
answers at once: non-streamed completions, and SSE streams written in one go, one chunk per event):

- latency: N sequential keep-alive completions (default 5000) direct and through a proxy with no faults,
  interleaved in blocks so both see the same noise; added p50/p99 = proxied - direct percentile;
- token_delay 20ms: streams of 32 tokens through a proxy with `token_delay: 20ms`; the gaps between token
  events as the client receives them vs the 20 ms requested (the upstream's own gap is ~0);
- abort share 0.2: M requests (default 6000) through a proxy with `abort: 503, share: 0.2`; the share of 503s;
- streaming throughput: one SSE stream of E events (default 1 000 000, ~80 MB, made once by the upstream)
  read whole, direct, through the proxy with no faults (bytes relayed as they are, the end of the chunked body
  found by llhttp) and with a token-level fault that parses and re-frames every event but changes nothing
  (truncate after 10^9 tokens); 5 rounds, each reading once from each of the three in turn.

The L4 network.proxy (no toxics) is measured beside it in the same interleaved latency loop: what one more
loopback hop through a Python process costs on this machine at this moment (the noise floor of the goal).

Every answer is checked: a completion must be `200` with the upstream's body (`503` or that through the abort
proxy); a stream must be `200` with every token event the upstream sent, `data: [DONE]` and the final chunk.
A short, cut or wrong answer is an error: it is left out of what is measured (a latency, a gap, a throughput
over complete streams only; `nan` when none was complete) and counted in `errors`; the exit status is then 1.
Sizes: `BENCH_REQUESTS` (N), `BENCH_ABORTS` (M), `BENCH_EVENTS` (E).

RESULT keys: added_p50_us, added_p99_us (goal p50 <= 200 us), l4_added_p50_us (network.proxy, same run),
itl_p50_ms, itl_error_ms (|p50 - 20|, goal <= 1), abort_share, abort_share_error (|share - 0.2|, goal <= 0.015),
direct_mbps, proxy_mbps (medians of the rounds), throughput_ratio (the median of the rounds' proxy / direct;
goal >= 0.8), throughput_ratio_min/_max, events_mbps (every event parsed), events_ratio (median, parsed / direct),
errors (short, cut or wrong answers in all of the above), goal_met, missed= (the goals missed).

Goals (GOALS below; exit 1 when one is missed; `--goal key=value` sets one for a run, see bench/goals.py): added
p50 <= 200 us, token gap p50 within 1 ms of 20 ms, abort share within 1.5 points of 0.2, relayed SSE >= 0.95x
direct (raised from 0.8: 0.89 measured), no error.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaoskit.injectors.llm_proxy.fault import LlmProxy  # noqa: E402
from chaoskit.injectors.proxy.fault import Proxy  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from goals import Goal, Goals  # noqa: E402

GOALS = Goals(Goal("added_p50_us", "<=", 200, "median completion through llm.proxy - direct"),
              Goal("itl_error_ms", "<=", 1, "|token gap p50 - 20 ms| through token_delay 20ms"),
              Goal("abort_share_error", "<=", 0.015, "|share of 503s - 0.2| through abort share 0.2"),
              Goal("throughput_ratio", ">=", 0.95, "relayed SSE stream / direct, median round"),
              Goal("errors", "<=", 0, "short, cut or wrong answers"))

N = int(os.environ.get("BENCH_REQUESTS", "5000"))
M = int(os.environ.get("BENCH_ABORTS", "6000"))
EVENTS = int(os.environ.get("BENCH_EVENTS", "1000000"))
GAP_MS, ITL_TOKENS, ITL_STREAMS, TRIALS = 20.0, 32, 10, 5


# ---------------------------------------------------------------- the upstream (run as `--upstream PORT`)

COMPLETION_BODY = b'{"id":"c","choices":[{"text":"hello","index":0}],"usage":{"completion_tokens":1}}'
TOKEN_MARK = b'"text":"'  # one in each token event
STREAM_END = b"data: [DONE]\n\n\r\n0\r\n\r\n"  # the [DONE] event, then the final chunk


def _event(i: int) -> bytes:
    ev = b'data: {"id":"c","choices":[{"text":"t%d","index":0}]}\n\n' % i
    return b"%x\r\n%b\r\n" % (len(ev), ev)


@functools.cache
def _big() -> bytes:
    """The E-event stream, made once: the throughputs measure relaying it, not making it (making 200 000 events
    took 0.29 s here, longer than relaying them)."""
    return b"".join(_event(i) for i in range(EVENTS))


class _Upstream(asyncio.Protocol):
    def connection_made(self, t: asyncio.BaseTransport) -> None:
        self.t, self.buf = t, b""
        t.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", self.buf[:end])
            total = end + 4 + (int(m.group(1)) if m else 0)
            if len(self.buf) < total:
                return
            head, body, self.buf = self.buf[:end], self.buf[end + 4:total], self.buf[total:]
            self.answer(head.split(b" ", 2)[1], body)

    def answer(self, path: bytes, body: bytes) -> None:
        if path == b"/big":
            events = _big()
        elif b'"stream": true' in body:
            n = int(re.search(rb'"max_tokens": (\d+)', body).group(1))
            events = b"".join(_event(i) for i in range(n))
        else:
            js = COMPLETION_BODY
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                         % (len(js), js))
            return
        done = b"data: [DONE]\n\n"
        self.t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + events + b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done))


def upstream_main(port: int) -> None:
    from chaoskit.aio import run_fast

    _big()  # made before `ready`: no round pays for it

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(_Upstream, "127.0.0.1", port, backlog=256)
        print("ready", flush=True)
        async with srv:
            await srv.serve_forever()

    run_fast(serve())


# ---------------------------------------------------------------- the client

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conn(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _request(body: dict, path: str = "/v1/completions") -> bytes:
    b = json.dumps(body).encode()
    return b"POST %b HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        path.encode(), len(b), b)


COMPLETION = _request({"model": "m", "prompt": "hi", "max_tokens": 1})


class BadAnswer(Exception):
    """A short, cut or wrong answer: counted as an error, never measured."""


class Errors:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, where: str, what: object) -> None:
        self.lines.append(f"{where}: {what}")

    def __len__(self) -> int:
        return len(self.lines)


def _recv(s: socket.socket, n: int) -> bytes:
    data = s.recv(n)
    if not data:
        raise BadAnswer("connection closed mid-answer")
    return data


def one(s: socket.socket, req: bytes) -> tuple[int, bytes]:
    """Send a request, read a Content-Length answer: (status, body); BadAnswer if it is cut or has no length."""
    s.sendall(req)
    buf = b""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        buf += _recv(s, 65536)
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", buf[:end])
    if not buf.startswith(b"HTTP/1.1 ") or m is None:
        raise BadAnswer(f"not a Content-Length answer: {buf[:end][:80]!r}")
    n = int(m.group(1))
    while len(buf) < end + 4 + n:
        buf += _recv(s, 65536)
    return int(buf[9:12]), buf[end + 4:end + 4 + n]


def completion(s: socket.socket, allowed: tuple[int, ...] = (200,)) -> int:
    """One completion; its status, which must be in `allowed`, with the upstream's body when 200 (BadAnswer)."""
    status, body = one(s, COMPLETION)
    if status not in allowed:
        raise BadAnswer(f"status {status}")
    if status == 200 and body != COMPLETION_BODY:
        raise BadAnswer(f"200 with a body of {len(body)} bytes, not the upstream's {len(COMPLETION_BODY)}")
    return status


def stream(s: socket.socket, req: bytes, tokens: int) -> tuple[list[float], int]:
    """Send a streaming request, read to the final chunk: (arrival time of each token event, bytes). BadAnswer
    unless it is a 200 carrying all `tokens` token events, then [DONE] and the final chunk."""
    s.sendall(req)
    times: list[float] = []
    total, head, tail = 0, b"", b""
    keep = len(TOKEN_MARK) - 1  # a mark split between two reads is counted once: in the read that ends it
    while True:
        try:
            data = s.recv(1 << 20)
        except ConnectionError as e:
            raise BadAnswer(f"stream cut after {len(times)} of {tokens} token events ({e})") from None
        now = time.perf_counter()
        if not data:
            raise BadAnswer(f"stream closed after {len(times)} of {tokens} token events, before its final chunk")
        if len(head) < 12:
            head += data[:12]
        total += len(data)
        times.extend([now] * (tail[-keep:] + data).count(TOKEN_MARK))
        tail = (tail + data)[-len(STREAM_END):]
        if tail.endswith(b"\r\n0\r\n\r\n"):
            break
    if not head.startswith(b"HTTP/1.1 200"):
        raise BadAnswer(f"stream answered {head[:12]!r}")
    if len(times) != tokens or tail != STREAM_END:
        raise BadAnswer(f"stream ended after {len(times)} of {tokens} token events"
                        + ("" if tail == STREAM_END else ", without [DONE]"))
    return times, total


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile; nan for no values (no complete answer to measure)."""
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def latency(errors: Errors, **ports: int) -> list[list[float]]:
    """N sequential requests on one keep-alive connection to each port, interleaved in blocks of 100; the times
    of the complete 200s with the upstream's body (a bad answer is an error, and the connection is made anew)."""
    socks = {name: _conn(p) for name, p in ports.items()}
    out: dict[str, list[float]] = {name: [] for name in ports}

    def timed(name: str) -> float | None:
        t0 = time.perf_counter()
        try:
            completion(socks[name])
            return time.perf_counter() - t0
        except (BadAnswer, OSError) as e:
            errors.add(f"latency {name}", e)
            socks[name].close()
            socks[name] = _conn(ports[name])
            return None

    for name in ports:  # warm up
        for _ in range(200):
            timed(name)
    for _ in range(N // 100):
        for name, times in out.items():
            for _ in range(100):
                if (dt := timed(name)) is not None:
                    times.append(dt)
    for s in socks.values():
        s.close()
    return list(out.values())


def read_big(port: int, errors: Errors, name: str) -> float:
    """MB/s of one read of the whole E-event stream; nan (and an error) if it was not complete."""
    with _conn(port) as s:
        t0 = time.perf_counter()
        try:
            _, n = stream(s, b"GET /big HTTP/1.1\r\nHost: bench\r\n\r\n", EVENTS)
        except (BadAnswer, OSError) as e:
            errors.add(f"throughput {name}", e)
            return math.nan
        return n / (time.perf_counter() - t0) / 1e6


def throughput(errors: Errors, **ports: int) -> dict[str, list[float]]:
    """TRIALS rounds (after one that warms up), each reading the stream once from every port in turn (so all see
    the same noise): the MB/s of each read, by port name."""
    out: dict[str, list[float]] = {name: [] for name in ports}
    for i in range(TRIALS + 1):
        for name, port in ports.items():
            mbps = read_big(port, errors, name)
            if i:  # round 0 warms up
                out[name].append(mbps)
    return out


def ratios(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the per-round ratios num/den over the rounds where both reads were complete."""
    rs = sorted(a / b for a, b in zip(num, den, strict=True) if not (math.isnan(a) or math.isnan(b)))
    return (statistics.median(rs), rs[0], rs[-1]) if rs else (math.nan,) * 3


def median(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def start(upstream: int, faults: list[dict]) -> tuple[int, dict]:
    port = _free_port()
    inj = LlmProxy(LlmProxy.Spec(type="llm.proxy", listen=f"127.0.0.1:{port}", upstream=f"127.0.0.1:{upstream}",
                                 faults=faults, seed=7))
    inj.ctx.lifetime_s = 600
    return port, inj.apply(inj.prepare())


def main() -> int:
    up_port = _free_port()
    up = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)], stdout=subprocess.PIPE, text=True)
    assert up.stdout is not None and up.stdout.readline().strip() == "ready"
    records = []
    errors = Errors()
    try:
        plain, r = start(up_port, [])
        records.append(r)
        itl, r = start(up_port, [{"type": "token_delay", "delay": f"{GAP_MS}ms"}])
        records.append(r)
        abort, r = start(up_port, [{"type": "abort", "status": 503, "retry_after": 1, "share": 0.2}])
        records.append(r)
        parsed, r = start(up_port, [{"type": "truncate", "after_tokens": 10**9, "match": {"path": "/big"}}])
        records.append(r)

        l4_port = _free_port()
        l4 = Proxy(Proxy.Spec(type="network.proxy", listen=f"127.0.0.1:{l4_port}", upstream=f"127.0.0.1:{up_port}"))
        l4_rec = l4.apply(l4.prepare())
        try:
            dt, pt, lt = latency(errors, direct=up_port, proxy=plain, l4=l4_port)
        finally:
            Proxy.revert(l4_rec)
        added50, added99 = (pct(pt, 50) - pct(dt, 50)) * 1e6, (pct(pt, 99) - pct(dt, 99)) * 1e6
        l4_added50 = (pct(lt, 50) - pct(dt, 50)) * 1e6

        gaps: list[float] = []
        s = _conn(itl)
        for _ in range(ITL_STREAMS):
            try:
                times, _ = stream(s, _request({"model": "m", "prompt": "hi", "max_tokens": ITL_TOKENS,
                                               "stream": True}), ITL_TOKENS)
            except (BadAnswer, OSError) as e:
                errors.add("token_delay", e)
                s.close()
                s = _conn(itl)
                continue
            gaps += [(b - a) * 1e3 for a, b in zip(times, times[1:], strict=False)]
        s.close()
        itl50 = statistics.median(gaps) if gaps else math.nan

        statuses: list[int] = []
        s = _conn(abort)
        for _ in range(M):
            try:
                statuses.append(completion(s, (200, 503)))
            except (BadAnswer, OSError) as e:
                errors.add("abort", e)
                s.close()
                s = _conn(abort)
        s.close()
        share = statuses.count(503) / len(statuses) if statuses else math.nan

        mbps = throughput(errors, direct=up_port, proxy=plain, parsed=parsed)
    finally:
        for r in records:
            LlmProxy.revert(r)
        up.kill()
        up.wait()

    for line in errors.lines[:20]:
        print(f"ERROR {line}")
    if len(errors) > 20:
        print(f"ERROR ... and {len(errors) - 20} more")
    print(f"{'':34}{'p50':>10}{'p99':>10}")
    print(f"{'direct completion RTT (us)':34}{pct(dt, 50) * 1e6:10.1f}{pct(dt, 99) * 1e6:10.1f}")
    print(f"{'through llm.proxy, no faults (us)':34}{pct(pt, 50) * 1e6:10.1f}{pct(pt, 99) * 1e6:10.1f}")
    print(f"{'added (us)':34}{added50:10.1f}{added99:10.1f}   ({N} requests each; complete: direct {len(dt)}, "
          f"llm.proxy {len(pt)}, L4 {len(lt)})")
    print(f"{'through network.proxy (L4) (us)':34}{pct(lt, 50) * 1e6:10.1f}{pct(lt, 99) * 1e6:10.1f}   "
          f"added p50 {l4_added50:.1f}")
    print(f"token_delay {GAP_MS:g}ms: inter-token gap p50 {itl50:.3f} ms, p10 {pct(gaps, 10):.3f}, "
          f"p90 {pct(gaps, 90):.3f}, p99 {pct(gaps, 99):.3f} ({len(gaps)} gaps)")
    print(f"abort 503 share 0.2: {statuses.count(503)} of {len(statuses)} answered (of {M} sent) = {share:.4f}; "
          f"Retry-After sent with each")
    direct_mbps, proxy_mbps, events_mbps = (median(mbps[k]) for k in ("direct", "proxy", "parsed"))
    ratio, ratio_min, ratio_max = ratios(mbps["proxy"], mbps["direct"])
    events_ratio = ratios(mbps["parsed"], mbps["direct"])[0]
    print(f"SSE stream of {EVENTS} events, MB/s of each of {TRIALS} rounds: "
          + "; ".join(f"{k} {' '.join(f'{x:.0f}' for x in v)}" for k, v in mbps.items()))
    print(f"  medians: direct {direct_mbps:.1f}, proxy {proxy_mbps:.1f} (ratio per round: median {ratio:.3f}, "
          f"{ratio_min:.3f}-{ratio_max:.3f}), proxy parsing every event {events_mbps:.1f}")
    return GOALS.result({
        "added_p50_us": f"{added50:.1f}", "added_p99_us": f"{added99:.1f}", "l4_added_p50_us": f"{l4_added50:.1f}",
        "itl_p50_ms": f"{itl50:.3f}", "itl_error_ms": f"{abs(itl50 - GAP_MS):.3f}", "abort_share": f"{share:.4f}",
        "abort_share_error": f"{abs(share - 0.2):.4f}", "direct_mbps": f"{direct_mbps:.1f}",
        "proxy_mbps": f"{proxy_mbps:.1f}", "throughput_ratio": f"{ratio:.3f}",
        "throughput_ratio_min": f"{ratio_min:.3f}", "throughput_ratio_max": f"{ratio_max:.3f}",
        "events_mbps": f"{events_mbps:.1f}", "events_ratio": f"{events_ratio:.3f}", "errors": len(errors)})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--upstream":
        upstream_main(int(sys.argv[2]))
    else:
        sys.exit(main())
