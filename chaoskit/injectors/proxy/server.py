"""The asyncio L4 proxy behind network.proxy: forwards TCP and applies Toxiproxy-style toxics per connection.

Started by chaoskit.injectors.proxy.helper (which listens, says `ready`, then calls helper_main with the socket):
`proxy/helper.py TOKEN chaoskit.injectors.proxy.server LISTEN UPSTREAM TOXICS_JSON UNTIL_EPOCH`. Standard library only,
and uvloop when installed. Toxics (each with `stream` upstream|downstream and `toxicity`, the chance a connection
gets it): latency, bandwidth, slow_close, timeout, reset_peer, slicer, limit_data.

In a traced run (CHAOSKIT_OTLP_ENDPOINT set; chaoskit.injectors.proxy.trace imported only then) a connection with
toxics drawn whose first bytes from the client are an HTTP/1 request head with a sampled traceparent gets a
child span per toxic on that trace, from the connection's start to its end. It does not parse further: later
requests on a kept-alive connection, TLS and other protocols are not looked into, and get no span.

With the upstream `original-destination` (intercept: an nftables redirect in its namespace sends it connections)
each connection goes to its own original destination (SO_ORIGINAL_DST).

With a `tls` configuration (chaoskit.injectors.proxy.tls, imported only then) it ends TLS from its clients and/or
starts TLS to its upstream: the toxics then act on the decrypted bytes, and each side gets its own TLS records.

A connection that drew no toxic (and has no TLS to end or start) is not read by Python at all: the kernel relays
its bytes (chaoskit.injectors.proxy.splice); where no pipe or thread can be had, it is relayed here instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from chaoskit.injectors.proxy.splice import Relay, RelayStarted

if TYPE_CHECKING:
    from chaoskit.injectors.proxy.tls import TlsJson
    from chaoskit.injectors.proxy.trace import ConnTrace, NetTracer

CHUNK = 64 * 1024
ORIGINAL = "original-destination"  # the upstream of an intercepting proxy: each connection's own
SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
IP6T_SO_ORIGINAL_DST = 80  # linux/netfilter_ipv6/ip6_tables.h
PARAMS = {"latency": ("latency", "jitter"), "bandwidth": ("rate",), "slow_close": ("delay",), "timeout": ("timeout",),
          "reset_peer": ("timeout",), "slicer": ("average_size", "size_variation", "delay"), "limit_data": ("bytes",)}


class Toxic(NamedTuple):
    """One toxic as the helper takes it: its kind, the stream it acts on (downstream = upstream->client), the
    chance a connection gets it, and the parameters of its kind (PARAMS; rate in bytes/s, times in seconds)."""

    type: str
    stream: str = "downstream"
    toxicity: float = 1.0
    latency: float = 0.0
    jitter: float = 0.0
    rate: int = 0
    delay: float = 0.0
    timeout: float = 0.0
    average_size: int = 0
    size_variation: int = 0
    bytes: int = 0

    def params(self) -> dict[str, float]:
        """The parameters of its kind, by name."""
        return {k: getattr(self, k) for k in PARAMS[self.type]}

    def to_json(self) -> dict[str, str | float]:
        """The wire form (in the helper's argv): its fields, those of other kinds left out."""
        return {"stream": self.stream, "toxicity": self.toxicity, "type": self.type, **self.params()}

    @classmethod
    def from_json(cls, data: dict[str, str | float]) -> Toxic:
        return cls(**data)  # type: ignore[arg-type]  # to_json's own form


class ProxyConfig(NamedTuple):
    """network.proxy's helper configuration: its toxics, and where it ends or starts TLS, proxy.tls.TlsConfig's
    JSON (None: plain TCP both ways; that module is imported only when there is one)."""

    toxics: list[Toxic]
    tls: TlsJson | None = None

    @classmethod
    def from_json(cls, data: Any) -> ProxyConfig:
        """From its argv's JSON: the toxics' list, or {"toxics": [...], "tls": {...}}."""
        if isinstance(data, list):
            return cls([Toxic.from_json(t) for t in data])
        return cls([Toxic.from_json(t) for t in data.get("toxics", [])], data.get("tls"))


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def original_dst(sock: socket.socket | None) -> tuple[str, int] | None:
    """Where a redirected (intercepted) connection was going: conntrack's original destination (an IPv4 one for
    an IPv4 client, also on the dual-stack socket); None for a connection made to the proxy's own address (not
    redirected) or without conntrack."""
    if sock is None:
        return None
    try:
        here = sock.getsockname()
        if sock.family == socket.AF_INET6 and not here[0].startswith("::ffff:"):
            raw = sock.getsockopt(socket.IPPROTO_IPV6, IP6T_SO_ORIGINAL_DST, 28)  # a sockaddr_in6
            dst = (socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack_from("!H", raw, 2)[0])
        else:
            port, ip = struct.unpack_from("!2xH4s", sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16))
            dst = (socket.inet_ntoa(ip), port)
    except OSError:
        return None
    own = (here[0].removeprefix("::ffff:"), here[1])
    return None if dst == own else dst


