"""The process behind host.cpu_stress: fork N busy workers and keep them until SIGTERM, the deadline or chaoskit's end.

Run as `python -m chaoskit.injectors.cpu.stress_helper TOKEN WORKERS LOAD NICE UNTIL_EPOCH PARENT_PID`; prints
`ready` once every worker runs. Workers are forks, so they carry TOKEN in their command line too (a fresh
process finds them all). The helper dies with PARENT_PID (PR_SET_PDEATHSIG), each worker with the helper.
A worker with LOAD < 1 is busy LOAD of every 100 ms slice and sleeps the rest.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
SLICE_S = 0.1


def _die_with_parent(parent: int, sig: signal.Signals) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(0)


def burn(load: float, until: float) -> None:
    """Spin `load` of every slice (time.monotonic() checks are the work), sleep the rest, until `until`."""
    while time.time() < until:
        start = time.monotonic()
        busy_until = start + SLICE_S * load
        while time.monotonic() < busy_until:
            pass
        rest = SLICE_S - (time.monotonic() - start)
        if load < 1.0 and rest > 0:
            time.sleep(rest)


def _worker(load: float, until: float, helper: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the engine's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _die_with_parent(helper, signal.SIGKILL)
    burn(load, until)


def main(argv: list[str]) -> int:
    workers, load, nice, until, parent = int(argv[1]), float(argv[2]), int(argv[3]), float(argv[4]), int(argv[5])
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent, signal.SIGTERM)
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) != nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)  # the workers inherit it
    except OSError as e:
        print(f"cannot set nice {nice}: {e.strerror}", file=sys.stderr, flush=True)
        return 1
    me, pids = os.getpid(), []
    for _ in range(workers):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # no SIGTERM to the child before its reset
        pid = os.fork()
        if pid == 0:
            try:
                _worker(load, until, me)
            finally:
                os._exit(0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        pids.append(pid)
    print("ready", flush=True)
    while not stop and time.time() < until and pids:
        for pid in list(pids):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                pids.remove(pid)
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for pid in pids:
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
