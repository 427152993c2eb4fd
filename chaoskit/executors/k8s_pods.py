"""Helper pods: where one runs (HelperPlacement), its spec, and a batch of them run at once, one per node.

A helper pod (hostPID, pinned by nodeName, not privileged: all capabilities dropped but the few the fault type
needs, activeDeadlineSeconds, the chaoskit image) runs `python -m chaoskit.agent VERB --env CHAOSKIT_REQUEST`
and answers one JSON line in its log. `run_helpers` creates the pods of every node at once and waits for them
with one LIST per poll (not one GET per pod): N nodes cost N creates, N log reads, N deletes and a few LISTs.
No helper gets the service account token the kubelet would mount; only an apply that holds its fault (hold_s)
mounts a short-lived token of its own (projected, read-only, at API_DIR, named by $CHAOSKIT_API_CREDENTIALS), to
read the cluster's halt lever: its ServiceAccount may get that one ConfigMap and nothing else (role.yaml).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chaoskit.executors.k8s_halt import CA_FILE, TOKEN_FILE
from chaoskit.executors.revert_store import RUN_LABEL, dns_label
from chaoskit.injectors import Injector, injector_class
from chaoskit.injectors.base import NodeHelper
from chaoskit.injectors.placement import HelperPlacement

REQUEST_ENV = "CHAOSKIT_REQUEST"
ROLE_LABEL = "chaoskit.io/role"
VERB_LABEL = "chaoskit.io/verb"
POLL_S = (0.05, 0.2)  # helper pods are listed after 50 ms, then twice as late each time, at most every 200 ms

# a GPU fault's helper gets from the NVIDIA container toolkit every GPU of the node and the driver's libraries
# (the fault picks the target container's GPU itself), and room for a CUDA context
GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
LIMITS = {"cpu": "500m", "memory": "256Mi"}
GPU_LIMITS = {"cpu": "1", "memory": "2Gi"}  # per pod of the node: each pod's holder has its own CUDA context
API_ENV = "CHAOSKIT_API_CREDENTIALS"  # a holding agent's service account volume: it watches the halt lever
API_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the kubelet would mount the token: in-cluster tools
TOKEN_TTL_S = 600  # of the projected token (the least the API server issues); the kubelet renews it at 80%
STATE_DIR = "/var/lib/chaoskit"  # state_dir() of root: an emptyDir, as the root filesystem is read-only


class HelperFailed(RuntimeError):
    """The helper pod did not run the verb to the end (failed, timed out, or answered an error)."""


def placed(injector: Injector) -> HelperPlacement:
    """The helper placement the target layer gave a fault (executors.layer.place); ValueError if it gave none."""
    if injector.ctx.placement is None:
        raise ValueError(f"{injector.type}: no k8s-helper placement (the target layer did not place it on pods)")
    return injector.ctx.placement


def grants(type_name: str) -> NodeHelper:
    """What the helper pod of a fault type is granted: its class's node_helper (everything else is dropped)."""
    return injector_class(type_name).node_helper


def host_kind(path: str) -> str:
    """The hostPath type the kubelet checks: a device under /dev (the kernel log /dev/kmsg), else a directory."""
    return "CharDevice" if path.startswith("/dev/") else "Directory"