class Pipe:
    """One direction of one connection with its toxics."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, toxics: list[Toxic],
                 conn: Connection):
        self.reader, self.writer, self.conn = reader, writer, conn
        self.toxics = {t.type: t for t in toxics}
        self.sent = 0
        self.next_free = 0.0  # bandwidth pacing
        self.first: Callable[[bytes], None] | None = None  # told the first bytes read (a traced connection's)

    async def run(self) -> None:
        try:
            if not self.toxics:
                await self._plain()
            else:
                await self._toxic()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            await self.conn.half_closed(self)

    async def _plain(self) -> None:
        read, write, drain = self.reader.read, self.writer.write, self.writer.drain
        while data := await read(CHUNK):
            if self.first is not None:
                self.first(data)
                self.first = None
            write(data)
            await drain()

    async def _toxic(self) -> None:
        t = self.toxics
        if "timeout" in t:  # swallow everything; close after the timeout (0 = never)
            if t["timeout"].timeout > 0:
                await asyncio.sleep(t["timeout"].timeout)
                self.conn.abort(reset=False)
            else:
                while await self.reader.read(CHUNK):
                    pass
            return
        if "reset_peer" in t:
            asyncio.get_running_loop().call_later(t["reset_peer"].timeout, self.conn.abort, True)
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=256)
        feeder = asyncio.create_task(self._feed(queue))
        try:
            while True:
                arrived, data = await queue.get()
                if not data:
                    break
                if "latency" in t:
                    lat = t["latency"]
                    delay = lat.latency + random.uniform(-lat.jitter, lat.jitter)
                    wait = arrived + max(0.0, delay) - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                if "limit_data" in t:
                    room = t["limit_data"].bytes - self.sent
                    data = data[:max(0, room)]
                for piece in self._slices(data):
                    await self._write(piece)
                if "limit_data" in t and self.sent >= t["limit_data"].bytes:
                    self.conn.abort(reset=False)
                    return
        finally:
            feeder.cancel()

    async def _feed(self, queue: asyncio.Queue) -> None:
        try:
            while data := await self.reader.read(CHUNK):
                if self.first is not None:
                    self.first(data)
                    self.first = None
                await queue.put((time.monotonic(), data))
        except (ConnectionError, OSError):
            pass
        await queue.put((time.monotonic(), b""))

    def _slices(self, data: bytes) -> list[bytes]:
        s = self.toxics.get("slicer")
        if not s:
            return [data]
        out, i = [], 0
        while i < len(data):
            n = max(1, int(s.average_size + random.uniform(-s.size_variation, s.size_variation)))
            out.append(data[i:i + n])
            i += n
        return out

    async def _write(self, data: bytes) -> None:
        if not data:
            return
        bw = self.toxics.get("bandwidth")
        if bw:  # pace so the average never exceeds rate (bytes/s); a piece leaves when the link is free
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + len(data) / bw.rate
            if start > now:
                await asyncio.sleep(start - now)
        self.writer.write(data)
        await self.writer.drain()
        self.sent += len(data)
        s = self.toxics.get("slicer")
        if s and s.delay > 0:
            await asyncio.sleep(s.delay)


class Connection:
    """A client connection and its upstream connection, with the toxics drawn for it."""

    def __init__(self, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter], drawn: list[Toxic],
                 tracer: NetTracer | None = None):
        self.client, self.upstream = client, upstream
        self.tracer = tracer if drawn else None
        self.trace: ConnTrace | None = None
        self.slow_close = next((t.delay for t in drawn if t.type == "slow_close"), 0.0)
        self.pipes = [
            Pipe(client[0], upstream[1], [t for t in drawn if t.stream == "upstream"], self),
            Pipe(upstream[0], client[1], [t for t in drawn if t.stream == "downstream"], self),
        ]
        self.closed = False
        if self.tracer is not None:
            self.trace = self.tracer.begin(drawn)
            self.pipes[0].first = self._first

    def _first(self, data: bytes) -> None:
        if self.tracer is not None and self.trace is not None:
            self.tracer.first(self.trace, data)

    async def run(self) -> None:
        try:
            await asyncio.gather(*(p.run() for p in self.pipes))
        finally:
            if self.tracer is not None and self.trace is not None:
                self.tracer.end(self.trace)

    async def half_closed(self, pipe: Pipe) -> None:
        """The source of `pipe` hit EOF: pass the EOF on (after slow_close's delay)."""
        if self.closed:
            return
        if self.slow_close:
            await asyncio.sleep(self.slow_close)
        try:
            if pipe.writer.can_write_eof():
                pipe.writer.write_eof()
        except (OSError, RuntimeError):
            pass

    def abort(self, reset: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if self.trace is not None:
            self.trace.aborted = True
        for _, w in (self.client, self.upstream):
            sock = w.get_extra_info("socket")
            if reset and sock is not None:  # SO_LINGER 0: close sends RST, as a crashed peer would
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.close()
        for p in self.pipes:
            p.reader.feed_eof()


async def serve(sock: socket.socket, upstream: str, config: ProxyConfig, until: float) -> None:
    intercept = upstream == ORIGINAL
    up_host, up_port = ("", 0) if intercept else split_addr(upstream)
    toxics, tls_cfg = config
    listen_ssl = up_ssl = server_name = None
    if tls_cfg:  # the ssl contexts' module, only now
        from chaoskit.injectors.proxy.tls import Tls, TlsConfig, quiet_handshakes

        tls = Tls.of(TlsConfig.from_json(tls_cfg))
        listen_ssl, up_ssl, server_name = tls.listen, tls.upstream, tls.server_name
        quiet_handshakes(asyncio.get_running_loop())
    tracer = None
    if os.environ.get("CHAOSKIT_OTLP_ENDPOINT"):  # a traced run: the span module, only now
        from chaoskit.injectors.proxy.trace import NetTracer

        tracer = NetTracer.from_env(os.environ)

    async def handle(client: socket.socket) -> None:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host, port = up_host, up_port
        if intercept:  # where this connection was going before the redirect
            dst = original_dst(client)
            if dst is None:  # made to the proxy's port itself: it has nowhere to go
                client.close()
                return
            host, port = dst
        drawn = [t for t in toxics if random.random() < t.toxicity]
        upstream = None
        if not drawn and listen_ssl is None and up_ssl is None:  # untouched: the kernel relays it
            upstream = await _connect(host, port)
            if upstream is None:
                client.close()
                return
            if _relayed(client, upstream):
                return
        try:  # toxics drawn, TLS, or no pipe or thread to be had for the kernel relay: relayed here
            reader, writer = await _streams(client, listen_ssl)
            up = (await asyncio.open_connection(sock=upstream) if upstream is not None else
                  await asyncio.open_connection(host, port, ssl=up_ssl,
                                                server_hostname=server_name if up_ssl is not None else None))
        except (OSError, asyncio.IncompleteReadError):
            for s in (client, upstream):
                if s is not None:
                    s.close()
            return
        _nodelay(up[1])
        await Connection((reader, writer), up, drawn, tracer).run()
        for w in (writer, up[1]):
            w.close()

    await serve_until(Listener(sock, handle), until, tracer.close if tracer is not None else None)


def _relayed(client: socket.socket, upstream: socket.socket) -> bool:
    """Hand the connection to the kernel relay; False (the sockets still ours) when it could not start."""
    try:
        Relay(client, upstream).start()
    except RelayStarted:  # it ended the connection itself
        return True
    except (OSError, RuntimeError):  # out of file descriptors or threads now
        return False
    return True


async def _streams(sock: socket.socket, ssl: Any = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over an accepted socket, TLS ended on it first with an `ssl` context (a server's side)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    transport, protocol = await loop.connect_accepted_socket(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), sock, ssl=ssl)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def _connect(host: str, port: int) -> socket.socket | None:
    """A connected TCP socket to the upstream (TCP_NODELAY), or None if it cannot be reached."""
    loop = asyncio.get_running_loop()
    try:  # an address is taken as it is (no resolver thread); a name is resolved
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            return None
    for family, kind, proto, _, addr in infos:
        try:
            s = socket.socket(family, kind, proto)
        except OSError:  # out of file descriptors
            return None
        s.setblocking(False)
        try:
            await loop.sock_connect(s, addr)
        except OSError:
            s.close()
            continue
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s
    return None


class Listener:
    """Accepts connections on the listening socket and hands each to `handle` as a plain socket (an
    asyncio.Server would start reading it at once: the kernel relay must get it unread)."""

    def __init__(self, sock: socket.socket, handle: Callable[[socket.socket], Awaitable[None]]):
        self.sock, self.handle = sock, handle
        self.task: asyncio.Task | None = None
        self.conns: set[asyncio.Task] = set()

    async def __aenter__(self) -> Listener:
        self.sock.setblocking(False)
        self.task = asyncio.get_running_loop().create_task(self._accept())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(self.sock)
            except OSError:  # out of descriptors, or the connection went before its accept: go on
                await asyncio.sleep(0.01)
                continue
            task = loop.create_task(self.handle(client))
            self.conns.add(task)
            task.add_done_callback(self.conns.discard)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.sock.close()


async def serve_until(server: asyncio.Server | Listener, until: float, before_exit: Callable[[], None] | None = None) -> None:
    """Serve until SIGTERM or the epoch `until` (a helper outliving its run ends by itself); `before_exit` runs
    either way once it stops listening (a traced run's last spans: bounded). At `until` an intercepting proxy
    (CHAOSKIT_PROXY_TABLE) first deletes its redirect, while still listening: the port it intercepts must not
    be left sending new connections to a closed one (on SIGTERM the revert deleted it already)."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, _exit_now, server, before_exit)
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # Ctrl-C at the terminal is the engine's to handle
    async with server:
        await asyncio.sleep(max(0.0, until - time.time()))
        if table := os.environ.get("CHAOSKIT_PROXY_TABLE"):
            from chaoskit.injectors.proxy.intercept import drop_own_table

            drop_own_table(table)
    if before_exit is not None:
        before_exit()


def _exit_now(server: asyncio.Server | Listener, before_exit: Callable[[], None] | None = None) -> None:
    """SIGTERM (the revert): stop listening and end the process at once. The kernel closes every connection as
    a clean exit would; skipping the interpreter's teardown makes the exit a few ms of CPU instead of ~40."""
    server.close()
    if before_exit is not None:
        before_exit()
    os._exit(0)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def run_fast(coro: Awaitable[Any]) -> Any:
    """On uvloop when it is installed (chaoskit.aio's, without importing the chaoskit package: ~25 ms of CPU per
    helper start)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


ConfigT = TypeVar("ConfigT")


def serve_helper(sock: socket.socket, argv: list[str],
                 serve: Callable[[socket.socket, str, ConfigT, float], Awaitable[None]],
                 config: Callable[[Any], ConfigT]) -> int:
    """A proxy server's part of its helper (proxy_proc listened already): argv is upstream, its JSON
    configuration (read by `config`: the server's typed configuration), the epoch to end at."""
    run_fast(serve(sock, argv[0], config(json.loads(argv[1])), float(argv[2])))
    return 0


def helper_main(sock: socket.socket, argv: list[str]) -> int:
    """Called by proxy_proc with its listening socket."""
    return serve_helper(sock, argv, serve, ProxyConfig.from_json)
