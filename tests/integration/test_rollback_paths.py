"""A real process is SIGSTOPped by `chaoskit run` and must be running again, with the ledger closed, after:
(a) normal end, (b) a probe that raises, (c) SIGINT, (d) SIGTERM, (e) SIGKILL of chaoskit (watchdog),
(f) `chaoskit rollback --all` after both chaoskit and its watchdog were killed."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import chaoskit, ledger_ops, ledgers, proc_state, wait_for, write

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: stop-sleeper}}
steadyState:
  probes:
    - name: probe
      type: command
      argv: {argv}
      phases: {phases}
  during: {{every: 200ms}}
  after: {{within: 5s, every: 100ms}}
method:
  - inject: {{type: process.signal, pid: "{{pid}}"}}
    duration: {duration}
"""


def experiment(tmp_path: Path, duration: str = "60s", argv: str = "[\"true\"]",
               phases: str = "[before, during, after]") -> Path:
    return write(tmp_path / "exp.yaml", EXPERIMENT.format(duration=duration, argv=argv, phases=phases))


def wait_applied(state: Path, timeout: float = 15) -> Path:
    wait_for(lambda: any("applied" in ledger_ops(p) for p in ledgers(state)), timeout)
    return ledgers(state)[0]


def assert_reverted(pid: int, ledger: Path) -> None:
    assert proc_state(pid) in ("S", "R"), f"target still in state {proc_state(pid)}"
    # closed by the watchdog or `rollback`: kept as evidence; closed by the run itself: discarded
    assert not ledger.exists() or ledger_ops(ledger)[-1] == "closed"


def test_a_normal_end(tmp_path, state_dir, sleeper):
    run = chaoskit("run", str(experiment(tmp_path, "500ms")), "--var", f"pid={sleeper.pid}",
                   "--out", str(tmp_path / "out"), "--junit", str(tmp_path / "junit.xml"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, out + err
    assert ledgers(state_dir) == []
    assert proc_state(sleeper.pid) == "S"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdict"] == "held" and summary["faults"][0]["reverted_at"] is not None
    assert summary["recovery_s"] is not None
    events = [json.loads(line)["event"] for line in (tmp_path / "out" / "journal.jsonl").read_text().splitlines()]
    assert events[:3] == ["experiment", "host", "run"] and "fault_applied" in events and events[-1] == "end"
    assert "<testsuite" in (tmp_path / "junit.xml").read_text()
    assert (tmp_path / "out" / "report.html").read_text().count("stop-sleeper") >= 1


def test_b_probe_raises(tmp_path, state_dir, sleeper):
    # the during probe runs a program that does not exist: an `error` result, never an engine crash
    exp = experiment(tmp_path, "1s", argv="[/nonexistent/chaoskit-probe]", phases="[during]")
    run = chaoskit("run", str(exp), "--var", f"pid={sleeper.pid}", "--out", str(tmp_path / "out"), state=state_dir)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 1, out + err  # deviated
    assert "FileNotFoundError" in out and "Traceback" not in out + err
    assert proc_state(sleeper.pid) == "S" and ledgers(state_dir) == []


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_cd_interrupted(tmp_path, state_dir, sleeper, sig, code):
    run = chaoskit("run", str(experiment(tmp_path)), "--var", f"pid={sleeper.pid}", "--out", str(tmp_path / "o"),
                   state=state_dir)
    ledger = wait_applied(state_dir)
    assert proc_state(sleeper.pid) == "T"
    t0 = time.monotonic()
    run.send_signal(sig)
    out, err = run.communicate(timeout=30)
    assert run.returncode == code, out + err
    assert time.monotonic() - t0 < 5
    assert_reverted(sleeper.pid, ledger)
    assert "interrupted" in out


def test_e_sigkill_watchdog_reverts(tmp_path, state_dir, sleeper):
    run = chaoskit("run", str(experiment(tmp_path)), "--var", f"pid={sleeper.pid}", "--out", str(tmp_path / "o"),
                   state=state_dir)
    ledger = wait_applied(state_dir)
    assert proc_state(sleeper.pid) == "T"
    run.kill()
    run.wait()
    took = wait_for(lambda: proc_state(sleeper.pid) != "T", timeout=5)
    assert took < 2.0, f"watchdog took {took:.2f}s"
    wait_for(lambda: ledger_ops(ledger)[-1] == "closed", timeout=2)
    assert "rolling back" in Path(str(ledger) + ".watchdog.log").read_text()
    assert_reverted(sleeper.pid, ledger)


def test_f_rollback_command_after_both_killed(tmp_path, state_dir, sleeper):
    run = chaoskit("run", str(experiment(tmp_path)), "--var", f"pid={sleeper.pid}", "--out", str(tmp_path / "o"),
                   state=state_dir)
    ledger = wait_applied(state_dir)
    wd = next(json.loads(line)["proc"]["pid"] for line in ledger.read_text().splitlines()
              if json.loads(line)["op"] == "watchdog")
    run.send_signal(signal.SIGSTOP)  # frozen first, so it cannot replace the watchdog killed next
    os.kill(wd, signal.SIGKILL)
    run.kill()
    run.wait()
    time.sleep(0.5)
    assert proc_state(sleeper.pid) == "T", "nothing should have reverted yet"
    # from another directory, as after a reboot: the state dir is well known
    rb = chaoskit("rollback", "--all", state=state_dir, cwd="/")
    out, err = rb.communicate(timeout=30)
    assert rb.returncode == 0, out + err
    assert "reverted #1 process.signal" in out
    assert_reverted(sleeper.pid, ledger)
    rb2 = chaoskit("rollback", "--all", state=state_dir)
    assert "nothing to roll back" in rb2.communicate(timeout=30)[0]


def test_rollback_skips_a_live_run(tmp_path, state_dir, sleeper):
    run = chaoskit("run", str(experiment(tmp_path)), "--var", f"pid={sleeper.pid}", "--out", str(tmp_path / "o"),
                   state=state_dir)
    try:
        wait_applied(state_dir)
        rb = chaoskit("rollback", "--all", state=state_dir)
        out, _ = rb.communicate(timeout=30)
        assert "still running" in out and proc_state(sleeper.pid) == "T"
    finally:
        run.send_signal(signal.SIGINT)
        run.communicate(timeout=30)
    assert proc_state(sleeper.pid) in ("S", "R")


def test_dry_run_changes_nothing(tmp_path, state_dir, sleeper):
    run = chaoskit("run", str(experiment(tmp_path, "1s")), "--var", f"pid={sleeper.pid}", "--dry-run",
                   "--out", str(tmp_path / "o"), state=state_dir)
    out, err = run.communicate(timeout=30)
    assert run.returncode == 0, out + err
    assert f"send SIGSTOP to PID {sleeper.pid}" in out
    assert proc_state(sleeper.pid) == "S" and ledgers(state_dir) == [] and not (tmp_path / "o").exists()
