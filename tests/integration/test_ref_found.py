"""A real deployment started with `chaoskit ref up --dir` somewhere is found from another working directory, with no
--dir and no $CHAOSKIT_REF_DIR: by `ref status`, a dry run of an experiment on `target: {reference: triton}`, and
`ref down` (through the registry in the state directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from chaoskit.reference.deploy import Deployment
from chaoskit.targets.process import group_members
from tests.conftest import requires_triton, write

pytestmark = requires_triton

PORT = 18450
EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: found}
target: {reference: triton}
steadyState:
  probes: [{name: up, type: http, url: "{target.url}/v2/health/ready"}]
method:
  - inject: {type: process.signal, pid: "{target.replica_pid}", signal: SIGSTOP}
    duration: 1s
"""


def test_a_deployment_started_with_dir_is_found_without_it(tmp_path):
    ref, elsewhere = tmp_path / "somewhere" / "ref", tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CHAOSKIT_REF_DIR"}
    env["CHAOSKIT_STATE_DIR"] = str(tmp_path / "state")

    def chaoskit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "chaoskit", *args], env=env, cwd=elsewhere, capture_output=True,
                              text=True, timeout=120)

    try:
        up = chaoskit("ref", "up", "--replicas", "1", "--port", str(PORT), "--dir", str(ref))
        assert up.returncode == 0, up.stderr
        assert f"stop it with `chaoskit ref down --dir {ref}`" in up.stdout
        facts = Deployment(ref).facts()
        assert facts is not None

        st = chaoskit("ref", "status", "--json")
        doc = json.loads(st.stdout)
        assert st.returncode == 0 and doc["dir"] == str(ref) and doc["found_by"] == "the registry", st.stdout
        assert [p["name"] for p in doc["processes"]] == ["triton-0", "gateway"]

        dry = chaoskit("run", "--dry-run", str(write(tmp_path / "found.yaml", EXPERIMENT)))
        assert dry.returncode == 0, dry.stderr
        assert f"send SIGSTOP to PID {facts['replica_pid']} (tritonserver)" in dry.stdout, dry.stdout + dry.stderr

        pids = [p["pid"] for p in Deployment(ref).processes()]
        down = chaoskit("ref", "down")
        assert down.returncode == 0 and "down: 2 process group(s) stopped" in down.stdout, down.stdout + down.stderr
        assert f"the deployment in {ref} (the registry)" in down.stderr
        assert not any(group_members(pid) for pid in pids)

        gone = chaoskit("ref", "status")
        assert gone.returncode == 1 and "no reference deployment found" in gone.stdout
        assert f"the registry of deployments `chaoskit ref up` started ({tmp_path / 'state' / 'references'}): no " \
               "deployment with anything left" in gone.stderr, gone.stderr
        assert not list((tmp_path / "state" / "references").iterdir())
    finally:
        Deployment(ref).down(say=lambda _m: None)
