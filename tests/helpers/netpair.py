"""Test network fixtures: two namespaces joined by a veth pair, servers and clients inside them."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable

from chaoskit.targets.netns import run_in_netns

SERVER_IP, CLIENT_IP = "10.211.0.1", "10.211.0.2"


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


class Pair:
    """Two namespaces joined by a veth pair: srv/eth0 = SERVER_IP, cli/eth0 = CLIENT_IP."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.srv, self.cli = f"ckt-srv-{tag}", f"ckt-cli-{tag}"
        for ns in (self.srv, self.cli):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.srv, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", self.cli)
        for ns, ip in ((self.srv, SERVER_IP), (self.cli, CLIENT_IP)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def path(self, ns: str) -> str:
        return f"/run/netns/{ns}"

    def qdiscs(self, ns: str) -> list[dict]:
        """tc's own view (an observer independent of the code under test)."""
        return json.loads(sh("ip", "netns", "exec", ns, "tc", "-j", "qdisc", "show"))

    def ruleset(self, ns: str) -> list[dict]:
        out = json.loads(sh("ip", "netns", "exec", ns, "nft", "-j", "list", "ruleset"))["nftables"]
        return [x for x in out if "metainfo" not in x]

    def close(self) -> None:
        for ns in (self.srv, self.cli):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def serve_in_threads(sock: socket.socket, handle) -> Callable[[], None]:
    """Accept on `sock`, one thread per connection running handle(conn); returns `stop`, which shuts the socket
    down (a plain close leaves accept() blocked and the port listening until the next connection) and waits for
    the accept thread."""

    def loop() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()

    def stop() -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        t.join()

    return stop


class Server:
    """A TCP server in a namespace: `bulk` sends N bytes per connection, `sink` reads to EOF; else it just accepts."""

    def __init__(self, ns_path: str, port: int = 7000, bulk: int = 0, sink: bool = False):
        self.sock = run_in_netns(ns_path, lambda: socket.create_server(("0.0.0.0", port), backlog=1024))
        self.bulk, self.sink, self.port = bulk, sink, port
        self.close = serve_in_threads(self.sock, self._one)

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                if self.bulk:
                    conn.sendall(b"x" * self.bulk)
                elif self.sink:  # read to EOF, then say so
                    while conn.recv(1 << 16):
                        pass
                    conn.sendall(b"k")
                else:
                    conn.recv(1)
            except OSError:
                pass


def download_rate(ns_path: str, port: int, nbytes: int) -> float:
    """Bytes/s of one download of `nbytes` from the server, measured in the client namespace: the bytes after the
    first read over the time from it to the last, so that the server's late accept on a loaded box (its thread
    waits for the CPU; 0.3 s of it read a 2 MB/s limit as 1.66 MB/s in a CI run) is not counted as the link's."""

    def go() -> float:
        with socket.create_connection((SERVER_IP, port), timeout=30) as s:
            first = s.recv(1 << 16)
            t0, got = time.monotonic(), 0
            while first and len(first) + got < nbytes:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                got += len(chunk)
            return got / max(time.monotonic() - t0, 1e-9)

    return run_in_netns(ns_path, go)


def upload_rate(ns_path: str, port: int, nbytes: int) -> float:
    """Bytes/s of one upload to a sink server, from the first byte sent to the server's acknowledgement."""

    def go() -> float:
        with socket.create_connection((SERVER_IP, port), timeout=30) as s:
            t0 = time.monotonic()
            s.sendall(b"u" * nbytes)
            s.shutdown(socket.SHUT_WR)
            assert s.recv(1) == b"k"
            return nbytes / (time.monotonic() - t0)

    return run_in_netns(ns_path, go)


def snmp(ns_path: str, proto: str, table: str = "snmp") -> dict[str, int]:
    """/proc/net/snmp's `proto` counters of that namespace (table "netstat": /proc/net/netstat's, e.g. TcpExt)."""
    def read() -> dict[str, int]:
        rows = [ln.split() for ln in open(f"/proc/thread-self/net/{table}").read().splitlines()
                if ln.startswith(proto + ":")]
        return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:], strict=True)}
    return run_in_netns(ns_path, read)


def connect_share(ns_path: str, port: int, n: int, timeout: float) -> float:
    """Share of n concurrent connects that complete within `timeout` (one SYN each: SYN retry comes after 1 s)."""

    async def one() -> bool:
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection(SERVER_IP, port), timeout)
            w.close()
            return True
        except (TimeoutError, OSError):
            return False

    async def main() -> float:
        res = await asyncio.gather(*(one() for _ in range(n)))
        return sum(res) / n

    return run_in_netns(ns_path, lambda: asyncio.run(main()))


def queue_mode_missing() -> str | None:
    """Why network.netem's queue mode cannot run on this host (None: it can)."""
    import os

    from chaoskit import cbuild, doctor

    if os.geteuid() != 0:
        return "network namespaces and nftables need root"
    off = [o for o in doctor.QUEUE_OPTIONS if doctor.kernel_config(o) == "n"]
    if off:
        return f"this kernel lacks {', '.join(off)}"
    if cbuild.compiler() is None:
        return "no C compiler ($CC, cc or gcc) to build the netemq helper"
    return None
