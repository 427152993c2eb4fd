"""The after phase's check of a reference deployment: each replica is the very process the run started with,
still alive, and answers the real 1-token request `chaoskit ref status` makes (a replica that died or hangs
after the revert is never called recovered)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from chaoskit.reference.deploy import check_replica
from chaoskit.targets.process import ProcessRef, is_alive, proc_ref

EXIT_GRACE_S = 0.3  # after a failed check: how long a replica whose process is exiting may take to be gone


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
        dead = _dead(replica)
        if not dead:
            ready, check = check_replica(replica.url, self.engine)
            if ready:
                return []
            dead = _dead(replica, EXIT_GRACE_S)  # a check that ran while the process died (its connection
            # closed as it exited): the exit is what went wrong
            if not dead:
                return [f"{replica.name}: not ready ({check})"]
        if self.may_exit or any((p.pid, p.start_time) in ended for p in replica.processes):
            return []
        return [f"{replica.name}: process not running (PID {p.pid}{' ' + p.comm if p.comm else ''})" for p in dead]


def _dead(replica: Replica, within: float = 0.0) -> list[ProcessRef]:
    """The replica's processes that are gone, waiting up to `within` seconds for one to go."""
    deadline = time.monotonic() + within
    while True:
        dead = [p for p in replica.processes if not is_alive(p)]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.02)


def _replica(facts: dict[str, Any]) -> Replica:
    pids = [facts.get("pid"), facts.get("engine_pid")]  # not Triton's stubs: a model reload replaces them (its
    # 1-token requests tell a dead stub: HTTP 400)
    refs = tuple(ref for pid in pids if isinstance(pid, int) and (ref := proc_ref(pid)) is not None)
    return Replica(str(facts.get("name", "?")), str(facts.get("url", "")), refs)
