"""kube.nodes probe against FakeKubeApi (a FAKE API server, tests/helpers/fake_kube.py: no cluster here), through
the real `kubernetes` client: node conditions, taints, cordon state, GPUs, DRA device taints, pods' placement, and
stages timed from the faults' apply and revert."""

from __future__ import annotations

import asyncio
import time

import pytest

from chaoskit.model.events import FaultApplied, FaultReverted
from chaoskit.probes.kube_nodes import KubeNodesProbe, KubeNodesProbeSpec
from tests.helpers.fake_kube import FakeKubeApi

pytestmark = pytest.mark.usefixtures("no_kube_env")


@pytest.fixture
def api(tmp_path):
    with FakeKubeApi() as api:
        api.write_kubeconfig(tmp_path / "kubeconfig")
        api.add_node("gpu-a", {"pool": "gpu"}, gpus=8)
        api.add_node("gpu-b", {"pool": "gpu"}, gpus=8)
        api.add_node("cpu-a", {"pool": "cpu"})
        api.add_pod("prod", "llm-0", {"app": "llm"}, node="gpu-a", gpus=2)
        api.add_pod("prod", "llm-1", {"app": "llm"}, node="gpu-a", gpus=1)
        yield api


def probe(tmp_path, **kw) -> KubeNodesProbe:
    target = {"kubeconfig": str(tmp_path / "kubeconfig"), **kw.pop("target", {})}
    spec = KubeNodesProbeSpec.model_validate({"name": "nodes", "type": "kube.nodes",
                                              "target": {"kubernetes": target}, **kw})
    p = KubeNodesProbe(spec)
    p.preflight()
    return p


def measure(p: KubeNodesProbe) -> dict:
    return asyncio.run(p.measure())


def cordon(api: FakeKubeApi, node: str, condition: str | None = None) -> None:
    with api._lock:
        n = api.state.nodes[node]
        n["spec"]["unschedulable"] = True
        n["spec"]["taints"] = [{"key": "nvidia.com/gpu-xid", "effect": "NoSchedule"}]
        if condition:
            n["status"]["conditions"].append({"type": condition, "status": "True", "reason": "Xid79",
                                              "lastTransitionTime": "2026-12-04T00:00:00Z"})


def test_counts_of_the_selected_nodes(api, tmp_path):
    api.state.resourceslices = [{"spec": {"nodeName": "gpu-a", "devices": [
        {"name": "gpu-0", "taints": [{"key": "xid", "effect": "NoExecute"}]}, {"name": "gpu-1"}]}},
        {"spec": {"nodeName": "cpu-a", "devices": [{"name": "x", "taints": [{"key": "t", "effect": "NoSchedule"}]}]}}]
    cordon(api, "gpu-a", "GpuXid")
    p = probe(tmp_path, target={"selector": {"pool": "gpu"}, "pods": {"namespace": "prod", "selector": {"app": "llm"}},
                                "problem_conditions": ["GpuXid"], "problem_taints": ["other/key"]},
              expect={"condition": {"GpuXid": "== 0", "NotThere": "== 0"}, "taint": {"absent.example/key": "== 0"}})
    v = measure(p)
    age = v.pop("condition_age_s.GpuXid")
    assert age > 0 and v.pop("condition_age_s.Ready") > age
    assert v == {"nodes": 2, "ready": 2, "not_ready": 0, "cordoned": 1, "tainted": 1, "flagged": 1, "gpu_allocatable": 16,
                 "gpu_allocated": 3, "gpu_free": 13, "condition.Ready": 2, "condition.GpuXid": 1,
                 "condition.NotThere": 0, "taint.nvidia.com/gpu-xid": 1, "taint.absent.example/key": 0,
                 "pods": 2, "pods_ready": 2, "pods_on_nodes": 2, "device_taints": 1,
                 "late": "", "overdue": 0, "waiting": 0}


def test_no_dra_api_leaves_device_taints_out_and_names_the_nodes(api, tmp_path):
    p = probe(tmp_path, target={"names": ["cpu-a"]})
    v = measure(p)
    assert v["nodes"] == 1 and v["gpu_allocatable"] == 0 and "device_taints" not in v
    assert p.missing("device_taints", v).startswith("not measured: the cluster serves no DRA ResourceSlices")


def test_stages_are_timed_from_apply_and_revert_and_a_missed_one_is_late(api, tmp_path):
    p = probe(tmp_path, target={"names": ["gpu-a"]}, stages=[
        {"name": "detect", "when": {"condition.GpuXid": ">= 1"}, "within": "5s"},
        {"name": "cordon", "when": {"cordoned": ">= 1"}, "within": "5s"},
        {"name": "drain", "when": {"gpu_allocated": "== 0"}, "within": "0.3s"},
        {"name": "recover", "when": {"cordoned": "== 0"}, "within": "5s", "after": "revert"}])
    assert set(p.spec.flat_expect()) == {"late", "waiting"}  # the default: no stage late, none awaited at the end
    t0 = time.time()
    p.note_fault(FaultApplied(id=1, step="xid", type="gpu.xid", applied_at=t0))
    assert measure(p)["late"] == ""
    cordon(api, "gpu-a", "GpuXid")
    time.sleep(0.35)
    v = measure(p)
    assert 0.3 <= v["stage_s.detect"] < 2 and v["stage_s.cordon"] == v["stage_s.detect"]
    assert v["late"] == "drain: not reached fault #1 xid's apply (within 0.3s)" and v["overdue"] == 1
    assert v["waiting"] == 0  # the fault is in effect: nothing is awaited yet
    p.note_fault(FaultReverted(id=1, type="gpu.xid"))
    assert measure(p)["waiting"] == 1  # recover, after the revert
    with api._lock:
        api.state.nodes["gpu-a"]["spec"]["unschedulable"] = False
    v = measure(p)
    assert v["waiting"] == 0 and 0 <= v["stage_s.recover"] < 2


def test_a_stage_on_an_unknown_key_is_refused():
    with pytest.raises(ValueError, match="when: unknown key 'cordon'"):
        KubeNodesProbeSpec.model_validate({"name": "n", "type": "kube.nodes", "stages": [
            {"name": "x", "when": {"cordon": ">= 1"}, "within": "5s"}]})
