"""Target processes that exit while their fault is in effect, each journaled once as `target_exited` (news for
the journal, the live view and the report; the run's status is the state machine's alone)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from chaoskit.targets.process import ProcessRef, is_alive, proc_state, start_ticks

EVENT = "target_exited"


@dataclass(frozen=True)
class TargetExit:
    """One target process of fault `fault_id` seen gone (or a zombie: exited, not yet reaped by its parent)
    between the fault's apply and its revert."""

    fault_id: int
    step: str
    type: str
    pid: int
    comm: str
    start_time: int
    zombie: bool
    seen_at: float  # wall clock when the run saw it gone

    def text(self) -> str:
        """`PID 29566 triton_python_backend_stub exited during the fault` (+ why it is still listed)."""
        name = f" {self.comm}" if self.comm else ""
        return f"PID {self.pid}{name} exited during the fault" + (
            " (a zombie: its parent has not reaped it)" if self.zombie else "")

    def to_event(self) -> dict[str, Any]:
        """The journal event's fields (Journal.emit(EVENT, **fields))."""
        return {"id": self.fault_id, "step": self.step, "type": self.type, "pid": self.pid, "comm": self.comm,
                "start_time": self.start_time, "zombie": self.zombie, "seen_at": self.seen_at, "text": self.text()}

    @classmethod
    def from_event(cls, ev: dict[str, Any]) -> TargetExit:
        return cls(int(ev["id"]), str(ev.get("step", "")), str(ev.get("type", "")), int(ev["pid"]),
                   str(ev.get("comm", "")), int(ev.get("start_time", 0)), bool(ev.get("zombie", False)),
                   float(ev.get("seen_at", ev.get("t", 0.0))))


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

    def check(self, fault_id: int | None = None) -> list[TargetExit]:
        """The watched processes of one fault (or of all) that exited since the last check."""
        ids = [fault_id] if fault_id is not None else list(self._watched)
        return [e for i in ids if i in self._watched for e in self._check_one(i)]

    def stop(self, fault_id: int) -> list[TargetExit]:
        """The fault is about to be reverted: a last check, then it is no longer watched."""
        exits = self.check(fault_id)
        self._watched.pop(fault_id, None)
        return exits

    def _check_one(self, fault_id: int) -> list[TargetExit]:
        w = self._watched[fault_id]
        gone = [r for r in w.processes if not is_alive(r)]
        if not gone:
            return []
        self._watched[fault_id] = Watched(w.step, w.type, tuple(r for r in w.processes if r not in gone))
        now = time.time()
        return [TargetExit(fault_id, w.step, w.type, r.pid, r.comm, r.start_time, _zombie(r), now) for r in gone]


def _zombie(ref: ProcessRef) -> bool:
    """That very process (not a reuse of its PID) is still listed, as a zombie."""
    return start_ticks(ref.pid) == ref.start_time and proc_state(ref.pid) == "Z"
