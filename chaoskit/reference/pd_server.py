"""tiny_lm disaggregated into prefill and decode servers (`ref up --disaggregated`): one process per role, the KV
cache handed from prefill to decode over a TCP side channel (chaoskit.reference.pd_kv), the gateway as the router.

The router gives each request a room and sends it to both at once (SGLang's and Mooncake's way): the prefill
server (`POST /prefill`) runs the prompt through tiny_lm in arrival order and pushes its K/V to the decode server's
KV port; the decode server (`POST /v1/completions`, OpenAI-style, with header X-KV-Room) takes one of its `slots`,
waits for the room's KV, then decodes. A request without a room is served whole by the decode server (the
gateway's health and readiness checks). What the 2026 PD outages were made of is a setting here:
- `waiting_timeout_s` (default 300, SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT): how long a decode request
  holds its slot waiting for KV that may never come;
- `prefill_timeout_s`: a prefill request that waited longer in the queue is aborted (a TTFT deadline);
  `notify_abort` (the fix of SGLang PR #28651): the abort is sent to the decode server, which frees the slot at
  once instead of at its waiting timeout;
- `fail_on_disconnect` (a fix): a KV connection that ends before its done notification fails the room at once;
- `transfer_deadline_s` (a fix): a transfer whose done notification has not come this long after its bootstrap
  fails its room (a lost notification; the connection may still be open);
- `kv_checksum` (a fix): the prefill puts the CRC-32 of the KV bytes in its done notification and the decode
  server checks it: a transfer altered on the way fails its room instead of decoding garbage;
- `kv_load_failure_policy` (vLLM's name): `fail` answers 503 naming why, `recompute` runs the prefill locally.
Run as `python -m chaoskit.reference.pd_server ROLE HOST PORT [KV_PORT] PARAMS_JSON`; prints `ready`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from chaoskit.reference import pd_kv
from chaoskit.reference.tinylm import KVCacheOOM, Seq, TinyLM

MAX_TOKENS = 256
STUCK_S = 1.0  # a request that waited longer for its KV counts in slots_stuck (a healthy transfer takes ms)


@dataclass
class Settings:
    """A server's settings (PARAMS_JSON), both roles' in one place; strings as the scenario writes them."""

    slots: int = 8
    waiting_timeout_s: float = 300.0
    prefill_timeout_s: float = 0.0  # 0: never aborted
    notify_abort: bool = False
    fail_on_disconnect: bool = False
    transfer_deadline_s: float = 0.0  # 0: none
    kv_checksum: bool = False
    kv_load_failure_policy: str = "fail"

    @classmethod
    def of(cls, params: dict[str, Any]) -> Settings:
        def flag(v: Any) -> bool:
            return str(v).strip().lower() == "true"

        s = cls()
        for name, conv in (("slots", int), ("waiting_timeout_s", float), ("prefill_timeout_s", float),
                           ("notify_abort", flag), ("fail_on_disconnect", flag), ("transfer_deadline_s", float),
                           ("kv_checksum", flag), ("kv_load_failure_policy", str)):
            if name in params:
                setattr(s, name, conv(params[name]))
        if s.kv_load_failure_policy not in ("fail", "recompute"):
            raise ValueError("kv_load_failure_policy: fail|recompute")
        return s


class Engine:
    """tiny_lm behind one worker thread (its KV pool is not shared between threads)."""

    def __init__(self) -> None:
        self.lm = TinyLM(budget_bytes=64 << 20)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="tiny_lm")

    async def run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def prefill(self, prompt: bytes, max_new: int) -> tuple[dict, bytes]:
        """The prompt's K/V (every layer), as the transfer sends it."""
        seq = self.lm.start(prompt, max_new)
        try:
            self.lm.prefill(seq)
            return pd_kv.encode([self.lm.pool.read(seq, layer, seq.length) for layer in range(self.lm.layers)])
        finally:
            self.lm.finish(seq)

    def generate(self, prompt: bytes, max_new: int, kv: list | None) -> bytes:
        """Decode max_new tokens after the prompt: over the transferred K/V, or prefilled here (kv None)."""
        seq: Seq = self.lm.start(prompt, max_new)
        try:
            if kv is None:
                self.lm.prefill(seq)
            else:
                for layer, (k, v) in enumerate(kv):
                    self.lm.pool.write(seq, layer, 0, k, v)
                seq.length = len(kv[0][0])
            while len(seq.out) < max_new:
                self.lm.step([seq])
            return bytes(t % 256 for t in seq.out)
        finally:
            self.lm.finish(seq)


