"""Find processes by PID, name or marker token, and tell a live process from a reused PID."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessRef:
    """A process identity that survives PID reuse: pid + kernel start time (clock ticks since boot)."""

    pid: int
    start_time: int
    comm: str = ""

    def to_json(self) -> dict:
        return {"pid": self.pid, "start_time": self.start_time, "comm": self.comm}

    @classmethod
    def from_json(cls, data: dict) -> ProcessRef:
        return cls(int(data["pid"]), int(data["start_time"]), str(data.get("comm", "")))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    # comm is in parentheses and may contain spaces or ')'; split after the last ')'.
    head, _, tail = raw.rpartition(")")
    comm = head.partition("(")[2]
    return [str(pid), comm] + tail.split()


def proc_ref(pid: int) -> ProcessRef | None:
    """The identity of a running process, or None if there is no such process."""
    f = _stat_fields(pid)
    if f is None:
        return None
    return ProcessRef(pid=pid, start_time=int(f[21]), comm=f[1])


def parent_pid(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[3]) if f else None


def proc_state(pid: int) -> str | None:
    """One-letter scheduler state (R, S, T = stopped, Z = zombie ...) or None if gone."""
    f = _stat_fields(pid)
    return f[2] if f else None


def is_alive(ref: ProcessRef) -> bool:
    """True if that very process (same start time) still exists and is not a zombie."""
    cur = proc_ref(ref.pid)
    return cur is not None and cur.start_time == ref.start_time and proc_state(ref.pid) not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def all_pids() -> list[int]:
    return sorted(int(p.name) for p in PROC.iterdir() if p.name.isdigit())


def find_by_name(pattern: str, full: bool = False) -> list[ProcessRef]:
    """Processes whose comm (or full command line when `full`) matches the regex `pattern`."""
    rx = re.compile(pattern)
    me = os.getpid()
    found = []
    for pid in all_pids():
        if pid == me:
            continue
        ref = proc_ref(pid)
        if ref is None or proc_state(pid) == "Z":
            continue
        text = " ".join(cmdline(pid)) if full else ref.comm
        if text and rx.search(text):
            found.append(ref)
    return found


def find_by_token(token: str) -> list[ProcessRef]:
    """Processes whose command line carries the marker `token` as one argument."""
    found = []
    for pid in all_pids():
        if token in cmdline(pid):
            ref = proc_ref(pid)
            if ref is not None:
                found.append(ref)
    return found


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`."""
    out = []
    for pid in all_pids():
        f = _stat_fields(pid)
        if f and f[4] == str(pgid) and f[2] not in ("Z", "X"):
            out.append(pid)
    return out
