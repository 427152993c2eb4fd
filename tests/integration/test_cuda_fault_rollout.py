"""gpu.cuda_fault with `prepare: restart` (issue 37): in a `chaoskit run`, the Deployment of the chosen pods is
prepared (its template wrapped with the interposer, a rollout the run waits for), the fault is armed in the NEW
pods, and revert disarms them, then restores the template (a second rollout). Against FakeKubeApi (a FAKE API
server) whose Deployment controller is a DOUBLE (add_rollout_deployment); the new pods' GPU container is a real
process in a real pod cgroup, started the way the wrapped template starts it (LD_PRELOAD and the control file
from a volume filled like the init container fills it), calling the simulated CUDA driver (a TEST DOUBLE); the
helper pods run the real agent on this host (run_pod_here).
"""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaoskit.executors.k8s_cuda_wrap import ANNOTATION, INIT
from chaoskit.gpu import cuda_fault_ctl as ctl
from chaoskit.gpu.cuda_fault_install import CONTROL, LIBRARY, install
from chaoskit.injectors.gpu.cuda_fault import CudaFault
from tests.conftest import ROOT, chaoskit, ledgers, wait_for, write
from tests.helpers import standin_container
from tests.helpers.cuda_workload import Driver
from tests.helpers.fake_kube import FakeKubeApi, Obj, run_pod_here
from tests.integration.test_cuda_fault_kube import pod_cgroup, remove, start_in

WORKLOAD = str(ROOT / "tests" / "helpers" / "cuda_workload.py")
GPU = {"name": "vllm", "image": "vllm/vllm-openai:v0.9", "env": [{"name": "HF_HOME", "value": "/cache"}],
       "resources": {"limits": {"nvidia.com/gpu": "1"}}}
SIDECAR = {"name": "envoy", "image": "envoy:1"}
POD_SPEC = {"containers": [GPU, SIDECAR], "volumes": [{"name": "cache", "emptyDir": {}}]}
STUCK = "reg/missing:1"  # an image the fake controller can never pull

pytestmark = pytest.mark.usefixtures("no_kube_env")


def experiment(kubeconfig: str, *, prepare: str = "restart", image: str = "reg/chaoskit:0.9",
               rollout_timeout: str = "20s") -> str:
    return f"""\
apiVersion: chaoskit/v1
kind: Experiment
metadata: {{name: cuda-restart}}
steadyState:
  probes: [{{name: t, type: command, argv: ["true"], phases: [before]}}]
method:
  - inject:
      type: gpu.cuda_fault
      alloc: {{share: 1.0}}
      prepare: {prepare}
      rollout_timeout: {rollout_timeout}
      kubernetes: {{namespace: prod, selector: {{app: llm}}, container: vllm, kubeconfig: {kubeconfig},
                    helper: {{image: "{image}"}}}}
    duration: 3s
"""


class Node:
    """What the kubelet of the fake's node runs for the Deployment's pods: the GPU container of a pod whose template
    has the interposer's environment is a real workload (its control file in a volume of its own); any other
    container gets a made-up ID and no process."""

    def __init__(self, tmp_path: Path):
        self.tmp_path, self.root = tmp_path, standin_container.hierarchy_or_skip()
        self.workloads: dict[str, tuple[Driver, Path, Path]] = {}  # pod -> (workload, cgroup, control file)

    def __call__(self, pod: Obj) -> tuple[str, ...]:
        return tuple(self._start(pod, c) for c in pod["spec"]["containers"])

    def _start(self, pod: Obj, c: Obj) -> str:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if ctl.ENV not in env:
            return f"containerd://{secrets.token_hex(32)}"
        assert env["LD_PRELOAD"] == f"/chaoskit-cuda/{LIBRARY}" and env[ctl.ENV] == f"/chaoskit-cuda/{CONTROL}"
        assert [i["name"] for i in pod["spec"]["initContainers"]] == [INIT]
        lib, control = install(self.tmp_path / pod["metadata"]["name"])  # what the init container does
        cid, cg = pod_cgroup(self.root, pod["metadata"]["uid"])
        proc = start_in(cg, [sys.executable, WORKLOAD, "procaddress"], {"LD_PRELOAD": str(lib), ctl.ENV: str(control)},
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.workloads[pod["metadata"]["name"]] = (Driver(proc), cg, control)
        return f"containerd://{cid}"

    def stop(self) -> None:
        for w, cg, _ in self.workloads.values():
            w.stop()
            remove(cg)


@pytest.fixture
def fake(tmp_path: Path, fake_cuda) -> Iterator[tuple[FakeKubeApi, Node]]:
    node = Node(tmp_path)
    with FakeKubeApi() as api:
        api.kubelet = run_pod_here
        api.start_containers = node
        api.kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        try:
            yield api, node
        finally:
            node.stop()


def deployment(api: FakeKubeApi) -> Obj:
    return api.state.workloads[("prod", "llm")]


def llm_pods(api: FakeKubeApi) -> list[str]:
    return sorted(name for ns, name in api.state.pods if ns == "prod")


def armed(control: Path) -> bool:
    with ctl.Control(control) as c:
        return c.armed


def run(tmp_path: Path, state: Path, text: str, *args: str) -> subprocess.Popen:
    exp = write(tmp_path / "exp.yaml", text)
    return chaoskit("run", str(exp), "--plain", "--out", str(tmp_path / "out"), *args, state=state)


def while_running(proc: subprocess.Popen, cond: Callable[[], bool]) -> None:
    def seen() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) first: {proc.communicate()}")
        return cond()

    wait_for(seen, timeout=90)


