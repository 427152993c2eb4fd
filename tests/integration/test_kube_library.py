"""The bundled Kubernetes experiments (experiments/kubernetes/): the docs' walkthrough (pod.kill +
deployment.scale), latency on pods' network through helper pods, and GPU memory pressure on a GPU pod. Each
validates with every fault on a `kubernetes:` target, and without a cluster each exits 4 plainly: the missing
kubeconfig named, no traceback, nothing applied (the three run as one suite: one process)."""

from __future__ import annotations

import json

import pytest

from chaoskit.experiment.loader import load_experiment
from chaoskit.paths import library
from tests.conftest import chaoskit, ledgers

KUBE = library("experiments") / "kubernetes"
EXPECTED = {"pod-kill-and-scale": {"pod.kill", "deployment.scale"}, "pod-network-latency": {"network.netem"},
            "gpu-pod-memory-pressure": {"gpu.memory_pressure"}}


def test_each_validates_and_acts_on_kubernetes_only():
    assert sorted(p.stem for p in KUBE.glob("*.yaml")) == sorted(EXPECTED)
    for stem, types in EXPECTED.items():
        exp = load_experiment(KUBE / f"{stem}.yaml").experiment
        assert {s.inject.type for s in exp.method} == types
        assert "kubernetes" in exp.metadata.tags and "kubernetes:" in (KUBE / f"{stem}.yaml").read_text()
        assert [p.type for p in exp.steady_state.probes] == ["kube.pods"]


@pytest.mark.usefixtures("no_kube_env")
def test_without_a_cluster_each_exits_4_plainly_and_applies_nothing(tmp_path, state_dir):
    out_dir = tmp_path / "out"
    p = chaoskit("run", str(KUBE), "--plain", "--out", str(out_dir), state=state_dir)
    out, err = p.communicate(timeout=120)
    text = " ".join((out + err).split())
    assert p.returncode == 4 and "Traceback" not in text, text
    for stem in EXPECTED:
        events = [json.loads(line) for line in next(out_dir.glob(f"*-{stem}/journal.jsonl")).read_text().splitlines()]
        (ended,) = [e for e in events if e["event"] == "end"]
        assert ended["exit_code"] == 4 and "no kubeconfig found" in ended["reason"], ended
        assert not [e for e in events if e["event"].startswith("fault")]
    assert text.count("failed (exit 4)") >= 3 and ledgers(state_dir) == []


@pytest.mark.usefixtures("no_kube_env")
def test_the_walkthrough_runs_as_is_against_a_cluster_and_reverts(tmp_path, state_dir, monkeypatch):
    """pod-kill-and-scale on FakeKubeApi (3 pods of app=web whose ReplicaSet replaces a killed one, Deployment
    web of 3): held, one pod killed, scaled to 2 and back to 3."""
    from tests.helpers.fake_kube import FakeKubeApi

    with FakeKubeApi() as api:
        for i in range(3):
            api.add_pod("default", f"web-{i}", {"app": "web"}, node=f"node-{i}")
        api.add_deployment("default", "web", 3)
        api.recreate_deleted = True
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        p = chaoskit("run", "kubernetes/pod-kill-and-scale", "--var", "duration=1s", "--plain", "--out",
                     str(tmp_path / "out"), state=state_dir)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, out + err
        assert [r.body for r in api.calls("PATCH", "/deployments/web/scale$")] == [{"spec": {"replicas": 2}},
                                                                                  {"spec": {"replicas": 3}}]
        assert len(api.state.deleted) == 1 and api.replicas("default", "web") == 3
    assert ledgers(state_dir) == []
