"""gpu.cuda_fault on Kubernetes: `chaoskit cuda-wrap --deployment` prepares a Deployment once (its template patched,
and restored exactly) through FakeKubeApi (a FAKE API server), and a helper pod (its FAKE kubelet runs the real
`python -m chaoskit.agent` on this host) arms the control file of a pod's container: a real process in a real
cgroup named as the kubelet and containerd name them (no container runtime here), started with the interposer
the way the prepared template starts it, calling the simulated CUDA driver (fake_libcuda.c, a TEST DOUBLE).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaoskit.cli.main import app
from chaoskit.executors.k8s_cuda_wrap import ANNOTATION, INIT, VOLUME, init_container
from chaoskit.executors.k8s_helper import K8sHelperExecutor
from chaoskit.executors.layer import place
from chaoskit.gpu import cuda_fault_ctl as ctl
from chaoskit.gpu.cuda_fault_install import CONTROL, LIBRARY, install
from chaoskit.injectors.base import FaultContext
from chaoskit.injectors.gpu.cuda_fault import CudaFault, CudaFaultRecord, CudaFaultSpec
from tests.conftest import ROOT
from tests.helpers import standin_container
from tests.helpers.cuda_workload import Driver
from tests.helpers.fake_kube import FakeKubeApi, run_pod_here

WORKLOAD = str(ROOT / "tests" / "helpers" / "cuda_workload.py")
LIB, CTL = f"/chaoskit-cuda/{LIBRARY}", f"/chaoskit-cuda/{CONTROL}"
GPU = {"name": "vllm", "image": "vllm/vllm-openai:v0.9", "env": [{"name": "HF_HOME", "value": "/cache"}],
       "resources": {"limits": {"nvidia.com/gpu": "1"}}}
SIDECAR = {"name": "envoy", "image": "envoy:1"}
POD_SPEC = {"containers": [GPU, SIDECAR], "volumes": [{"name": "cache", "emptyDir": {}}]}

pytestmark = pytest.mark.usefixtures("no_kube_env")


def cuda_wrap(*args: str):
    return CliRunner().invoke(app, ["cuda-wrap", *args])


@pytest.fixture
def api(tmp_path):
    with FakeKubeApi() as api:
        api.kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        yield api


def wrap(api, *args: str, ref: str = "prod/llm"):
    return cuda_wrap("--deployment", ref, "--kubeconfig", api.kubeconfig, *args)


def template(api, name: str = "llm") -> dict:
    return api.state.workloads[("prod", name)]["spec"]["template"]["spec"]


def test_cuda_wrap_patches_the_gpu_container_and_restore_gives_the_template_back(api):
    api.add_deployment_spec("prod", "llm", POD_SPEC)
    r = wrap(api, "--image", "reg/chaoskit:0.9")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        f"deployment prod/llm: container(s) vllm get LD_PRELOAD={LIB} and CHAOSKIT_CUDA_FAULT={CTL}; volume "
        f"chaoskit-cuda (emptyDir) mounted at /chaoskit-cuda; init container {INIT} (reg/chaoskit:0.9) installs the "
        "interposer and a disarmed control file there",
        "this is a rollout: every pod of deployment prod/llm is restarted now (and once more on --restore); the pods "
        "that faults then reach are new pods, started with the interposer (a loaded, disarmed interposer passes every "
        "call through)",
        f"what the template had is kept in annotation {ANNOTATION}, signed with the installation's key; undo: chaoskit "
        "cuda-wrap --deployment prod/llm --restore",
        "follow the rollout: kubectl rollout status deployment/llm -n prod"]
    (patch,) = [q.body for q in api.calls("PATCH", "/deployments/llm$")]
    note = json.loads(patch["metadata"]["annotations"][ANNOTATION])
    assert note.pop("mac").startswith("hmac-sha256:")
    assert note == {"containers": ["vllm"], "image": "reg/chaoskit:0.9",
                    "original": {"containers": [GPU, SIDECAR], "initContainers": None, "volumes": POD_SPEC["volumes"]}}
    assert patch["spec"] == {"template": {"spec": {
        "initContainers": [init_container("reg/chaoskit:0.9")],
        "volumes": [{"name": "cache", "emptyDir": {}}, {"name": VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}],
        "containers": [{**GPU, "env": [{"name": "HF_HOME", "value": "/cache"}, {"name": "LD_PRELOAD", "value": LIB},
                                       {"name": "CHAOSKIT_CUDA_FAULT", "value": CTL}],
                        "volumeMounts": [{"name": VOLUME, "mountPath": "/chaoskit-cuda"}]}, SIDECAR]}}}
    assert init_container("reg/chaoskit:0.9")["command"] == ["python", "-m", "chaoskit.gpu.cuda_fault_install",
                                                             "/chaoskit-cuda"]
    assert ("chaoskit", "chaoskit-record-key") in api.state.secrets  # the key it was signed with, made on first use
    again = wrap(api)
    assert (again.exit_code, again.output) == (0, "deployment prod/llm is prepared already (undo: --restore)\n")
    assert len(api.calls("PATCH", "/deployments/llm$")) == 1

    r = wrap(api, "--restore")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == (
        f"deployment prod/llm: take out the interposer (init container {INIT}, volume {VOLUME}, LD_PRELOAD and "
        "CHAOSKIT_CUDA_FAULT of vllm); this is a rollout: every pod is restarted")
    restore = api.calls("PATCH", "/deployments/llm$")[-1].body
    assert restore == {"metadata": {"annotations": {ANNOTATION: None}}, "spec": {"template": {"spec": {
        "containers": [GPU, SIDECAR], "initContainers": None, "volumes": POD_SPEC["volumes"]}}}}
    assert template(api) == POD_SPEC and ANNOTATION not in api.state.workloads[("prod", "llm")]["metadata"].get(
        "annotations", {})
    r = wrap(api, "--restore")
    assert (r.exit_code, r.output) == (0, "deployment prod/llm was not prepared by cuda-wrap: nothing to restore\n")


def test_a_literal_ld_preload_is_kept_behind_the_interposer_and_other_changes_survive_restore(api):
    own = {**GPU, "env": [{"name": "LD_PRELOAD", "value": "/usr/lib/libjemalloc.so.2"}]}
    api.add_deployment_spec("prod", "llm", {"containers": [own]})
    r = wrap(api, "--dry-run")
    assert r.exit_code == 0 and r.output.startswith(
        f"would: deployment prod/llm: container(s) vllm get LD_PRELOAD={LIB} — vllm (ahead of its own "
        "/usr/lib/libjemalloc.so.2) and"), r.output
    assert api.calls("PATCH", "/deployments") == []
    assert wrap(api).exit_code == 0
    (c,) = template(api)["containers"]
    assert c["env"] == [{"name": "LD_PRELOAD", "value": f"{LIB} /usr/lib/libjemalloc.so.2"},
                        {"name": "CHAOSKIT_CUDA_FAULT", "value": CTL}]
    c["image"] = "vllm/vllm-openai:v0.10"  # someone rolls out a new image meanwhile
    assert wrap(api, "--restore").exit_code == 0
    assert template(api) == {"containers": [{**own, "image": "vllm/vllm-openai:v0.10"}]}
    assert wrap(api).exit_code == 0
    api.add_deployment_spec("prod", "llm", {"containers": [own]})  # re-applied from its manifest: wrap is gone
    api.state.workloads[("prod", "llm")]["metadata"]["annotations"] = api.calls("PATCH", "/deployments/llm$")[-1].body[
        "metadata"]["annotations"]  # ... but not its annotation
    r = wrap(api, "--restore")
    assert r.exit_code == 0 and "its template no longer has the interposer (changed since): only the annotation" in (
        " ".join(r.output.split())), r.output
    assert template(api) == {"containers": [own]} and not api.state.workloads[("prod", "llm")]["metadata"]["annotations"]


@pytest.mark.parametrize(("pod_spec", "why"), [
    ({"containers": [SIDECAR]}, "deployment prod/llm has no container that asks for a GPU (an nvidia.com/* resource "
                                "or a resource claim; it has envoy): name the container with --container"),
    ({"containers": [{**GPU, "env": [{"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]}]},
     "deployment prod/llm: container vllm takes LD_PRELOAD from a reference (valueFrom): it cannot be kept alongside "
     "the interposer; give it as a literal value first"),
    ({"containers": [{**GPU, "env": [{"name": "CHAOSKIT_CUDA_FAULT", "value": "/x"}]}]},
     "deployment prod/llm: container vllm already sets CHAOSKIT_CUDA_FAULT (prepared by hand?)"),
    ({"containers": [{**GPU, "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "app"}},
                                         {"secretRef": {"name": "llm-secrets"}}]}]},
     "deployment prod/llm: container vllm may take LD_PRELOAD from envFrom Secret llm-secrets: its value cannot be "
     "seen here, and the interposer's LD_PRELOAD would silently override it; set LD_PRELOAD literally in env (it "
     "then wins over envFrom and is kept behind the interposer), or give that envFrom a prefix"),
    ({"containers": [{**GPU, "envFrom": [{"prefix": "LD_", "configMapRef": {"name": "libs"}}]}]},
     "deployment prod/llm: container vllm may take LD_PRELOAD from envFrom ConfigMap libs (prefix LD_): its value "
     "cannot be seen here, and the interposer's LD_PRELOAD would silently override it; set LD_PRELOAD literally in "
     "env (it then wins over envFrom and is kept behind the interposer), or give that envFrom a prefix"),
])
def test_a_deployment_that_cannot_be_prepared_is_refused_with_exit_4_and_left_alone(api, pod_spec, why):
    api.add_deployment_spec("prod", "llm", pod_spec)
    r = wrap(api)
    assert r.exit_code == 4 and " ".join(r.output.split()) == f"error: {why}", r.output
    assert api.calls("PATCH", "/deployments") == [] and template(api) == pod_spec


def test_an_envfrom_that_cannot_set_ld_preload_or_is_overridden_by_a_literal_one_is_no_obstacle(api):
    """envFrom with a prefix LD_PRELOAD does not start with cannot set it; a literal LD_PRELOAD in env wins over
    envFrom (Kubernetes' rule) and is kept behind the interposer."""
    own = {**GPU, "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "app"}}]}
    literal = {**GPU, "name": "second", "envFrom": [{"configMapRef": {"name": "all"}}],
               "env": [{"name": "LD_PRELOAD", "value": "/lib/x.so"}]}
    api.add_deployment_spec("prod", "llm", {"containers": [own, literal]})
    assert wrap(api).exit_code == 0
    envs = [c["env"] for c in template(api)["containers"]]
    assert envs[0][-2:] == [{"name": "LD_PRELOAD", "value": LIB}, {"name": "CHAOSKIT_CUDA_FAULT", "value": CTL}]
    assert envs[1] == [{"name": "LD_PRELOAD", "value": f"{LIB} /lib/x.so"}, {"name": "CHAOSKIT_CUDA_FAULT", "value": CTL}]


def test_bad_references_unknown_deployments_and_a_tampered_record(api):
    r = cuda_wrap("--deployment", "llm")
    assert r.exit_code == 2 and "--deployment: expected NAMESPACE/NAME, got 'llm'" in r.output
    r = wrap(api, ref="prod/nope")
    assert r.exit_code == 4 and "no deployment prod/nope" in r.output
    api.add_deployment_spec("prod", "llm", {"containers": [SIDECAR]})
    r = wrap(api, "--container", "envoy")  # named: prepared although it asks for no GPU
    assert r.exit_code == 0, r.output
    meta = api.state.workloads[("prod", "llm")]["metadata"]
    meta["annotations"][ANNOTATION] = meta["annotations"][ANNOTATION].replace('"envoy"', '"evil"', 1)
    r = wrap(api, "--restore")
    assert r.exit_code == 5 and "fails its MAC check" in r.output, r.output
    assert len(api.calls("PATCH", "/deployments")) == 1  # only the wrap


# -- on the node ----------------------------------------------------------------------------------------------

def pod_cgroup(root: Path, pod_uid: str) -> tuple[str, Path]:
    """A container's cgroup inside a pod's, named as the kubelet (systemd driver) and containerd name them."""
    cid = secrets.token_hex(32)
    cg = root / f"ckt-kubepods-pod{pod_uid.replace('-', '_')}.slice" / f"cri-containerd-{cid}.scope"
    cg.mkdir(parents=True)
    return cid, cg


def start_in(cg: Path, argv: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    def join() -> None:
        (cg / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.Popen(argv, preexec_fn=join, env={**os.environ, **env}, **kw)


def remove(*cgroups: Path) -> None:
    for cg in cgroups:
        for path in (cg, cg.parent):
            try:
                path.rmdir()
            except OSError:
                pass


def start_workload(cg: Path, volume: Path) -> Driver:
    """The GPU container's process, started the way the prepared template starts it (LD_PRELOAD and the control
    file from the volume the init container filled)."""
    env = {"LD_PRELOAD": str(volume / LIBRARY), ctl.ENV: str(volume / CONTROL)}
    return Driver(start_in(cg, [sys.executable, WORKLOAD, "procaddress"], env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, cwd=ROOT))


def test_the_init_containers_install_makes_a_disarmed_control_file_any_user_may_write(tmp_path):
    lib, control = install(tmp_path / "vol")
    assert (lib.stat().st_mode & 0o777, control.stat().st_mode & 0o777) == (0o644, 0o666)
    with ctl.Control(control) as c:
        assert not c.armed


def test_a_helper_pod_arms_the_pods_control_file_at_the_asked_share_and_revert_disarms_it(tmp_path, fake_cuda, api):
    root = standin_container.hierarchy_or_skip()
    volume = install(tmp_path / "vol")[0].parent
    cid, cg = pod_cgroup(root, str(uuid.uuid4()))
    w = start_workload(cg, volume)
    try:
        api.kubelet = run_pod_here
        api.add_pod("prod", "llm-0", {"app": "llm"}, node="gpu-node", container_ids=(f"containerd://{cid}",))
        spec = CudaFault.Spec.model_validate({"type": "gpu.cuda_fault", "alloc": {"share": 0.2}, "kubernetes": {
            "namespace": "prod", "selector": {"app": "llm"}, "kubeconfig": api.kubeconfig}})
        inj, executor = CudaFault(spec, FaultContext(run_id="cuda-test", lifetime_s=120)), K8sHelperExecutor()
        place(inj)
        assert executor.plan(inj)[0] == ("on node gpu-node: a helper pod (chaoskit:latest, hostPID, capabilities "
                                         'SYS_PTRACE) applies gpu.cuda_fault {"alloc": {"share": 0.2}} to pod '
                                         "prod/llm-0 container app")
        assert w.calls(200) == {"alloc": {}, "launch": {}, "sync": {}}
        record = executor.apply(inj, executor.prepare(inj), inj.ctx.placement)
        (local,) = [p["record"] for p in record["pods"]]
        assert local["controls"] == [str(volume / CONTROL)] and local["pids"] == [w.proc.pid]
        with ctl.Control(volume / CONTROL) as c:  # the run's lifetime for the fault reached the node
            assert time.time() + 118 < c.expires_at <= time.time() + 121
        seen = w.calls(2000)
        executor.revert(inj.type, record, inj.ctx.placement)
        after = w.calls(1000)
    finally:
        w.stop()
        remove(cg)
    assert set(seen["alloc"]) == {"2"} and abs(seen["alloc"]["2"] / 2000 - 0.2) <= 0.03, seen
    assert seen["launch"] == seen["sync"] == {}
    assert after == {"alloc": {}, "launch": {}, "sync": {}}
    helpers = api.calls("POST", "/namespaces/chaoskit/pods$")
    assert [h.body["metadata"]["labels"]["chaoskit.io/verb"] for h in helpers] == ["apply", "revert"]
    assert helpers[0].body["spec"]["containers"][0]["securityContext"]["capabilities"] == {
        "add": ["SYS_PTRACE"], "drop": ["ALL"]}


def test_a_container_without_the_interposer_is_refused_on_its_node(tmp_path):
    root = standin_container.hierarchy_or_skip()
    cid, cg = pod_cgroup(root, str(uuid.uuid4()))
    p = start_in(cg, ["sleep", "30"], {})
    try:
        with pytest.raises(LookupError, match=f"no process of container {cid[:12]} was started with the CUDA "
                                              r"interposer: prepare its Deployment once with `chaoskit cuda-wrap "
                                              r"--deployment NAMESPACE/NAME` \(a rollout restarts its pods\)"):
            CudaFault.on_node(CudaFaultSpec.model_validate({
                "type": "gpu.cuda_fault", "alloc": {"share": 0.5},
                "kubernetes": {"namespace": "prod", "selector": {"app": "llm"}}}), f"containerd://{cid}")
    finally:
        p.kill()
        p.wait()
        remove(cg)


def armed_in_a_pod(tmp_path: Path, named: bool) -> tuple[Path, Path, subprocess.Popen, CudaFaultRecord]:
    """An armed control file in a pod's volume, a `sleep` in the pod's cgroup (its environment naming the file, or
    not), and the record of a fault that reached the file through a process that is gone (PID 999999999)."""
    root = standin_container.hierarchy_or_skip()
    control = install(tmp_path / "vol")[1]
    with ctl.Control(control) as c:
        c.arm({"alloc": ctl.Rule(0.5, 2)})
    uid = str(uuid.uuid4())
    _, cg = pod_cgroup(root, uid)
    proc = start_in(cg, ["sleep", "30"], {ctl.ENV: str(control)} if named else {})
    gone = f"/proc/999999999/root{control}"
    return control, cg, proc, CudaFault.from_ledger({"controls": [gone], "pids": [999999999], "inside": {
        gone: {"path": str(control), "pid": 999999999, "pod_uid": uid}}})


def test_revert_finds_the_control_file_through_the_pod_after_its_container_restarted(tmp_path):
    """The record names the file through a process that is gone (the container crashed and was restarted); the
    pod's volume, with the armed file in it, stayed: revert reaches it through the restarted container."""
    control, cg, restarted, record = armed_in_a_pod(tmp_path, named=True)
    try:
        assert CudaFault.observe(record)
        CudaFault.revert(record)
        with ctl.Control(control) as c:
            assert not c.armed
        assert not CudaFault.observe(record)
    finally:
        restarted.kill()
        restarted.wait()
        remove(cg)
    CudaFault.revert(record)  # the pod gone too: nothing left to disarm, and that is fine


def test_revert_fails_and_keeps_the_record_while_the_pod_lives_but_its_container_does_not(tmp_path):
    """A container in CrashLoopBackOff (likely under injected failures): only the pod's pause process is left,
    and the armed file sits in the pod's volume. Revert must fail (the record is kept for a later rollback), not
    report success and leave every restart of the container faulted."""
    control, cg, pause, record = armed_in_a_pod(tmp_path, named=False)  # without the interposer's environment
    try:
        with pytest.raises(RuntimeError, match="its container is not running"):
            CudaFault.revert(record)
        with ctl.Control(control) as c:
            assert c.armed
    finally:
        pause.kill()
        pause.wait()
        remove(cg)
