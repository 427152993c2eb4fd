"""network.proxy benchmark: latency the proxy adds with no toxics, and its throughput, against a direct
loopback connection to the same upstream measured in the same run (the anchor).

Latency: 64-byte ping-pong over one connection, N round trips (default 5000) direct and through the proxy;
added p50/p99 = proxied percentile - direct percentile. Throughput: one connection downloading M bytes
(default 512 MiB) from a bulk upstream, direct and through the proxy.

RESULT keys: proxy_added_p50_us, proxy_added_p99_us (goal p50 <= 200 us), proxy_mbps, direct_mbps (MB/s),
throughput_ratio (proxy / direct).
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time

from chaoskit.injectors.proxy import Proxy

N = int(os.environ.get("BENCH_RTTS", "5000"))
BULK = int(os.environ.get("BENCH_BYTES", str(512 << 20)))
PAYLOAD = b"x" * (1 << 20)


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


def rtts(port: int) -> list[float]:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out = []
        for _ in range(N + 200):
            t0 = time.perf_counter()
            s.sendall(b"p" * 64)
            got = 0
            while got < 64:
                got += len(s.recv(4096))
            out.append(time.perf_counter() - t0)
        return sorted(out[200:])  # the first ones warm up caches and the proxy's connection


def mbps(port: int) -> float:
    with socket.create_connection(("127.0.0.1", port)) as s:
        buf = bytearray(1 << 20)
        t0, got = time.perf_counter(), 0
        while n := s.recv_into(buf):
            got += n
        return got / (time.perf_counter() - t0) / 1e6


def pct(sorted_vals: list[float], q: float) -> float:
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    echo, bulk = serve(bulk=False), serve(bulk=True)
    records = []
    try:
        ports = {}
        for name, up in (("echo", echo), ("bulk", bulk)):
            port = free_port()
            inj = Proxy(Proxy.Spec(type="network.proxy", listen=f"127.0.0.1:{port}",
                                   upstream=f"127.0.0.1:{up.getsockname()[1]}"))
            records.append(inj.apply(inj.prepare()))
            ports[name] = port
        direct, proxied = rtts(echo.getsockname()[1]), rtts(ports["echo"])
        d_mbps, p_mbps = mbps(bulk.getsockname()[1]), mbps(ports["bulk"])
    finally:
        for rec in records:
            Proxy.revert(rec)
        echo.close()
        bulk.close()
    add50 = (statistics.median(proxied) - statistics.median(direct)) * 1e6
    add99 = (pct(proxied, 0.99) - pct(direct, 0.99)) * 1e6
    print(f"round trips ({N}): direct p50 {statistics.median(direct) * 1e6:.1f} us p99 {pct(direct, .99) * 1e6:.1f} us; "
          f"proxy p50 {statistics.median(proxied) * 1e6:.1f} us p99 {pct(proxied, .99) * 1e6:.1f} us")
    print(f"throughput ({BULK >> 20} MiB): direct {d_mbps:.0f} MB/s, proxy {p_mbps:.0f} MB/s")
    print(f"RESULT proxy_added_p50_us={add50:.1f} proxy_added_p99_us={add99:.1f} proxy_mbps={p_mbps:.1f} "
          f"direct_mbps={d_mbps:.1f} throughput_ratio={p_mbps / d_mbps:.3f}")


if __name__ == "__main__":
    main()
