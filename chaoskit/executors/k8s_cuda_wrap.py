"""Prepare a Kubernetes Deployment for gpu.cuda_fault once (its GPU containers start with the interposer), and undo it.

`chaoskit cuda-wrap --deployment NS/NAME` patches the pod template: a volume (emptyDir) mounted at MOUNT, an init
container (the chaoskit image) that installs the interposer and a disarmed control file there, and in each GPU
container LD_PRELOAD (ahead of a literal one it had) and CHAOSKIT_CUDA_FAULT. That is a rollout: every pod is
restarted once. From then on gpu.cuda_fault arms and disarms the pods' control files through helper pods, without
another restart. What the template had is kept in an annotation of the Deployment, signed like the revert records
(k8s_records: an HMAC with the installation's key), and `--restore` takes out exactly what was added (a second
rollout), leaving alone any other change made meanwhile; an annotation that does not check is refused.
"""

from __future__ import annotations

import copy
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

from chaoskit.executors.k8s_records import MAC_FIELD, ensure_key, mac, read_key
from chaoskit.gpu.cuda_fault_ctl import ENV
from chaoskit.gpu.cuda_fault_install import CONTROL, LIBRARY, MOUNT

ANNOTATION = "chaoskit.io/cuda-wrap"
VOLUME = "chaoskit-cuda"
INIT = "chaoskit-cuda-install"
PRELOAD = "LD_PRELOAD"
GPU_PREFIXES = ("nvidia.com/",)  # nvidia.com/gpu, nvidia.com/mig-1g.10gb ...
MERGE_PATCH = "application/merge-patch+json"
OWNER = "by"  # in the annotation's record: the fault (RUN/KEY) that prepared the Deployment in a run
ROLLOUT_POLL_S = 0.5
Obj = dict[str, Any]


class WrapRefused(RuntimeError):
    """The Deployment cannot be prepared (or restored) as it stands; nothing was changed."""


class AnnotationRefused(RuntimeError):
    """The annotation that records what the template had does not check: it is never applied."""


class RolloutStalled(RuntimeError):
    """A Deployment's rollout did not finish in time (its pods are not all new and ready)."""


@dataclass(frozen=True)
class Change:
    """A merge patch for the Deployment and the plan of it, in words."""

    patch: Obj
    plan: list[str]
    containers: list[str]


def gpu_containers(pod_spec: Obj) -> list[str]:
    """The containers that ask for a GPU: an nvidia.com/* resource, or a resource claim (DRA)."""
    out = []
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        names = {*(res.get("limits") or {}), *(res.get("requests") or {})}
        if any(n.startswith(GPU_PREFIXES) for n in names) or res.get("claims"):
            out.append(c["name"])
    return out


def _env_value(container: Obj, name: str) -> Obj | None:
    return next((e for e in container.get("env") or [] if e.get("name") == name), None)


def _check(where: str, pod_spec: Obj, chosen: list[str]) -> None:
    """WrapRefused if a chosen container's LD_PRELOAD cannot be kept, or the template already has our names."""
    if any(v.get("name") == VOLUME for v in pod_spec.get("volumes") or []) or any(
            c.get("name") == INIT for c in pod_spec.get("initContainers") or []):
        raise WrapRefused(f"{where}: its template already has a volume {VOLUME} or an init container {INIT} (but "
                          f"no annotation {ANNOTATION}): prepared by hand? Remove them first")
    for c in pod_spec["containers"]:
        if c["name"] not in chosen:
            continue
        if _env_value(c, ENV) is not None:
            raise WrapRefused(f"{where}: container {c['name']} already sets {ENV} (prepared by hand?)")
        pre = _env_value(c, PRELOAD)
        if pre is not None and "valueFrom" in pre:
            raise WrapRefused(f"{where}: container {c['name']} takes {PRELOAD} from a reference (valueFrom): it "
                              "cannot be kept alongside the interposer; give it as a literal value first")
        source = _preload_from(c) if pre is None else None  # a literal env entry wins over envFrom
        if source is not None:
            raise WrapRefused(f"{where}: container {c['name']} may take {PRELOAD} from envFrom {source}: its value "
                              f"cannot be seen here, and the interposer's {PRELOAD} would silently override it; "
                              f"set {PRELOAD} literally in env (it then wins over envFrom and is kept behind the "
                              "interposer), or give that envFrom a prefix")


