"""In-process aiohttp servers for a test: an application (or one catch-all handler) on a free loopback port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.conftest import free_port


def catch_all(handle: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.Application:
    """An application whose one handler answers every method and path."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def serve(app: web.Application, **runner_kw: Any) -> tuple[web.AppRunner, str]:
    """The application listening on 127.0.0.1 at a free port: (its runner, to clean up; its base URL)."""
    runner = web.AppRunner(app, access_log=None, **runner_kw)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"
