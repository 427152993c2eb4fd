"""A fault's target that exits while the fault is in effect is reported (journal, plain view, report, summary),
once; the run deviates for it unless the experiment declares target.may_exit: a real `chaoskit run` SIGSTOPs the two `sleep` children of a parent this test
started (child_of + name, like a Triton replica's python stubs) and the test kills one of them mid-fault; the
parent does not reap it, so it stays a zombie, as a stub Triton killed does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from chaoskit.engine.journal import read_journal
from chaoskit.model.events import FaultReverted, TargetExited
from tests.conftest import chaoskit, proc_state, wait_for

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: stop-two-sleeps}
target: {may_exit: MAY_EXIT}
steadyState:
  probes:
    - {name: probe, type: command, argv: ["true"], phases: [before, after]}
  after: {within: 5s, every: 100ms}
method:
  - name: stop-sleeps
    inject: {type: process.signal, child_of: "{var.parent}", name: "^sleep$"}
    duration: 3s
"""
# a parent that starts two sleeps and never waits for them (a killed one stays a zombie until the parent dies)
PARENT = "import subprocess, time; [subprocess.Popen(['sleep', '600']) for _ in range(2)]; time.sleep(600)"


@pytest.fixture
def parent() -> Iterator[tuple[subprocess.Popen, list[int]]]:
    """This test's own parent process and its two sleep children; all of them killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT])
    kids: list[int] = []
    try:
        wait_for(lambda: len(psutil.Process(proc.pid).children()) == 2, timeout=10)
        kids = sorted(c.pid for c in psutil.Process(proc.pid).children())
        yield proc, kids
    finally:
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("may_exit", [True, False])
def test_a_target_killed_during_the_fault_is_reported_once(tmp_path: Path, state_dir: Path, parent,
                                                           may_exit: bool) -> None:
    proc, (victim, survivor) = parent
    (tmp_path / "exp.yaml").write_text(EXPERIMENT.replace("MAY_EXIT", str(may_exit).lower()))
    out_dir = tmp_path / "out"
    run = chaoskit("run", str(tmp_path / "exp.yaml"), "--var", f"parent={proc.pid}", "--out", str(out_dir),
                   "--ci", state=state_dir)
    try:
        wait_for(lambda: proc_state(victim) == "T" and proc_state(survivor) == "T", timeout=30)
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)  # this test's own sleep
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == (0 if may_exit else 1), out + err  # declared: information; not declared: deviated
    assert proc_state(victim) == "Z" and proc_state(survivor) == "S"  # the survivor was resumed
    events = read_journal(out_dir / "journal.jsonl")
    exits = [e for e in events if isinstance(e, TargetExited)]
    assert [(e.id, e.pid, e.comm, e.zombie, e.expected) for e in exits] == [(1, victim, "sleep", True, may_exit)], \
        exits  # the parent, the sleeps' service, is watched too, but alive
    text = f"PID {victim} sleep exited during the fault"
    assert exits[0].text.startswith(text) and exits[0].step == "stop-sleeps"
    reverted = next(e.t for e in events if isinstance(e, FaultReverted))
    # seen while the fault was in effect (the run checks every 0.5 s), not only at its end: the kill comes right
    # after the stop, so a run that looked only at revert time would report it ~3 s later, at the revert. No bound
    # from the kill itself: with the unit tests running beside this one, 1.5 s after the kill was missed once.
    assert killed_at <= exits[0].t < reverted - 1.0, (killed_at, reverted, exits)
    assert f"fault #1 process.signal (stop-sleeps): {text}" in out  # the plain view (--ci)
    summary = json.loads((out_dir / "summary.json").read_text())
    if may_exit:
        assert summary["verdict"] == "held" and summary["deviations"] == [] and summary["recovery_s"] is not None
    else:
        assert summary["verdict"] == "deviated" and summary["recovery_s"] is None
        assert summary["deviations"][0].startswith(f"stop-sleeps: {text}"), summary["deviations"]
    assert [e["pid"] for e in summary["faults"][0]["exited"]] == [victim]
    html = (out_dir / "report.html").read_text()
    assert f"<td class='exits'><b>{text}" in html  # the fault's row
    assert f"<td>target_exited</td><td>fault #1 stop-sleeps (process.signal): {text}" in html  # the events table
    assert f"- fault #1 stop-sleeps: {text}" in (out_dir / "summary.md").read_text()
