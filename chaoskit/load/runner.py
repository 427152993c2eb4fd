"""Run a load spec across worker processes and merge their histograms: one bounded run (`run_load`) or an
open-ended one reporting per window, cut on demand (`ContinuousLoad`, for probes that sample a whole experiment)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chaoskit.errors import ChaoskitError
from chaoskit.load import native
from chaoskit.load.recorder import Recorder
from chaoskit.load.schedule import ScheduleClock, schedule
from chaoskit.load.spec import LoadSpec
from chaoskit.load.traceparent import from_env

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
        traceparent = from_env(os.environ)  # a traced run's (chaoskit run --otlp-endpoint sets it): on every request
        for k in range(n):
            p = await asyncio.create_subprocess_exec(sys.executable, "-m", "chaoskit.load.worker",
                                                     stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.PIPE)
            assert p.stdin is not None
            p.stdin.write(json.dumps({"spec": self.spec.model_dump(mode="json"), "start_epoch": self.start,
                                      "worker": k, "workers": n, "window_s": self.window_s,
                                      "open_ended": self.open_ended, "group_by": self.group_by,
                                      "traceparent": traceparent}).encode() + b"\n")
            await p.stdin.drain()
            if not self.open_ended:  # an open-ended one takes commands (worker.py) on stdin
                p.stdin.close()
            self.procs.append(p)

    async def command(self, cmd: dict[str, Any]) -> None:
        """Send one command to every worker of an open-ended run."""
        line = json.dumps(cmd).encode() + b"\n"
        try:
            for p in self.procs:
                assert p.stdin is not None
                p.stdin.write(line)
            await asyncio.gather(*(p.stdin.drain() for p in self.procs if p.stdin is not None))
        except (BrokenPipeError, ConnectionResetError):
            raise ChaoskitError(f"a load worker has exited; cannot send {cmd}") from None

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
            if p.stdin is not None and not p.stdin.is_closing():
                p.stdin.close()
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


@dataclass
class Part:
    """What an open-ended load's workers reported for one stretch of it: their merged recorder, how long the
    stretch was and how many sends the schedule held in it."""

    rec: Recorder
    elapsed_s: float
    scheduled: int

    def merge(self, other: Part) -> None:
        self.rec.merge(other.rec.to_json())
        self.elapsed_s += other.elapsed_s
        self.scheduled += other.scheduled

    def summary(self, rate: float) -> dict[str, Any]:
        out = self.rec.summary(rate, self.elapsed_s, self.scheduled)
        out["window_s"] = self.elapsed_s
        return out


class ContinuousLoad:
    """Load that runs until stopped or closed, reported in parts that together hold every completed request once.
    `window()`: what completed since the previous part, waiting for at least one whole window (half of one after
    a cut); `cut()`: what completed up to now, the partial window included; `stop()`: send nothing more, then
    `drain()`: what is left once the requests in flight have completed or timed out."""

    def __init__(self, spec: LoadSpec, window_s: float, group_by: str | None = None):
        self.spec, self.window_s = spec, window_s
        self._w = _Workers(spec, window_s=window_s, open_ended=True, group_by=group_by)
        self._parts: dict[int, list[dict[str, Any]]] = {}  # window -> the workers' reports not taken yet
        self._delivered = [0] * spec.workers  # each worker's latest window
        self._cuts: dict[int, list[dict[str, Any]]] = {}  # cut -> the workers' reports
        self._acks = 0  # workers that have stopped sending
        self._finals: list[dict[str, Any]] = []  # the workers' last reports (after stop)
        self._ended = 0
        self._failed: BaseException | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._tasks: list[asyncio.Task] = []
        self._clock = ScheduleClock(schedule(spec, math.inf))
        self._taken_at = 0.0  # seconds after the start up to which the parts have been taken
        self._n_cuts = 0
        self._stop_at: float | None = None

    async def start(self) -> None:
        await self._w.spawn()
        self._tasks = [asyncio.create_task(self._drive(k)) for k in range(self.spec.workers)]

    async def _drive(self, k: int) -> None:
        try:
            async for kind, data in self._w.lines(k):
                if kind == b"W":
                    self._parts.setdefault(data["window"], []).append(data)
                    self._delivered[k] = data["window"]
                elif kind == b"C":
                    self._cuts.setdefault(data["cut"], []).append(data)
                elif kind == b"S":
                    self._acks += 1
                elif kind == b"R":
                    self._finals.append(data)
                self._changed()
        except Exception as e:
            self._failed = self._failed or e
        finally:
            self._ended += 1
            self._changed()

    def _changed(self) -> None:
        for f in self._waiters:
            if not f.done():
                f.set_result(None)
        self._waiters.clear()

    async def _until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        async with asyncio.timeout(timeout):
            while not ready():
                if self._failed is not None:
                    raise self._failed
                if self._ended == self.spec.workers:
                    raise ChaoskitError(f"the load ended before {what}: its schedule has no more sends "
                                        f"(arrival: replay plays its trace once)")
                f = asyncio.get_running_loop().create_future()
                self._waiters.append(f)
                await f

    def _take(self, up_to: float, *more: list[dict[str, Any]]) -> Part:
        """Merge and remove the reports of windows <= up_to, plus the reports in `more` (its span: `_ends`)."""
        rec = Recorder()
        for k in [k for k in self._parts if k <= up_to]:
            for data in self._parts.pop(k):
                rec.merge(data)
        for reports in more:
            for data in reports:
                rec.merge(data)
        return Part(rec, 0.0, 0)

    def _ends(self, part: Part, until: float) -> Part:
        """The part spans from where the previous one ended to `until` (seconds after the start)."""
        until = max(until, self._taken_at)
        part.scheduled = self._clock.due_before(until)
        part.elapsed_s = until - self._taken_at
        self._taken_at = until
        return part

    @property
    def stopped(self) -> bool:
        """stop() was called: it sends nothing more, and window() raises."""
        return self._stop_at is not None

    async def window(self, timeout: float) -> Part:
        half = self.window_s / 2
        await self._until(lambda: self._stop_at is not None
                          or min(self._delivered) * self.window_s - self._taken_at >= half - 1e-9,
                          timeout, "the next window")
        if self._stop_at is not None:
            raise ChaoskitError("the load was stopped (the probe's last phase has ended)")
        last = min(self._delivered)  # window k ends k windows after the start
        return self._ends(self._take(last), last * self.window_s)

    async def cut(self, timeout: float) -> Part:
        """Everything completed up to now that no window() has taken (each worker reports its partial window)."""
        self._n_cuts += 1
        n, at = self._n_cuts, time.time() - self._w.start
        await self._w.command({"cut": n})
        await self._until(lambda: len(self._cuts.get(n, ())) == self.spec.workers, timeout, "the cut")
        return self._ends(self._take(math.inf, self._cuts.pop(n)), at)

    async def stop(self, timeout: float, settle_s: float = 0.0) -> None:
        """Send nothing more (returns once every worker has stopped, then up to settle_s later once the requests
        in flight have completed too); a window() waiting now gives up."""
        self._stop_at = time.time() - self._w.start
        self._changed()
        await self._w.command({"stop": True})
        await self._until(lambda: self._acks == self.spec.workers, timeout, "it stopped")
        try:
            await self._until(lambda: len(self._finals) == self.spec.workers, settle_s, "its requests completed")
        except TimeoutError:
            pass  # drain() waits for the rest

    async def drain(self, timeout: float) -> Part:
        """After stop(): what is left once every request in flight completed (each within its timeout)."""
        assert self._stop_at is not None
        await self._until(lambda: len(self._finals) == self.spec.workers, timeout, "its requests completed")
        return self._ends(self._take(math.inf, self._finals), self._stop_at)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._w.stop()


def _sum(parts: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    out = {k: sum(p.get(k, 0) for p in parts) for k in ("sent", "ok", "errors", "late", "in_flight")}
    out["elapsed_s"] = max(0.0, elapsed)
    return out
