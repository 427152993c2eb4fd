"""A replica that dies after the revert is never called recovered: SIGSTOP one of Triton's python backend stubs
under load; on SIGCONT the real tritonserver aborts (boost::interprocess::lock_exception) after the revert. The
run deviates naming the dead replica (its stub and its server, watched through the after phase, and the after
phase's replica check), unless the experiment declares target.may_exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaoskit.reference.deploy import Deployment, RefOptions
from tests.conftest import chaoskit, requires_triton, write

pytestmark = requires_triton

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: stop-a-stub}}
target: {{reference: triton, may_exit: {may_exit}}}
steadyState:
  probes:
    - name: load
      type: slo
      load: {{url: "{{target.url}}", api: triton, model: tiny_lm, rate: 10, duration: 1s, timeout: 1s}}
      expect: {{error_rate: "< {during_errors}"}}
  during: {{every: 1s}}
  after: {{within: 10s, every: 500ms}}
method:
  - name: stop-stub
    inject: {{type: process.signal, pid: "{{target.replicas[0].model_pids[0]}}", signal: SIGSTOP}}
    duration: 4s
"""


@pytest.fixture
def deployment(tmp_path):
    d = Deployment(tmp_path / "ref")
    facts = d.up(RefOptions(), say=lambda _m: None)
    yield d, facts
    d.down(say=lambda _m: None)


def _run(tmp_path: Path, state_dir: Path, root: Path, may_exit: bool, during_errors: float) -> tuple[int, str]:
    exp = write(tmp_path / "e.yaml", EXPERIMENT.format(may_exit=str(may_exit).lower(), during_errors=during_errors))
    p = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), state=state_dir, env={"CHAOSKIT_REF_DIR": str(root)})
    out, err = p.communicate(timeout=120)
    return p.returncode, out + err


def _events(tmp_path: Path, name: str) -> list[dict]:
    lines = (tmp_path / "o" / "journal.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_a_replica_that_dies_after_the_revert_is_never_called_recovered(deployment, tmp_path, state_dir):
    d, facts = deployment
    replica = facts["replicas"][0]
    code, out = _run(tmp_path, state_dir, d.root, may_exit=False, during_errors=1.01)
    assert code == 1, out
    assert "recovered" not in out.replace("not recovered", ""), out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["verdict"] == "deviated" and summary["recovery_s"] is None
    exits = {e["pid"]: e for e in _events(tmp_path, "target_exited")}
    assert replica["pid"] in exits, out  # tritonserver itself, the stub's service
    assert exits[replica["pid"]]["service_of"] == replica["model_pids"][0]
    assert exits[replica["pid"]]["when"] in ("at_revert", "after") and not exits[replica["pid"]]["expected"]
    assert any(f"PID {replica['pid']} tritonserver" in d for d in summary["deviations"]), summary["deviations"]
    checked = _events(tmp_path, "service_checked")
    assert checked and any(p.startswith(f"{replica['name']}: process not running") for p in checked[-1]["problems"])
    status = {p["name"]: p for p in d.status()["processes"]}  # what `chaoskit ref status` shows
    assert not status[replica["name"]]["alive"]


def test_a_declared_may_exit_journals_the_death_without_deviating(deployment, tmp_path, state_dir):
    d, facts = deployment
    code, out = _run(tmp_path, state_dir, d.root, may_exit=True, during_errors=1.01)
    assert code == 0, out
    exits = _events(tmp_path, "target_exited")
    assert facts["replicas"][0]["pid"] in {e["pid"] for e in exits} and all(e["expected"] for e in exits), out
    assert "exited" in out and "recovered" in out
