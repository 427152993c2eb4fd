"""`engine: tiny-openai`: a light OpenAI-compatible replica (completions and chat, streamed or not) with
deterministic greedy tokens at a set token rate, which logs every request it serves (the independent count).
Chat also takes `tools`/`tool_choice` (a tool call, its arguments streamed in fragments as vLLM streams them) and
`response_format` json_schema/json_object (a JSON answer valid against the schema): chaoskit.reference.tiny_tools
says when and what, from the prompt alone."""

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

from chaoskit.reference import tiny_tools
from chaoskit.reference.tiny_tools import tokens

SERVED_NAME = "tiny-openai"
DEFAULT_MAX_TOKENS = 16


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


@dataclass(frozen=True)
class Reply:
    """What a request is answered: `pieces` sent one per token (words; a tool call's argument fragments; a JSON
    answer's fragments), the tool called (if any) and the finish reason."""

    kind: str  # text | tool_call | json
    pieces: list[str]
    finish: str
    tool: str = ""
    call_id: str = ""


class Replica:
    """The HTTP handlers and the request log (a JSON line per request: when it came and ended, its path, the
    client's request id, its prompt's key, whether streamed, what it answered (text, tool_call and the tool, or
    json), tokens sent, status and outcome)."""

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
            prompt = "\n".join(str(m.get("content") or "") for m in messages if isinstance(m, dict))
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

    @staticmethod
    def reply(body: dict[str, Any], chat: bool, prompt: str, n: int) -> Reply:
        """A tool call, a JSON answer or text (tiny_tools decides), or BadRequest for a tool_choice or
        response_format it cannot follow."""
        if chat:
            try:
                tool = tiny_tools.chosen_tool(body)
                schema = None if tool else tiny_tools.response_schema(body)
            except (ValueError, TypeError, AttributeError, KeyError) as e:
                raise BadRequest(400, str(e), "BadRequestError") from None
            if tool:
                args = tiny_tools.arguments(body, tool, prompt)
                return Reply("tool_call", tiny_tools.fragments(args), "tool_calls", tool,
                             f"chatcmpl-tool-{hashlib.sha256(prompt.encode()).hexdigest()[:24]}")
            if schema is not None:
                text = tiny_tools.structured(body, schema, prompt)
                return Reply("json", tiny_tools.fragments(text), "stop")
        return Reply("text", tokens(prompt, n), "length")

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
            reply = self.reply(body, chat, prompt, n)
        except (ValueError, BadRequest) as e:
            status, kind = (e.status, e.kind) if isinstance(e, BadRequest) else (400, "BadRequestError")
            self.record(t0=t0, t1=time.time(), path=request.path, rid=rid, stream=False, tokens=0, status=status,
                        outcome="rejected")
            return self.error(status, str(e) if isinstance(e, BadRequest) else f"invalid JSON: {e}", kind)
        stream = bool(body.get("stream"))
        key = prompt_key(prompt)
        sent = [0]  # tokens sent so far (a client gone mid-answer leaves fewer)
        try:
            if stream:
                try:
                    return await self.stream(request, reply, chat, sent)
                except ConnectionResetError:  # the client went mid-answer (aiohttp's reset error is one): logged
                    return web.Response(status=200)  # as client_gone below; nothing more can reach it
            await asyncio.sleep(len(reply.pieces) / self.s.token_rate)
            sent[0] = len(reply.pieces)
            return web.json_response(self.whole(reply, chat, len(prompt)))
        finally:
            self.record(t0=t0, t1=time.time(), path=request.path, rid=rid, prompt=key, stream=stream,
                        answer=reply.kind, **({"tool": reply.tool} if reply.tool else {}), tokens=sent[0],
                        status=200, outcome="complete" if sent[0] == len(reply.pieces) else "client_gone")

    @staticmethod
    def message(reply: Reply) -> dict[str, Any]:
        """The whole answer's chat message: text, or a tool call with its JSON arguments."""
        if reply.kind != "tool_call":
            return {"role": "assistant", "content": "".join(reply.pieces)}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": reply.call_id, "type": "function",
             "function": {"name": reply.tool, "arguments": "".join(reply.pieces)}}]}

    def whole(self, reply: Reply, chat: bool, prompt_len: int) -> dict[str, Any]:
        n = len(reply.pieces)
        usage = {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n}
        choice: dict[str, Any] = ({"index": 0, "message": self.message(reply), "finish_reason": reply.finish}
                                  if chat else {"index": 0, "text": "".join(reply.pieces), "logprobs": None,
                                                "finish_reason": reply.finish})
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                "object": "chat.completion" if chat else "text_completion", "model": SERVED_NAME,
                "choices": [choice], "usage": usage}

    @staticmethod
    def deltas(reply: Reply, chat: bool) -> list[tuple[dict[str, Any], str | None]]:
        """(delta or completion choice, finish_reason) per event. A tool call as vLLM streams it: its id, type and
        name first (arguments ""), then an argument fragment per event, then an empty delta with "tool_calls"."""
        last = len(reply.pieces) - 1
        if not chat:
            return [({"text": p, "logprobs": None}, reply.finish if i == last else None)
                    for i, p in enumerate(reply.pieces)]
        if reply.kind != "tool_call":
            return [({"content": p, **({"role": "assistant"} if i == 0 else {})}, reply.finish if i == last else None)
                    for i, p in enumerate(reply.pieces)]
        head = {"role": "assistant", "tool_calls": [{"index": 0, "id": reply.call_id, "type": "function",
                                                     "function": {"name": reply.tool, "arguments": ""}}]}
        frags = [{"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in reply.pieces]
        return [(head, None), *((f, None) for f in frags), ({}, reply.finish)]

    async def stream(self, request: web.Request, reply: Reply, chat: bool, sent: list[int]) -> web.StreamResponse:
        """Server-sent events as vLLM sends them: a chunk per token, the last with finish_reason, then [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        kind = "chat.completion.chunk" if chat else "text_completion"
        created = int(time.time())
        start = time.monotonic()
        tool = reply.kind == "tool_call"
        for i, (delta, finish) in enumerate(self.deltas(reply, chat)):
            piece = not tool or 0 < i <= len(reply.pieces)  # a tool call's head and end carry no token
            if piece:
                await asyncio.sleep(max(0.0, start + (sent[0] + 1) / self.s.token_rate - time.monotonic()))
            choice: dict[str, Any] = {"index": 0, "delta": delta} if chat else {"index": 0, **delta}
            choice["finish_reason"] = finish
            chunk = {"id": cid, "object": kind, "created": created, "model": SERVED_NAME, "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            sent[0] += piece
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
