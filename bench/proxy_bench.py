"""network.proxy benchmark: latency the proxy adds with no toxics, and its throughput, against a direct
loopback connection to the same upstream measured in the same run (the anchor).

Latency: 64-byte ping-pong over one connection, N round trips (default 2000, `BENCH_RTTS`) direct and through
the proxy; added p50/p99 = proxied percentile - direct percentile. Throughput: one connection downloading M bytes
(default 256 MiB, `BENCH_BYTES`) from a bulk upstream, direct and through the proxy. `BENCH_TRIALS` (default 5)
trials, each measuring both in turn (the order alternates); each figure is the median of the trials, and the
throughput ratio's range is printed with it.

Every answer is checked: a round trip must echo the 64 bytes sent (a closed connection or other bytes is an
error, and ends that connection's round trips); a download must deliver exactly M bytes, each one the payload's.
A throughput is computed only from a complete download (else `nan`); the latency only from complete round trips.

RESULT keys: proxy_added_p50_us, proxy_added_p99_us (goal p50 <= 50 us), proxy_mbps, direct_mbps (MB/s),
throughput_ratio (proxy / direct, each trial's; goal >= 0.8) and its min/max over the trials,
proxy_cpu_s_per_gib (the proxy helper's CPU, all its threads, per GiB it relayed) beside receiver_cpu_s_per_gib
(the CPU of the direct download's receiving thread per GiB: what a client spends on the same bytes; on 2 cores the
sender, the receiver and the relay share them, so the ratio also says how busy the machine was), trials, errors (short or wrong answers, direct and proxied; the exit status is 1
when it is not 0).
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import sys
import threading
import time

import psutil

from chaoskit.injectors.proxy import Proxy

N = int(os.environ.get("BENCH_RTTS", "2000"))
BULK = int(os.environ.get("BENCH_BYTES", str(256 << 20)))
TRIALS = int(os.environ.get("BENCH_TRIALS", "5"))
PAYLOAD = b"x" * (1 << 20)
PAYLOAD_VIEW = memoryview(PAYLOAD)


def serve(bulk: bool) -> socket.socket:
    srv = socket.create_server(("127.0.0.1", 0), backlog=64)

    def one(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            try:
                if bulk:
                    left = BULK
                    while left > 0:
                        c.sendall(PAYLOAD[:left])
                        left -= len(PAYLOAD)
                    return
                while d := c.recv(1 << 16):
                    c.sendall(d)
            except OSError:
                pass

    def loop() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(c,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return srv


PING = b"p" * 64


def rtts(port: int, errors: list[str], label: str) -> list[float]:
    """N round trips (after 200 warm-up ones); each must get its 64 bytes back. A closed connection or other
    bytes is an error and ends the loop: the times of the complete round trips before it are returned."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out = []
        for i in range(N + 200):
            t0 = time.perf_counter()
            s.sendall(PING)
            got = b""
            while len(got) < len(PING):
                data = s.recv(4096)
                if not data:
                    break
                got += data
            dt = time.perf_counter() - t0
            if got != PING:
                errors.append(f"{label}: round trip {i + 1}: {len(got)} of {len(PING)} bytes"
                              + (" (connection closed)" if len(got) < len(PING) else " (not the bytes sent)"))
                break
            out.append(dt)
        return sorted(out[200:])  # the first ones warm up caches and the proxy's connection


def mbps(port: int, errors: list[str], label: str, helper: psutil.Process | None = None) -> tuple[float, float]:
    """MB/s of one download of BULK bytes (nan, and an error, unless exactly BULK bytes of the payload arrived),
    and the CPU seconds per GiB it cost: the proxy helper's (all its threads) through the proxy, this receiving
    thread's on the direct download."""
    cpu = (lambda: sum(helper.cpu_times()[:2])) if helper is not None else time.thread_time
    with socket.create_connection(("127.0.0.1", port)) as s:
        buf = bytearray(1 << 20)
        t0, c0, got, wrong = time.perf_counter(), cpu(), 0, 0
        while n := s.recv_into(buf):
            got += n
            if not buf.startswith(PAYLOAD_VIEW[:n]):  # the payload is all b"x": a memcmp, no copy
                wrong += n - buf.count(b"x", 0, n)
        dt, used = time.perf_counter() - t0, cpu() - c0
    if got != BULK or wrong:
        errors.append(f"{label}: download of {BULK} bytes got {got}" + (f", {wrong} of them not the payload's"
                                                                       if wrong else ""))
        return math.nan, math.nan
    return got / dt / 1e6, used / (got / (1 << 30))


