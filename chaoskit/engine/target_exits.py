"""Target processes that exit from a fault's apply to the end of the after phase, each journaled once as a
TargetExited event: the processes the fault acted on and the service processes they belong to (their ancestors
in the same process group: tritonserver for a python backend stub, vLLM's API server for its EngineCore). The
run's status is the state machine's alone: the runner is told of each exit."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Literal

from chaoskit.model.events import TargetExited
from chaoskit.targets.process import ProcessRef, is_alive, parent_pid, proc_ref, proc_state, start_ticks

When = Literal["during", "at_revert", "after"]


@dataclass(frozen=True)
class Watched:
    """One watched process of a fault; `service_of`: the acted-on PID whose service (ancestor) it is."""

    ref: ProcessRef
    service_of: int | None = None


@dataclass(frozen=True)
class FaultWatch:
    """What a fault's exits are reported with: its step and type, the stage it is in, its processes still alive."""

    step: str
    type: str
    when: When
    processes: tuple[Watched, ...]


def services_of(refs: list[ProcessRef]) -> list[Watched]:
    """`refs`, then each one's ancestors in its own process group (the server it is part of), each PID once; not
    this process's own ancestors (a shell or CI job that started both the target and chaoskit is no service)."""
    out = [Watched(r) for r in refs]
    seen = {r.pid for r in refs} | _ancestors(os.getpid())
    for r in refs:
        try:
            group = os.getpgid(r.pid)
        except OSError:
            continue
        pid = parent_pid(r.pid)
        while pid is not None and pid > 1 and pid not in seen:
            try:
                if os.getpgid(pid) != group:
                    break
            except OSError:
                break
            ref = proc_ref(pid)
            if ref is None:
                break
            seen.add(pid)
            out.append(Watched(ref, service_of=r.pid))
            pid = parent_pid(pid)
    return out


def _ancestors(pid: int) -> set[int]:
    out = {pid}
    while (pid := parent_pid(pid) or 0) > 1 and pid not in out:
        out.add(pid)
    return out


class ExitWatch:
    """The watched processes of the faults applied so far; `check` reports each one that exited, once."""

    def __init__(self) -> None:
        self._watched: dict[int, FaultWatch] = {}

    def watch(self, fault_id: int, step: str, type_name: str, refs: list[ProcessRef]) -> None:
        """From the apply on: `refs`, the processes the fault acted on (alive when it did; one that is gone by
        now exited during the fault, between its signal, move ... and this call), and their services."""
        if refs:
            self._watched[fault_id] = FaultWatch(step, type_name, "during", tuple(services_of(refs)))

    def stage(self, fault_id: int, when: When) -> None:
        """The fault is being reverted (at_revert), or was (after): exits seen from now on are labelled so."""
        if fault_id in self._watched:
            self._watched[fault_id] = replace(self._watched[fault_id], when=when)

    def check(self, fault_id: int | None = None) -> list[TargetExited]:
        """The watched processes of one fault (or of all) that exited since the last check."""
        ids = [fault_id] if fault_id is not None else list(self._watched)
        return [e for i in ids if i in self._watched for e in self._check_one(i)]

    def _check_one(self, fault_id: int) -> list[TargetExited]:
        w = self._watched[fault_id]
        gone = [p for p in w.processes if not is_alive(p.ref)]
        if not gone:
            return []
        self._watched[fault_id] = replace(w, processes=tuple(p for p in w.processes if p not in gone))
        now = time.time()
        return [TargetExited(id=fault_id, step=w.step, type=w.type, pid=p.ref.pid, comm=p.ref.comm,
                             start_time=p.ref.start_time, zombie=_zombie(p.ref), seen_at=now, when=w.when,
                             service_of=p.service_of) for p in gone]


def _zombie(ref: ProcessRef) -> bool:
    """That very process (not a reuse of its PID) is still listed, as a zombie."""
    return start_ticks(ref.pid) == ref.start_time and proc_state(ref.pid) == "Z"
