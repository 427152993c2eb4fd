"""A small OpenAI-compatible server on 127.0.0.1: /v1/models lists MODEL, /v1/completions answers max_tokens
tokens t0 t1 ... (JSON, or SSE when stream is true: the same text), /health answers 200. Run as a subprocess;
prints `ready`.

    python -m tests.helpers.openai_standin PORT MODEL
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web


def app(model: str) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "test"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("model") != model:
            return web.json_response({"error": {"message": f"no model {body.get('model')!r}"}}, status=404)
        n = int(body.get("max_tokens", 16))
        if not body.get("stream"):
            return web.json_response({"id": "cmpl-1", "object": "text_completion", "created": int(time.time()),
                                      "model": model, "choices": [{"index": 0, "text": "".join(f"t{i}" for i in range(n)),
                                                                   "finish_reason": "length"}],
                                      "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):  # the last token's event says why it ended, as OpenAI's and vLLM's do
            choice = {"index": 0, "text": f"t{i}", "finish_reason": "length" if i == n - 1 else None}
            await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    a = web.Application()
    a.router.add_get("/v1/models", models)
    a.router.add_post("/v1/completions", completions)
    a.router.add_get("/health", health)
    return a


def main(argv: list[str]) -> None:
    port, model = int(argv[0]), argv[1]

    async def serve() -> None:
        runner = web.AppRunner(app(model), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main(sys.argv[1:])
