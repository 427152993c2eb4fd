"""The k8s-helper executor: a node-level fault's verbs run in a short-lived helper pod on the target's node.

The pod (hostPID, pinned by nodeName, not privileged: all capabilities dropped but the few the fault type
needs, activeDeadlineSeconds, the chaoskit image) runs `python -m chaoskit.agent VERB --env CHAOSKIT_REQUEST`
and answers one JSON line in its log. The fault's revert record is also kept in the cluster (RevertStore), so a
rollback from any machine finishes the run after a crash; it is removed once reverted. Records are signed and
checked (k8s_records: an HMAC with the installation's key): one that does not check is refused, never executed.
"""

from __future__ import annotations

import json
import math
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from chaoskit.executors.base import Placement, Record
from chaoskit.executors.k8s_records import SignedRecords, checked_faults
from chaoskit.executors.revert_store import RUN_LABEL, configmap_name, dns_label
from chaoskit.injectors import Injector, injector_class
from chaoskit.injectors.base import NodeHelper
from chaoskit.targets.kube import ClusterRef, api_client

REQUEST_ENV = "CHAOSKIT_REQUEST"
ROLE_LABEL = "chaoskit.io/role"
POLL_S = (0.05, 0.2)  # a helper pod's phase is read after 50 ms, then twice as late each time, at most every 200 ms

# a GPU fault's helper gets from the NVIDIA container toolkit every GPU of the node and the driver's libraries
# (the fault picks the target container's GPU itself), and room for a CUDA context
GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
LIMITS = {"cpu": "500m", "memory": "256Mi"}
GPU_LIMITS = {"cpu": "1", "memory": "2Gi"}
STATE_DIR = "/var/lib/chaoskit"  # state_dir() of root: an emptyDir, as the root filesystem is read-only


class HelperFailed(RuntimeError):
    """The helper pod did not run the verb to the end (failed, timed out, or answered an error)."""


@dataclass(frozen=True)
class HelperPlacement:
    """Where and how a helper runs; the ledger entry's placement (plain JSON), enough for a fresh process."""

    cluster: dict[str, Any]  # ClusterRef.to_json()
    node: str
    run_id: str
    namespace: str = "chaoskit"  # where helper pods and the run's ConfigMap live
    image: str = "chaoskit:latest"
    service_account: str = "chaoskit-helper"
    deadline_s: int = 120
    key: str = field(default_factory=lambda: uuid.uuid4().hex[:10])  # this fault's key in the run's ConfigMap
    target: dict[str, Any] | None = None  # the pod placement the fault acts on (targets.kube.Placement)
    targets: list[dict[str, Any]] | None = None  # every chosen pod (the target layer's choice), one helper each
    hold_s: float = 0.0  # > 0: the apply helper stays, and reverts on SIGTERM or once this long has passed
    runtime_class: str | None = None  # of a GPU fault's helper (the NVIDIA container runtime's class)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def per_pod(self) -> list[HelperPlacement]:
        """One placement per chosen pod (on its node, its own ConfigMap key); itself if it names no pods."""
        if not self.targets:
            return [self]
        return [replace(self, node=t["node"], target=t, targets=None, key=f"{self.key}-{i}")
                for i, t in enumerate(self.targets)]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HelperPlacement:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


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
    container = client.V1Container(
        name="agent", image=hp.image, command=["python", "-m", "chaoskit.agent", verb, "--env", REQUEST_ENV],
        env=[client.V1EnvVar(name=k, value=v) for k, v in env.items()],
        security_context=security, volume_mounts=mounts,
        resources=client.V1ResourceRequirements(requests={"cpu": "10m", "memory": "64Mi"},
                                                limits=GPU_LIMITS if gpu else LIMITS))
    labels = {RUN_LABEL: dns_label(hp.run_id), ROLE_LABEL: "helper", "chaoskit.io/verb": verb,
              "app.kubernetes.io/managed-by": "chaoskit"}
    name = dns_label(f"chaoskit-{verb}-{hp.key}-{uuid.uuid4().hex[:6]}")
    spec = client.V1PodSpec(
        node_name=hp.node, host_pid=True, restart_policy="Never",
        active_deadline_seconds=hp.deadline_s + (math.ceil(hp.hold_s) if verb == "apply" else 0),
        service_account_name=hp.service_account, automount_service_account_token=False,
        tolerations=[client.V1Toleration(operator="Exists")], containers=[container], volumes=volumes,
        runtime_class_name=hp.runtime_class if gpu else None)
    return client.V1Pod(api_version="v1", kind="Pod", spec=spec,
                        metadata=client.V1ObjectMeta(name=name, namespace=hp.namespace, labels=labels))


