"""Run a load spec across worker processes and merge their histograms: one bounded run (`run_load`) or an
open-ended one reporting per window (`ContinuousLoad`, for probes that sample during a whole experiment)."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from chaoskit.errors import ChaoskitError
from chaoskit.load import native
from chaoskit.load.recorder import Recorder
from chaoskit.load.schedule import ScheduleClock, schedule
from chaoskit.load.spec import LoadSpec

SPAWN_LEAD_S = 1.0  # workers start sending this long after launch (python start-up and imports)


class _Workers:
    """The sender processes of one run and the lines they print."""

    def __init__(self, spec: LoadSpec, window_s: float | None = None, open_ended: bool = False,
                 group_by: str | None = None):
        if next(schedule(spec, spec.duration), None) is None:
            raise ChaoskitError(f"the schedule has no sends (rate {spec.rate}/s for {spec.duration}s)")
        self.spec, self.window_s, self.open_ended, self.group_by = spec, window_s, open_ended, group_by
        self.start = 0.0
        self.procs: list[asyncio.subprocess.Process] = []

    async def spawn(self) -> None:
        """Resolve the sender (building the native one on first use), then start the workers."""
        sender = await asyncio.to_thread(native.choose, self.spec, self.group_by)
        self.spec = self.spec.model_copy(update={"sender": sender})
        self.start = time.time() + SPAWN_LEAD_S
        n = self.spec.workers
        for k in range(n):
            p = await asyncio.create_subprocess_exec(sys.executable, "-m", "chaoskit.load.worker",
                                                     stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.PIPE)
            assert p.stdin is not None
            p.stdin.write(json.dumps({"spec": self.spec.model_dump(mode="json"), "start_epoch": self.start,
                                      "worker": k, "workers": n, "window_s": self.window_s,
                                      "open_ended": self.open_ended, "group_by": self.group_by}).encode())
            await p.stdin.drain()
            p.stdin.close()
            self.procs.append(p)

    async def lines(self, k: int):
        proc = self.procs[k]
        assert proc.stdout is not None and proc.stderr is not None
        stderr = asyncio.create_task(_tail(proc.stderr))  # drained as it comes: a full pipe would block the worker
        async for line in proc.stdout:
            yield line[:1], json.loads(line[2:])
        err = (await stderr).decode(errors="replace")
        await proc.wait()
        if proc.returncode:
            raise ChaoskitError(f"load worker {k} failed (exit {proc.returncode}): {err.strip()[-400:]}")

    async def stop(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.kill()
                await p.wait()


async def _tail(stream: asyncio.StreamReader, keep: int = 4000) -> bytes:
    tail = b""
    while chunk := await stream.read(65536):
        tail = (tail + chunk)[-keep:]
    return tail


async def run_load(spec: LoadSpec, on_progress: Callable[[dict[str, Any]], None] | None = None,
                   group_by: str | None = None) -> dict[str, Any]:
    """One bounded run; with group_by (a response header) the summary also has KEY[value] for each value."""
    w = _Workers(spec, group_by=group_by)
    rec = Recorder()
    progress: list[dict[str, Any]] = [{} for _ in range(spec.workers)]
    got = [False] * spec.workers

    async def drive(k: int) -> None:
        async for kind, data in w.lines(k):
            if kind == b"P":
                progress[k] = data
                if on_progress is not None:
                    on_progress(_sum(progress, time.time() - w.start))
            elif kind == b"R":
                rec.merge(data)
                got[k] = True
        if not got[k]:
            raise ChaoskitError(f"load worker {k} ended without a result")

    try:
        await w.spawn()
        await asyncio.gather(*(drive(k) for k in range(spec.workers)))
    finally:
        await w.stop()
    summary = rec.summary(spec.rate, spec.duration, scheduled=sum(1 for _ in schedule(spec, spec.duration)))
    summary["workers"] = spec.workers
    summary["sender"] = w.spec.sender
    summary["recorder"] = rec
    return summary


class ContinuousLoad:
    """Load that runs until closed; `window()` returns the summary of everything completed since the last call
    (waiting for at least one whole window)."""

    def __init__(self, spec: LoadSpec, window_s: float, group_by: str | None = None):
        self.spec, self.window_s = spec, window_s
        self._w = _Workers(spec, window_s=window_s, open_ended=True, group_by=group_by)
        self._parts: dict[int, list[dict[str, Any]]] = {}
        self._ready: asyncio.Queue[tuple[int, Recorder]] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._clock = ScheduleClock(schedule(spec, math.inf))

    async def start(self) -> None:
        await self._w.spawn()
        self._tasks = [asyncio.create_task(self._drive(k)) for k in range(self.spec.workers)]

    async def _drive(self, k: int) -> None:
        async for kind, data in self._w.lines(k):
            if kind == b"W":
                parts = self._parts.setdefault(data["window"], [])
                parts.append(data)
                if len(parts) == self.spec.workers:
                    rec = Recorder()
                    for part in self._parts.pop(data["window"]):
                        rec.merge(part)
                    self._ready.put_nowait((data["window"], rec))

    async def window(self, timeout: float) -> dict[str, Any]:
        for t in self._tasks:
            if t.done() and t.exception():
                raise t.exception()  # type: ignore[misc]
        async with asyncio.timeout(timeout):
            last, rec = await self._ready.get()
        windows = 1
        while not self._ready.empty():
            last, more = self._ready.get_nowait()
            rec.merge(more.to_json())
            windows += 1
        scheduled = self._clock.due_before(last * self.window_s)  # window k ends k windows after the start
        summary = rec.summary(self.spec.rate, windows * self.window_s, scheduled)
        summary["window_s"] = windows * self.window_s
        return summary

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._w.stop()


def _sum(parts: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    out = {k: sum(p.get(k, 0) for p in parts) for k in ("sent", "ok", "errors", "late", "in_flight")}
    out["elapsed_s"] = max(0.0, elapsed)
    return out
