"""A sender process: `python -m chaoskit.load.worker` reads {"spec", "start_epoch", "worker", "workers",
"window_s", "open_ended", "group_by", "traceparent"} as one JSON line on stdin (traceparent: a header value every
request carries, or null); sends every `workers`-th arrival of the schedule
starting at `worker` (with the native sender or the asyncio one, as spec.sender says); prints progress `P {...}`,
per-window recorders `W {...}` (when window_s is set) and finally `R {recorder}` on stdout. An open-ended one
then reads commands, one JSON line each: {"cut": N} prints `C {"cut": N, recorder}` (what completed since the last
W or C) and starts a new part; {"stop": true} sends nothing more, prints `S {}`, and ends as a bounded run does
(the requests in flight complete or time out, then `R`)."""

from __future__ import annotations

import asyncio
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from itertools import islice

from chaoskit.aio import run_fast
from chaoskit.errors import ChaoskitError
from chaoskit.load.fastclient import request_bytes
from chaoskit.load.generator import PROGRESS_S, requests, run, trace_headers, warm_count
from chaoskit.load.recorder import Recorder, load_readers
from chaoskit.load.schedule import schedule
from chaoskit.load.spec import LoadSpec


def _progress(r: Recorder, in_flight: int) -> None:
    print("P " + json.dumps({"sent": r.sent, "ok": r.ok, "errors": sum(r.errors.values()), "late": r.late,
                             "in_flight": in_flight}), flush=True)


def _window(k: int, rec: Recorder) -> None:
    print("W " + json.dumps({"window": k, **rec.to_json()}), flush=True)


def _cut(n: int, rec: Recorder) -> None:
    print("C " + json.dumps({"cut": n, **rec.to_json()}), flush=True)


def _read_commands(on: Callable[[dict], None]) -> None:
    """The parent's commands (JSON lines on stdin after the job), read in a thread and handed to `on`; EOF
    (the parent closed stdin or went away) ends the thread."""
    def read() -> None:
        while line := sys.stdin.readline():
            if line.strip():
                try:
                    on(json.loads(line))
                except RuntimeError:  # the event loop has closed: the sending is over
                    return

    threading.Thread(target=read, daemon=True).start()


def main() -> int:
    job = json.loads(sys.stdin.readline())
    spec = LoadSpec.model_validate(job["spec"])
    rec = Recorder()
    load_readers()  # before the clock starts (the start epoch is SPAWN_LEAD_S after the launch)
    k, n = job["worker"], job["workers"]
    if k:
        spec = spec.model_copy(update={"poison": None})  # the first sender process sends it, once
    duration = float("inf") if job.get("open_ended") else spec.duration
    mine = islice(schedule(spec, duration), k, None, n)
    group_by = job.get("group_by")
    if spec.sender == "native":
        try:
            if group_by is not None:
                raise ChaoskitError("group_by needs the python sender: the native one does not read headers")
            _native(spec, mine, job["start_epoch"], job.get("window_s"), rec, bool(job.get("open_ended")),
                    job.get("traceparent"))
        except ChaoskitError as e:
            print(e, file=sys.stderr)  # the parent reports it: no traceback for what the user can fix
            return 2
    else:
        run_fast(_asyncio(spec, mine, job["start_epoch"], job.get("window_s"), rec, group_by,
                          bool(job.get("open_ended")), job.get("traceparent")))
    print("R " + json.dumps(rec.to_json()), flush=True)
    return 0


def _native(spec: LoadSpec, offsets: Iterable[float], start_epoch: float, window: float | None,
            rec: Recorder, commands: bool = False, traceparent: str | None = None) -> None:
    from chaoskit.load.native import Sender

    headers = trace_headers(traceparent)  # in the payloads sender.c sends as they are
    sender = Sender(spec, [request_bytes(*r, headers) for r in requests(spec)], rec)
    todo: queue.SimpleQueue[dict] = queue.SimpleQueue()
    stopped = False
    if commands:
        _read_commands(todo.put)
    try:
        if not spec.concurrency_cap:
            sender.warm(warm_count(spec))
        t0 = time.monotonic() + (start_epoch - time.time())
        next_window, next_progress = 1, time.monotonic()

        def tick() -> None:  # between the C sender's slices (every 10 ms at most)
            nonlocal next_window, next_progress, stopped
            while not todo.empty():
                cmd = todo.get_nowait()
                if "cut" in cmd:
                    sender.sync()
                    _cut(cmd["cut"], rec)
                    sender.reset()
                elif cmd.get("stop"):
                    stopped = True  # Sender.run drops the unsent schedule before its next slice
                    print("S {}", flush=True)
            now = time.monotonic()
            if window and now >= t0 + next_window * window:
                sender.sync()
                _window(next_window, rec)
                sender.reset()
                next_window += 1
            if now >= next_progress:
                sender.sync()
                _progress(rec, sender.stats.in_flight)
                next_progress = now + PROGRESS_S

        sender.run(offsets, t0, tick, lambda: stopped)
        sender.sync()
    finally:
        sender.close()


async def _asyncio(spec: LoadSpec, offsets: Iterable[float], start_epoch: float, window: float | None,
                   rec: Recorder, group_by: str | None = None, commands: bool = False,
                   traceparent: str | None = None) -> None:
    reporter = asyncio.create_task(_windows(rec, start_epoch, window)) if window else None
    stop = asyncio.Event()

    def on(cmd: dict) -> None:  # on the loop, so no send and no window report runs in between
        if "cut" in cmd:
            _cut(cmd["cut"], rec)
            rec.reset()
        elif cmd.get("stop"):
            stop.set()  # run() sends nothing once this is set
            print("S {}", flush=True)

    if commands:
        loop = asyncio.get_running_loop()
        _read_commands(lambda cmd: loop.call_soon_threadsafe(on, cmd))
    await run(spec, offsets, start_epoch, rec, _progress, group_by, stop.is_set, traceparent)
    if reporter:
        reporter.cancel()


async def _windows(rec: Recorder, start_epoch: float, window: float) -> None:
    """Every `window` seconds from the start: print what completed in that window, then start a new one."""
    k = 1
    while True:
        await asyncio.sleep(max(0.0, start_epoch + k * window - time.time()))
        _window(k, rec)
        rec.reset()
        k += 1


if __name__ == "__main__":
    sys.exit(main())
