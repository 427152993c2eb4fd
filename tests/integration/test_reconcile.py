"""Reconcile: after every revert the fault is observed again; one still in effect is a revert failure."""

from __future__ import annotations

import os
import signal

import pytest

from chaoskit.engine.ledger import Ledger
from chaoskit.engine.rollback import revert_entry, rollback
from chaoskit.injectors.process.fault import ProcessSignal
from chaoskit.targets.process import proc_ref
from tests.conftest import proc_state, wait_for


def _stopped_entry(tmp_path, sleeper):
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(sleeper.pid) == "T")
    ledger = Ledger.create("reconcile", "x", tmp_path)
    record = {"signal": "SIGSTOP", "targets": [proc_ref(sleeper.pid).to_json()]}
    entry_id = ledger.intent("process.signal", record, ["stop"])
    ledger.applied(entry_id, record)
    return ledger, ledger.read().entries[entry_id]


def test_a_revert_that_leaves_the_fault_is_a_failure(tmp_path, sleeper, monkeypatch: pytest.MonkeyPatch):
    ledger, entry = _stopped_entry(tmp_path, sleeper)
    monkeypatch.setattr(ProcessSignal, "revert", classmethod(lambda cls, record: None))  # "succeeds", does nothing
    error = revert_entry(ledger, entry, retries=2)
    assert error == "RuntimeError: still in effect after revert (observe() sees it)"
    st = ledger.read()
    assert not st.entries[entry.id].reverted and len(st.entries[entry.id].failures) == 2
    monkeypatch.undo()
    result = rollback(ledger)  # the real revert: observed gone, ledger closed
    assert result.complete and proc_state(sleeper.pid) in ("S", "R") and ledger.read().closed


LATE = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: late-apply}}
steadyState:
  probes:
    - {{name: probe, type: command, argv: ["true"], phases: [before]}}
method:
  - inject: {{type: process.signal, pid: {pid}}}
    duration: 5s
    timeout: 300ms
"""


def test_an_apply_that_lands_after_the_rollback_is_reverted(tmp_path, sleeper, state_dir,
                                                             monkeypatch: pytest.MonkeyPatch):
    """A stuck apply (a netlink call that hangs, say) outlives its timeout and the grace, the rollback runs,
    then the apply lands: the run must wait for it and revert it, not leave the process stopped."""
    import asyncio
    import time

    from chaoskit.engine import faults as faults_mod
    from chaoskit.engine import runner as runner_mod
    from chaoskit.engine.journal import Journal, read_journal
    from chaoskit.experiment.loader import load_experiment

    real_apply = ProcessSignal.apply

    def stuck_apply(self, record):
        time.sleep(1.5)  # lands after timeout (0.3 s) + grace (0.5 s) + the rollback
        return real_apply(self, record)

    monkeypatch.setattr(ProcessSignal, "apply", stuck_apply)
    monkeypatch.setattr(faults_mod, "APPLY_GRACE_S", 0.5)
    (tmp_path / "late.yaml").write_text(LATE.format(pid=sleeper.pid))
    exp = load_experiment(tmp_path / "late.yaml").experiment
    journal = Journal(tmp_path / "journal.jsonl")
    run = runner_mod.Runner(exp, journal, runner_mod.RunOptions(use_watchdog=False))
    result = asyncio.run(run.execute())
    events = [e.event for e in read_journal(tmp_path / "journal.jsonl")]
    assert "late_apply_wait" in events and "late_apply_reverted" in events
    assert proc_state(sleeper.pid) in ("S", "R")  # stopped late, resumed by the late revert
    assert not result.status.rollback_incomplete


def test_a_ledger_lock_nobody_releases_fails_loudly_instead_of_hanging(tmp_path, sleeper,
                                                                      monkeypatch: pytest.MonkeyPatch):
    import fcntl
    import time

    from chaoskit.engine import ledger as ledger_mod

    ledger, entry = _stopped_entry(tmp_path, sleeper)
    monkeypatch.setattr(ledger_mod, "LOCK_TIMEOUT_S", 0.5)
    fd = os.open(str(ledger.path) + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a revert stuck elsewhere holds the lock
    try:
        t0 = time.monotonic()
        result = rollback(ledger)
        took = time.monotonic() - t0
    finally:
        os.close(fd)
    assert 0.4 < took < 3 and [e.id for e, _ in result.failed] == [entry.id]
    assert "held the ledger lock for 0.5s" in result.failed[0][1] and not ledger.read().closed
    assert rollback(ledger).complete and proc_state(sleeper.pid) in ("S", "R")


GUARD = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: slow-guard}}
steadyState:
  probes:
    - {{name: alive, type: command, argv: ["true"], phases: [before]}}
method:
  - inject: {{type: process.signal, pid: {pid}}}
    duration: 20s
safeguards:
  - probe: {{name: slow, type: command, argv: ["sleep", "3"], timeout: 5s}}
    abort_when: "duration_ms > 300"
    every: 200ms
"""


def test_a_latency_safeguard_trips_when_its_threshold_passes_not_when_the_probe_returns(tmp_path, state_dir,
                                                                                        sleeper):
    import json

    from tests.conftest import chaoskit

    (tmp_path / "g.yaml").write_text(GUARD.format(pid=sleeper.pid))
    run = chaoskit("run", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "o"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 3, out + err  # aborted by the safeguard
    events = [json.loads(x) for x in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    method = next(e["t"] for e in events if e["event"] == "state" and e["state"] == "method")
    guard = next(e for e in events if e["event"] == "safeguard")
    assert "no answer after 300 ms" in guard["reason"]
    assert guard["t"] - method < 1.5, guard["t"] - method  # was 3 s: the probe's own return
    assert proc_state(sleeper.pid) in ("S", "R")