def journal(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in next((tmp_path / "out").rglob("journal.jsonl")).read_text().splitlines()]


def deployment_calls(api: FakeKubeApi) -> list[str]:
    """The run's requests in order, those that matter here: PATCH/GET of the Deployment, helper pods made."""
    out = []
    for r in api.requests:
        if r.path.endswith("/deployments/llm"):
            out.append(f"{r.method} deployment")
        elif r.method == "POST" and r.path.endswith("/namespaces/chaoskit/pods"):
            out.append(f"helper {r.body['metadata']['labels']['chaoskit.io/verb']}")
    return out


def test_a_run_restarts_an_unprepared_deployment_arms_the_new_pods_and_restores_it(tmp_path, state_dir, fake):
    api, node = fake
    api.add_rollout_deployment("prod", "llm", POD_SPEC)
    (first,) = llm_pods(api)
    before = copy.deepcopy(deployment(api)["spec"]["template"])
    p = run(tmp_path, state_dir, experiment(api.kubeconfig))
    while_running(p, lambda: bool(node.workloads) and armed(next(iter(node.workloads.values()))[2]))
    (new,) = node.workloads
    w, _, control = node.workloads[new]
    seen = w.calls(200)  # while the fault is in effect: every allocation fails with OUT_OF_MEMORY (2)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, (out, err)
    assert seen == {"alloc": {"2": 200}, "launch": {}, "sync": {}}
    assert not armed(control)  # disarmed by the revert helper, before the second rollout replaced the pod
    d = deployment(api)
    assert d["spec"]["template"] == before and ANNOTATION not in d["metadata"].get("annotations", {})
    assert d["metadata"]["generation"] == 3  # two rollouts: the wrap, the restore
    (last,) = llm_pods(api)
    assert first != new != last and [k[1] for k in api.state.deleted if k[0] == "prod"] == [first, new]
    calls = deployment_calls(api)
    patched = [i for i, c in enumerate(calls) if c == "PATCH deployment"]
    assert len(patched) == 2
    waited = calls[patched[0] + 1:calls.index("helper apply")]
    assert len(waited) >= 2 and set(waited) == {"GET deployment"}  # polled until the rollout finished
    assert calls.index("helper revert") < patched[1]  # disarmed first, then restored
    after = calls[patched[1] + 1:]  # that rollout waited for too, then the rollback's check that nothing is armed
    assert len(after) >= 3 and set(after[:-1]) == {"GET deployment"} and after[-1] == "helper observe", after
    events = journal(tmp_path)
    applied = next(e for e in events if e["event"] == "fault_observed" and e["when"] == "applied")
    assert applied["details"]["in_effect"] is True and list(applied["details"]["pods"]) == [f"node-a/{new}"]
    reverted = [e for e in events if e["event"] == "fault_reverted"]
    assert len(reverted) == 1
    assert ledgers(state_dir) == [] and api.state.configmaps == {}


def test_a_deployment_prepared_before_the_run_is_armed_without_a_restart_and_stays_prepared(tmp_path, state_dir,
                                                                                           fake):
    from typer.testing import CliRunner

    from chaoskit.cli.main import app

    api, node = fake
    api.add_rollout_deployment("prod", "llm", POD_SPEC)
    r = CliRunner().invoke(app, ["cuda-wrap", "--deployment", "prod/llm", "--kubeconfig", api.kubeconfig,
                                 "--image", "reg/chaoskit:0.9"])
    assert r.exit_code == 0, r.output
    wait_for(lambda: bool(node.workloads), timeout=10)
    wrapped = copy.deepcopy(deployment(api))
    (pod,) = node.workloads
    api.requests.clear()
    p = run(tmp_path, state_dir, experiment(api.kubeconfig))
    while_running(p, lambda: armed(node.workloads[pod][2]))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, (out, err)
    assert "deployment prod/llm is prepared already: no restart, and it stays prepared after the run" in " ".join(
        (out + err).split())
    assert not armed(node.workloads[pod][2])
    assert api.calls("PATCH", "/deployments") == []
    assert deployment(api) == wrapped and llm_pods(api) == [pod]  # still prepared, its pod untouched


