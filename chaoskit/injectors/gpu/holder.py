"""The process behind gpu.memory_pressure: real CUDA allocations held (or steadied) until SIGTERM or deadline.

`python -m chaoskit.injectors.gpu.holder TOKEN CONFIG_JSON UNTIL_EPOCH PARENT_PID` runs the holder: it dies
with its parent (PR_SET_PDEATHSIG), prints `ready` once the first allocation is done, re-measures every
100 ms, appends every correction to CONFIG.journal (JSON lines) and rewrites CONFIG.status (JSON) each tick.
`python -m chaoskit.injectors.gpu.holder probe` prints the device's facts as JSON (preflight), or one line
and exit 4. The device is chosen by CUDA_VISIBLE_DEVICES (the spawner sets it), so it is always ordinal 0.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from chaoskit.errors import PreflightError
from chaoskit.gpu.cuda import Driver
from chaoskit.gpu.hold import Fragmented, Holder, Target, fragment

TICK_S = 0.1
PR_SET_PDEATHSIG = 1


def probe() -> int:
    try:
        drv = Driver()
        if drv.device_count() < 1:
            raise PreflightError(f"no device {os.environ.get('CUDA_VISIBLE_DEVICES', '0')} (CUDA sees none)")
        facts = drv.facts(0)
        drv.open_device(0)
        free, total = drv.info()
    except Exception as e:  # CudaError on a bad device, PreflightError without a driver
        print(str(e), flush=True)
        return 4
    print(json.dumps({"name": facts.name, "uuid": facts.uuid, "total": total, "free": free}), flush=True)
    return 0


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(0)


def _write_status(path: Path, holder: Holder, frag: Fragmented | None, corrections: int, state: str) -> None:
    free, total = holder.mem.info()
    data: dict[str, Any] = {"state": state, "pid": os.getpid(), "held": holder.held, "chunks": len(holder.chunks),
                            "device_free": free, "device_total": total, "device_used": total - free,
                            "baseline_used": holder.baseline_used, "corrections": corrections,
                            "short": holder.short, "t": time.time()}
    if holder.target.hold == "steady":
        data["goal_used"] = holder.goal_used(time.time())
    else:
        data["goal_own"] = holder.own_goal
    if frag is not None:
        data["fragment"] = {"holes": frag.holes, "hole_size": frag.hole_size, "free_after": frag.free_after,
                            "largest_alloc": frag.largest_alloc, "largest_ratio": round(frag.largest_ratio, 4)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def hold(config: dict[str, Any], until: float) -> int:
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the engine's to handle
    status, journal = Path(config["status"]), Path(config["journal"])
    drv = Driver()
    drv.open_device(0)
    holder = Holder(drv, Target(**config["target"]))
    holder.start(time.time())
    frag = None
    n = 0
    with open(journal, "a", encoding="utf-8") as jf:
        def record(c: Any) -> None:
            nonlocal n
            if c is not None:
                n += 1
                jf.write(json.dumps(c.to_json()) + "\n")
                jf.flush()

        if config.get("fragment"):
            frag = fragment(holder, config["fragment"]["holes"], config["fragment"]["hole_size"])
        else:
            record(holder.tick(time.time()))
            if holder.target.hold == "fixed" and not holder.target.ramp_s and holder.held < holder.own_goal:
                got = holder.held
                holder.release()
                print(f"only {got} of {holder.own_goal} bytes could be allocated "
                      f"(device free at start: {holder.total - holder.baseline_used})", file=sys.stderr)
                return 3
        _write_status(status, holder, frag, n, "holding")
        print("ready", flush=True)
        next_t = time.monotonic()
        while not stop and time.time() < until:
            next_t += TICK_S
            time.sleep(max(0.0, next_t - time.monotonic()))
            if frag is None:
                record(holder.tick(time.time()))
            _write_status(status, holder, frag, n, "holding")
    holder.release()
    _write_status(status, holder, frag, n, "released")
    drv.close()
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "probe":
        return probe()
    _token, config, until, parent = argv[0], json.loads(argv[1]), float(argv[2]), int(argv[3])
    _die_with_parent(parent)
    try:
        return hold(config, until)
    except (PreflightError, RuntimeError, ValueError) as e:  # CudaError is a RuntimeError
        print(str(e), file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
