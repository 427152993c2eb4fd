"""A probe of the during phase that judged no sample while its fault was in effect cannot let the run hold: a
`sleep 2.5` probe whose one sample is still out when a 1.5 s SIGSTOP of a sleeper ends (it is dropped) makes the
run deviate naming it, though another probe judged the fault; with a 4 s fault its sample ends in time and the
run holds."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import chaoskit, write

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: slow-probe}}
steadyState:
  probes:
    - {{name: fast, type: command, argv: ["true"]}}
    - {{name: slow, type: command, argv: ["sleep", "2.5"], timeout: 5s, phases: [during]}}
  during: {{every: 0.5s}}
method:
  - name: freeze
    inject: {{type: process.signal, pid: {pid}, signal: SIGSTOP}}
    duration: {duration}
"""
SILENT = "these probes of the during phase judged no sample while a fault was in effect, so the run cannot hold: slow"


@pytest.mark.parametrize("duration, expected", [("1.5s", 1), ("4s", 0)])
def test_a_probe_that_judged_nothing_of_the_fault_lets_the_run_hold_only_once_it_has(tmp_path, state_dir,
                                                                                       duration, expected):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        exp = write(tmp_path / "e.yaml", EXPERIMENT.format(pid=sleeper.pid, duration=duration))
        p = chaoskit("run", str(exp), "--out", str(tmp_path / "o"), "--plain", state=state_dir)
        out, err = p.communicate(timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert p.returncode == expected, out + err
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    judged = {s["probe"] for s in summary["samples"] if s["phase"] == "during"}
    assert judged == ({"fast"} if expected else {"fast", "slow"}), summary["samples"]
    assert [d.split(" (")[0] for d in summary["deviations"]] == ([SILENT] if expected else [])