def test_a_rollout_that_never_finishes_fails_the_step_naming_the_deployment_and_leaves_nothing(tmp_path, state_dir,
                                                                                               fake):
    api, node = fake
    api.stuck_images = {STUCK}  # the init container's image (the helper image) cannot be pulled
    api.add_rollout_deployment("prod", "llm", POD_SPEC)
    (first,) = llm_pods(api)
    before = copy.deepcopy(deployment(api)["spec"]["template"])
    p = run(tmp_path, state_dir, experiment(api.kubeconfig, image=STUCK, rollout_timeout="2s"))
    out, err = p.communicate(timeout=120)
    text = " ".join((out + err).split())
    assert p.returncode == 1, (out, err)
    assert ("apply failed: RolloutStalled: deployment prod/llm: its rollout did not finish within 2s (generation 2, "
            "observed 2; 0 updated, 1 ready, 1 in all, of 1 replicas)") in text, text
    d = deployment(api)
    assert d["spec"]["template"] == before and ANNOTATION not in d["metadata"].get("annotations", {})
    assert node.workloads == {} and api.calls("POST", "/namespaces/chaoskit/pods$") == []  # nothing was armed
    assert [c for c in deployment_calls(api) if c == "PATCH deployment"] == ["PATCH deployment"] * 2
    (last,) = llm_pods(api)
    assert last != first  # the restore's rollout (to an image that can be pulled) finished
    assert ledgers(state_dir) == []


def test_an_ld_preload_from_envfrom_is_refused_before_anything_is_applied(tmp_path, state_dir, fake):
    api, _ = fake
    gpu = {**GPU, "envFrom": [{"configMapRef": {"name": "llm-env"}}]}
    api.add_rollout_deployment("prod", "llm", {"containers": [gpu, SIDECAR]})
    p = run(tmp_path, state_dir, experiment(api.kubeconfig))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 4, (out, err)
    assert ("gpu.cuda_fault: prepare: restart: deployment prod/llm: container vllm may take LD_PRELOAD from envFrom "
            "ConfigMap llm-env: its value cannot be seen here, and the interposer's LD_PRELOAD would silently "
            "override it") in " ".join((out + err).split()), (out, err)
    assert api.calls("PATCH") == [] and api.calls("POST") == [] and ledgers(state_dir) == []


def test_pods_without_the_interposer_are_refused_at_preflight_with_prepare_none(tmp_path, state_dir, fake):
    api, _ = fake
    api.add_rollout_deployment("prod", "llm", POD_SPEC)
    (pod,) = llm_pods(api)
    p = run(tmp_path, state_dir, experiment(api.kubeconfig, prepare="none"))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 4, (out, err)
    assert (f"gpu.cuda_fault: pod prod/{pod} container vllm was not started with the CUDA interposer (no "
            "CHAOSKIT_CUDA_FAULT in its env): prepare its Deployment with `chaoskit cuda-wrap --deployment "
            "NAMESPACE/NAME`, or set `prepare: restart` (a rollout in the run)") in " ".join((out + err).split())
    assert api.calls("PATCH") == [] and api.calls("POST") == []


def test_a_dry_run_says_the_deployment_restarts_and_changes_nothing(tmp_path, state_dir, fake):
    api, _ = fake
    api.add_rollout_deployment("prod", "llm", POD_SPEC)
    before = copy.deepcopy(deployment(api))
    p = run(tmp_path, state_dir, experiment(api.kubeconfig), "--dry-run")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, (out, err)
    text = " ".join((out + err).split())
    assert ("restart (rollout) of deployment prod/llm first, waited for (up to 20s): container(s) vllm get "
            "LD_PRELOAD=/chaoskit-cuda/") in text, text
    assert "revert: disarm, then restore its template (a second rollout, waited for too)" in text
    assert deployment(api) == before
    assert {r.method for r in api.requests} == {"GET"} and api.state.secrets == {}


def test_prepare_restart_needs_a_kubernetes_target():
    with pytest.raises(ValueError, match="prepare: restart restarts the pods of a Deployment: it needs a kubernetes: "
                                         "target"):
        CudaFault.Spec.model_validate({"type": "gpu.cuda_fault", "name": "^vllm", "alloc": {"share": 0.1},
                                       "prepare": "restart"})


def test_a_torn_restart_record_is_refused_before_anything_is_undone(tmp_path):
    """The ledger's record of a fault with prepare: restart, hand-edited: revert names each wrong field and sends
    no request (no helper pod, no restore)."""
    from chaoskit.executors.k8s_helper import K8sHelperExecutor
    from chaoskit.injectors.base import RecordError
    from chaoskit.targets.kube import ClusterRef
    from tests.helpers.fake_kube import helper_placement

    with FakeKubeApi() as api:
        hp = helper_placement(ClusterRef(str(api.write_kubeconfig(tmp_path / "kc")), None))
        torn = {"pods": [], "restart": {"owner": "", "deployments": "prod/llm", "timeout_s": 30}}
        with pytest.raises(RecordError, match=r"^gpu.cuda_fault: its revert record does not read back \(owner: String "
                                              r"should have at least 1 character; deployments: Input should be a "
                                              r"valid list\)$"):
            K8sHelperExecutor().revert("gpu.cuda_fault", torn, hp.to_json())
        assert api.requests == []
