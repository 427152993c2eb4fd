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

Line rate: the same download from an upstream paced at BENCH_LINE_GBIT (default 10 Gbit/s: SO_MAX_PACING_RATE,
TCP's own pacing, as a NIC would cap it), direct and through another proxy: what the proxy keeps of a real line.
Host CPU: the whole machine's busy CPU per GiB downloaded (/proc/stat, softirqs and kernel threads included), direct
and proxied, means over the trials (its ticks are 10 ms). On loopback the download is CPU-bound (direct keeps both
cores busy: sender and receiver), so throughput_ratio measures what the relay costs in CPU, not whether it keeps a
line: a relay that costs one more direct download's CPU (relay_host_cpu_vs_direct = 1.0: the second TCP
connection that a proxy is) caps it near 0.5 on 2 cores.

RESULT keys: proxy_added_p50_us, proxy_added_p99_us (goal p50 <= 50 us), proxy_mbps, direct_mbps (MB/s),
throughput_ratio (proxy / direct on loopback, each trial's; goal >= 0.8) and its min/max over the trials,
line_ratio (proxy / direct at the paced line) and its min, line_gbit, proxy_cpu_s_per_gib (the proxy helper's CPU,
all its threads, per GiB it relayed) beside receiver_cpu_s_per_gib (the CPU of the direct download's receiving
thread per GiB), host_cpu_s_per_gib_direct / _proxied and relay_host_cpu_vs_direct ((proxied - direct) / direct),
trials, errors (short or wrong answers, direct and proxied), goal_met, missed= (the goals missed).

Goals (GOALS below; exit 1 when one is missed; `--goal key=value` sets one for a run, see bench/goals.py): added
p50 <= 50 us, throughput on loopback >= 0.8x direct (not met on a 2-core box, see docs/benchmarks.md), no error.
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

from chaoskit.injectors.proxy.fault import Proxy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from goals import Goal, Goals  # noqa: E402

GOALS = Goals(Goal("proxy_added_p50_us", "<=", 50, "median round trip through the proxy - direct"),
              Goal("throughput_ratio", ">=", 0.8, "loopback download through the proxy / direct, median trial"),
              Goal("errors", "<=", 0, "short or wrong answers"))

N = int(os.environ.get("BENCH_RTTS", "2000"))
BULK = int(os.environ.get("BENCH_BYTES", str(256 << 20)))
TRIALS = int(os.environ.get("BENCH_TRIALS", "5"))
PAYLOAD = b"x" * (1 << 20)
PAYLOAD_VIEW = memoryview(PAYLOAD)
LINE = float(os.environ.get("BENCH_LINE_GBIT", "10")) * 1e9 / 8  # bytes/s of the paced line
SO_MAX_PACING_RATE = 47  # asm-generic/socket.h


def serve(bulk: bool, pace: float = 0) -> socket.socket:
    """An echo or bulk (BULK bytes, then close) server; `pace`: each connection's send rate in bytes/s
    (SO_MAX_PACING_RATE: TCP's own pacing, as a NIC's line rate would cap it)."""
    srv = socket.create_server(("127.0.0.1", 0), backlog=64)

    def one(c: socket.socket) -> None:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if pace:
            c.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(pace))
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
        t0, c0, h0, got, wrong = time.perf_counter(), cpu(), host_busy_s(), 0, 0
        while n := s.recv_into(buf):
            got += n
            if not buf.startswith(PAYLOAD_VIEW[:n]):  # the payload is all b"x": a memcmp, no copy
                wrong += n - buf.count(b"x", 0, n)
        dt, used, host = time.perf_counter() - t0, cpu() - c0, host_busy_s() - h0
    if got != BULK or wrong:
        errors.append(f"{label}: download of {BULK} bytes got {got}" + (f", {wrong} of them not the payload's"
                                                                       if wrong else ""))
        return math.nan, math.nan, math.nan
    gib = got / (1 << 30)
    return got / dt / 1e6, used / gib, host / gib