class K8sHelperExecutor:
    """Each chosen pod's fault runs in its own helper pod; the ledger record holds each pod's revert record
    (`pods`), and the cluster's RevertStore holds them too, so a fault whose apply failed halfway, or whose
    host crashed, is still reverted on every pod that has it."""

    name: ClassVar[str] = "k8s-helper"

    def preflight(self, injector: Injector) -> None:
        """Nothing more here: the target layer chose the pods; the helper checks the node before applying."""

    def plan(self, injector: Injector) -> list[str]:
        hp = HelperPlacement.from_json(injector.ctx.placement or {})
        needs = injector.node_helper
        caps = ", ".join(needs.capabilities) or "none"
        host = "".join(f", the host's {p} mounted" for p in needs.host_paths)
        if needs.gpu:
            host += ", every GPU of the node" + (f" (runtime class {hp.runtime_class})" if hp.runtime_class else "")
        spec = injector.spec.model_dump(mode="json", by_alias=True, exclude_defaults=True,
                                        exclude={"type", "target", "kubernetes"})
        lines = []
        for one in hp.per_pod():
            pod = one.target or {}
            lines.append(f"on node {one.node}: a helper pod ({hp.image}, hostPID, capabilities {caps}{host}) applies "
                         f"{injector.type} {json.dumps(spec, sort_keys=True)} to pod {pod.get('namespace')}/"
                         f"{pod.get('pod')} container {pod.get('container')}")
        return [*lines, f"revert: a helper pod on each node, from the record (also kept in ConfigMap "
                        f"{hp.namespace}/{configmap_name(hp.run_id)})"]

    def prepare(self, injector: Injector) -> Record:
        return {"pods": []}  # each helper prepares on its node; until then there is nothing to undo

    def apply(self, injector: Injector, record: Record, placement: Placement) -> Record:
        hp, core = self._open(placement)
        store = SignedRecords(core, hp.namespace, hp.run_id)
        if not hp.targets:  # one fault on one node, its record prepared by the caller
            return self._apply_one(core, store, injector, record, hp)[0]
        pods = []
        for one in hp.per_pod():
            final, holder = self._apply_one(core, store, injector, {}, one)
            pods.append({"key": one.key, "node": one.node, "pod": (one.target or {}).get("pod"), "record": final,
                         "holder": holder})
        return {"pods": pods}

    def _apply_one(self, core: Any, store: SignedRecords, injector: Injector, record: Record,
                   hp: HelperPlacement) -> tuple[Record, str | None]:
        request = {"type": injector.type, "spec": injector.spec.model_dump(mode="json", by_alias=True), "record": record,
                   "placement": hp.to_json(), "hold_s": hp.hold_s}
        who = {"host": socket.gethostname(), "applied_at": time.time()}  # what `chaoskit status --cluster` shows
        store.put(hp.key, {**request, **who, "state": "applying"})  # in the cluster before anything is applied
        answer = run_helper(core, "apply", injector.type, request, hp)
        final, holder = answer["record"], answer.get("holder")
        store.put(hp.key, {**request, **who, "record": final, "state": "applied", "holder": holder})
        return final, holder

    def revert(self, type_name: str, record: Record, placement: Placement) -> None:
        hp, core = self._open(placement)
        self.revert_from(core, hp, type_name, record, SignedRecords(core, hp.namespace, hp.run_id))

    @classmethod
    def revert_from(cls, core: Any, hp: HelperPlacement, type_name: str, record: Record,
                    store: SignedRecords) -> None:
        """Revert on each pod that has the fault; a record of the cluster's that does not check: RecordRefused."""
        for one, rec, holder in cls._records(store, hp, record):
            if rec:  # an empty record: nothing was applied there
                run_helper(core, "revert", type_name, {"type": type_name, "record": rec}, one)
            if holder:  # reverted: its own revert on SIGTERM finds nothing left to undo
                _delete_quietly(core, holder, one.namespace)
            store.remove(one.key)

    def observe(self, type_name: str, record: Record, placement: Placement) -> bool:
        return bool(self.observe_details(type_name, record, placement).get("in_effect"))

    def observe_details(self, type_name: str, record: Record, placement: Placement) -> dict[str, Any]:
        hp, core = self._open(placement)
        store = SignedRecords(core, hp.namespace, hp.run_id)
        per_pod = {}
        for one, rec, _ in self._records(store, hp, record):
            if rec:  # an empty record: nothing was applied there
                answer = run_helper(core, "observe", type_name, {"type": type_name, "record": rec}, one)
                per_pod[f"{one.node}/{(one.target or {}).get('pod', '')}"] = {
                    **answer.get("details", {}), "in_effect": bool(answer.get("in_effect"))}
        if not hp.targets:
            return next(iter(per_pod.values()), {"in_effect": False})
        return {"in_effect": any(d["in_effect"] for d in per_pod.values()), "pods": per_pod}

    @staticmethod
    def _records(store: SignedRecords, hp: HelperPlacement, record: Record) -> list[tuple[
            HelperPlacement, Record | None, str | None]]:
        """Each pod's placement, revert record and holding helper pod: the ledger's, else the cluster's copy of
        an applied one (RecordRefused if it does not check), else None (never applied there: a helper whose apply
        failed reverted itself)."""
        if not hp.targets:  # one pod's entry (a rollback from the cluster's records): its holder is stored
            return [(hp, record, (store.get(hp.key) or {}).get("holder"))]
        known = {p["key"]: p for p in record.get("pods", [])}
        out: list[tuple[HelperPlacement, Record | None, str | None]] = []
        for one in hp.per_pod():
            entry = known.get(one.key)
            if entry is None:
                stored = store.get(one.key) or {}
                entry = stored if stored.get("state") == "applied" else {}
            out.append((one, entry.get("record"), entry.get("holder")))
        return out

    @staticmethod
    def _open(placement: Placement) -> tuple[HelperPlacement, Any]:
        from kubernetes import client

        if not placement:
            raise ValueError("k8s-helper: the ledger entry has no placement (node, cluster)")
        hp = HelperPlacement.from_json(placement)
        return hp, client.CoreV1Api(api_client(ClusterRef.from_json(hp.cluster)))


