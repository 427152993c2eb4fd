"""Run a load spec across worker processes and merge their histograms into one summary."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from chaoskit.errors import ChaoskitError
from chaoskit.load import schedule
from chaoskit.load.recorder import Recorder
from chaoskit.load.spec import LoadSpec

SPAWN_LEAD_S = 1.0  # workers start sending this long after launch (python start-up and imports)


async def run_load(spec: LoadSpec, on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    offs = schedule.offsets(spec.arrival, spec.rate, spec.duration, spec.seed, spec.burstiness, spec.ramp_to,
                            spec.trace)
    if not offs:
        raise ChaoskitError(f"the schedule has no sends (rate {spec.rate}/s for {spec.duration}s)")
    start = time.time() + SPAWN_LEAD_S
    n = min(spec.workers, len(offs))
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-m", "chaoskit.load.worker",
                                                  stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                  stderr=asyncio.subprocess.PIPE) for _ in range(n)]
    progress: list[dict[str, Any]] = [{} for _ in procs]
    rec = Recorder()

    async def drive(k: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdin and proc.stdout and proc.stderr
        proc.stdin.write(json.dumps({"spec": spec.model_dump(mode="json"), "offsets": offs[k::n],
                                     "start_epoch": start}).encode())
        await proc.stdin.drain()
        proc.stdin.close()
        got = False
        async for line in proc.stdout:
            if line.startswith(b"P "):
                progress[k] = json.loads(line[2:])
                if on_progress is not None:
                    on_progress(_sum(progress, time.time() - start))
            elif line.startswith(b"R "):
                rec.merge(json.loads(line[2:]))
                got = True
        err = (await proc.stderr.read()).decode(errors="replace")
        await proc.wait()
        if not got:
            raise ChaoskitError(f"load worker {k} failed (exit {proc.returncode}): {err.strip()[-400:]}")

    try:
        await asyncio.gather(*(drive(k, p) for k, p in enumerate(procs)))
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    summary = rec.summary(spec.rate, spec.duration)
    summary["workers"] = n
    summary["recorder"] = rec
    return summary


def _sum(parts: list[dict[str, Any]], elapsed: float) -> dict[str, Any]:
    out = {k: sum(p.get(k, 0) for p in parts) for k in ("sent", "ok", "errors", "late", "in_flight")}
    out["elapsed_s"] = max(0.0, elapsed)
    return out
