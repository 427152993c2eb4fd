"""A counting pass-through between a third-party gateway and each replica: bytes relayed unchanged, every request
and its answer written as a JSON line (when it reached the replica's door, status, when its answer ended or how
it broke) and counted on a Prometheus /metrics listener, in a process of its own so that a frozen or killed
replica cannot hide what was sent to it."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import httptools
from prometheus_client import CollectorRegistry, Counter, generate_latest

CHUNK = 65536


@dataclass
class Exchange:
    """One request through the tap and what came back."""

    replica: str
    conn: int
    method: str
    path: str
    t: float = field(default_factory=time.time)  # its head arrived from the gateway
    status: int = 0
    t_status: float | None = None  # the answer's head came from the replica
    t_end: float | None = None  # the answer ended
    outcome: str = "pending"  # complete | upstream_closed | gateway_closed | refused | tap_stopped

    def line(self) -> str:
        return json.dumps(asdict(self)) + "\n"


class Counts:
    """The tap's Prometheus counters, in a registry of its own: requests as they reach a replica's door (the
    gateway's upstream attempts), answers as they end."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("chaoskit_tap_requests", "requests the gateway sent to a replica, counted on "
                                "arrival", ["replica", "path"], registry=self.registry)
        self.answers = Counter("chaoskit_tap_answers", "requests whose answer ended, by how", ["replica", "path",
                               "outcome", "status"], registry=self.registry)

    def arrived(self, ex: Exchange) -> None:
        self.requests.labels(ex.replica, ex.path.partition("?")[0]).inc()

    def ended(self, ex: Exchange) -> None:
        self.answers.labels(ex.replica, ex.path.partition("?")[0], ex.outcome, str(ex.status)).inc()


class Connection:
    """One gateway connection and its upstream one, both directions parsed as they are relayed; answers are
    matched to requests in order (HTTP/1.1 keeps the order)."""

    def __init__(self, replica: str, conn: int, log: TextIO, counts: Counts):
        self.replica, self.conn, self.log, self.counts = replica, conn, log, counts
        self.waiting: deque[Exchange] = deque()  # requests sent on, their answers not ended yet
        self.requests = httptools.HttpRequestParser(RequestSide(self))
        self.answers = httptools.HttpResponseParser(AnswerSide(self))

    def finish(self, outcome: str) -> None:
        ex = self.waiting.popleft()
        ex.t_end, ex.outcome = time.time(), outcome
        self.log.write(ex.line())
        self.counts.ended(ex)

    def close(self, outcome: str) -> None:
        """The connection ended: every request still waiting for (the rest of) its answer ends with `outcome`."""
        while self.waiting:
            self.finish(outcome)


class RequestSide:
    """httptools callbacks of the gateway -> replica direction."""

    def __init__(self, c: Connection):
        self.c = c
        self.path = ""

    def on_message_begin(self) -> None:
        self.path = ""

    def on_url(self, url: bytes) -> None:
        self.path += url.decode(errors="replace")

    def on_headers_complete(self) -> None:
        method = self.c.requests.get_method().decode()
        ex = Exchange(self.c.replica, self.c.conn, method, self.path)
        self.c.waiting.append(ex)
        self.c.counts.arrived(ex)


class AnswerSide:
    """httptools callbacks of the replica -> gateway direction."""

    def __init__(self, c: Connection):
        self.c = c

    def on_headers_complete(self) -> None:
        if self.c.waiting:
            self.c.waiting[0].status = self.c.answers.get_status_code()
            self.c.waiting[0].t_status = time.time()

    def on_message_complete(self) -> None:
        if self.c.waiting:
            self.c.finish("complete")


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parse: Any) -> None:
    try:
        while data := await reader.read(CHUNK):
            try:
                parse(data)
            except httptools.HttpParserError:
                pass  # still relayed: the tap counts, it does not judge
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass


