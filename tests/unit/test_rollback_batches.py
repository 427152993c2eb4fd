"""The faults of one `parallel` block that revert independently are reverted at once; everything else is
still undone one at a time, newest first."""

from __future__ import annotations

import subprocess
import threading

from chaoskit.engine import rollback as rollback_mod
from chaoskit.engine.ledger import Entry, Ledger
from chaoskit.engine.rollback import batches, rollback
from chaoskit.injectors.process import ProcessSignal
from tests.conftest import proc_state, wait_for


def _e(n: int, type_: str, group: str | None) -> Entry:
    return Entry(n, type_, {}, group=group)


def test_batches_join_only_independent_faults_of_one_block():
    pending = [_e(9, "network.proxy", "parallel-2"), _e(8, "network.partition", "parallel-2"),
               _e(7, "process.cpu_throttle", "parallel-2"),  # stacks (cgroup moves): alone
               _e(6, "process.signal", "parallel-2"), _e(5, "process.signal", "parallel-1"),
               _e(4, "process.signal", "parallel-1"), _e(3, "process.signal", None), _e(2, "process.signal", None),
               _e(1, "no.such.type", "parallel-1")]
    assert [[e.id for e in b] for b in batches(pending)] == [[9, 8], [7], [6], [5, 4], [3], [2], [1]]


def test_a_parallel_blocks_sigstops_are_reverted_at_once_for_real(tmp_path, monkeypatch):
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(4)]
    threads: set[str] = set()
    real = rollback_mod.revert_entry

    def spy(ledger, entry, retries=rollback_mod.RETRIES):
        threads.add(threading.current_thread().name)
        return real(ledger, entry, retries)

    monkeypatch.setattr(rollback_mod, "revert_entry", spy)
    try:
        ledger = Ledger.create("batch", "x", tmp_path)
        for p in procs:
            inj = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "pid": p.pid}))
            record = inj.prepare()
            entry_id = ledger.intent(inj.type, record, inj.plan(), group="parallel-1")
            ledger.applied(entry_id, inj.apply(record))
        for p in procs:
            wait_for(lambda p=p: proc_state(p.pid) == "T")
        assert [e.group for e in ledger.read().entries.values()] == ["parallel-1"] * 4
        result = rollback(ledger)
        assert result.complete and len(result.reverted) == 4 and ledger.read().closed
        assert all(proc_state(p.pid) in ("S", "R") for p in procs)
        assert len(threads) > 1 and threading.main_thread().name not in threads  # in a pool, not one by one
    finally:
        for p in procs:
            p.kill()
            p.wait()
