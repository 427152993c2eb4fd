"""gpu.memory_pressure on a Kubernetes pod's GPU: the target layer chooses the pod through FakeKubeApi (a FAKE
API server), each verb runs in a helper pod (its FAKE kubelet runs the real `python -m chaoskit.agent` on this
host), the agent finds the container (a stand-in: real processes in a real cgroup named as containerd names
it) and the GPU it was given (NVIDIA_VISIBLE_DEVICES in its init's environment), and the real holder takes the
memory there with real CUDA calls — on the simulated driver (fake_libcuda.c, a TEST DOUBLE: no GPU here), whose
device memory every process on this host shares. Revert gives it back; nothing is left in the cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaoskit.executors.k8s_helper import HelperFailed, K8sHelperExecutor
from chaoskit.executors.layer import place
from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.gpu.memory_pressure import GpuMemoryPressure
from tests.conftest import chaoskit, device_used, ledgers, wait_for, write
from tests.helpers import standin_container
from tests.helpers.fake_kube import FakeKubeApi, run_pod_here

GiB = 1 << 30
FAKE_UUID = "GPU-00000000-0000-0000-0000-00000000c0de"  # the simulated driver's one device

pytestmark = pytest.mark.usefixtures("no_kube_env")


@pytest.fixture
def gpu_pod():
    """A stand-in container that was given the simulated GPU, as the NVIDIA device plugin gives one."""
    root = standin_container.hierarchy_or_skip()
    c = standin_container.start(None, root, env={"NVIDIA_VISIBLE_DEVICES": FAKE_UUID})
    try:
        wait_for(lambda: len(c.pids()) == 2, timeout=10)
        yield c
    finally:
        c.stop()


EXPERIMENT = """\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {name: kube-gpu}
steadyState:
  probes:
    - name: device-used
      type: command
      argv: [PYTHON, -c, "from tests.conftest import device_used; print(device_used())"]
      phases: [during]
      expect: {stdout_number: "== 2147483648"}
  during: {every: 500ms}
method:
  - inject:
      type: gpu.memory_pressure
      bytes: 2GiB
      kubernetes: {namespace: prod, selector: {app: llm}, mode: all}
    duration: 4s
"""


def fault(kubeconfig: Path, **kw) -> GpuMemoryPressure:
    spec = GpuMemoryPressure.Spec.model_validate({"type": "gpu.memory_pressure", "bytes": "1GiB", **kw, "kubernetes": {
        "namespace": "prod", "selector": {"app": "llm"}, "kubeconfig": str(kubeconfig),
        "helper": {"runtime_class": "nvidia"}}})
    inj = GpuMemoryPressure(spec, FaultContext(lifetime_s=600.0, run_id="gpu-test"))
    place(inj)
    return inj


def test_a_pods_gpu_gets_the_memory_pressure_in_a_helper_pod_and_gets_it_back(tmp_path, state_dir, fake_cuda, gpu_pod):
    with FakeKubeApi() as api:
        api.kubelet = run_pod_here
        api.add_pod("prod", "llm-0", {"app": "llm"}, node="gpu-node", container_ids=(gpu_pod.container_id,))
        inj, executor = fault(api.write_kubeconfig(tmp_path / "kubeconfig")), K8sHelperExecutor()
        assert executor.plan(inj)[0].startswith("on node gpu-node: a helper pod (chaoskit:latest, hostPID, capabilities "
                                                "SYS_PTRACE, every GPU of the node (runtime class nvidia)) applies "
                                                'gpu.memory_pressure {"bytes": "1GiB"} to pod prod/llm-0 container app')
        assert device_used() == 0
        record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
        try:
            assert device_used() == GiB
            (local,) = [p["record"] for p in record["pods"]]
            assert local["device"] == FAKE_UUID  # the container's GPU, by the node's name for it
            holder = local["holder"]["pid"]
            status = GpuMemoryPressure.from_ledger(local).holder_file(local["status"])
            assert str(status).startswith(f"/proc/{holder}/root/")  # as from another pod
            details = executor.observe_details(inj.type, record, inj.ctx.placement)
            assert list(details["pods"]) == ["gpu-node/llm-0"] and details["in_effect"] is True
            seen = details["pods"]["gpu-node/llm-0"]["holder"]
            assert (seen["state"], seen["held"], seen["pid"]) == ("holding", GiB, holder)
        finally:
            executor.revert(inj.type, record, inj.ctx.placement)
        assert device_used() == 0
        assert executor.observe(inj.type, record, inj.ctx.placement) is False
        helpers = api.calls("POST", "/namespaces/chaoskit/pods$")
        assert [h.body["metadata"]["labels"]["chaoskit.io/verb"] for h in helpers] == [
            "apply", "observe", "revert", "observe"]
        for h in helpers:
            assert h.body["spec"]["runtimeClassName"] == "nvidia" and h.body["spec"]["nodeName"] == "gpu-node"
            env = {e["name"]: e["value"] for e in h.body["spec"]["containers"][0]["env"]}
            assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
        wait_for(lambda: sorted(api.state.pods) == [("prod", "llm-0")], timeout=10)  # every helper pod deleted
        assert api.state.configmaps == {}


def test_a_gpu_the_container_was_not_given_fails_on_the_node_and_takes_nothing(tmp_path, state_dir, fake_cuda,
                                                                              gpu_pod):
    with FakeKubeApi() as api:
        api.kubelet = run_pod_here
        api.add_pod("prod", "llm-0", {"app": "llm"}, node="gpu-node", container_ids=(gpu_pod.container_id,))
        inj, executor = fault(api.write_kubeconfig(tmp_path / "kubeconfig"), device=1), K8sHelperExecutor()
        with pytest.raises(HelperFailed, match=rf"the container has 1 GPU\(s\) \({FAKE_UUID}; from "
                                               r"NVIDIA_VISIBLE_DEVICES\), no index 1"):
            executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
        assert device_used() == 0


def test_chaoskit_run_of_a_pod_gpu_experiment_holds_the_memory_for_the_step_and_leaves_nothing(
        tmp_path, state_dir, fake_cuda, gpu_pod, monkeypatch):
    import sys

    with FakeKubeApi() as api:
        api.kubelet = run_pod_here
        api.add_pod("prod", "llm-0", {"app": "llm"}, node="gpu-node", container_ids=(gpu_pod.container_id,))
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        exp = write(tmp_path / "exp.yaml", EXPERIMENT.replace("PYTHON", sys.executable))
        run = chaoskit("run", str(exp), "--plain", "--out", str(tmp_path / "out"), state=state_dir)
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, (out, err)  # the probe saw the 2 GiB on the device throughout the step
        assert device_used() == 0
        journal = [json.loads(x) for x in next((tmp_path / "out").rglob("journal.jsonl")).read_text().splitlines()]
        (applied,) = [e for e in journal if e["event"] == "fault_applied"]
        assert applied["executor"] == "k8s-helper"
        assert [(t["pod"], t["node"]) for t in applied["placement"]["targets"]] == [("llm-0", "gpu-node")]
        during = [e["values"]["stdout_number"] for e in journal if e["event"] == "sample" and e["phase"] == "during"]
        assert len(during) >= 2 and set(during) == {2 * GiB}
        wait_for(lambda: sorted(api.state.pods) == [("prod", "llm-0")], timeout=10)
        assert api.state.configmaps == {} and ledgers(state_dir) == []