def helper_pod(verb: str, type_name: str, request: dict[str, Any], hp: HelperPlacement) -> Any:
    """The V1Pod that runs `python -m chaoskit.agent VERB` for one fault on hp.node."""
    from kubernetes import client

    needs = grants(type_name)
    caps, paths, gpu = list(needs.capabilities), needs.host_paths, needs.gpu
    mounts = [client.V1VolumeMount(name="state", mount_path=STATE_DIR),
              *(client.V1VolumeMount(name=f"host-{i}", mount_path=p) for i, p in enumerate(paths))]
    volumes = [client.V1Volume(name="state", empty_dir=client.V1EmptyDirVolumeSource(size_limit="64Mi")),
               *(client.V1Volume(name=f"host-{i}", host_path=client.V1HostPathVolumeSource(path=p, type=host_kind(p)))
                 for i, p in enumerate(paths))]
    security = client.V1SecurityContext(
        privileged=False, allow_privilege_escalation=False, read_only_root_filesystem=True, run_as_user=0,
        capabilities=client.V1Capabilities(drop=["ALL"], add=caps or None))
    env = {REQUEST_ENV: json.dumps(request, sort_keys=True), **(GPU_ENV if gpu else {})}
    if verb == "apply" and hp.hold_s > 0:  # it stays on the node: it watches the cluster's halt lever
        mounts.append(client.V1VolumeMount(name="api", mount_path=API_DIR, read_only=True))
        volumes.append(api_volume())
        env[API_ENV] = API_DIR
    container = client.V1Container(
        name="agent", image=hp.image, command=["python", "-m", "chaoskit.agent", verb, "--env", REQUEST_ENV],
        env=[client.V1EnvVar(name=k, value=v) for k, v in env.items()],
        security_context=security, volume_mounts=mounts,
        resources=client.V1ResourceRequirements(requests={"cpu": "10m", "memory": "64Mi"},
                                                limits=gpu_limits(len(hp.pods())) if gpu else LIMITS))
    labels = {RUN_LABEL: dns_label(hp.run_id), ROLE_LABEL: "helper", VERB_LABEL: verb,
              "app.kubernetes.io/managed-by": "chaoskit"}
    name = f"{dns_label(f'chaoskit-{verb}-{hp.key}', 56)}-{uuid.uuid4().hex[:6]}"
    spec = client.V1PodSpec(
        node_name=hp.node, host_pid=True, restart_policy="Never",
        active_deadline_seconds=hp.deadline_s + (math.ceil(hp.hold_s) if verb == "apply" else 0),
        service_account_name=hp.service_account, automount_service_account_token=False,
        tolerations=[client.V1Toleration(operator="Exists")], containers=[container], volumes=volumes,
        runtime_class_name=hp.runtime_class if gpu else None)
    return client.V1Pod(api_version="v1", kind="Pod", spec=spec,
                        metadata=client.V1ObjectMeta(name=name, namespace=hp.namespace, labels=labels))


def api_volume() -> Any:
    """A projected volume with a token of the pod's ServiceAccount (TOKEN_TTL_S) and the cluster's CA: what the
    kubelet would mount, minus the namespace file, for a pod that does not get the automatic token."""
    from kubernetes import client

    return client.V1Volume(name="api", projected=client.V1ProjectedVolumeSource(sources=[
        client.V1VolumeProjection(service_account_token=client.V1ServiceAccountTokenProjection(
            path=TOKEN_FILE, expiration_seconds=TOKEN_TTL_S)),
        client.V1VolumeProjection(config_map=client.V1ConfigMapProjection(
            name="kube-root-ca.crt", items=[client.V1KeyToPath(key=CA_FILE, path=CA_FILE)]))]))


def gpu_limits(pods: int) -> dict[str, str]:
    """A GPU helper's limits: GPU_LIMITS for each pod of its node it holds memory for (at least one)."""
    n = max(1, pods)
    return {"cpu": str(n), "memory": f"{2 * n}Gi"} if n > 1 else dict(GPU_LIMITS)


@dataclass(frozen=True)
class HelperJob:
    """One helper pod to run: its node's placement and the request its agent reads (`type` names the fault)."""

    hp: HelperPlacement
    request: dict[str, Any]


@dataclass
class _Waiting:
    job: HelperJob
    name: str
    deadline: float