def host_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (/proc/stat: all but idle and iowait), kernel threads and
    softirqs included: what the sender, the receiver and the relay cost together."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


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
    echo, bulk, paced = serve(bulk=False), serve(bulk=True), serve(bulk=True, pace=LINE)
    records = []
    added50, added99, ratios, line_ratios = [], [], [], []
    direct_mb, proxy_mb, proxy_cpu, receiver_cpu, host_direct, host_proxy = [], [], [], [], [], []
    try:
        ports = {}
        for name, up in (("echo", echo), ("bulk", bulk), ("paced", paced)):
            port = free_port()
            inj = Proxy(Proxy.Spec(type="network.proxy", listen=f"127.0.0.1:{port}",
                                   upstream=f"127.0.0.1:{up.getsockname()[1]}"))
            records.append(inj.apply(inj.prepare()))
            ports[name] = port
        helper = psutil.Process(records[1].proxy.pid)  # the bulk download's proxy
        for trial in range(TRIALS):  # interleaved, the same policy for both; the order alternates
            def alternate(pair: tuple, flip: bool = trial % 2 == 1) -> tuple:
                return pair[::-1] if flip else pair

            r = {label: rtts(port, errors, label)
                 for label, port in alternate((("direct", echo.getsockname()[1]), ("proxy", ports["echo"])))}
            p50 = {k: statistics.median(v) if v else math.nan for k, v in r.items()}
            p99 = {k: pct(v, 0.99) if v else math.nan for k, v in r.items()}
            added50.append((p50["proxy"] - p50["direct"]) * 1e6)
            added99.append((p99["proxy"] - p99["direct"]) * 1e6)
            m = {label: mbps(port, errors, label, h)
                 for label, port, h in alternate((("direct", bulk.getsockname()[1], None),
                                                  ("proxy", ports["bulk"], helper)))}
            line = {label: mbps(port, errors, f"{label} (paced)")[0]
                    for label, port in alternate((("direct", paced.getsockname()[1]), ("proxy", ports["paced"])))}
            direct_mb.append(m["direct"][0])
            proxy_mb.append(m["proxy"][0])
            ratios.append(m["proxy"][0] / m["direct"][0])
            line_ratios.append(line["proxy"] / line["direct"])
            receiver_cpu.append(m["direct"][1])
            proxy_cpu.append(m["proxy"][1])
            host_direct.append(m["direct"][2])
            host_proxy.append(m["proxy"][2])
            print(f"trial {trial + 1}: added p50 {added50[-1]:.1f} us p99 {added99[-1]:.1f} us; direct "
                  f"{m['direct'][0]:.0f} MB/s, proxy {m['proxy'][0]:.0f} MB/s, ratio {ratios[-1]:.3f}; CPU s/GiB: "
                  f"proxy {proxy_cpu[-1]:.3f}, direct receiver {receiver_cpu[-1]:.3f}, host direct "
                  f"{host_direct[-1]:.3f}, host proxied {host_proxy[-1]:.3f}; paced at {LINE * 8 / 1e9:g} Gbit/s: "
                  f"direct {line['direct']:.0f} MB/s, proxy {line['proxy']:.0f} MB/s, ratio {line_ratios[-1]:.3f}")
    finally:
        for rec in records:
            Proxy.revert(rec)
        for srv in (echo, bulk, paced):
            srv.close()
    for e in errors:
        print(f"ERROR {e}")
    med = statistics.median
    mean = statistics.fmean
    extra = (mean(host_proxy) - mean(host_direct)) / mean(host_direct)  # over all trials: ticks are 10 ms
    print(f"{TRIALS} trials of {N} round trips and {BULK >> 20} MiB downloads each, median (min-max): added p50 "
          f"{spread(added50)} us, throughput ratio {spread(ratios)}, at a {LINE * 8 / 1e9:g} Gbit/s line "
          f"{spread(line_ratios)}; host CPU per GiB (mean) direct {mean(host_direct):.3f} s, proxied "
          f"{mean(host_proxy):.3f} s: the relay adds {extra:.2f}x a direct download's (1.0: one more direct "
          f"download's worth)")
    return GOALS.result({
        "proxy_added_p50_us": f"{med(added50):.1f}", "proxy_added_p99_us": f"{med(added99):.1f}",
        "proxy_mbps": f"{med(proxy_mb):.1f}", "direct_mbps": f"{med(direct_mb):.1f}",
        "throughput_ratio": f"{med(ratios):.3f}", "throughput_ratio_min": f"{min(ratios):.3f}",
        "throughput_ratio_max": f"{max(ratios):.3f}", "line_ratio": f"{med(line_ratios):.3f}",
        "line_ratio_min": f"{min(line_ratios):.3f}", "line_gbit": f"{LINE * 8 / 1e9:g}",
        "proxy_cpu_s_per_gib": f"{med(proxy_cpu):.3f}", "receiver_cpu_s_per_gib": f"{med(receiver_cpu):.3f}",
        "host_cpu_s_per_gib_direct": f"{mean(host_direct):.3f}",
        "host_cpu_s_per_gib_proxied": f"{mean(host_proxy):.3f}", "relay_host_cpu_vs_direct": f"{extra:.3f}",
        "trials": TRIALS, "errors": len(errors)})


if __name__ == "__main__":
    sys.exit(main())
