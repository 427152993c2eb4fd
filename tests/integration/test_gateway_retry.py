"""The reference gateway's retries: a request whose replica dies serving it (the connection breaks after the
request was sent) goes on to the next replica with `retry`, and not with `retry_on_death: false`; a 5xx and a
refused connection are retried either way; without `retry` nothing is (real sockets, in-process replicas)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from chaoskit.reference.gateway import Gateway, GatewayConfig, upstream_session
from tests.conftest import free_port
from tests.helpers.aioserve import catch_all, serve


async def _replica(kind: str, hits: list[str]) -> tuple[web.AppRunner, str]:
    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        hits.append(kind)
        if kind == "dies":
            assert request.transport is not None
            request.transport.close()  # the engine died serving it: no answer, the connection breaks
        return web.Response(status=500 if kind == "5xx" else 200, text=kind)

    return await serve(catch_all(handle))


async def _through(kinds: list[str], **cfg: bool) -> tuple[int, list[str]]:
    """One request through a gateway over replicas of these kinds (the first one first): (status, hits)."""
    hits: list[str] = []
    replicas = [await _replica(k, hits) if k != "refused" else (None, f"http://127.0.0.1:{free_port()}")
                for k in kinds]
    gw = Gateway(GatewayConfig(replicas=[{"name": f"r{i}", "url": url} for i, (_, url) in enumerate(replicas)],
                               **cfg))
    gw.session = aiohttp.ClientSession()
    runner, url = await serve(gw.app())
    try:
        async with aiohttp.ClientSession() as s, s.post(f"{url}/v2/x", data=b"poison") as r:
            return r.status, hits
    finally:
        await gw.session.close()
        await runner.cleanup()
        for rep, _ in replicas:
            if rep is not None:
                await rep.cleanup()


@pytest.mark.parametrize("kinds, cfg, status, hits", [
    (["dies", "dies", "ok"], {"retry": True}, 200, ["dies", "dies", "ok"]),  # the poison reaches every replica
    (["dies", "ok"], {"retry": True, "retry_on_death": False}, 502, ["dies"]),  # the fix: not handed on
    (["5xx", "ok"], {"retry": True, "retry_on_death": False}, 200, ["5xx", "ok"]),
    (["refused", "ok"], {"retry": True, "retry_on_death": False}, 200, ["ok"]),
    (["dies", "ok"], {}, 502, ["dies"]),  # no retry: as before
    (["5xx", "ok"], {}, 500, ["5xx"]),
])
def test_gateway_retries(kinds, cfg, status, hits):
    assert asyncio.run(_through(kinds, **cfg)) == (status, hits)


# The gateway keeps an idle upstream connection KEEPALIVE_S (1.5 s): closed within 2.5 s, a second for a busy
# host's event loop (aiohttp's cleanup runs KEEPALIVE_S after the release); 4.5 s would pass a gateway that kept
# it three times as long, just under the server's 5 s.
BOUND_S = 2.5


async def _idle_upstream_connection_closed() -> tuple[float | None, int]:
    """One request through the gateway's own upstream session to a replica that, like vLLM's uvicorn, closes a
    connection idle for 5 s: (seconds until the gateway closed it after the answer, None if not within
    BOUND_S; the answer's status)."""
    conns: list[asyncio.Transport] = []

    async def handle(request: web.Request) -> web.Response:
        assert request.transport is not None
        conns.append(request.transport)  # type: ignore[arg-type]
        return web.Response(text="ok")

    runner, url = await serve(catch_all(handle), keepalive_timeout=5.0)
    session = upstream_session(GatewayConfig(replicas=[{"name": "r0", "url": url}]))
    try:
        async with session.post(f"{url}/v1/x", data=b"{}") as r:
            status = r.status
            await r.read()
        t0 = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - t0 < BOUND_S:
            if conns[0].is_closing():
                return asyncio.get_running_loop().time() - t0, status
            await asyncio.sleep(0.05)
        return None, status
    finally:
        await session.close()
        await runner.cleanup()


def test_the_gateway_closes_an_idle_upstream_connection_before_the_server_does():
    """A connection the server closes as the gateway reuses it fails the request as if the replica had died: the
    gateway lets go of idle ones first (KEEPALIVE_S; vLLM's server closes them after 5 s)."""
    closed_after, status = asyncio.run(_idle_upstream_connection_closed())
    assert status == 200 and closed_after is not None and closed_after < BOUND_S, closed_after
