"""Move target processes into a `chaoskit-*` cgroup, and each thread back where it was (cpu_throttle, memory_limit)."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import ConfigDict, Field, model_validator

from chaoskit.injectors.base import RevertRecord
from chaoskit.targets.cgroups import Hierarchy
from chaoskit.targets.local import CgroupTarget, LocalTarget
from chaoskit.targets.process import ProcessRef, is_alive, parent_pid, thread_group, threads

H = TypeVar("H", bound=Hierarchy)


class MovedThread(RevertRecord):
    model_config = ConfigDict(populate_by_name=True)

    tid: int
    from_: str = Field(alias="from")  # the cgroup it goes back to


class MovedProcess(RevertRecord):
    """A process a cgroup fault moves (proc_record): its identity, its cgroup and each thread's before the move."""

    model_config = ConfigDict(populate_by_name=True)

    pid: int
    start_time: int
    comm: str = ""
    from_: str = Field(alias="from")
    threads: list[MovedThread] = Field(default_factory=list)

    def ref(self) -> ProcessRef:
        return ProcessRef(self.pid, self.start_time, self.comm)


class CgroupHierarchy(RevertRecord):
    """The controller's hierarchy a cgroup record's cgroup is in, as Hierarchy.to_json writes it."""

    version: Literal[1, 2]
    root: str = Field(min_length=1)

    def of(self, kind: type[H]) -> H:
        """It as the controller's Hierarchy class (CpuHierarchy, MemHierarchy, IoHierarchy)."""
        return kind(self.version, Path(self.root))


class CgroupRecord(RevertRecord):
    """The record of a cgroup limit: on an existing cgroup (`dedicated` false, its previous limits restored), or
    on a dedicated one, which is always chaoskit's own `chaoskit-*` cgroup: revert moves everything out of it and
    removes it."""

    hierarchy: CgroupHierarchy
    cgroup: str = Field(min_length=1)
    dedicated: bool = True
    procs: list[MovedProcess] = Field(default_factory=list)

    @model_validator(mode="after")
    def _ours(self) -> CgroupRecord:
        if self.dedicated and not Path(self.cgroup).name.startswith("chaoskit-"):
            raise ValueError(f"a dedicated cgroup is a chaoskit-* one, not {self.cgroup}")
        return self

    @property
    def path(self) -> Path:
        return Path(self.cgroup)

    def moved(self, target: LocalTarget | None) -> list[ProcessRef]:
        """The processes it moved, alive when it did (watched_processes of a cgroup fault whose local target is
        `target`); none for a whole cgroup, or where the target is not here."""
        return [p.ref() for p in self.procs] if isinstance(target, CgroupTarget) else []


def proc_record(hier: Hierarchy, ref: ProcessRef) -> MovedProcess | None:
    """The target with its cgroup and each thread's cgroup before the move; None if it is gone."""
    home = hier.cgroup_of(ref.pid)
    if home is None:
        return None
    tids = [MovedThread(tid=t, from_=str(c)) for t in threads(ref.pid)
            if (c := hier.cgroup_of(ref.pid, t)) is not None]
    return MovedProcess(pid=ref.pid, start_time=ref.start_time, comm=ref.comm, from_=str(home), threads=tids)


def cgroup_target(hier: Hierarchy, refs: list[ProcessRef], selector: str) -> CgroupTarget:
    """The processes a thread-level cgroup fault will move, each with its and its threads' cgroups now (as the
    target keeps them: plain JSON)."""
    procs = (proc_record(hier, r) for r in refs)
    return CgroupTarget(hier.to_json(), selector, tuple(p.to_json() for p in procs if p is not None))


def target_procs(target: CgroupTarget) -> list[MovedProcess]:
    """The target's processes, each as a cgroup record keeps it."""
    return [MovedProcess.model_validate(p) for p in target.procs]


def target_refs(target: CgroupTarget) -> list[ProcessRef]:
    return [p.ref() for p in target_procs(target)]


def move_in(hier: Hierarchy, cg: Path, procs: list[MovedProcess], who: str) -> list[MovedProcess]:
    """Move each recorded process that is still alive into `cg`; the records of those moved, with the threads
    started since `proc_record` added. RuntimeError if none was left to move."""
    moved = []
    for p in procs:
        ref = p.ref()
        if not is_alive(ref):
            continue
        known = {t.tid for t in p.threads}  # threads started since prepare: where they are now
        extra = [MovedThread(tid=t, from_=str(c)) for t in threads(ref.pid)
                 if t not in known and (c := hier.cgroup_of(ref.pid, t)) is not None]
        try:
            hier.move(ref.pid, cg)  # cgroup.procs: every thread of the process at once (v1 and v2)
        except ProcessLookupError:
            continue
        moved.append(p.model_copy(update={"threads": [*p.threads, *extra]}))
    if not moved:
        raise RuntimeError(f"{who}: every target exited before it could be moved")
    return moved


def any_target_inside(cg: Path, procs: list[MovedProcess]) -> bool:
    """Whether a recorded process (that very process: PID + start time) is in `cg` now."""
    inside = set(Hierarchy.procs(cg))
    return any(p.pid in inside and is_alive(p.ref()) for p in procs)


def move_back_and_remove(hier: Hierarchy, cg: Path, procs: list[MovedProcess], who: str, wait_s: float,
                         poll_s: float, by_parent: bool = False,
                         when_empty: Callable[[Path], None] | None = None) -> None:
    """Move what is in `cg` now back where it came from, then rmdir it, retrying for `wait_s` while the kernel
    says busy (calling `when_empty` between tries once no task is left in it). A thread goes back to its own
    cgroup, else to its process's; a process started meanwhile to its parent's (with `by_parent`), else to the
    first target's."""
    by_pid = {p.pid: Path(p.from_) for p in procs}
    by_tid = {(p.pid, t.tid): Path(t.from_) for p in procs for t in p.threads}
    fallback = Path(procs[0].from_) if procs else hier.root
    deadline = time.monotonic() + wait_s
    while True:
        # only what is in our cgroup now is moved: a task someone else moved meanwhile is left alone
        tasks = [(p, p) for p in hier.procs(cg)] if hier.version == 2 else \
            [(thread_group(t), t) for t in hier.tasks(cg)]
        for pid, tid in tasks:
            if pid is None:
                continue
            dest = by_tid.get((pid, tid)) or by_pid.get(pid) or \
                (by_pid.get(parent_pid(pid) or 0) if by_parent else None) or fallback
            try:
                hier.move_task(pid, tid, dest if dest.is_dir() else hier.root)
            except OSError:  # exited meanwhile (ESRCH) or not movable: the rmdir below tells
                pass
        try:
            os.rmdir(cg)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise RuntimeError(f"{who}: cannot remove {cg}: {e.strerror}; tasks still in it: "
                                   f"{hier.tasks(cg)[:10]}") from None
            if when_empty is not None and not hier.tasks(cg):
                when_empty(cg)
            time.sleep(poll_s)
