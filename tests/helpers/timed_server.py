"""Test servers with known timing, on 127.0.0.1 (run as a subprocess; prints `ready`).

stall PORT S T      every request that arrives while (now - start) mod T < S waits until that window ends
sse PORT TTFT ITL N an OpenAI streaming completion: first token after TTFT ms, then one every ITL ms, N tokens
errors PORT EVERY   every EVERY-th request is answered 500, the others 200 at once; GET /_stats (not counted)
                    answers {"requests": N, "errors": E} so far
hang PORT EVERY     every EVERY-th request is never answered (the client times out), the others 200 at once
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web


def stall_app(s: float, t: float) -> web.Application:
    start = time.monotonic()

    async def handle(_: web.Request) -> web.Response:
        now = time.monotonic()
        phase = (now - start) % t
        if phase < s:
            await _sleep_until(now + s - phase)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def _sleep_until(due: float) -> None:
    """asyncio sleeps round up to whole milliseconds: sleep to 2 ms before, then yield until due."""
    if due - time.monotonic() > 0.002:
        await asyncio.sleep(due - time.monotonic() - 0.002)
    while time.monotonic() < due:
        await asyncio.sleep(0)


def sse_app(ttft_ms: float, itl_ms: float, n: int) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        t0 = time.monotonic()
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            await _sleep_until(t0 + (ttft_ms + i * itl_ms) / 1e3)
            await resp.write(b"data: " + json.dumps({"choices": [{"text": f"t{i}"}]}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    return app


def errors_app(every: int) -> web.Application:
    seen = {"requests": 0, "errors": 0}

    async def handle(_: web.Request) -> web.Response:
        seen["requests"] += 1
        if seen["requests"] % every == 0:
            seen["errors"] += 1
            return web.Response(status=500, text="planned error")
        return web.Response(text="ok")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(seen)

    app = web.Application()
    app.router.add_get("/_stats", stats)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def hang_app(every: int) -> web.Application:
    seen = [0]

    async def handle(_: web.Request) -> web.Response:
        seen[0] += 1
        if seen[0] % every == 0:
            await asyncio.Event().wait()
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main(argv: list[str]) -> None:
    mode, port = argv[0], int(argv[1])
    app = stall_app(float(argv[2]), float(argv[3])) if mode == "stall" else \
        errors_app(int(argv[2])) if mode == "errors" else hang_app(int(argv[2])) if mode == "hang" else sse_app(float(argv[2]), float(argv[3]), int(argv[4]))

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main(sys.argv[1:])