def _preload_from(container: Obj) -> str | None:
    """The envFrom source that may set LD_PRELOAD (`ConfigMap NAME`, `Secret NAME`): one whose prefix (default
    none) LD_PRELOAD starts with; None if none can."""
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix") or ""
        if not PRELOAD.startswith(prefix):
            continue
        kind, ref = ("ConfigMap", src["configMapRef"]) if "configMapRef" in src else ("Secret", src.get("secretRef"))
        return f"{kind} {(ref or {}).get('name', '?')}" + (f" (prefix {prefix})" if prefix else "")
    return None


def _wrapped_container(c: Obj) -> Obj:
    out = copy.deepcopy(c)
    env = out.setdefault("env", [])
    lib = f"{MOUNT}/{LIBRARY}"
    pre = _env_value(out, PRELOAD)
    if pre is None:
        env.append({"name": PRELOAD, "value": lib})
    else:  # the interposer first, the library the container preloaded kept after it
        pre["value"] = " ".join(p for p in (lib, pre.get("value") or "") if p)
    env.append({"name": ENV, "value": f"{MOUNT}/{CONTROL}"})
    out.setdefault("volumeMounts", []).append({"name": VOLUME, "mountPath": MOUNT})
    return out


def init_container(image: str) -> Obj:
    """The init container that installs the interposer and a disarmed control file (restricted-policy safe)."""
    return {"name": INIT, "image": image, "command": ["python", "-m", "chaoskit.gpu.cuda_fault_install", MOUNT],
            "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}],
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True, "runAsUser": 65534, "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "RuntimeDefault"}}}


def wrap_change(deployment: Obj, image: str, containers: list[str] | None = None, owner: str | None = None) -> Change:
    """The patch that prepares the Deployment (pure: from the object as the API returns it). WrapRefused if it
    has no GPU container (and none is named), names an unknown one, or a chosen container's LD_PRELOAD cannot
    be kept. `owner`: the fault (RUN/KEY) that prepares it in a run, kept in the annotation."""
    ns, name = deployment["metadata"]["namespace"], deployment["metadata"]["name"]
    where = f"deployment {ns}/{name}"
    template = deployment["spec"]["template"]
    pod = template["spec"]
    names = [c["name"] for c in pod["containers"]]
    chosen = list(containers or gpu_containers(pod))
    if not chosen:
        raise WrapRefused(f"{where} has no container that asks for a GPU (an nvidia.com/* resource or a resource "
                          f"claim; it has {', '.join(names)}): name the container with --container")
    unknown = [c for c in chosen if c not in names]
    if unknown:
        raise WrapRefused(f"{where} has no container {', '.join(unknown)} (it has {', '.join(names)})")
    _check(where, pod, chosen)
    kept = {c["name"]: (_env_value(c, PRELOAD) or {}).get("value") for c in pod["containers"] if c["name"] in chosen}
    original = {k: pod.get(k) for k in ("containers", "initContainers", "volumes")}
    record = {"containers": chosen, "image": image, "original": original, **({OWNER: owner} if owner else {})}
    patch = {"metadata": {"annotations": {ANNOTATION: record}}, "spec": {"template": {"spec": {
        "initContainers": [*(pod.get("initContainers") or []), init_container(image)],
        "volumes": [*(pod.get("volumes") or []), {"name": VOLUME, "emptyDir": {"sizeLimit": "16Mi"}}],
        "containers": [_wrapped_container(c) if c["name"] in chosen else c for c in pod["containers"]]}}}}
    ahead = [f"{c} (ahead of its own {v})" for c, v in kept.items() if v]
    plan = [
        f"{where}: container(s) {', '.join(chosen)} get {PRELOAD}={MOUNT}/{LIBRARY}"
        + (f" — {', '.join(ahead)}" if ahead else "") + f" and {ENV}={MOUNT}/{CONTROL}; volume {VOLUME} "
        f"(emptyDir) mounted at {MOUNT}; init container {INIT} ({image}) installs the interposer and a disarmed "
        "control file there",
        f"this is a rollout: every pod of {where} is restarted now (and once more on --restore); the pods that "
        "faults then reach are new pods, started with the interposer (a loaded, disarmed interposer passes every "
        "call through)",
        f"what the template had is kept in annotation {ANNOTATION}, signed with the installation's key; undo: "
        f"chaoskit cuda-wrap --deployment {ns}/{name} --restore",
    ]
    return Change(patch, plan, chosen)


def _binding(ns: str, name: str) -> str:
    return f"deployment/{ns}/{name}"  # the MAC covers which Deployment it was written for


def signed(key: bytes, ns: str, name: str, change: Change) -> Change:
    """The change with its annotation as a signed JSON string."""
    record = change.patch["metadata"]["annotations"][ANNOTATION]
    text = json.dumps({**record, MAC_FIELD: mac(key, _binding(ns, name), ANNOTATION, record)}, sort_keys=True)
    patch = {**change.patch, "metadata": {"annotations": {ANNOTATION: text}}}
    return Change(patch, change.plan, change.containers)


def recorded(key: bytes | None, deployment: Obj) -> Obj | None:
    """What cuda-wrap recorded on the Deployment (None: it was not prepared); AnnotationRefused if it does not
    check (changed after chaoskit wrote it, or no key to check it with)."""
    meta = deployment["metadata"]
    raw = (meta.get("annotations") or {}).get(ANNOTATION)
    if raw is None:
        return None
    where = f"deployment {meta['namespace']}/{meta['name']}: annotation {ANNOTATION}"
    try:
        data = json.loads(raw)
    except ValueError:
        raise AnnotationRefused(f"{where} is not JSON (changed after chaoskit wrote it)") from None
    got = data.pop(MAC_FIELD, None) if isinstance(data, dict) else None
    if not isinstance(got, str) or key is None or not hmac.compare_digest(
            got.encode(), mac(key, _binding(meta["namespace"], meta["name"]), ANNOTATION, data).encode()):
        why = "there is no key to check it with" if key is None and isinstance(got, str) else \
            "it fails its MAC check: changed after chaoskit wrote it (or signed with another installation's key)"
        raise AnnotationRefused(f"{where}: {why}; nothing was changed")
    return data


def restore_change(deployment: Obj, record: Obj) -> Change:
    """The patch that takes out exactly what wrap added (pure): our init container, volume, mounts and
    variables, and each container's own LD_PRELOAD as it was; other changes made since are kept."""
    ns, name = deployment["metadata"]["namespace"], deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]["spec"]
    original = {c["name"]: c for c in record["original"].get("containers") or []}
    containers = [_unwrapped(c, original.get(c["name"], {})) if c["name"] in record["containers"] else c
                  for c in pod["containers"]]
    inits = [c for c in pod.get("initContainers") or [] if c.get("name") != INIT]
    volumes = [v for v in pod.get("volumes") or [] if v.get("name") != VOLUME]
    patch = {"metadata": {"annotations": {ANNOTATION: None}}, "spec": {"template": {"spec": {
        "containers": containers, "initContainers": inits or None, "volumes": volumes or None}}}}
    unchanged = (containers, inits, volumes) == (pod["containers"], pod.get("initContainers") or [],
                                                 pod.get("volumes") or [])
    plan = [f"deployment {ns}/{name}: its template no longer has the interposer (changed since): only the "
            f"annotation {ANNOTATION} is removed" if unchanged else
            f"deployment {ns}/{name}: take out the interposer (init container {INIT}, volume {VOLUME}, {PRELOAD} "
            f"and {ENV} of {', '.join(record['containers'])}); this is a rollout: every pod is restarted"]
    return Change(patch, plan, list(record["containers"]))


