"""Target processes that exit while their fault is in effect, each journaled once as a TargetExited event (news
for the journal, the live view and the report; the run's status is the state machine's alone)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from chaoskit.model.events import TargetExited
from chaoskit.targets.process import ProcessRef, is_alive, proc_state, start_ticks


@dataclass(frozen=True)
class Watched:
    """What a fault's exits are reported with: its step and type, and its target processes still alive."""

    step: str
    type: str
    processes: tuple[ProcessRef, ...]


class ExitWatch:
    """The target processes of the faults in effect; `check` reports each one that exited, once."""

    def __init__(self) -> None:
        self._watched: dict[int, Watched] = {}

    def watch(self, fault_id: int, step: str, type_name: str, refs: list[ProcessRef]) -> None:
        """From the apply on: `refs`, the processes the fault acted on (alive when it did; one that is gone by
        now exited during the fault, between its signal, move ... and this call)."""
        if refs:
            self._watched[fault_id] = Watched(step, type_name, tuple(refs))

    def check(self, fault_id: int | None = None) -> list[TargetExited]:
        """The watched processes of one fault (or of all) that exited since the last check."""
        ids = [fault_id] if fault_id is not None else list(self._watched)
        return [e for i in ids if i in self._watched for e in self._check_one(i)]

    def stop(self, fault_id: int) -> list[TargetExited]:
        """The fault is about to be reverted: a last check, then it is no longer watched."""
        exits = self.check(fault_id)
        self._watched.pop(fault_id, None)
        return exits

    def _check_one(self, fault_id: int) -> list[TargetExited]:
        w = self._watched[fault_id]
        gone = [r for r in w.processes if not is_alive(r)]
        if not gone:
            return []
        self._watched[fault_id] = Watched(w.step, w.type, tuple(r for r in w.processes if r not in gone))
        now = time.time()
        return [TargetExited(id=fault_id, step=w.step, type=w.type, pid=r.pid, comm=r.comm, start_time=r.start_time,
                             zombie=_zombie(r), seen_at=now) for r in gone]


def _zombie(ref: ProcessRef) -> bool:
    """That very process (not a reuse of its PID) is still listed, as a zombie."""
    return start_ticks(ref.pid) == ref.start_time and proc_state(ref.pid) == "Z"