async def relay(replica: str, host: str, port: int, log: TextIO, counts: Counts, ids: itertools.count,
                live: set[Connection], down: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
    c = Connection(replica, next(ids), log, counts)
    live.add(c)
    try:
        await _relay(c, host, port, down, up)
    finally:
        live.discard(c)


async def _relay(c: Connection, host: str, port: int, down: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
    connected = await connect(c, host, port, down)
    if connected is None:
        up.close()
        return
    r_reader, r_writer = connected
    to_replica = asyncio.create_task(pump(down, r_writer, c.requests.feed_data))
    from_replica = asyncio.create_task(pump(r_reader, up, c.answers.feed_data))
    done, _ = await asyncio.wait({to_replica, from_replica}, return_when=asyncio.FIRST_COMPLETED)
    if from_replica in done:  # the replica closed or reset: whatever waits is lost
        c.close("upstream_closed")
        to_replica.cancel()
    else:  # the gateway closed: what it waited for ends now (a frozen replica may answer much later, or never)
        c.close("gateway_closed")
        from_replica.cancel()
    for w in (r_writer, up):
        w.close()


async def connect(c: Connection, host: str, port: int,
                  down: asyncio.StreamReader) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """The connection to the replica, the gateway's bytes read (and its requests logged as they arrive) while it
    is being made: a replica cut off by the network answers no SYN for minutes. None when it refused, or the
    gateway gave up first (its requests then ended: refused, gateway_closed)."""
    connecting = asyncio.ensure_future(asyncio.open_connection(host, port))
    early = bytearray()
    while not connecting.done():
        reading = asyncio.ensure_future(down.read(CHUNK))
        await asyncio.wait({connecting, reading}, return_when=asyncio.FIRST_COMPLETED)
        if not reading.done():
            reading.cancel()  # a read cancelled while it waits takes no bytes
            continue
        data = reading.result()
        if not data:
            connecting.cancel()
            c.close("gateway_closed")
            return None
        early += data
        try:
            c.requests.feed_data(data)
        except httptools.HttpParserError:
            pass
    try:
        r_reader, r_writer = connecting.result()
    except OSError:  # refused at once: the request the gateway sends next (within a second) is counted
        if not c.waiting:
            try:
                c.requests.feed_data(await asyncio.wait_for(down.read(CHUNK), 1.0))
            except (TimeoutError, OSError, httptools.HttpParserError):
                pass
        c.close("refused")
        return None
    if early:
        r_writer.write(bytes(early))
    return r_reader, r_writer


async def metrics(counts: Counts, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One HTTP/1.0-style exchange: GET /metrics gets the counters, anything else a 404; then the connection
    closes."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        parts = head.split(b" ", 2)
        ok = len(parts) == 3 and parts[0] == b"GET" and parts[1].partition(b"?")[0] == b"/metrics"
        body = generate_latest(counts.registry) if ok else b"not found\n"
        writer.write(b"HTTP/1.1 %s\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (b"200 OK" if ok else b"404 Not Found", len(body), body))
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        pass
    finally:
        writer.close()


async def serve(routes: list[tuple[str, int, str, int]], log: TextIO, metrics_port: int | None = None) -> None:
    """routes: (replica name, tap port, replica host, replica port); the counters on 127.0.0.1:metrics_port."""
    ids, counts = itertools.count(1), Counts()
    live: set[Connection] = set()
    servers = []
    for name, listen, host, port in routes:
        servers.append(await asyncio.start_server(
            lambda d, u, name=name, host=host, port=port: relay(name, host, port, log, counts, ids, live, d, u),
            "127.0.0.1", listen))
    if metrics_port is not None:
        servers.append(await asyncio.start_server(lambda d, u: metrics(counts, d, u), "127.0.0.1", metrics_port))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for c in list(live):  # stopped (`ref down`): what still waits for an answer is written, not lost
        c.close("tap_stopped")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaoskit.reference.tap", description=__doc__)
    ap.add_argument("--route", action="append", required=True, metavar="NAME=LISTEN_PORT=HOST:PORT")
    ap.add_argument("--log", required=True, help="append a JSON line per request here")
    ap.add_argument("--metrics", type=int, metavar="PORT", help="serve the counters at 127.0.0.1:PORT/metrics")
    a = ap.parse_args(argv)
    routes = []
    for spec in a.route:
        name, listen, target = spec.split("=")
        host, _, port = target.rpartition(":")
        routes.append((name, int(listen), host, int(port)))
    with open(a.log, "a", buffering=1) as log:
        asyncio.run(serve(routes, log, a.metrics))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