def _unwrapped(c: Obj, before: Obj) -> Obj:
    out = copy.deepcopy(c)
    own = _env_value(before, PRELOAD)
    env = []
    for e in out.get("env") or []:
        if e.get("name") == ENV:
            continue
        if e.get("name") == PRELOAD:
            if own is None:
                continue
            e = own
        env.append(e)
    mounts = [m for m in out.get("volumeMounts") or [] if m.get("name") != VOLUME]
    for key, value in (("env", env), ("volumeMounts", mounts)):
        if value or key in before:
            out[key] = value
        else:
            out.pop(key, None)
    return out


def read_deployment(apps: Any, ns: str, name: str) -> Obj:
    """The Deployment as plain JSON; WrapRefused if there is none."""
    from kubernetes.client.exceptions import ApiException

    try:
        resp = apps.read_namespaced_deployment(name, ns, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            raise WrapRefused(f"no deployment {ns}/{name}") from None
        raise
    return json.loads(resp.data)


def patch_deployment(apps: Any, ns: str, name: str, patch: Obj) -> None:
    apps.patch_namespaced_deployment(name, ns, patch, _content_type=MERGE_PATCH, _preload_content=False)


def wrap(apps: Any, core: Any, ns: str, name: str, image: str, containers: list[str] | None, key_namespace: str,
         dry_run: bool = False, owner: str | None = None) -> Change | None:
    """Prepare the Deployment (None: it already is). WrapRefused / AnnotationRefused as above."""
    deployment = read_deployment(apps, ns, name)
    if (deployment["metadata"].get("annotations") or {}).get(ANNOTATION) is not None:
        recorded(read_key(core, key_namespace), deployment)  # refused if it does not check
        return None
    change = wrap_change(deployment, image, containers, owner)
    if dry_run:
        return change
    change = signed(ensure_key(core, key_namespace), ns, name, change)
    patch_deployment(apps, ns, name, change.patch)
    return change


def restore(apps: Any, core: Any, ns: str, name: str, key_namespace: str, dry_run: bool = False,
            owner: str | None = None) -> Change | None:
    """Undo wrap (None: it was not prepared, or with `owner`, not by that fault). AnnotationRefused if its record
    does not check."""
    deployment = read_deployment(apps, ns, name)
    if (deployment["metadata"].get("annotations") or {}).get(ANNOTATION) is None:
        return None
    record = recorded(read_key(core, key_namespace), deployment)
    assert record is not None
    if owner is not None and record.get(OWNER) != owner:
        return None
    change = restore_change(deployment, record)
    if not dry_run:
        patch_deployment(apps, ns, name, change.patch)
    return change


def rollout_done(deployment: Obj) -> bool:
    """Whether the Deployment's rollout has finished: its controller saw the latest template (observedGeneration
    >= generation) and every replica is new and ready (updated == ready == replicas == spec.replicas)."""
    meta, status = deployment["metadata"], deployment.get("status") or {}
    want = deployment["spec"].get("replicas", 1)
    return status.get("observedGeneration", 0) >= meta.get("generation", 0) and (
        status.get("updatedReplicas", 0) == status.get("readyReplicas", 0) == status.get("replicas", 0) == want)


def _progress(deployment: Obj) -> str:
    """Where a rollout stands, in words."""
    meta, status = deployment["metadata"], deployment.get("status") or {}
    return (f"generation {meta.get('generation', 0)}, observed {status.get('observedGeneration', 0)}; "
            f"{status.get('updatedReplicas', 0)} updated, {status.get('readyReplicas', 0)} ready, "
            f"{status.get('replicas', 0)} in all, of {deployment['spec'].get('replicas', 1)} replicas")


def wait_rollout(apps: Any, ns: str, name: str, timeout_s: float, poll_s: float = ROLLOUT_POLL_S) -> None:
    """Wait until the Deployment's rollout has finished; RolloutStalled naming it (and where it stands) if it has
    not within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        deployment = read_deployment(apps, ns, name)
        if rollout_done(deployment):
            return
        if time.monotonic() >= deadline:
            raise RolloutStalled(f"deployment {ns}/{name}: its rollout did not finish within {timeout_s:g}s "
                                 f"({_progress(deployment)})")
        time.sleep(poll_s)