def run_helpers(core: Any, verb: str, jobs: list[HelperJob]) -> Iterator[tuple[HelperJob, dict[str, Any] | HelperFailed]]:
    """Create every job's helper pod at once, then yield each job's answer (or its HelperFailed) as it comes.
    A helper that answered is deleted — unless it holds the fault (apply with hold_s): that one stays on its node
    to revert on SIGTERM or at its deadline, and its name is the answer's `holder`. Helpers still waited for
    when the caller stops early are deleted."""
    waiting: dict[str, _Waiting] = {}
    try:
        for job in jobs:
            pod = helper_pod(verb, job.request["type"], job.request, job.hp)
            try:
                core.create_namespaced_pod(job.hp.namespace, pod)
            except Exception as e:  # this node's helper is refused (quota, admission): the others still run
                yield job, HelperFailed(f"helper pod {job.hp.namespace}/{pod.metadata.name} on node {job.hp.node}: "
                                        f"{verb} {job.request['type']}: not created: {_api_error(e)}")
                continue
            waiting[pod.metadata.name] = _Waiting(job, pod.metadata.name,
                                                  time.monotonic() + job.hp.deadline_s + 30)
        pause = POLL_S[0]
        while waiting:
            time.sleep(pause)  # an observe or revert helper answers within a second: its answer is not kept waiting
            pause = min(pause * 2, POLL_S[1])
            phases = _phases(core, verb, {w.job.hp.namespace for w in waiting.values()})
            for w in list(waiting.values()):
                out = _settle(core, verb, w, phases.get((w.job.hp.namespace, w.name)))
                if out is not None:
                    del waiting[w.name]
                    yield w.job, out
    finally:
        for w in waiting.values():
            delete_quietly(core, w.name, w.job.hp.namespace)


def _phases(core: Any, verb: str, namespaces: set[str]) -> dict[tuple[str, str], str]:
    """(namespace, name) -> phase of every helper pod of this verb: one LIST per namespace, read as plain JSON
    (the client's models would cost more than the API call)."""
    out = {}
    for ns in namespaces:
        resp = core.list_namespaced_pod(ns, label_selector=f"{ROLE_LABEL}=helper,{VERB_LABEL}={verb}",
                                        _preload_content=False)
        for item in json.loads(resp.data).get("items", []):
            out[(ns, item["metadata"]["name"])] = (item.get("status") or {}).get("phase") or "Pending"
    return out


def _settle(core: Any, verb: str, w: _Waiting, phase: str | None) -> dict[str, Any] | HelperFailed | None:
    """A helper's outcome once it has one (its answer, or HelperFailed), else None (still waited for)."""
    hp, type_name = w.job.hp, w.job.request["type"]
    where = f"helper pod {hp.namespace}/{w.name} on node {hp.node}"
    if phase is None:
        return HelperFailed(f"{where}: {verb} {type_name}: the pod was deleted before it answered")
    holds = verb == "apply" and hp.hold_s > 0
    if phase in ("Succeeded", "Failed") or (holds and phase == "Running"):
        lines = [ln for ln in (core.read_namespaced_pod_log(w.name, hp.namespace) or "").splitlines() if ln.strip()]
        answer = _answer(lines)
        if phase == "Running" and not answer:
            return None  # running, not answered yet
        ok = "error" not in answer and phase in ("Succeeded", "Running")
        kept = ok and phase == "Running"
        if not kept:
            delete_quietly(core, w.name, hp.namespace)
        if not ok:
            why = answer.get("error") or (lines[-1] if lines else "no output")
            return HelperFailed(f"{where}: {verb} {type_name} {phase}: {why}")
        return {**answer, "holder": w.name} if kept else answer
    if time.monotonic() > w.deadline:
        delete_quietly(core, w.name, hp.namespace)
        return HelperFailed(f"{where} did not answer within {hp.deadline_s + 30}s")
    return None


def _answer(lines: list[str]) -> dict[str, Any]:
    """The verb's answer among the log lines: the first JSON object with a record or an error (a holding helper
    prints its revert later), else the last JSON object."""
    objs = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            if "record" in obj or "error" in obj:
                return obj
            objs.append(obj)
    return objs[-1] if objs else {}


def _api_error(e: Exception) -> str:
    status = getattr(e, "status", None)
    return f"{status} {getattr(e, 'reason', '')}".strip() if status else f"{type(e).__name__}: {e}"


def delete_quietly(core: Any, name: str, namespace: str) -> None:
    """Delete a helper pod now (grace 0: its agent gets SIGTERM); one already gone is fine."""
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as e:
        if e.status != 404:
            raise

