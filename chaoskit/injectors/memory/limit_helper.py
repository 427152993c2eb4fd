"""The holder of process.memory_limit: joins the cgroup, asks for oom_score_adj -1000, then becomes memory_holder.

Run as `python -S -P chaoskit/injectors/memory/limit_helper.py TOKEN CGROUP BYTES UNTIL PARENT_PID` (helper_proc.spawn);
standard library only, so the holder does not carry chaoskit's imports: its own size decides who the OOM killer
picks where -1000 is refused."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

HOLDER_OOM_SCORE_ADJ = -1000  # never the OOM killer's pick (OOM_SCORE_ADJ_MIN)
PR_SET_PDEATHSIG = 1
MEMORY_HOLDER = Path(__file__).with_name("holder.py")


def holder_main(argv: list[str]) -> int:
    token, cgroup, nbytes, until, parent = argv[0], Path(argv[1]), argv[2], argv[3], int(argv[4])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # kept across exec; KILL: TERM waits for the pages
    if os.getppid() != parent:  # the parent died before prctl took effect
        return 0
    (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")
    try:
        Path("/proc/self/oom_score_adj").write_text(f"{HOLDER_OOM_SCORE_ADJ}\n")
    except PermissionError:  # below oom_score_adj_min needs CAP_SYS_RESOURCE; apply records what it got
        pass
    os.execv(sys.executable, [sys.executable, "-S", "-P", str(MEMORY_HOLDER), token, nbytes, until])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(holder_main(sys.argv[1:]))
