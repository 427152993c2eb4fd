"""The reference gateway: round-robin reverse proxy over replicas that stamps X-Model-Latency, streams SSE
unbuffered, ejects replicas by active health checks (`status` or `latency` mode; latency mode also ejects a
replica whose real responses are slower than the threshold, for ejection_s x its ejections, unless no replica left
in rotation passes its checks; slowness alone, a check's timeout included, never ejects the last healthy replica)
and exports /metrics. Each replica is checked on its own schedule; ejections and readmissions are logged.
With `retry` a failed request (connect error, the replica dying mid-request, a 5xx) is sent again to the next
healthy replica, each replica once: a poison request then takes every replica down. `retry_on_death: false`
keeps the retries but not for a request whose replica died while serving it (answered 502 at once): what
killed one replica is not handed to the next.

With `prefill` servers (a disaggregated deployment, chaoskit.reference.pd_server) it is the PD router: the
`replicas` are the decode servers; each request gets a room and goes at once to a prefill server (`POST
/prefill`, round robin) and to a decode server (header X-KV-Room), whose answer is the client's. `pd_abort` (a
fix): a prefill that fails or cannot be reached is reported to the decode server, which frees the request's slot
at once; with `retry`, a request whose KV failed (503 with X-KV-Failed) goes again through the next prefill.

Run as `python -m chaoskit.reference.gateway CONFIG.json` (see GatewayConfig); prints `ready` once listening.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length"}


@dataclass
class Replica:
    name: str
    url: str
    metrics_url: str = ""
    kv: str = ""  # a decode server's KV port (host:port), in a disaggregated deployment
    healthy: bool = True
    passes: int = 0
    ejections: int = 0
    ejected_until: float = 0.0  # latency mode: not readmitted before this (monotonic) while another passes checks
    failing: bool = False  # its last check failed
    last_check: dict[str, Any] = field(default_factory=dict)


@dataclass
class GatewayConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 8000
    replicas: list[dict[str, str]] = field(default_factory=list)
    health_mode: str = "status"  # status: HTTP 200 only; latency: also the measured model latency
    health_path: str = "/v2/health/ready"
    latency_check: dict[str, Any] = field(default_factory=dict)  # {method, path, body} of a tiny real request
    latency_threshold_ms: float = 500.0
    check_every_s: float = 1.0
    check_timeout_s: float = 2.0
    readmit_after: int = 2  # consecutive passing checks before an ejected replica gets traffic again
    ejection_s: float = 30.0  # latency mode: an ejected replica stays out at least ejection_s x its ejections
    upstream_timeout_s: float = 60.0
    retry: bool = False  # a failed request (connect error, replica died, 5xx) again on the next healthy replica
    retry_on_death: bool = True  # with retry: also a request whose replica died while serving it
    prefill: list[dict[str, str]] = field(default_factory=list)  # disaggregated: the prefill servers
    pd_abort: bool = False  # disaggregated: tell the decode server when a request's prefill failed


def log(line: str) -> None:
    """One line of the gateway's log (its stderr: the deployment's gateway.log)."""
    print(f"{time.strftime('%H:%M:%S')} gateway: {line}", file=sys.stderr, flush=True)


class ReplicaDied(Exception):
    """The replica's connection broke after the request was sent (its engine died serving it)."""


