"""A CI job cancelled the way runners, systemd and Kubernetes do it: every process in the job's cgroups is
killed at once. The watchdog must have left those cgroups, so it survives and reverts what the run applied.
Also: a watchdog killed during the run is replaced, and a run that died together with its watchdog is
replayed by the next chaoskit command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, ledger_ops, ledgers, proc_state, wait_for
from tests.helpers.jobcgroup import enter_job, job_procs, kill_job, make_job_cgroups, remove_job_cgroups
from tests.integration.test_rollback_paths import experiment, wait_applied

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups and move processes")


@pytest.fixture
def job_cgroups() -> Iterator[list[Path]]:
    dirs = make_job_cgroups()
    yield dirs
    remove_job_cgroups(dirs)


def run_in_job(dirs: list[Path], state: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(state)}
    return subprocess.Popen([sys.executable, "-m", "chaoskit", *args], env=env, cwd=ROOT,
                            preexec_fn=lambda: enter_job(dirs),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def watchdog_pid(ledger: Path) -> int:
    return [json.loads(x)["proc"]["pid"] for x in ledger.read_text().splitlines() if json.loads(x)["op"] == "watchdog"][-1]


def test_whole_job_cgroup_kill_is_reverted_by_the_watchdog(tmp_path, state_dir, sleeper, job_cgroups):
    run = run_in_job(job_cgroups, state_dir, "run", str(experiment(tmp_path)), "--var", f"pid={sleeper.pid}",
                     "--out", str(tmp_path / "o"))
    ledger = wait_applied(state_dir)
    assert proc_state(sleeper.pid) == "T"
    wd = watchdog_pid(ledger)
    assert "watching" in ledger_ops(ledger)
    assert run.pid in job_procs(job_cgroups) and wd not in job_procs(job_cgroups)  # it left the job's cgroups
    assert kill_job(job_cgroups) >= 1
    run.wait(timeout=5)
    took = wait_for(lambda: proc_state(sleeper.pid) != "T", timeout=5)
    assert took < 3.0, f"the watchdog took {took:.2f}s"
    wait_for(lambda: ledger_ops(ledger)[-1] == "closed", timeout=3)


def test_without_the_escape_the_job_kill_leaves_the_fault(tmp_path, state_dir, sleeper, job_cgroups):
    """The test above can fail: a watchdog put back into the job's cgroups dies with it and the fault stays."""
    run = run_in_job(job_cgroups, state_dir, "run", str(experiment(tmp_path)), "--var", f"pid={sleeper.pid}",
                     "--out", str(tmp_path / "o"))
    ledger = wait_applied(state_dir)
    run.send_signal(signal.SIGSTOP)  # so it cannot replace the watchdog while we move it
    for d in job_cgroups:
        (d / "cgroup.procs").write_text(str(watchdog_pid(ledger)))
    kill_job(job_cgroups)
    run.wait(timeout=5)
    time.sleep(1.0)
    assert proc_state(sleeper.pid) == "T" and ledger_ops(ledger)[-1] != "closed"
    # the next chaoskit command replays it and says so
    doc = subprocess.run([sys.executable, "-m", "chaoskit", "doctor", "--json"], capture_output=True, text=True,
                         env={**os.environ, "CHAOSKIT_STATE_DIR": str(state_dir)}, cwd=ROOT, timeout=120)
    assert "died together with its watchdog" in doc.stderr and "reverted #1 process.signal" in doc.stderr
    assert proc_state(sleeper.pid) in ("S", "R") and ledger_ops(ledger)[-1] == "closed"


def test_a_killed_watchdog_is_replaced_during_the_run(tmp_path, state_dir, sleeper):
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(state_dir)}
    run = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(experiment(tmp_path)), "--var",
                            f"pid={sleeper.pid}", "--out", str(tmp_path / "o")], env=env, cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ledger = wait_applied(state_dir)
        first = watchdog_pid(ledger)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: watchdog_pid(ledger) != first and ledger_ops(ledger)[-1] == "watching", timeout=5)
        run.kill()  # the replacement reverts
        run.wait()
        wait_for(lambda: proc_state(sleeper.pid) != "T", timeout=3)
        wait_for(lambda: ledger_ops(ledger)[-1] == "closed", timeout=3)
    finally:
        run.kill()
        run.wait()
    events = [json.loads(x) for x in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    assert any(e["event"] == "watchdog_died" and e["pid"] == first for e in events)
    assert ledgers(state_dir)


HUNG = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: hung-run}}
steadyState:
  probes:
    - {{name: probe, type: command, argv: ["true"], phases: [before, after]}}
method:
  - inject: {{type: process.signal, pid: {pid}}}
    duration: 1s
    max_lifetime: 2s
"""


def test_a_hung_run_loses_its_fault_at_its_maximum_lifetime(tmp_path, state_dir, sleeper):
    """The run lives but hangs (here: SIGSTOPped right after the apply): the watchdog reverts the fault at
    max_lifetime although the run is alive, and the run's own rollback later finds nothing left to do."""
    (tmp_path / "hung.yaml").write_text(HUNG.format(pid=sleeper.pid))
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(state_dir)}
    run = subprocess.Popen([sys.executable, "-m", "chaoskit", "run", str(tmp_path / "hung.yaml"), "--out",
                            str(tmp_path / "o")], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        ledger = wait_applied(state_dir)
        run.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        wait_for(lambda: proc_state(sleeper.pid) != "T", timeout=6)
        took = time.monotonic() - t0
        assert proc_state(run.pid) == "T"  # the run is still there, hung
        assert 0.5 < took < 3.5, took
        # the watchdog resumes the target, then records the revert: a read in between saw 'applied' (a clean CI run)
        wait_for(lambda: ledger_ops(ledger)[-1] == "reverted", timeout=2)
        assert ledger_ops(ledger)[-1] == "reverted"
        assert "outlived its maximum lifetime" in Path(str(ledger) + ".watchdog.log").read_text()
        run.send_signal(signal.SIGCONT)
        out, err = run.communicate(timeout=30)
    finally:
        run.kill()
        run.wait()
    assert run.returncode == 0, out + err
    assert not ledgers(state_dir)  # the run's own rollback found it reverted and closed the ledger
