"""`engine: tiny-openai`: a light OpenAI-compatible replica (completions and chat, streamed or not) with
deterministic greedy tokens at a set token rate, which logs every request it serves (the independent count)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

SERVED_NAME = "tiny-openai"
WORDS = ("the", "a", "model", "token", "fast", "slow", "gpu", "cache", "node", "queue", "page", "block", "route",
         "retry", "shard", "batch", "stream", "reply", "prompt", "layer", "head", "vector", "kernel", "graph",
         "server", "client", "load", "time", "data", "fault", "chaos", "steady")
DEFAULT_MAX_TOKENS = 16


def tokens(prompt: str, n: int) -> list[str]:
    """The greedy answer to `prompt`: the same `n` words on every replica and every call (temperature 0)."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return [" " + WORDS[(digest[i % len(digest)] + i) % len(WORDS)] for i in range(n)]


def prompt_key(prompt: str) -> str:
    """What the request log keeps of a prompt: enough to tell a client's requests apart, not the text."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Settings:
    name: str
    token_rate: float  # tokens per second per request (the time between two tokens is 1 / token_rate)
    max_context: int  # prompt characters; more is a 400 as vLLM answers a too-long prompt


class BadRequest(Exception):
    def __init__(self, status: int, message: str, kind: str):
        super().__init__(message)
        self.status, self.kind = status, kind


class Replica:
    """The HTTP handlers and the request log (a JSON line per request: when it came and ended, its path, the
    client's request id, its prompt's key, whether streamed, tokens sent, status and outcome)."""

    def __init__(self, settings: Settings, log: TextIO | None):
        self.s = settings
        self.log = log
        self.served = 0

    def record(self, **fields: Any) -> None:
        self.served += 1
        if self.log is not None:
            self.log.write(json.dumps({"replica": self.s.name, **fields}) + "\n")
            self.log.flush()

    @staticmethod
    def error(status: int, message: str, kind: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)

    def parse(self, body: dict[str, Any], chat: bool) -> tuple[str, int]:
        """(prompt, max tokens) of a request, or BadRequest as vLLM words it."""
        model = body.get("model", SERVED_NAME)
        if model != SERVED_NAME:
            raise BadRequest(404, f"The model `{model}` does not exist.", "NotFoundError")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest(400, "messages: a non-empty list is required", "BadRequestError")
            prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise BadRequest(400, "prompt: a string is required", "BadRequestError")
        n = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
        if not isinstance(n, int) or n < 1:
            raise BadRequest(400, "max_tokens: a positive integer is required", "BadRequestError")
        if len(prompt) + n > self.s.max_context:
            raise BadRequest(400, f"This model's maximum context length is {self.s.max_context} tokens. However, "
                                  f"you requested {len(prompt) + n} tokens.", "BadRequestError")
        return prompt, n

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.answer(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.answer(request, chat=True)

    async def answer(self, request: web.Request, chat: bool) -> web.StreamResponse:
        t0 = time.time()
        rid = request.headers.get("x-request-id", "")
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest(400, "the body must be a JSON object", "BadRequestError")
            prompt, n = self.parse(body, chat)
        except (ValueError, BadRequest) as e:
            status, kind = (e.status, e.kind) if isinstance(e, BadRequest) else (400, "BadRequestError")
            self.record(t0=t0, t1=time.time(), path=request.path, rid=rid, stream=False, tokens=0, status=status,
                        outcome="rejected")
            return self.error(status, str(e) if isinstance(e, BadRequest) else f"invalid JSON: {e}", kind)
        words = tokens(prompt, n)
        stream = bool(body.get("stream"))
        key = prompt_key(prompt)
        sent = [0]  # tokens sent so far (a client gone mid-answer leaves fewer than n)
        try:
            if stream:
                return await self.stream(request, words, chat, sent)
            await asyncio.sleep(n / self.s.token_rate)
            sent[0] = n
            return web.json_response(self.whole(words, chat, len(prompt)))
        finally:
            self.record(t0=t0, t1=time.time(), path=request.path, rid=rid, prompt=key, stream=stream,
                        tokens=sent[0], status=200, outcome="complete" if sent[0] == n else "client_gone")

    def whole(self, words: list[str], chat: bool, prompt_len: int) -> dict[str, Any]:
        text = "".join(words)
        usage = {"prompt_tokens": prompt_len, "completion_tokens": len(words),
                 "total_tokens": prompt_len + len(words)}
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                   "finish_reason": "length"} if chat else
                                  {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"})
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                "object": "chat.completion" if chat else "text_completion", "model": SERVED_NAME,
                "choices": [choice], "usage": usage}

    async def stream(self, request: web.Request, words: list[str], chat: bool,
                     sent: list[int]) -> web.StreamResponse:
        """Server-sent events as vLLM sends them: a chunk per token, the last with finish_reason, then [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        kind = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())
        start = time.monotonic()
        for i, word in enumerate(words):
            await asyncio.sleep(max(0.0, start + (i + 1) / self.s.token_rate - time.monotonic()))
            last = i == len(words) - 1
            choice: dict[str, Any] = ({"index": 0, "delta": {"content": word, **({"role": "assistant"} if i == 0
                                                                                 else {})}}
                                      if chat else {"index": 0, "text": word, "logprobs": None})
            choice["finish_reason"] = "length" if last else None
            chunk = {"id": cid, "object": kind, "created": created, "model": SERVED_NAME, "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            sent[0] = i + 1
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": SERVED_NAME, "object": "model",
                                                              "owned_by": "chaoskit"}]})

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response({"name": self.s.name, "served": self.served})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/stats", self.stats)
        return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaoskit.reference.tiny_openai", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--name", default="replica")
    ap.add_argument("--token-rate", type=float, default=200.0, help="tokens per second per request (default 200)")
    ap.add_argument("--max-context", type=int, default=4096, help="prompt characters + max_tokens (default 4096)")
    ap.add_argument("--log", type=Path, help="append a JSON line per request here")
    a = ap.parse_args(argv)
    settings = Settings(a.name, a.token_rate, a.max_context)
    log = open(a.log, "a", buffering=1) if a.log else None
    try:
        web.run_app(Replica(settings, log).app(), host=a.host, port=a.port, print=None, access_log=None,
                    handle_signals=True)
    finally:
        if log:
            log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
