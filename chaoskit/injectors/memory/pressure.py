"""host.memory_pressure: a holder process has the kernel populate N bytes of RAM and holds them, or holds the host's
available memory (MemAvailable + the per-CPU lists' free pages) at a goal while others allocate and free; revert = it
exits."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.injectors import helper_proc
from chaoskit.injectors.memory.holder import meminfo
from chaoskit.model.types import Percent, StrictModel
from chaoskit.paths import state_dir
from chaoskit.targets.process import ProcessRef
from chaoskit.units import format_size, is_percent, parse_size

SAFE_SHARE_OF_AVAILABLE = 0.8
FLOOR_SHARE, FLOOR_MIN = 0.05, 256 << 20  # a hold never pushes available memory below max(5% of MemTotal, 256 MiB)
DEADBAND_SHARE, DEADBAND_MIN = 0.0025, 4 << 20  # corrections smaller than this are not made


def _positive_size(v: str | int | None) -> str | int | None:
    if v is not None and parse_size(v, total=1 << 40) <= 0:  # syntax and sign only; the host decides the rest
        raise ValueError("must be greater than 0")
    return v


class MemoryPressureSpec(StrictModel):
    type: Literal["host.memory_pressure"]
    size: str | int | None = Field(None, description="bytes to hold: '512MiB', '2GiB' or a share of RAM like '40%' "
                                                     "(one of size, leave_available, target_used)")
    leave_available: str | int | None = Field(None, description="hold so that available memory (MemAvailable "
                                                                "plus the free pages on the kernel's per-CPU "
                                                                "lists, which MemAvailable leaves out) stays at "
                                                                "this, e.g. '1GiB' or '10%' of MemTotal, while "
                                                                "other processes allocate and free")
    target_used: Percent | None = Field(None, description="hold so that used memory (MemTotal - available memory) "
                                                          "stays at this share of MemTotal, e.g. '75%'")
    allow_unsafe: bool = Field(False, description=f"allow more than {SAFE_SHARE_OF_AVAILABLE:.0%} of "
                                                  "currently available memory (a hold still keeps the floor)")

    @field_validator("size")
    @classmethod
    def _size(cls, v: str | int | None) -> str | int | None:
        if v is not None and parse_size(v, total=1 << 40) <= 0:
            raise ValueError("size must be greater than 0")
        return v

    @field_validator("leave_available")
    @classmethod
    def _leave(cls, v: str | int | None) -> str | int | None:
        return _positive_size(v)

    @model_validator(mode="after")
    def _one_mode(self) -> MemoryPressureSpec:
        given = [k for k in ("size", "leave_available", "target_used") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of size (hold a fixed amount), leave_available (keep available "
                             "memory at that) or target_used (keep used memory at that share of MemTotal)"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.target_used is not None and not 0 < self.target_used < 1:
            raise ValueError("target_used must be between 0% and 100%, both excluded (e.g. '75%')")
        return self

    @property
    def holds(self) -> bool:
        """A hold (leave_available / target_used) rather than a fixed size."""
        return self.size is None

    def nbytes(self) -> int:
        """The fixed size in bytes (size mode only)."""
        total, _ = meminfo()
        return parse_size(self.size, total=total) if is_percent(self.size) else parse_size(self.size)

    def goal_available(self, total: int) -> int:
        """The available memory a hold keeps (hold modes only)."""
        if self.target_used is not None:
            return int(total * (1 - self.target_used))
        return parse_size(self.leave_available, total=total)

    def describe_goal(self, total: int) -> str:
        goal = self.goal_available(total)
        if self.target_used is not None:
            return (f"used memory at {self.target_used:.2%} of MemTotal {format_size(total)} "
                    f"(available memory {format_size(goal)})")
        return f"available memory at {format_size(goal)}"


def floor_bytes(total: int) -> int:
    return max(int(FLOOR_SHARE * total), FLOOR_MIN)


def deadband_bytes(total: int) -> int:
    return max(int(DEADBAND_SHARE * total), DEADBAND_MIN)


class HolderRecord(helper_proc.HelperFiles):
    """host.memory_pressure's record: the holder's token and status file, the most it may hold (bytes); for a hold,
    the available memory it keeps (goal_available), its floor and deadband; once started, the holder."""

    bytes: int
    goal_available: int | None = None
    floor: int | None = None
    deadband: int | None = None
    holder: ProcessRef | None = None

    def config(self) -> str:
        """What the holder is started with (JSON): its status file and, for a hold, goal, floor and deadband."""
        return self.model_dump_json(include={"status", "goal_available", "floor", "deadband"}, exclude_none=True)


class MemoryPressure(helper_proc.HelperFault[MemoryPressureSpec, HolderRecord]):
    type: ClassVar[str] = "host.memory_pressure"
    host_needs: ClassVar[frozenset[str]] = frozenset({"meminfo"})
    Record = HolderRecord
    helper: ClassVar[str | None] = "chaoskit.injectors.memory.holder"
    summary: ClassVar[str] = ("hold N bytes of host RAM, or hold available memory at a goal, in a holder process "
                              "(revert: it exits)")
    Spec = MemoryPressureSpec
    spec: MemoryPressureSpec

    def cap_bytes(self, total: int, avail: int) -> int:
        """The most a hold may own: 80% of what is available at start, or (allow_unsafe) all but the floor."""
        return total if self.spec.allow_unsafe else int(SAFE_SHARE_OF_AVAILABLE * avail)

    def preflight(self) -> None:
        total, avail = meminfo()
        if not self.spec.holds:
            n = self.spec.nbytes()
            if n > SAFE_SHARE_OF_AVAILABLE * avail and not self.spec.allow_unsafe:
                raise PreflightError(
                    f"host.memory_pressure: {format_size(n)} is more than {SAFE_SHARE_OF_AVAILABLE:.0%} of the "
                    f"{format_size(avail)} available now; set allow_unsafe: true to force")
            return
        goal, floor, used = self.spec.goal_available(total), floor_bytes(total), total - avail
        if goal < floor:
            raise PreflightError(
                f"host.memory_pressure: the goal ({self.spec.describe_goal(total)}) is below the floor: a hold "
                f"never pushes available memory under {format_size(floor)} (max({FLOOR_SHARE:.0%} of MemTotal, "
                f"{format_size(FLOOR_MIN)}))")
        need = avail - goal
        if need <= 0:
            raise PreflightError(
                f"host.memory_pressure: nothing to hold: used memory is already {format_size(used)} "
                f"({used / total:.1%} of MemTotal, {format_size(avail)} available), at or past the goal "
                f"({self.spec.describe_goal(total)})")
        cap = self.cap_bytes(total, avail)
        if need > cap:
            raise PreflightError(
                f"host.memory_pressure: the holder would need {format_size(need)} now, more than its cap of "
                f"{format_size(cap)} ({SAFE_SHARE_OF_AVAILABLE:.0%} of the {format_size(avail)} available now); "
                "set allow_unsafe: true to lift the cap (the floor still holds)")

    def plan(self) -> list[str]:
        revert = (f"revert: SIGTERM the holder, which gives everything back and exits (it also exits by itself "
                  f"after {self.ctx.lifetime_s:g}s)")
        populate = ("the kernel populates it 64 MiB at a time (madvise MADV_POPULATE_WRITE; MAP_POPULATE or "
                    "touching each page on kernels before 5.14)")
        if not self.spec.holds:
            return [f"start a holder process that maps {format_size(self.spec.nbytes())} of anonymous memory; "
                    f"{populate}; ready once every page is resident, then held unchanged", revert]
        total, avail = meminfo()
        goal = self.spec.goal_available(total)
        cap = self.cap_bytes(total, avail)
        cap_why = ("MemTotal: allow_unsafe" if self.spec.allow_unsafe else
                   f"{SAFE_SHARE_OF_AVAILABLE:.0%} of the {format_size(avail)} available now")
        return [f"start a holder process that keeps {self.spec.describe_goal(total)}: now that means holding about "
                f"{format_size(max(avail - goal, 0))}; {populate}; ready once available memory is within "
                f"{format_size(deadband_bytes(total))} of the goal",
                f"every 100 ms it re-reads available memory (MemAvailable in /proc/meminfo + the free pages on the "
                f"per-CPU lists in /proc/zoneinfo): when it is more than "
                f"{format_size(deadband_bytes(total))} above the goal it populates more, when more than that below "
                f"it gives memory back (MADV_DONTNEED / munmap, newest first); it never holds more than "
                f"{format_size(cap)} ({cap_why}) and never pushes available memory below "
                f"{format_size(floor_bytes(total))}; each correction is counted in its status file (held bytes, last "
                "available memory, last corrections)",
                revert]

    def prepare(self) -> HolderRecord:
        token = f"chaoskit-holder-{uuid.uuid4().hex}"
        d = state_dir() / "memory"
        d.mkdir(parents=True, exist_ok=True)
        status = str(d / f"{token}.status.json")
        if not self.spec.holds:
            return HolderRecord(token=token, status=status, bytes=self.spec.nbytes())
        total, avail = meminfo()
        return HolderRecord(token=token, status=status, bytes=self.cap_bytes(total, avail),
                            goal_available=self.spec.goal_available(total), floor=floor_bytes(total),
                            deadband=deadband_bytes(total))

    def apply(self, record: HolderRecord) -> HolderRecord:
        until = time.time() + self.ctx.lifetime_s
        what = (f"memory holder keeping available memory at {format_size(record.goal_available)}"
                if record.goal_available is not None else f"memory holder for {format_size(record.bytes)}")
        args = [str(record.bytes), f"{until:.3f}", record.config()]
        ref = helper_proc.spawn(self.helper, record.token, args, what)
        return record.model_copy(update={"holder": ref})

    @classmethod
    def revert(cls, record: HolderRecord) -> None:
        helper_proc.stop(record.token)
        record.remove_files()

    @classmethod
    def observe_details(cls, record: HolderRecord) -> dict[str, Any]:
        out: dict[str, Any] = {"in_effect": cls.observe(record)}
        try:
            st = json.loads(Path(record.status).read_text()) if record.status else None
        except (OSError, ValueError):
            st = None
        if st is None:
            return {**out, "holder": None}
        out.update(holder=st, held=st.get("held"), mem_available=st.get("mem_available"),
                   corrections=st.get("corrections"))
        return out


