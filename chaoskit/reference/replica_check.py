"""The after phase's check of a reference deployment: each replica is the very process the run started with,
still alive, and answers the real 1-token request `chaoskit ref status` makes (a replica that died or hangs
after the revert is never called recovered)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from chaoskit.reference.deploy import check_replica
from chaoskit.targets.process import ProcessRef, is_alive, proc_ref


@dataclass(frozen=True)
class Replica:
    name: str
    url: str
    processes: tuple[ProcessRef, ...]  # its server (vLLM: and its EngineCore), as found at the start


class ReplicaCheck:
    """Built from a deployment's facts before the run; called, says what is wrong with its replicas now (with
    target.may_exit, a replica that exited is not wrong: only the live ones must answer)."""

    def __init__(self, facts: dict[str, Any], may_exit: bool = False):
        self.engine = str(facts.get("engine") or "triton")
        self.may_exit = may_exit  # target.may_exit: a replica that exited is expected (only a live one is checked)
        self.replicas = [_replica(r) for r in facts.get("replicas", [])]

    def __call__(self, ended: frozenset[tuple[int, int]] = frozenset()) -> list[str]:
        """`ended`: the processes (pid, start time) the run's own faults ended: their replica is not checked."""
        if not self.replicas:
            return []
        with ThreadPoolExecutor(len(self.replicas)) as pool:  # a hung replica's check takes seconds
            return [p for problems in pool.map(lambda r: self._one(r, ended), self.replicas) for p in problems]

    def _one(self, replica: Replica, ended: frozenset[tuple[int, int]]) -> list[str]:
        dead = [p for p in replica.processes if not is_alive(p)]
        if dead and (self.may_exit or any((p.pid, p.start_time) in ended for p in replica.processes)):
            return []
        if dead:
            return [f"{replica.name}: process not running (PID {p.pid}{' ' + p.comm if p.comm else ''})"
                    for p in dead]
        ready, check = check_replica(replica.url, self.engine)
        return [] if ready else [f"{replica.name}: not ready ({check})"]


def _replica(facts: dict[str, Any]) -> Replica:
    pids = [facts.get("pid"), facts.get("engine_pid")]  # not Triton's stubs: a model reload replaces them (its
    # 1-token requests tell a dead stub: HTTP 400)
    refs = tuple(ref for pid in pids if isinstance(pid, int) and (ref := proc_ref(pid)) is not None)
    return Replica(str(facts.get("name", "?")), str(facts.get("url", "")), refs)
