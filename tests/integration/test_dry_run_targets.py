"""A dry run shows the blast radius the run will have: a fact the deployment cannot have is an error at validate
and --dry-run (exit 2), a fact not known yet plans the step "at run time", and a known one plans what the run
signals (compared with the run's own journal)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaoskit.engine.journal import read_journal
from chaoskit.engine.plan import UNRESOLVED
from chaoskit.model.events import Planned
from tests.conftest import chaoskit, write

M3 = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata:
  name: m3
vars: {big: false}
target:
  reference: REFERENCE
steadyState:
  probes:
    - {name: alive, type: command, argv: ["true"]}
method:
  - name: freeze
    inject:
      type: process.signal
      child_of: "{target.FACT}"
      name: ^sleep$
      signal: SIGSTOP
    duration: 500ms
"""


def experiment(tmp_path: Path, fact: str, reference: str = "triton") -> Path:
    return write(tmp_path / "m3.yaml", M3.replace("REFERENCE", reference).replace("FACT", fact))


@pytest.fixture
def no_ref(tmp_path, monkeypatch) -> Path:
    """No reference deployment running (an empty $CHAOSKIT_REF_DIR)."""
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(tmp_path / "no-ref"))
    return tmp_path / "no-ref"


@pytest.fixture
def parent_of_sleep(tmp_path, monkeypatch):
    """This test's own process tree: a python parent with one `sleep` child, published as a running reference
    deployment's replica 0 (facts.json), so {target.replica_pid} names it."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time\n"
                               "subprocess.Popen(['sleep', '600']); time.sleep(600)"])
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "facts.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "replica_pid": parent.pid,
                                                "replica_pids": [parent.pid]}))
    monkeypatch.setenv("CHAOSKIT_REF_DIR", str(ref))
    try:
        yield parent
    finally:
        for child in _children(parent.pid):
            subprocess.run(["kill", "-CONT", str(child)], check=False)
            subprocess.run(["kill", "-KILL", str(child)], check=False)
        parent.kill()
        parent.wait()


def _children(pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(pid).children()]


def _plan_lines(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("plan for "))
    return [line.strip() for line in lines[start + 1:] if line.startswith("      ")]


@pytest.mark.parametrize("running", [False, True])
def test_a_misspelt_fact_is_refused_at_validate_and_dry_run(tmp_path, state_dir, no_ref, running):
    if running:
        no_ref.mkdir()
        (no_ref / "facts.json").write_text(json.dumps({"url": "http://127.0.0.1:9", "replica_pid": 1}))
    f = experiment(tmp_path, "triton_pid")
    want = f"{f}:15:7: method[0].inject.child_of: unknown substitution {{target.triton_pid}} " \
           "(did you mean {target.replica_pid}?)"
    for args in (["validate", str(f)], ["run", "--dry-run", str(f)]):
        p = chaoskit(*args, state=state_dir)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2, (args, out, err)
        assert want in err and "Traceback" not in err
        assert "descendants of PID" not in out


def test_an_index_past_the_replicas_is_refused(tmp_path, state_dir, no_ref):
    f = experiment(tmp_path, "replica_pids[2]", "{engine: triton, replicas: 2, when: {big: {replicas: 3}}}")
    p = chaoskit("validate", str(f), state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert "unknown substitution {target.replica_pids[2]}: index out of range, the deployment has 2 replicas " \
           "(indices 0..1)" in err
    p = chaoskit("run", "--dry-run", str(f), "--var", "big=true", state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert _plan_lines(out) == [UNRESOLVED]


def test_a_fact_not_known_yet_is_planned_at_run_time_not_with_a_stand_in(tmp_path, state_dir, no_ref):
    p = chaoskit("run", "--dry-run", str(experiment(tmp_path, "replica_pid")), state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert _plan_lines(out) == [UNRESOLVED]


def test_the_dry_run_plans_the_processes_the_run_signals(tmp_path, state_dir, parent_of_sleep):
    f = experiment(tmp_path, "replica_pid")
    p = chaoskit("run", "--dry-run", str(f), state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    dry = _plan_lines(out)
    child = _children(parent_of_sleep.pid)
    assert len(child) == 1 and f"PID {child[0]}" in " ".join(dry), dry
    p = chaoskit("run", str(f), "--journal", str(tmp_path / "j.jsonl"), "--out", str(tmp_path / "run"),
                 state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    planned = [e for e in read_journal(tmp_path / "j.jsonl") if isinstance(e, Planned)]
    assert [line for step in planned[0].steps for line in step.changes] == dry


def test_a_dry_run_of_its_own_deployment_says_where_it_looked_for_a_running_one(tmp_path, state_dir, no_ref):
    """A scenario that brings up its own deployment: with none running, the dry run names every directory it
    looked in (here $CHAOSKIT_REF_DIR), not only that it would start one."""
    exp = experiment(tmp_path, "replica_pid", "{engine: triton, replicas: 1}")
    p = chaoskit("run", str(exp), "--dry-run", state=state_dir)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    assert "would start the reference deployment: triton x1" in out + err
    assert f"none running with these settings in {no_ref}" in out + err, out + err
