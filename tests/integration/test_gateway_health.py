"""The reference gateway's health checks in latency mode over real sockets: a replica ejected for one slow answer
comes back before its ejection time when the replica left in rotation stops answering its checks, and a check's
timeout never leaves the gateway with no replica (the SITS2026 health-check-blindspot fix on a busy host: the
healthy replica was ejected for a slow moment, then the throttled one for its checks' timeouts, and every request
failed for the 30 s of the first ejection)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from chaoskit.reference.gateway import Gateway, GatewayConfig, upstream_session
from tests.helpers.aioserve import catch_all, serve


async def _replica(name: str, delay: dict[str, float]) -> tuple[web.AppRunner, str]:
    """A replica that answers every request (checks too) after delay[name] seconds."""
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay[name])
        return web.Response(text=name)

    return await serve(catch_all(handle), shutdown_timeout=0.1)


async def _ask(s: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    """(status, the replica that answered); (0, '') when no answer came within 1 s."""
    try:
        async with s.post(url, data=b"{}", timeout=aiohttp.ClientTimeout(total=1.0)) as r:
            return r.status, r.headers.get("X-Upstream-Replica", "")
    except TimeoutError:
        return 0, ""


async def _scenario() -> tuple[list[tuple[float, int, str]], dict]:
    """b is ejected for one slow answer, then a stops answering: what each request 0.1 s apart got for 4 s after,
    (seconds since a stopped, status, replica), and the gateway's status at the end."""
    delay = {"a": 0.0, "b": 0.0}
    replicas = [await _replica(n, delay) for n in delay]
    cfg = GatewayConfig(replicas=[{"name": n, "url": url} for n, (_, url) in zip(delay, replicas, strict=True)],
                        health_mode="latency", latency_check={"path": "/check", "body": {}},
                        latency_threshold_ms=200, check_every_s=0.2, check_timeout_s=0.5, ejection_s=30)
    gw = Gateway(cfg)
    gw.session = upstream_session(cfg)
    runner, base = await serve(gw.app(), shutdown_timeout=0.1)
    checker = asyncio.create_task(gw.health_loop())
    url = f"{base}/v2/models/m/infer"
    seen: list[tuple[float, int, str]] = []
    try:
        async with aiohttp.ClientSession() as s:
            delay["b"] = 0.3
            for _ in range(2):  # round robin: one of two reaches b
                await _ask(s, url)
            delay["b"] = 0.0
            assert not gw.replicas[1].healthy, gw.replicas[1].last_check  # ejected for its slow answer
            delay["a"] = 5.0
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4.0:
                status, name = await _ask(s, url)
                seen.append((round(time.monotonic() - t0, 2), status, name))
                await asyncio.sleep(0.1)
            async with s.get(f"{base}/gateway/status") as r:
                return seen, await r.json()
    finally:
        checker.cancel()
        await gw.session.close()
        await runner.cleanup()
        for r, _ in replicas:
            await r.cleanup()


def test_a_replica_ejected_for_a_slow_moment_serves_again_when_the_other_stops_answering():
    seen, status = asyncio.run(_scenario())
    assert all(status != 503 for _, status, _ in seen), seen  # never "no healthy replica"
    # a's check times out 0.5 s after it stopped (at most 0.2 s after its last one), b passes its next check
    # 0.2 s later: b serves from about 0.9 s on; 2 s leaves a busy host's event loop a second
    served_by_b = [t for t, status, name in seen if (status, name) == (200, "b")]
    assert served_by_b and served_by_b[0] < 2.0, seen
    assert all((status, name) == (200, "b") for t, status, name in seen if t >= served_by_b[0]), seen
    assert [r["healthy"] for r in status["replicas"]] == [False, True], status  # a out, b in
