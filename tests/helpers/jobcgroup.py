"""A pretend CI job's cgroups (one per hierarchy) and the way runners, systemd and Kubernetes cancel a job:
kill every process in them at once."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from chaoskit.targets.cgroups import hierarchy_roots


def job_procs(dirs: list[Path]) -> set[int]:
    out: set[int] = set()
    for d in dirs:
        try:
            out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        except OSError:
            pass
    return out


def kill_job(dirs: list[Path], timeout: float = 10.0) -> int:
    """SIGKILL everything in the job's cgroups until they are empty (v2 cgroup.kill where it exists, as
    systemd does; a kill loop over cgroup.procs in v1, as runners do). Returns how many processes died."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while (pids := job_procs(dirs)) and time.monotonic() < deadline:
        for d in dirs:
            if (d / "cgroup.kill").exists():
                (d / "cgroup.kill").write_text("1")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    assert not job_procs(dirs), "the job's cgroups did not empty"
    return len(killed)


def make_job_cgroups() -> list[Path]:
    """One cgroup per hierarchy for a pretend CI job (cpuset skipped: a new one has no CPUs to run on)."""
    name = f"cktest-job-{uuid.uuid4().hex[:8]}"  # not chaoskit-*: that prefix is what leftover checks look for
    dirs = []
    for root in hierarchy_roots():
        if "cpuset" in root.name:
            continue
        d = root / name
        try:
            d.mkdir()
        except OSError:
            continue
        dirs.append(d)
    assert dirs, "no cgroup hierarchy to make a job cgroup in"
    return dirs


def enter_job(dirs: list[Path]) -> None:
    """Move the calling process into the job (a Popen preexec_fn)."""
    for d in dirs:
        (d / "cgroup.procs").write_text(str(os.getpid()))


def remove_job_cgroups(dirs: list[Path]) -> None:
    kill_job(dirs)
    for d in dirs:
        for _ in range(100):
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.05)
        assert not d.exists(), f"could not remove {d}"