def _request(body: dict[str, Any]) -> tuple[bytes, int, bool]:
    prompt = body.get("prompt", "")
    prompt = prompt[0] if isinstance(prompt, list) and prompt else prompt
    return str(prompt).encode(), max(1, min(MAX_TOKENS, int(body.get("max_tokens") or 16))), bool(body.get("stream"))


def _completion(model: str, text: str, prompt_tokens: int) -> dict[str, Any]:
    return {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text),
                      "total_tokens": prompt_tokens + len(text)}}


class Decode:
    """The decode server: slots, rooms, the waiting timeout and the load failure policy."""

    def __init__(self, s: Settings, engine: Engine):
        self.s, self.engine = s, engine
        self.kv = pd_kv.Receiver(s.fail_on_disconnect, s.transfer_deadline_s, s.kv_checksum)
        self.held = 0
        self.kv_waits: dict[int, float] = {}  # each request now waiting for its room's KV: since when
        self._ids = itertools.count()
        self.counts = {"served": 0, "no_slot": 0, "timeouts": 0, "failed": 0, "recomputed": 0}

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt, max_new, stream = _request(body)
        room = request.headers.get("X-KV-Room")
        if self.held >= self.s.slots:
            self.counts["no_slot"] += 1
            return web.json_response({"error": f"no free decode slot ({self.s.slots} held)"}, status=503)
        if room is not None and not room.isdigit():
            return web.json_response({"error": f"X-KV-Room: expected a number, got {room!r}"}, status=400)
        self.held += 1
        try:  # the slot is held from here to the answer, whatever happens
            wait = next(self._ids)
            self.kv_waits[wait] = time.monotonic()
            try:
                kv = None if room is None else await self._kv(int(room))
            except pd_kv.TransferFailed as e:
                self.counts["failed"] += 1
                return web.json_response({"error": f"KV of room {room}: {e}"}, status=503,
                                         headers={"X-KV-Failed": "1"})
            finally:
                del self.kv_waits[wait]
            try:
                text = (await self.engine.run(self.engine.generate, prompt, max_new, kv)).decode("latin-1")
            except KVCacheOOM as e:
                return web.json_response({"error": str(e)}, status=503)
        finally:
            self.held -= 1
        self.counts["served"] += 1
        model = str(body.get("model") or "tiny_lm")
        if stream:
            return await self._stream(request, model, text)
        return web.json_response(_completion(model, text, len(prompt)))

    async def _kv(self, room: int) -> list | None:
        """The room's K/V; None to recompute (the policy says so when it cannot come); TransferFailed else."""
        r = self.kv.room(room)
        try:
            assert r.result is not None
            return await asyncio.wait_for(asyncio.shield(r.result), self.s.waiting_timeout_s)
        except TimeoutError:
            self.counts["timeouts"] += 1
            error: pd_kv.TransferFailed = pd_kv.TransferFailed(
                f"no KV within the waiting timeout ({self.s.waiting_timeout_s:g} s; state {r.state})")
        except pd_kv.TransferFailed as e:
            error = e
        finally:
            self.kv.forget(room)
        if self.s.kv_load_failure_policy == "recompute":
            self.counts["recomputed"] += 1
            return None
        raise error

    @staticmethod
    async def _stream(request: web.Request, model: str, text: str) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for i, ch in enumerate(text):
            last = i == len(text) - 1
            event = {"object": "text_completion", "model": model,
                     "choices": [{"index": 0, "text": ch, "finish_reason": "length" if last else None}]}
            await out.write(f"data: {json.dumps(event)}\n\n".encode())
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def abort(self, request: web.Request) -> web.Response:
        """POST {room, why}: the router says the room's prefill failed."""
        body = await request.json()
        self.kv.fail(int(body["room"]), str(body.get("why") or "the router gave it up"))
        return web.json_response({"ok": True})

    def metrics(self) -> dict[str, float]:
        self.kv.sweep(max(60.0, self.s.waiting_timeout_s))
        waiting = sum(1 for r in self.kv.rooms.values() if r.state != "done")
        now = time.monotonic()
        stuck = sum(1 for since in self.kv_waits.values() if now - since > STUCK_S)
        return {"slots": self.s.slots, "slots_held": self.held, "slots_stuck": stuck, "rooms_waiting": waiting,
                **{f"requests_{k}": v for k, v in self.counts.items()},
                **{f"transfers_{k}": v for k, v in self.kv.counts.items()}}