def pct(sorted_vals: list[float], q: float) -> float:
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(vals: list[float]) -> str:
    ok = sorted(v for v in vals if not math.isnan(v))
    return f"{statistics.median(ok):.3f} ({ok[0]:.3f}-{ok[-1]:.3f})" if ok else "nan"


def main() -> int:
    errors: list[str] = []
    echo, bulk = serve(bulk=False), serve(bulk=True)
    records = []
    added50, added99, ratios, direct_mb, proxy_mb, proxy_cpu, receiver_cpu = [], [], [], [], [], [], []
    try:
        ports = {}
        for name, up in (("echo", echo), ("bulk", bulk)):
            port = free_port()
            inj = Proxy(Proxy.Spec(type="network.proxy", listen=f"127.0.0.1:{port}",
                                   upstream=f"127.0.0.1:{up.getsockname()[1]}"))
            records.append(inj.apply(inj.prepare()))
            ports[name] = port
        helper = psutil.Process(records[-1]["proxy"]["pid"])  # the bulk download's proxy
        for trial in range(TRIALS):  # interleaved, the same policy for both; the order alternates
            order = (("direct", echo.getsockname()[1]), ("proxy", ports["echo"]))
            order = order if trial % 2 == 0 else order[::-1]
            r = {label: rtts(port, errors, label) for label, port in order}
            p50 = {k: statistics.median(v) if v else math.nan for k, v in r.items()}
            p99 = {k: pct(v, 0.99) if v else math.nan for k, v in r.items()}
            added50.append((p50["proxy"] - p50["direct"]) * 1e6)
            added99.append((p99["proxy"] - p99["direct"]) * 1e6)
            order = (("direct", bulk.getsockname()[1], None), ("proxy", ports["bulk"], helper))
            m = {label: mbps(port, errors, label, h) for label, port, h in (order if trial % 2 == 0 else order[::-1])}
            direct_mb.append(m["direct"][0])
            proxy_mb.append(m["proxy"][0])
            ratios.append(m["proxy"][0] / m["direct"][0])
            receiver_cpu.append(m["direct"][1])
            proxy_cpu.append(m["proxy"][1])
            print(f"trial {trial + 1}: added p50 {added50[-1]:.1f} us p99 {added99[-1]:.1f} us; direct "
                  f"{m['direct'][0]:.0f} MB/s, proxy {m['proxy'][0]:.0f} MB/s, ratio {ratios[-1]:.3f}; CPU s/GiB: "
                  f"proxy {proxy_cpu[-1]:.3f}, direct receiver {receiver_cpu[-1]:.3f}")
    finally:
        for rec in records:
            Proxy.revert(rec)
        echo.close()
        bulk.close()
    for e in errors:
        print(f"ERROR {e}")
    print(f"{TRIALS} trials of {N} round trips and a {BULK >> 20} MiB download each, median (min-max): added p50 "
          f"{spread(added50)} us, throughput ratio {spread(ratios)}")
    med = statistics.median
    print(f"RESULT proxy_added_p50_us={med(added50):.1f} proxy_added_p99_us={med(added99):.1f} "
          f"proxy_mbps={med(proxy_mb):.1f} direct_mbps={med(direct_mb):.1f} throughput_ratio={med(ratios):.3f} "
          f"throughput_ratio_min={min(ratios):.3f} throughput_ratio_max={max(ratios):.3f} "
          f"proxy_cpu_s_per_gib={med(proxy_cpu):.3f} receiver_cpu_s_per_gib={med(receiver_cpu):.3f} trials={TRIALS} "
          f"errors={len(errors)}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
