"""The faults of one `parallel` block that revert independently are reverted at once; everything else is
still undone one at a time, newest first."""

from __future__ import annotations

import subprocess
import threading

from chaoskit.engine import rollback as rollback_mod
from chaoskit.engine.ledger import Entry, Ledger
from chaoskit.engine.rollback import batches, rollback
from chaoskit.injectors.process.fault import ProcessSignal
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
    together = threading.Barrier(len(procs), timeout=10)  # passes only when all four reverts are in flight at once
    real = rollback_mod.revert_unmarked

    def spy(ledger, entry, retries=rollback_mod.RETRIES):
        threads.add(threading.current_thread().name)
        together.wait()
        return real(ledger, entry, retries)

    monkeypatch.setattr(rollback_mod, "revert_unmarked", spy)
    try:
        ledger = Ledger.create("batch", "x", tmp_path)
        for p in procs:
            inj = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "pid": p.pid}))
            record = inj.prepare()
            entry_id = ledger.intent(inj.type, record.to_json(), inj.plan(), group="parallel-1")
            ledger.applied(entry_id, inj.apply(record).to_json())
        for p in procs:
            wait_for(lambda p=p: proc_state(p.pid) == "T")
        assert [e.group for e in ledger.read().entries.values()] == ["parallel-1"] * 4
        result = rollback(ledger)
        assert result.complete and len(result.reverted) == 4 and ledger.read().closed
        assert all(proc_state(p.pid) in ("S", "R") for p in procs)
        assert len(threads) == 4 and threading.main_thread().name not in threads  # in a pool, not one by one
    finally:
        for p in procs:
            p.kill()
            p.wait()


class _Flaky:
    """A fake executor: entry 2 never reverts; the others revert and are then observed gone."""

    def __init__(self, marks_seen: list[set[int]], ledger: Ledger):
        self.marks_seen, self.ledger = marks_seen, ledger

    def revert(self, type_name, record, placement):
        self.marks_seen.append({e.id for e in self.ledger.read().entries.values() if e.reverted})
        if record["n"] == 2:
            raise RuntimeError("stuck")

    def observe(self, type_name, record, placement):
        return False


def test_a_batch_marks_only_what_it_reverted_in_one_write(tmp_path, monkeypatch):
    ledger = Ledger.create("marks", "x", tmp_path)
    for n in range(1, 5):
        ledger.applied(ledger.intent("process.signal", {"n": n}, [], group="parallel-1"), {"n": n})
    seen: list[set[int]] = []
    monkeypatch.setattr(rollback_mod, "get_executor", lambda name: _Flaky(seen, ledger))
    monkeypatch.setattr(rollback_mod, "RETRY_DELAY_S", 0.0)
    appends, real = [], Ledger._append
    monkeypatch.setattr(Ledger, "_append", lambda self, *objs: appends.append(objs) or real(self, *objs))
    result = rollback(ledger)
    assert not result.complete and [e.id for e, _ in result.failed] == [2]
    assert all(not marks for marks in seen)  # nothing is marked while the batch still runs
    state = ledger.read()
    assert [e.id for e in state.pending()] == [2] and not state.closed and len(state.entries[2].failures) == 3
    assert [sorted(o["id"] for o in objs) for objs in appends if objs[0]["op"] == "reverted"] == [[1, 3, 4]]


def test_a_torn_batch_of_marks_leaves_the_rest_pending(tmp_path):
    ledger = Ledger.create("torn", "x", tmp_path)
    ids = [ledger.intent("process.signal", {}, [], group="g") for _ in range(3)]
    ledger.reverted_many(ids)
    text = ledger.path.read_text()
    ledger.path.write_text(text[:-10])  # a crash in the middle of the last mark
    assert [e.id for e in ledger.read().pending()] == [ids[-1]]