class Prefill:
    """The prefill server: one queue, served in order; a request that waited past prefill_timeout_s is
    aborted (and the decode told, with notify_abort)."""

    def __init__(self, s: Settings, engine: Engine):
        self.s, self.engine = s, engine
        self.queue: asyncio.Queue[tuple[float, dict[str, Any], asyncio.Future]] = asyncio.Queue()
        self.counts = {"sent": 0, "aborted": 0, "notified": 0, "unreachable": 0}

    async def prefill(self, request: web.Request) -> web.Response:
        body = await request.json()
        done = asyncio.get_running_loop().create_future()
        await self.queue.put((time.monotonic(), body, done))
        status, answer = await done
        return web.json_response(answer, status=status)

    async def worker(self) -> None:
        while True:
            queued, body, done = await self.queue.get()
            try:
                answer = await self._one(queued, body)
            except Exception as e:  # one bad request fails alone
                answer = (500, {"error": f"{type(e).__name__}: {e}"})
            if not done.done():  # its handler may be gone (the server stopping)
                done.set_result(answer)

    async def _one(self, queued: float, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        room, (host, _, port) = int(body["room"]), str(body["decode_kv"]).rpartition(":")
        waited = time.monotonic() - queued
        if self.s.prefill_timeout_s and waited > self.s.prefill_timeout_s:
            self.counts["aborted"] += 1
            if self.s.notify_abort:
                try:
                    await pd_kv.send_abort((host, int(port)), room)
                    self.counts["notified"] += 1
                except OSError:
                    pass
            return 503, {"error": f"aborted: waited {waited:.2f} s > prefill_timeout_s {self.s.prefill_timeout_s:g}",
                         "notified": self.s.notify_abort}
        prompt, max_new, _ = _request(body)
        meta, data = await self.engine.run(self.engine.prefill, prompt, max_new)
        try:
            await pd_kv.send((host, int(port)), room, meta, data, self.s.kv_checksum)
        except OSError as e:
            self.counts["unreachable"] += 1
            return 502, {"error": f"decode KV port {host}:{port}: {e}"}
        self.counts["sent"] += 1
        return 200, {"room": room, "tokens": meta["tokens"], "bytes": len(data)}

    def metrics(self) -> dict[str, float]:
        return {"queue": self.queue.qsize(), **{f"prefill_{k}": v for k, v in self.counts.items()}}


def _prometheus(role: str, values: dict[str, float]) -> str:
    return "".join(f'tiny_lm_pd_{k}{{role="{role}"}} {v}\n' for k, v in values.items())


async def serve(role: str, host: str, port: int, kv_port: int | None, s: Settings) -> None:
    engine = Engine()
    app = web.Application()
    server: Decode | Prefill
    tasks = []
    kv_server = None
    if role == "decode":
        server = Decode(s, engine)
        app.router.add_post("/v1/completions", server.completions)
        app.router.add_post("/kv/abort", server.abort)
        kv_server = await asyncio.start_server(server.kv.serve, host, kv_port)
    else:
        server = Prefill(s, engine)
        app.router.add_post("/prefill", server.prefill)
        tasks.append(asyncio.create_task(server.worker()))

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"role": role, **server.metrics()})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=_prometheus(role, server.metrics()), content_type="text/plain")

    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)  # requests waiting on KV do not hold `down`
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    for t in tasks:
        t.cancel()
    if kv_server is not None:
        kv_server.close()
    await runner.cleanup()


def main(argv: list[str]) -> int:
    role, host, port = argv[0], argv[1], int(argv[2])
    kv_port = int(argv[3]) if role == "decode" else None
    s = Settings.of(json.loads(argv[-1]))
    try:
        asyncio.run(serve(role, host, port, kv_port, s))
    except OSError as e:
        print(f"pd_server {role}: cannot listen: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
