"""The k8s-helper executor end to end: FakeKubeApi's kubelet callback runs each helper pod's command (the real
`python -m chaoskit.agent`) on this host, so a real SIGSTOP is applied and reverted through helper pods: rollback
through the ledger, a rollback from the cluster alone after a crash, and cleanup of pods and ConfigMaps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from kubernetes import client

from chaoskit.engine.ledger import Ledger
from chaoskit.engine.rollback import rollback
from chaoskit.executors import get_executor
from chaoskit.executors.k8s_helper import K8sHelperExecutor, replay_cluster
from chaoskit.executors.revert_store import RevertStore
from chaoskit.injectors.process.fault import ProcessSignal
from chaoskit.targets.kube import api_client
from chaoskit.targets.process import proc_ref
from tests.conftest import ROOT, proc_state, wait_for
from tests.helpers.fake_kube import HELPER_RUN as RUN
from tests.helpers.fake_kube import FakeKubeApi, helper_placement, run_pod_here


@pytest.fixture
def api(tmp_path):
    with FakeKubeApi() as fake:
        fake.kubelet = run_pod_here
        fake.write_kubeconfig(tmp_path / "kubeconfig")
        yield fake


@pytest.fixture
def sigstop(sleeper):
    inj = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "pid": sleeper.pid}))
    return inj


def _helper_pods(api: FakeKubeApi) -> list:
    return [k for k in api.state.pods if k[1].startswith("chaoskit-")]


def test_apply_and_rollback_through_the_helper_and_the_ledger(api, cluster, sleeper, sigstop, tmp_path):
    hp = helper_placement(cluster)
    ledger = Ledger.create("helper-run", "x", tmp_path)
    record = sigstop.prepare().to_json()  # the ledger form the executor takes
    entry_id = ledger.intent(sigstop.type, record, sigstop.plan(), executor="k8s-helper", placement=hp.to_json())
    final = get_executor("k8s-helper").apply(sigstop, record, hp.to_json())
    ledger.applied(entry_id, final)
    wait_for(lambda: proc_state(sleeper.pid) == "T")
    stored = RevertStore(client.CoreV1Api(api_client(cluster)), "chaoskit", RUN).get("k1")
    assert stored["state"] == "applied" and stored["record"] == final and stored["type"] == "process.signal"
    assert stored["spec"]["pid"] == sleeper.pid and stored["placement"]["node"] == "node-7"
    assert _helper_pods(api) == []  # the helper is deleted once it answered
    (created,) = api.calls("POST", "/namespaces/chaoskit/pods$")
    assert created.body["spec"]["containers"][0]["command"][3] == "apply"

    result = rollback(ledger)  # the ledger entry names k8s-helper: revert and observe run in helper pods
    assert result.complete, result.failed
    assert proc_state(sleeper.pid) in ("S", "R")
    verbs = [r.body["metadata"]["labels"]["chaoskit.io/verb"] for r in api.calls("POST", "/namespaces/chaoskit/pods$")]
    assert verbs == ["apply", "revert", "observe"]
    assert api.state.configmaps == {} and _helper_pods(api) == [] and ledger.read().closed


def test_after_a_crash_the_cluster_alone_is_enough_to_roll_back(api, cluster, sleeper, sigstop):
    K8sHelperExecutor().apply(sigstop, sigstop.prepare().to_json(), helper_placement(cluster).to_json())
    wait_for(lambda: proc_state(sleeper.pid) == "T")
    # the run's host is gone with its ledger; from "another machine" with a kubeconfig:
    assert [(r.key, r.error) for r in replay_cluster(cluster)] == [("k1", None)]
    assert proc_state(sleeper.pid) in ("S", "R") and api.state.configmaps == {} and _helper_pods(api) == []


def test_agent_cli_reads_stdin_and_answers_one_json_line(sleeper):
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(lambda: proc_state(sleeper.pid) == "T")
    req = {"type": "process.signal", "record": {"signal": "SIGSTOP", "targets": [proc_ref(sleeper.pid).to_json()]}}
    agent = [sys.executable, "-m", "chaoskit.agent"]
    out = subprocess.run([*agent, "observe"], input=json.dumps(req), capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and json.loads(out.stdout)["in_effect"] is True
    out = subprocess.run([*agent, "revert", "--file", "-"], input=json.dumps(req), capture_output=True, text=True,
                         cwd=ROOT)
    assert (out.returncode, out.stdout) == (0, '{"reverted":true}\n')
    assert proc_state(sleeper.pid) in ("S", "R")
    bad = subprocess.run([*agent, "revert"], input='{"record": {}}', capture_output=True, text=True, cwd=ROOT)
    assert (bad.returncode, json.loads(bad.stdout)) == (1, {"error": "ValueError: the request must be a JSON object "
                                                                     "with a 'type'"})


def test_rollback_cluster_command_finishes_the_job_from_another_machine(api, cluster, sleeper, sigstop, tmp_path,
                                                                         state_dir):
    K8sHelperExecutor().apply(sigstop, sigstop.prepare().to_json(), helper_placement(cluster).to_json())
    wait_for(lambda: proc_state(sleeper.pid) == "T")
    cli = [sys.executable, "-m", "chaoskit", "rollback", "--cluster", "--kubeconfig", str(tmp_path / "kubeconfig")]
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(state_dir)}
    done = subprocess.run(cli, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.split()) == (0, ["reverted", "k1"]), done.stdout + done.stderr
    assert proc_state(sleeper.pid) in ("S", "R") and api.state.configmaps == {} and _helper_pods(api) == []
    again = subprocess.run(cli, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to roll back (no revert records in namespace chaoskit)" in again.stdout
    nowhere = subprocess.run(cli[:5], env={**env, "KUBECONFIG": str(tmp_path / "missing")}, cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert nowhere.returncode == 4 and "no kubeconfig found" in nowhere.stderr and "Traceback" not in nowhere.stderr


def test_a_tampered_revert_record_is_refused_and_nothing_runs_on_the_node(api, cluster, sleeper, sigstop, tmp_path,
                                                                          state_dir):
    """One byte of the record changed (the node it names): `rollback --cluster` refuses it with exit 5, naming
    the ConfigMap, creates no helper pod and keeps the ConfigMap; the byte put back, the same command reverts."""
    K8sHelperExecutor().apply(sigstop, sigstop.prepare().to_json(), helper_placement(cluster).to_json())
    wait_for(lambda: proc_state(sleeper.pid) == "T")
    ((_, name), cm), = api.state.configmaps.items()
    genuine = cm["data"]["k1.json"]
    assert genuine.count('"node-7"') == 1 and '"mac": "hmac-sha256:' in genuine
    cm["data"]["k1.json"] = genuine.replace('"node-7"', '"node-8"')  # where a revert would run
    pods_before = len(api.calls("POST", "/pods$"))
    cli = [sys.executable, "-m", "chaoskit", "rollback", "--cluster", "--kubeconfig", str(tmp_path / "kubeconfig")]
    env = {**os.environ, "CHAOSKIT_STATE_DIR": str(state_dir)}
    done = subprocess.run(cli, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    said = " ".join(done.stderr.split())
    assert done.returncode == 5 and done.stdout == "", done.stdout + done.stderr
    assert f"REFUSED revert record chaoskit/{name} key k1.json fails its MAC check" in said, said
    assert "nothing was run on the node" in said and "Traceback" not in said
    assert len(api.calls("POST", "/pods$")) == pods_before and _helper_pods(api) == []  # nothing ran on a node
    assert proc_state(sleeper.pid) == "T" and api.state.configmaps[("chaoskit", name)]["data"]["k1.json"] != genuine
    cm["data"]["k1.json"] = genuine
    done = subprocess.run(cli, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.split()) == (0, ["reverted", "k1"]), done.stdout + done.stderr
    assert proc_state(sleeper.pid) in ("S", "R") and api.state.configmaps == {}
