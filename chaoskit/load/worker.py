"""A sender process: `python -m chaoskit.load.worker` reads {"spec", "start_epoch", "worker", "workers",
"window_s", "open_ended"} as JSON on stdin; sends every `workers`-th arrival of the schedule starting at
`worker`; prints progress `P {...}`, per-window recorders `W {...}` (when window_s is set) and finally
`R {recorder}` on stdout."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from chaoskit.aio import run_fast
from chaoskit.load.generator import run
from chaoskit.load.recorder import Recorder
from chaoskit.load.schedule import iter_offsets
from chaoskit.load.spec import LoadSpec


def main() -> int:
    job = json.loads(sys.stdin.read())
    spec = LoadSpec.model_validate(job["spec"])
    rec = Recorder()
    k, n = job["worker"], job["workers"]
    duration = float("inf") if job.get("open_ended") else spec.duration
    mine = (off for i, off in enumerate(iter_offsets(spec.arrival, spec.rate, duration, spec.seed, spec.burstiness,
                                                     spec.ramp_to, spec.trace)) if i % n == k)

    def progress(r: Recorder, in_flight: int) -> None:
        print("P " + json.dumps({"sent": r.sent, "ok": r.ok, "errors": sum(r.errors.values()), "late": r.late,
                                 "in_flight": in_flight}), flush=True)

    async def main() -> None:
        window = job.get("window_s")
        reporter = asyncio.create_task(_windows(rec, job["start_epoch"], window)) if window else None
        await run(spec, mine, job["start_epoch"], rec, progress)
        if reporter:
            reporter.cancel()

    run_fast(main())
    print("R " + json.dumps(rec.to_json()), flush=True)
    return 0


async def _windows(rec: Recorder, start_epoch: float, window: float) -> None:
    """Every `window` seconds from the start: print what completed in that window, then start a new one."""
    k = 1
    while True:
        await asyncio.sleep(max(0.0, start_epoch + k * window - time.time()))
        print("W " + json.dumps({"window": k, **rec.to_json()}), flush=True)
        rec.reset()
        k += 1


if __name__ == "__main__":
    sys.exit(main())
