"""The GPU health-pipeline conformance pack (gpu-health/xid-pipeline) end to end: `chaoskit run` chooses the
workload's pod on the node through FakeKubeApi (a FAKE API server: no cluster here), its helper pod (the FAKE
kubelet runs the real `python -m chaoskit.agent` on this host) writes the real XID line to this host's kernel log,
and a simulated health controller (tests/helpers/health_controller.py, a TEST DOUBLE for NVSentinel / the DRA
driver / node-problem-detector) reacts to it, or stays silent. kube.nodes times each stage. Needs root."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import chaoskit
from tests.helpers.fake_kube import FakeKubeApi, run_pod_here
from tests.helpers.gpu_host import writes_xid
from tests.helpers.health_controller import HealthController

pytestmark = [pytest.mark.usefixtures("no_kube_env"), writes_xid]  # its fault writes a real XID line
BUS = "cafe:7a:00.0"  # domain cafe: the line names no real GPU
BOUNDS = ["window=1500ms", "detect=3s", "cordon=3s", "drain=4s", "reschedule=4s", "recover=4s", "every=250ms"]


def run_pack(tmp_path, state_dir, monkeypatch, react: bool, bounds: list[str] = BOUNDS) -> tuple[int, dict, str, HealthController, FakeKubeApi]:
    if os.geteuid() != 0:
        pytest.skip("writes /dev/kmsg: needs root")
    with FakeKubeApi() as api:
        api.kubelet = run_pod_here
        api.add_node("gpu-a", {"pool": "gpu"}, gpus=8)
        api.add_node("gpu-b", {"pool": "gpu"}, gpus=8)
        for i in (0, 1):
            api.add_pod("prod", f"llm-{i}", {"app": "llm"}, node="gpu-a", gpus=1)
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        with HealthController(api, {"cafe:7a:00": "gpu-a"}, spare="gpu-b", react=react) as controller:
            run = chaoskit("run", "gpu-health/xid-pipeline", "--plain", "--out", str(tmp_path / "o"),
                           *[a for v in ["node=gpu-a", f"bus={BUS}", "namespace=prod", "app=llm", "replicas=2",
                                         *bounds] for a in ("--var", v)],
                           state=state_dir)
            out, err = run.communicate(timeout=120)
        summary = json.loads((tmp_path / "o" / "summary.json").read_text())
        helpers = [c for c in api.calls("POST", "/namespaces/chaoskit/pods$")]
        assert [h.body["spec"]["nodeName"] for h in helpers] and {h.body["spec"]["nodeName"] for h in helpers} == \
            {"gpu-a"}  # the helper ran on the workload's node
        assert not [k for k in api.state.pods if k[0] == "chaoskit"] and api.state.configmaps == {}
    return run.returncode, summary, out + err, controller, api


def last_values(summary: dict, phase: str) -> dict:
    return [s for s in summary["samples"] if s["phase"] == phase and s["probe"] == "gpu-node-health"][-1]["values"]


def test_a_reacting_pipeline_holds_and_every_stage_is_timed(tmp_path, state_dir, monkeypatch):
    code, summary, out, controller, api = run_pack(tmp_path, state_dir, monkeypatch, react=True)
    assert code == 0, out
    assert [(node, xid) for _, node, xid in controller.seen] == [("gpu-a", 79)]
    v = last_values(summary, "after")
    stages = {k.removeprefix("stage_s."): v[k] for k in v if k.startswith("stage_s.")}
    assert list(stages) == ["detect", "cordon", "drain", "reschedule", "recover"]
    # the controller's steps are 0.2 s apart after it read the line; a sample every 0.25 s sees each
    assert 0.1 < stages["detect"] <= stages["cordon"] <= stages["drain"] == stages["reschedule"] < 3, stages
    assert 0 <= stages["recover"] < 4 and v["late"] == "" and v["waiting"] == 0
    assert sorted(name for ns, name in api.state.pods) == ["llm-0-r", "llm-1-r"]  # rescheduled on gpu-b


def test_a_silent_pipeline_deviates_naming_the_missed_stage(tmp_path, state_dir, monkeypatch):
    short = ["window=1s", "detect=1s", "cordon=1s", "drain=1s", "reschedule=1s", "recover=1s", "every=250ms"]
    code, summary, out, controller, _ = run_pack(tmp_path, state_dir, monkeypatch, react=False, bounds=short)
    assert code == 1, out
    assert [(node, xid) for _, node, xid in controller.seen] == [("gpu-a", 79)]  # the line was there to see
    late = last_values(summary, "after")["late"]
    assert late.startswith("detect: not reached fault #1 gpu-xid's apply (within 1s); cordon: not reached"), late
