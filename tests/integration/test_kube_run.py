"""`chaoskit run` of Kubernetes experiments: without a kubeconfig preflight fails (exit 4, the reason, nothing
applied); with one pointing at FakeKubeApi the real CLI kills a pod, scales a deployment, records the chosen
pods in the ledger and the journal, and restores the replica count."""

from __future__ import annotations

import json

import pytest

from tests.conftest import chaoskit, ledgers, write
from tests.helpers.fake_kube import FakeKubeApi

EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: kube-pod-kill}
steadyState:
  probes:
    - name: web-ready
      type: kube.pods
      target: {kubernetes: {namespace: prod, selector: {app: web}}}
      expect: {ready: ">= 2"}
  during: {every: 0.5s}
  after: {within: 5s}
method:
  - inject:
      type: deployment.scale
      target: {kubernetes: {namespace: prod, deployment: web}}
      replicas: 1
    duration: 1s
  - inject:
      type: pod.kill
      target: {kubernetes: {namespace: prod, selector: {app: web}, mode: one, seed: 7}}
    duration: 1s
"""


pytestmark = pytest.mark.usefixtures("no_kube_env")  # the CLI runs with this process's environment


def test_a_kube_experiment_without_kubeconfig_fails_preflight_with_exit_4(tmp_path, state_dir):
    exp = write(tmp_path / "kube.yaml", EXPERIMENT)
    p = chaoskit("run", str(exp), "--plain", "--out", str(tmp_path / "out"), state=state_dir)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 4, (out, err)
    text = out + err
    for who in ("probe web-ready (kube.pods)", "deployment.scale", "pod.kill"):
        assert f"{who}: kubernetes: no kubeconfig found ($KUBECONFIG (unset), {tmp_path}/home/.kube/config) and " \
               "not running in a pod" in text.replace("\n", " "), text
    assert "failed (exit 4)" in text
    assert ledgers(state_dir) == []  # nothing applied, nothing ledgered


@pytest.fixture
def fake():
    with FakeKubeApi() as api:
        for i in range(3):
            api.add_pod("prod", f"web-{i}", {"app": "web"}, node=f"node-{i}")
        api.add_deployment("prod", "web", 3)
        api.recreate_deleted = True  # the ReplicaSet replaces a killed pod
        yield api


def test_a_kube_experiment_runs_against_the_fake_api_and_reverts(tmp_path, state_dir, fake, monkeypatch):
    exp = write(tmp_path / "kube.yaml", EXPERIMENT)
    monkeypatch.setenv("KUBECONFIG", str(fake.write_kubeconfig(tmp_path / "kubeconfig")))
    out_dir = tmp_path / "out"
    p = chaoskit("run", str(exp), "--plain", "--out", str(out_dir), state=state_dir)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, (out, err)
    assert fake.replicas("prod", "web") == 3  # restored
    scale_patches = [r.body for r in fake.calls("PATCH", "/deployments/web/scale$")]
    assert scale_patches == [{"spec": {"replicas": 1}}, {"spec": {"replicas": 3}}]
    (killed,) = fake.state.deleted
    assert killed[0] == "prod" and killed[2] == 0
    journal = [json.loads(line) for line in next(out_dir.rglob("journal.jsonl")).read_text().splitlines()]
    kill = next(e for e in journal if e["event"] == "fault_applied" and e["type"] == "pod.kill")
    assert kill["executor"] == "local"
    assert [p["pod"] for p in kill["placement"]["pods"]] == [killed[1]]
    assert kill["placement"]["pods"][0]["node"] == f"node-{killed[1][-1]}"
    assert ledgers(state_dir) == []  # everything reverted: the ledger is discarded
