"""gpu.cuda_fault prepare: restart's rollout bookkeeping (executors.k8s_cuda_restart), with the Kubernetes calls
replaced by recorders (a DOUBLE of the API: the full runs against the fake API server are in
tests/integration/test_cuda_fault_rollout.py): apply waits for every Deployment of the record, also one another
fault prepared meanwhile, but records only those it wrapped; revert waits only for a rollout it started."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chaoskit.executors import k8s_cuda_restart as hooks
from chaoskit.executors.k8s_pods import HelperPlacement
from chaoskit.injectors.gpu.cuda_fault import PodRestartRecord
from chaoskit.targets.kube import Placement


@pytest.fixture
def calls(monkeypatch):
    log: list[tuple] = []
    monkeypatch.setattr(hooks, "_apis", lambda hp: ("apps", "core"))
    monkeypatch.setattr(hooks, "wait_rollout", lambda apps, ns, name, timeout: log.append(("wait", ns, name)))
    return log


def placement() -> HelperPlacement:
    return HelperPlacement(cluster={}, node="n1", run_id="r1", key="k1", targets=[])


def test_apply_waits_for_every_deployment_and_records_those_it_wrapped(monkeypatch, calls):
    mine = {"prod/a"}  # prod/b was prepared by another fault between prepare and apply: wrap leaves it
    monkeypatch.setattr(hooks, "wrap", lambda apps, core, ns, name, image, containers, key_ns, owner:
                        calls.append(("wrap", ns, name, tuple(containers or ()))) or
                        ("change" if f"{ns}/{name}" in mine else None))
    pod = Placement(namespace="prod", pod="a-1", uid="u1", node="n2", container="vllm", container_id="containerd://x")
    monkeypatch.setattr(hooks, "choose", lambda core, selector: [pod])
    record = PodRestartRecord(owner="r1/k1", deployments=["prod/a", "prod/b"], timeout_s=5).model_dump()
    spec = SimpleNamespace(kubernetes=SimpleNamespace(container="vllm"))
    final, hp = hooks.roll_out(SimpleNamespace(spec=spec), {"restart": record}, placement())
    assert calls == [("wrap", "prod", "a", ("vllm",)), ("wrap", "prod", "b", ("vllm",)),
                     ("wait", "prod", "a"), ("wait", "prod", "b")]
    assert final["restart"]["deployments"] == ["prod/a"] and hp.node == "n2"
    assert final["restart"]["placement"] == hp.to_json() and hp.targets == [pod]  # the helpers' on the new pods


def test_revert_waits_only_for_the_rollouts_it_started(monkeypatch, calls):
    restored = {"prod/a"}  # prod/b: restored already, or prepared by another fault: restore leaves it
    monkeypatch.setattr(hooks, "restore", lambda apps, core, ns, name, key_ns, owner:
                        "change" if f"{ns}/{name}" in restored else None)
    hooks.undo(PodRestartRecord(owner="r1/k1", deployments=["prod/a", "prod/b"], timeout_s=5), placement())
    assert calls == [("wait", "prod", "a")]