def run_helper(core: Any, verb: str, type_name: str, request: dict[str, Any], hp: HelperPlacement) -> dict[str, Any]:
    """Create the helper pod, wait for its answer, delete it — unless it holds the fault (apply with hold_s): that
    one stays on the node to revert on SIGTERM or at its deadline, and its name is the answer's `holder`."""
    pod = helper_pod(verb, type_name, request, hp)
    name = pod.metadata.name
    holds = verb == "apply" and hp.hold_s > 0
    core.create_namespaced_pod(hp.namespace, pod)
    kept = False
    try:
        phase, lines = _wait_answer(core, name, hp, holds)
        answer = _answer(lines)
        ok = "error" not in answer and phase in ("Succeeded", "Running")
        kept = ok and phase == "Running"
    finally:
        if not kept:
            _delete_quietly(core, name, hp.namespace)
    if not ok:
        why = answer.get("error") or (lines[-1] if lines else "no output")
        raise HelperFailed(f"helper pod {hp.namespace}/{name} on node {hp.node}: {verb} {type_name} {phase}: {why}")
    return {**answer, "holder": name} if kept else answer


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


def _wait_answer(core: Any, name: str, hp: HelperPlacement, holds: bool) -> tuple[str, list[str]]:
    """(phase, log lines) once the pod finished — or, for a holding helper, once it answered while Running.
    HelperFailed past its deadline (+30 s to be scheduled)."""
    limit = hp.deadline_s + 30
    deadline, pause = time.monotonic() + limit, POLL_S[0]
    while time.monotonic() < deadline:
        phase = core.read_namespaced_pod(name, hp.namespace).status.phase
        if phase in ("Succeeded", "Failed") or (holds and phase == "Running"):
            lines = [ln for ln in (core.read_namespaced_pod_log(name, hp.namespace) or "").splitlines() if ln.strip()]
            if phase != "Running" or _answer(lines):
                return phase, lines
        time.sleep(pause)  # an observe or revert helper answers within a second: its answer is not kept waiting
        pause = min(pause * 2, POLL_S[1])
    raise HelperFailed(f"helper pod {hp.namespace}/{name} on node {hp.node} did not answer within {limit}s")


def _delete_quietly(core: Any, name: str, namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as e:
        if e.status != 404:
            raise


@dataclass(frozen=True)
class Replayed:
    """One fault recorded in the cluster, after `rollback --cluster`: reverted (error None), failed, or refused
    (its record does not check: nothing was run for it)."""

    key: str
    configmap: str
    error: str | None = None
    refused: bool = False


def replay_cluster(cluster: ClusterRef, namespace: str = "chaoskit") -> list[Replayed]:
    """Revert every fault recorded in the cluster's ConfigMaps (a run whose host is gone) whose record checks;
    refuse the others (k8s_records.RecordRefused). KeyUnavailable if the key Secret cannot be read."""
    from kubernetes import client

    core = client.CoreV1Api(api_client(cluster))
    key, faults = checked_faults(core, namespace)
    out: list[Replayed] = []
    for fault in faults:
        req = fault.request
        if req is None:  # refused: nothing runs on the node for it, and its ConfigMap is kept for a look
            out.append(Replayed(fault.key, fault.configmap, fault.refused, refused=True))
            continue
        try:
            hp = HelperPlacement.from_json({**req["placement"], "cluster": cluster.to_json()})
            K8sHelperExecutor.revert_from(core, hp, req["type"], req["record"],
                                          SignedRecords(core, namespace, hp.run_id, key))
            out.append(Replayed(fault.key, fault.configmap))
        except Exception as e:  # one fault's failure never stops the others
            out.append(Replayed(fault.key, fault.configmap, f"{type(e).__name__}: {e}"))
    return out