class Gateway:
    def __init__(self, cfg: GatewayConfig):
        self.cfg = cfg
        self.replicas = [Replica(r["name"], r["url"].rstrip("/"), r.get("metrics_url", ""), r.get("kv", ""))
                         for r in cfg.replicas]
        self.prefills = [Replica(r["name"], r["url"].rstrip("/"), r.get("metrics_url", "")) for r in cfg.prefill]
        self._rr = itertools.cycle(range(len(self.replicas)))
        self._rr_prefill = itertools.cycle(range(len(self.prefills)))
        self._settings = 0  # counts /gateway/config switches: a check started before one is not applied after it
        reg = self.registry = CollectorRegistry()
        self.m_requests = Counter("gateway_requests", "requests forwarded", ["replica"], registry=reg)
        self.m_errors = Counter("gateway_errors", "upstream errors (connect, timeout, 5xx)", ["replica"], registry=reg)
        self.m_ejections = Counter("gateway_ejections", "times a replica was ejected", ["replica"], registry=reg)
        self.m_healthy = Gauge("gateway_replica_healthy", "1 when the replica gets traffic", ["replica"], registry=reg)
        self.m_latency = Histogram("gateway_upstream_latency_seconds", "upstream time to response headers",
                                   ["replica"], registry=reg,
                                   buckets=(.005, .01, .025, .05, .1, .25, .5, .75, 1, 2.5, 5, 10, 30))
        self.m_no_replica = Counter("gateway_no_healthy_replica", "requests refused: no healthy replica",
                                    registry=reg)
        self.m_retries = Counter("gateway_retries", "requests sent again to the next replica", registry=reg)
        self.m_deaths = Counter("gateway_replica_died_mid_request", "requests whose replica's connection broke "
                                "after they were sent (its engine died serving them)", ["replica"], registry=reg)
        self.m_pd_failed = Counter("gateway_prefill_failed", "prefill requests that failed or could not be sent",
                                   ["replica"], registry=reg)
        for r in [*self.replicas, *self.prefills]:
            self.m_healthy.labels(r.name).set(1)
        self.session: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task] = set()  # prefill halves in flight (kept referenced)

    # ---------------------------------------------------------------- routing

    def pick(self, tried: frozenset[str] = frozenset()) -> Replica | None:
        for _ in range(len(self.replicas)):
            r = self.replicas[next(self._rr)]
            if r.healthy and r.name not in tried:
                return r
        return None

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if self.prefills and request.method == "POST":
            return await self._disaggregated(request, body)
        tried: set[str] = set()
        while True:
            replica = self.pick(frozenset(tried))
            if replica is None:
                self.m_no_replica.inc()
                return web.json_response({"error": "no healthy replica"}, status=503)
            tried.add(replica.name)
            last = not self.cfg.retry or not any(r.healthy and r.name not in tried for r in self.replicas)
            try:
                upstream, latency = await self._send(replica, request, body)
            except ReplicaDied as e:
                self.m_deaths.labels(replica.name).inc()
                if last or not self.cfg.retry_on_death:
                    return self._failed(replica, e)
            except (TimeoutError, aiohttp.ClientError) as e:
                if last or isinstance(e, TimeoutError):
                    return self._failed(replica, e)
            else:
                if upstream.status < 500 or last:
                    return await self._relay(replica, request, upstream, latency)
                upstream.release()
            self.m_retries.inc()

    async def _disaggregated(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """A request through a prefill server and a decode server (see the module's docstring)."""
        tried: set[str] = set()
        while True:
            decode = self.pick()
            prefill = next((p for p in (self.prefills[next(self._rr_prefill)] for _ in self.prefills)
                            if p.healthy and p.name not in tried), None)
            if decode is None or prefill is None:
                self.m_no_replica.inc()
                return web.json_response({"error": f"no healthy {'decode' if decode is None else 'prefill'} "
                                                   "server"}, status=503)
            tried.add(prefill.name)
            room = random.getrandbits(63)
            pending = asyncio.create_task(self._prefill(prefill, decode, room, body))
            self._pending.add(pending)
            pending.add_done_callback(self._pending.discard)
            try:
                upstream, latency = await self._send(decode, request, body, {"X-KV-Room": str(room)})
            except (ReplicaDied, TimeoutError, aiohttp.ClientError) as e:
                return self._failed(decode, e)
            more = self.cfg.retry and any(p.healthy and p.name not in tried for p in self.prefills)
            if upstream.status == 503 and upstream.headers.get("X-KV-Failed") and more:
                upstream.release()
                self.m_retries.inc()
                continue
            return await self._relay(decode, request, upstream, latency)

    async def _prefill(self, prefill: Replica, decode: Replica, room: int, body: bytes) -> None:
        """The prefill half of a request; a failure is counted, and with pd_abort reported to the decode."""
        assert self.session is not None
        try:
            req = json.loads(body)
            if not isinstance(req, dict):
                raise ValueError("the request body is not a JSON object")
            async with self.session.post(prefill.url + "/prefill", json={**req, "room": room,
                                                                         "decode_kv": decode.kv}) as resp:
                await resp.read()
                why = None if resp.status == 200 else f"prefill {prefill.name} answered HTTP {resp.status}"
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            why = f"prefill {prefill.name}: {type(e).__name__}: {e}"
        if why is None:
            return
        self.m_pd_failed.labels(prefill.name).inc()
        if self.cfg.pd_abort:
            try:
                async with self.session.post(decode.url + "/kv/abort", json={"room": room, "why": why}) as resp:
                    await resp.read()
            except (TimeoutError, aiohttp.ClientError):
                pass

    async def _send(self, replica: Replica, request: web.Request, body: bytes,
                    extra: dict[str, str] | None = None) -> tuple[aiohttp.ClientResponse, float]:
        """The request to one replica, up to its response head, and how long that took (ReplicaDied: the
        connection broke after it was sent)."""
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP} | (extra or {})
        self.m_requests.labels(replica.name).inc()
        t0 = time.perf_counter()
        try:
            upstream = await self.session.request(request.method, replica.url + request.rel_url.path_qs,
                                                  headers=headers, data=body, allow_redirects=False)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as e:
            self.m_errors.labels(replica.name).inc()
            raise ReplicaDied(f"{type(e).__name__}: {e}") from None
        except (TimeoutError, aiohttp.ClientError):
            self.m_errors.labels(replica.name).inc()
            raise
        latency = time.perf_counter() - t0
        self.m_latency.labels(replica.name).observe(latency)
        slow = self.cfg.health_mode == "latency" and latency * 1e3 > self.cfg.latency_threshold_ms
        if slow and self._not_last(replica):
            self.eject(replica, f"served a request in {latency * 1e3:.0f} ms > {self.cfg.latency_threshold_ms:g} ms")
        if upstream.status >= 500:
            self.m_errors.labels(replica.name).inc()
        return upstream, latency

    @staticmethod
    def _failed(replica: Replica, e: Exception) -> web.Response:
        what = f"{type(e).__name__}: {e}" if not isinstance(e, ReplicaDied) else f"replica died: {e}"
        return web.json_response({"error": f"upstream {replica.name}: {what}"}, status=502,
                                 headers={"X-Upstream-Replica": replica.name})

    async def _relay(self, replica: Replica, request: web.Request, upstream: aiohttp.ClientResponse,
                     latency: float) -> web.StreamResponse:
        out = web.StreamResponse(status=upstream.status, headers={
            **{k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP},
            "X-Model-Latency": f"{latency * 1e3:.3f}", "X-Upstream-Replica": replica.name})
        try:
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():  # pass chunks on as they come (SSE unbuffered)
                await out.write(chunk)
            await out.write_eof()
        except (TimeoutError, aiohttp.ClientError, ConnectionResetError):
            self.m_errors.labels(replica.name).inc()
        finally:
            upstream.release()
        return out

    # ---------------------------------------------------------------- health

    async def check(self, r: Replica) -> tuple[bool, dict[str, Any]]:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.cfg.check_timeout_s)
        lc = self.cfg.latency_check
        latency_mode = self.cfg.health_mode == "latency" and lc and r not in self.prefills  # no completions there
        method, path = (lc.get("method", "POST"), lc["path"]) if latency_mode else ("GET", self.cfg.health_path)
        t0 = time.perf_counter()
        try:
            async with self.session.request(method, r.url + path, json=lc.get("body") if latency_mode else None,
                                            timeout=timeout) as resp:
                await resp.read()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as e:
            info: dict[str, Any] = {"error": f"{type(e).__name__}: {e}"}
            if latency_mode and isinstance(e, TimeoutError):  # slower than the timeout: slow, not gone
                info |= {"reason": f"no answer within {self.cfg.check_timeout_s:g} s", "slow": True}
            return False, info
        ms = (time.perf_counter() - t0) * 1e3
        info = {"status": status, "latency_ms": round(ms, 3)}
        ok = status == 200
        if latency_mode and ms > self.cfg.latency_threshold_ms:
            ok = False
            info["reason"] = f"latency {ms:.0f} ms > {self.cfg.latency_threshold_ms:g} ms"
            info["slow"] = True
        return ok, info

    async def health_loop(self) -> None:
        """Every replica checked every check_every_s, each on its own: one whose checks time out delays no other's."""
        await asyncio.gather(*(self._check_loop(r) for r in [*self.replicas, *self.prefills]))

    async def _check_loop(self, r: Replica) -> None:
        while True:
            settings = self._settings
            ok, info = await self.check(r)
            if settings == self._settings:  # else it judged by the settings of the run before (a latency check
                # ending after the switch back to status was judged by the new threshold and ejected the replica)
                self.checked(r, ok, info)
            await asyncio.sleep(self.cfg.check_every_s)

    def checked(self, r: Replica, ok: bool, info: dict[str, Any]) -> None:
        """One check's outcome: a failed one ejects, passing ones readmit. Slowness alone never ejects the last
        healthy replica, from a check as from real traffic: a slow replica serves, none cannot. An ejected replica
        whose checks pass comes back before its ejection time ends when no replica in rotation passes its own: one
        ejected for a slow moment of a busy host is not kept out while the one left in rotation fails."""
        r.last_check = {**info, "at": time.time()}
        r.failing = not ok
        if not ok and info.get("slow") and r.healthy and not self._not_last(r):
            r.last_check["kept"] = "the last healthy replica: slow, not ejected"
        elif not ok:
            self.eject(r, info.get("reason") or info.get("error") or f"HTTP {info.get('status')}")
        elif not r.healthy:
            r.passes += 1
            if r.passes >= self.cfg.readmit_after and time.monotonic() >= r.ejected_until:
                self.readmit(r, "")
            elif r.passes >= self.cfg.readmit_after and not self._passing_peer(r):
                self.readmit(r, " before its ejection time: no replica in rotation passes its checks")
                for x in self._peers(r):  # kept only as the last healthy ones: out now
                    if x is not r and x.healthy and x.failing:
                        self.eject(x, x.last_check.get("reason") or "failing its checks")
        self.m_healthy.labels(r.name).set(1 if r.healthy else 0)

    def readmit(self, r: Replica, why: str) -> None:
        r.healthy = True
        log(f"{r.name} readmitted after {r.passes} passing checks{why}")

    def _peers(self, r: Replica) -> list[Replica]:
        return self.prefills if r in self.prefills else self.replicas

    def _passing_peer(self, r: Replica) -> bool:
        """Whether another replica of r's kind (replica or prefill server) is in rotation and passed its last check."""
        return any(x.healthy and not x.failing for x in self._peers(r) if x is not r)

    def _not_last(self, r: Replica) -> bool:
        """Whether another replica is healthy (only replicas are judged slow: prefill servers get no latency check
        and serve no client's response)."""
        return any(x.healthy for x in self.replicas if x is not r)

    def eject(self, r: Replica, reason: str) -> None:
        """Out of rotation. In latency mode also for at least ejection_s x its ejections (like Envoy's outlier
        ejection), so a replica that is only fast while idle does not flap back in between checks."""
        r.passes = 0
        if not r.healthy:
            return
        r.healthy = False
        r.ejections += 1
        out = ""
        if self.cfg.health_mode == "latency":
            r.ejected_until = time.monotonic() + self.cfg.ejection_s * r.ejections
            out = f"; out for at least {self.cfg.ejection_s * r.ejections:g} s while another replica passes checks"
        log(f"{r.name} ejected ({reason}){out}")
        r.last_check = {**r.last_check, "ejected": reason}
        self.m_ejections.labels(r.name).inc()
        self.m_healthy.labels(r.name).set(0)

    # ---------------------------------------------------------------- own endpoints

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    async def replica_metrics(self, request: web.Request) -> web.Response:
        """A replica's own /metrics through the gateway (one endpoint to scrape every engine)."""
        r = next((x for x in self.replicas if x.name == request.match_info["name"]), None)
        if r is None or not r.metrics_url:
            return web.json_response({"error": f"no metrics for replica {request.match_info['name']!r}"}, status=404)
        assert self.session is not None
        try:
            async with self.session.get(r.metrics_url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                return web.Response(body=await resp.read(), status=resp.status, content_type="text/plain")
        except (TimeoutError, aiohttp.ClientError) as e:
            return web.json_response({"error": f"{r.name}: {type(e).__name__}: {e}"}, status=502)

    async def status(self, _: web.Request) -> web.Response:
        return web.json_response({**self.health_settings(), "replicas": [
            {"name": r.name, "url": r.url, "healthy": r.healthy, "last_check": r.last_check}
            for r in [*self.replicas, *self.prefills]]})

    def health_settings(self) -> dict[str, Any]:
        return {"health_mode": self.cfg.health_mode, "latency_threshold_ms": self.cfg.latency_threshold_ms}

    async def configure(self, request: web.Request) -> web.Response:
        """POST {health_mode, latency_threshold_ms}: switch health checking (an experiment reusing this
        deployment with other health settings); every replica starts healthy again. Answers the previous."""
        try:
            body = await request.json()
            mode = body.get("health_mode", self.cfg.health_mode)
            threshold = float(body.get("latency_threshold_ms", self.cfg.latency_threshold_ms))
        except (ValueError, TypeError, AttributeError) as e:
            return web.json_response({"error": f"expected JSON {{health_mode, latency_threshold_ms}}: {e}"}, status=400)
        if mode not in ("status", "latency") or threshold <= 0:
            return web.json_response({"error": "health_mode: status|latency; latency_threshold_ms > 0"}, status=400)
        previous = self.health_settings()
        self.switch(mode, threshold)
        return web.json_response({"previous": previous, "now": self.health_settings()})

    def switch(self, mode: str, threshold_ms: float) -> None:
        """New health settings: every replica starts healthy again, and checks in flight are not applied."""
        self.cfg.health_mode, self.cfg.latency_threshold_ms = mode, threshold_ms
        self._settings += 1
        for r in [*self.replicas, *self.prefills]:
            r.healthy, r.passes, r.ejections, r.ejected_until, r.failing = True, 0, 0, 0.0, False
            self.m_healthy.labels(r.name).set(1)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/gateway/status", self.status)
        app.router.add_post("/gateway/config", self.configure)
        app.router.add_get("/gateway/replicas/{name}/metrics", self.replica_metrics)
        app.router.add_route("*", "/{tail:.*}", self.proxy)
        return app


# An upstream connection idle this long is closed by the gateway, before the server would: vLLM's uvicorn closes
# one after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), and a request sent on a connection the server is closing fails
# as if the replica had died.
KEEPALIVE_S = 1.5


def upstream_session(cfg: GatewayConfig) -> aiohttp.ClientSession:
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=cfg.upstream_timeout_s),
                                 auto_decompress=False)


async def serve(cfg: GatewayConfig) -> None:
    gw = Gateway(cfg)
    gw.session = upstream_session(cfg)
    runner = web.AppRunner(gw.app(), access_log=None, shutdown_timeout=1.0)  # `down` waits for no slow request
    await runner.setup()
    await web.TCPSite(runner, cfg.listen_host, cfg.listen_port, backlog=1024, reuse_address=True).start()
    checker = asyncio.create_task(gw.health_loop())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    checker.cancel()
    await runner.cleanup()
    await gw.session.close()


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        cfg = GatewayConfig(**json.load(f))
    try:
        asyncio.run(serve(cfg))
    except OSError as e:
        print(f"gateway: cannot listen on {cfg.listen_host}:{cfg.listen_port}: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
