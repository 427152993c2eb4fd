"""Find processes by PID, name or marker token, and tell a live process from a reused PID (via psutil)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import psutil

# psutil's status names back to the kernel's one-letter states that callers compare (T = stopped, Z = zombie).
_STATE_LETTERS = {
    psutil.STATUS_RUNNING: "R", psutil.STATUS_SLEEPING: "S", psutil.STATUS_DISK_SLEEP: "D",
    psutil.STATUS_STOPPED: "T", psutil.STATUS_TRACING_STOP: "t", psutil.STATUS_ZOMBIE: "Z",
    psutil.STATUS_DEAD: "X", psutil.STATUS_WAKING: "W", psutil.STATUS_IDLE: "I", psutil.STATUS_PARKED: "P",
}


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


def start_ticks(pid: int) -> int | None:
    """The kernel start time of `pid` in clock ticks since boot (/proc/PID/stat field 22): the unit ledgers store.

    Read here, not through psutil: its create_time() is wall-clock seconds (boot time + ticks / CLK_TCK, with a
    boot time that moves when the clock is stepped), which does not convert back to the same integer reliably."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(raw.rpartition(b")")[2].split()[19])  # after "pid (comm)": field 3 is index 0


def proc_ref(pid: int) -> ProcessRef | None:
    """The identity of a running process, or None if there is no such process."""
    start = start_ticks(pid)
    try:
        return None if start is None else ProcessRef(pid=pid, start_time=start, comm=psutil.Process(pid).name())
    except psutil.Error:
        return None


def parent_pid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def proc_state(pid: int) -> str | None:
    """One-letter scheduler state (R, S, T = stopped, Z = zombie ...) or None if gone."""
    try:
        return _STATE_LETTERS.get(psutil.Process(pid).status(), "?")
    except psutil.Error:
        return None


def is_alive(ref: ProcessRef) -> bool:
    """True if that very process (same start time) still exists and is not a zombie."""
    return start_ticks(ref.pid) == ref.start_time and proc_state(ref.pid) not in (None, "Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def all_pids() -> list[int]:
    return sorted(psutil.pids())


def find_by_name(pattern: str, full: bool = False) -> list[ProcessRef]:
    """Processes whose name (or full command line when `full`) matches the regex `pattern`."""
    rx = re.compile(pattern)
    me = os.getpid()
    found = []
    for pid in all_pids():
        ref = proc_ref(pid) if pid != me else None
        if ref is None or proc_state(pid) == "Z":
            continue
        text = " ".join(cmdline(pid)) if full else ref.comm
        if text and rx.search(text):
            found.append(ref)
    return found


def find_by_token(token: str) -> list[ProcessRef]:
    """Processes whose command line carries the marker `token` as one argument."""
    refs = (proc_ref(pid) for pid in all_pids() if token in cmdline(pid))
    return [r for r in refs if r is not None]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid` (psutil has no pgid: getpgid(2) per process)."""
    out = []
    for pid in all_pids():
        try:
            if os.getpgid(pid) == pgid and proc_state(pid) not in (None, "Z", "X"):
                out.append(pid)
        except OSError:
            continue
    return out


def threads(pid: int) -> list[int]:
    """The thread IDs of a process (empty when it is gone)."""
    try:
        return sorted(t.id for t in psutil.Process(pid).threads())
    except psutil.Error:
        return []


def thread_group(tid: int) -> int | None:
    """The process (thread group) a thread ID belongs to."""
    try:
        for line in Path(f"/proc/{tid}/status").read_text().splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None
