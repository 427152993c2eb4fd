"""A helper pod that holds a fault obeys the cluster's halt lever by itself, with no run left to delete it: a
process.signal SIGSTOP of a sleeper this test started is applied through the k8s-helper executor (no `chaoskit
run`: nothing reverts it but its holder), against FakeKubeApi (a FAKE API server) whose FAKE kubelet
(InClusterKubelet) runs the real `python -m chaoskit.agent` on this host with what a node gives a pod to reach
the API server: KUBERNETES_SERVICE_HOST/PORT (the fake's HTTPS listener) and the pod's projected token and CA.
The agent reads the lever through the kubernetes client's real in-cluster config. Pulled: the sleeper runs again
within LEVER_POLL_S (+ margin) and the holder's log says `halted: ...`. Unreadable (403): the fault is held on,
said once, and obeyed once it can be read again."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from chaoskit.agent import LEVER_POLL_S
from chaoskit.executors.k8s_halt import HALT_CONFIGMAP, HaltLever, pull_lever
from chaoskit.executors.k8s_helper import HelperPlacement, K8sHelperExecutor
from chaoskit.executors.k8s_pods import API_DIR, API_ENV
from chaoskit.injectors.process.fault import ProcessSignal
from chaoskit.targets.kube import ClusterRef, api_client
from tests.conftest import ROOT, proc_state, wait_for
from tests.helpers.fake_kube import FakeKubeApi, InClusterKubelet

# pulled just after one of its reads, the holder sees the lever at its next read, LEVER_POLL_S later; the read
# (one GET from the fake, ms) and the revert (SIGCONT, ms) add little; 1.5 s is room for a loaded 2-core machine
OBEYED_WITHIN_S = LEVER_POLL_S + 1.5
LEVER_PATH = f"/namespaces/chaoskit/configmaps/{HALT_CONFIGMAP}$"

pytestmark = pytest.mark.usefixtures("no_kube_env")


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def api(tmp_path):
    with FakeKubeApi() as api:
        api.kubelet = InClusterKubelet(api, tmp_path / "node")
        (tmp_path / "node").mkdir()
        yield api


def hold_sigstop(api: FakeKubeApi, tmp_path: Path, pid: int) -> tuple[str, client.CoreV1Api]:
    """SIGSTOP `pid` through a helper pod that holds it for 60 s, the way a run's apply does; the holder's name
    and a CoreV1Api of the test's (the operator's kubeconfig)."""
    cluster = ClusterRef(str(api.write_kubeconfig(tmp_path / "kubeconfig")), None)
    hp = HelperPlacement(cluster=cluster.to_json(), node="node-a", run_id="halt-helpers", hold_s=60.0)
    sig = ProcessSignal(ProcessSignal.Spec.model_validate({"type": "process.signal", "pid": pid, "signal": "SIGSTOP"}))
    K8sHelperExecutor().apply(sig, sig.prepare().to_json(), hp.to_json())
    wait_for(lambda: proc_state(pid) == "T", timeout=5)
    (holder,) = [name for (ns, name), pod in api.state.pods.items()
                 if pod["metadata"]["labels"]["chaoskit.io/verb"] == "apply"]
    return holder, client.CoreV1Api(api_client(cluster))


def log(api: FakeKubeApi, holder: str) -> list[dict]:
    return [json.loads(line) for line in api.state.logs.get(("chaoskit", holder), "").splitlines() if line.strip()]


def lever_reads(api: FakeKubeApi) -> list:
    return api.calls("GET", LEVER_PATH)


def obeyed(api: FakeKubeApi, holder: str, pid: int, core: client.CoreV1Api) -> float:
    """Pull the lever; the seconds until `pid` runs again (the holder reverted by itself), after checking its log."""
    pull_lever(core, HaltLever("sre@ops", time.time(), "stop all chaos"))
    took = wait_for(lambda: proc_state(pid) != "T", timeout=OBEYED_WITHIN_S + 5)
    wait_for(lambda: api.state.pods[("chaoskit", holder)]["status"]["phase"] == "Succeeded", timeout=5)
    (last,) = log(api, holder)[-1:]
    assert last["reverted"] is True and last["why"].startswith("halted: in namespace chaoskit by sre@ops at "), last
    assert last["why"].endswith(": stop all chaos"), last
    return took


def test_a_holder_reverts_when_the_lever_is_pulled_with_no_run_left(api, tmp_path, sleeper):
    holder, core = hold_sigstop(api, tmp_path, sleeper.pid)
    pod = api.state.pods[("chaoskit", holder)]
    (c,) = pod["spec"]["containers"]
    assert pod["spec"]["automountServiceAccountToken"] is False  # no automatic token: the projected one, read-only
    assert {"name": "api", "mountPath": API_DIR, "readOnly": True} in c["volumeMounts"]
    assert {"name": API_ENV, "value": API_DIR} in c["env"]
    wait_for(lambda: len(lever_reads(api)) >= 1, timeout=10)  # the holder watches (the run would be gone now)
    took = obeyed(api, holder, sleeper.pid, core)
    print(f"lever pulled -> SIGCONT by the holder in {took:.2f} s (bound {OBEYED_WITHIN_S} s)")
    assert took < OBEYED_WITHIN_S
    # its reads carried its own token, and it asked for nothing but what its Role grants
    (token,) = [t for t, who in api.tokens.items() if who == "chaoskit/chaoskit-helper"]
    mine = [r for r in api.requests if token in r.authorization]
    assert mine and {(r.method, r.path) for r in mine} == {("GET", f"/api/v1/namespaces/chaoskit/configmaps/{HALT_CONFIGMAP}")}
    role = next(d for d in yaml.safe_load_all((ROOT / "deploy/k8s/chaoskit/role.yaml").read_text())
                if d and d["metadata"]["name"] == "chaoskit-helper")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [HALT_CONFIGMAP],
                              "verbs": ["get"]}]
    binding = next(d for d in yaml.safe_load_all((ROOT / "deploy/k8s/chaoskit/rolebinding.yaml").read_text())
                   if d and d["roleRef"]["name"] == "chaoskit-helper")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chaoskit-helper", "namespace": "chaoskit"}]


def test_a_lever_the_holder_cannot_read_does_not_revert_early(api, tmp_path, sleeper):
    api.refuse("GET", LEVER_PATH, 403)  # what a missing Role answers
    holder, core = hold_sigstop(api, tmp_path, sleeper.pid)
    pull_lever(core, HaltLever("sre@ops", time.time(), "ignored while unreadable"))
    wait_for(lambda: len(lever_reads(api)) >= 3, timeout=10)  # the first read, then two more polls
    assert proc_state(sleeper.pid) == "T"  # still held
    lines = log(api, holder)
    assert [list(x) for x in lines] == [["record"], ["lever", "where", "why"]], lines  # said once, not per poll
    assert lines[1] == {"lever": "cannot be read; holding until SIGTERM or the deadline",
                        "where": "in namespace chaoskit", "why": "403 Forbidden"}
    assert api.state.pods[("chaoskit", holder)]["status"]["phase"] == "Running"
    api.refused.clear()  # readable again: obeyed at the next poll
    took = obeyed(api, holder, sleeper.pid, core)
    print(f"lever readable again -> SIGCONT by the holder in {took:.2f} s")
    assert took < OBEYED_WITHIN_S
