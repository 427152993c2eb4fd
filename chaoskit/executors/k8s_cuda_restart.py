"""gpu.cuda_fault's `prepare: restart` inside a run (the k8s-helper executor calls these): the chosen pods'
Deployments not prepared yet are wrapped with the interposer (k8s_cuda_wrap's patch and signed annotation, naming
the fault), the run waits for their rollouts and arms the new pods; revert restores exactly those Deployments
and waits for that rollout too. A Deployment prepared before the run stays prepared."""

from __future__ import annotations

from typing import Any

from chaoskit.errors import PreflightError
from chaoskit.executors.k8s_cuda_wrap import (
    ANNOTATION,
    AnnotationRefused,
    Obj,
    WrapRefused,
    read_deployment,
    recorded,
    restore,
    wait_rollout,
    wrap,
    wrap_change,
)
from chaoskit.executors.k8s_pods import HelperPlacement, placed
from chaoskit.executors.k8s_records import KeyUnavailable, read_key
from chaoskit.gpu.cuda_fault_ctl import ENV
from chaoskit.injectors import Injector, injector_class
from chaoskit.injectors.gpu.cuda_fault import CudaFault, PodRestartRecord
from chaoskit.targets.kube import KubeNodeSelector, api_client, choose, running_pods


def _restarts(injector: Injector) -> bool:
    """Does this fault on pods prepare their Deployments itself (its pod_preparation hook)?"""
    return injector.pod_preparation() == "restart"


def _cuda_fault(injector: Injector) -> bool:
    return injector.pod_preparation() != "none"


def _apis(hp: HelperPlacement) -> tuple[Any, Any]:
    """(AppsV1Api, CoreV1Api) of the placement's cluster."""
    from kubernetes import client

    api = api_client(hp.cluster)
    return client.AppsV1Api(api), client.CoreV1Api(api)


def _chosen_pods(core: Any, selector: KubeNodeSelector, hp: HelperPlacement) -> list[Any]:
    """The V1Pods of the placement's chosen pods (listed again: their owners and containers' env)."""
    by_name = {p.metadata.name: p for p in running_pods(core, selector)}
    out = []
    for t in hp.pods():
        pod = by_name.get(t.pod)
        if pod is None:
            raise PreflightError(f"gpu.cuda_fault: pod {t.namespace}/{t.pod} is gone")
        out.append(pod)
    return out


def deployment_of(pod: Any) -> str | None:
    """The Deployment that runs a pod, by its ReplicaSet (the controller names it DEPLOYMENT-HASH, HASH the pod's
    pod-template-hash label); None for a pod no Deployment runs."""
    rs = next((o for o in pod.metadata.owner_references or [] if o.kind == "ReplicaSet" and o.controller), None)
    suffix = "-" + ((pod.metadata.labels or {}).get("pod-template-hash") or "")
    if rs is None or suffix == "-" or not rs.name.endswith(suffix):
        return None
    return rs.name[:-len(suffix)]


def owners(pods: list[Any]) -> list[str]:
    """The Deployments (names, in the pods' order) that run the pods; PreflightError naming a pod none runs."""
    out: list[str] = []
    for pod in pods:
        name = deployment_of(pod)
        if name is None:
            raise PreflightError(f"gpu.cuda_fault: prepare: restart: pod {pod.metadata.namespace}/{pod.metadata.name} "
                                 "is not run by a Deployment (no ReplicaSet owner with its pod-template-hash)")
        if name not in out:
            out.append(name)
    return out


def _interposed(pod: Any, container: str) -> bool:
    """Does the pod's container start with the interposer (CHAOSKIT_CUDA_FAULT in its env)?"""
    c = next((c for c in pod.spec.containers if c.name == container), None)
    return c is not None and any(e.name == ENV for e in c.env or [])


def _survey(injector: Injector) -> tuple[Any, Any, HelperPlacement, list[str], dict[str, Obj]]:
    """(apps, core, placement, the chosen pods' Deployments, those not prepared yet by name -> their Deployment)."""
    hp = placed(injector)
    apps, core = _apis(hp)
    spec: Any = injector.spec
    names = owners(_chosen_pods(core, spec.kubernetes, hp))
    ns = spec.kubernetes.namespace
    fresh = {}
    for name in names:
        d = read_deployment(apps, ns, name)
        if (d["metadata"].get("annotations") or {}).get(ANNOTATION) is None:
            fresh[name] = d
    return apps, core, hp, names, fresh


def preflight(injector: Injector) -> None:
    """For a gpu.cuda_fault on pods: with prepare none, PreflightError naming a chosen pod whose container does not
    start with the interposer; with restart, naming a Deployment that cannot be prepared (nothing is changed)."""
    if not _cuda_fault(injector):
        return
    from kubernetes.client.exceptions import ApiException

    spec: Any = injector.spec
    try:
        if not _restarts(injector):
            hp = placed(injector)
            pods = _chosen_pods(_apis(hp)[1], spec.kubernetes, hp)
            for pod, target in zip(pods, hp.pods(), strict=True):
                container = target.container
                if not _interposed(pod, container):
                    raise PreflightError(
                        f"gpu.cuda_fault: pod {pod.metadata.namespace}/{pod.metadata.name} container {container} was "
                        f"not started with the CUDA interposer (no {ENV} in its env): prepare its Deployment with "
                        "`chaoskit cuda-wrap --deployment NAMESPACE/NAME`, or set `prepare: restart` (a rollout in "
                        "the run)")
            return
        apps, core, hp, names, fresh = _survey(injector)
        key = read_key(core, hp.namespace)
        for name in names:
            if name in fresh:
                wrap_change(fresh[name], hp.image)
            else:
                recorded(key, read_deployment(apps, spec.kubernetes.namespace, name))
    except (WrapRefused, AnnotationRefused, KeyUnavailable) as e:
        raise PreflightError(f"gpu.cuda_fault: prepare: restart: {e}") from None
    except ApiException as e:  # refused (RBAC) or failed: nothing was changed
        raise PreflightError(f"gpu.cuda_fault: the API server answered {e.status} {e.reason}") from None


def plan(injector: Injector) -> list[str]:
    """The lines said before the helpers' for a gpu.cuda_fault with prepare: restart: which Deployments restart."""
    if not _restarts(injector):
        return []
    try:
        _, _, hp, names, fresh = _survey(injector)
    except Exception as e:
        return [f"(no plan of the restart: {type(e).__name__}: {e})"]
    spec: Any = injector.spec
    ns, limit = spec.kubernetes.namespace, f"{spec.rollout_timeout:g}s"
    lines = [f"restart (rollout) of deployment {ns}/{name} first, waited for (up to {limit}): "
             + wrap_change(d, hp.image).plan[0].split(": ", 1)[1]
             + "; the fault is then armed in its new pods (chosen again: those named below are replaced); revert: "
             "disarm, then restore its template (a second rollout, waited for too)" for name, d in fresh.items()]
    lines += [f"deployment {ns}/{name} is prepared already: no restart, and it stays prepared after the run"
              for name in names if name not in fresh]
    return lines


def prepared(injector: Injector) -> Obj:
    """The k8s-helper record's `restart` part known before apply (empty without prepare: restart): the
    Deployments this fault may prepare, restored on revert only where their annotation names it."""
    if not _restarts(injector):
        return {}
    _, _, hp, _, fresh = _survey(injector)
    spec: Any = injector.spec
    ns = spec.kubernetes.namespace
    return {"restart": PodRestartRecord(owner=f"{hp.run_id}/{hp.key}", deployments=[f"{ns}/{n}" for n in fresh],
                                        timeout_s=spec.rollout_timeout).model_dump()}


def roll_out(injector: Injector, record: Obj, hp: HelperPlacement) -> tuple[Obj, HelperPlacement]:
    """Prepare the Deployments of the record's `restart` still unprepared, wait for their rollouts, and choose
    the pods again (the new ones): ({"restart": its final record}, the helpers' placement on the new pods); ({},
    hp) for a record without `restart`. RolloutStalled naming a Deployment whose rollout did not finish (what was
    prepared is in the ledger's record: revert restores it)."""
    if "restart" not in record:
        return {}, hp
    r: PodRestartRecord = CudaFault.read_record_as(PodRestartRecord, record["restart"])
    spec: Any = injector.spec
    apps, core = _apis(hp)
    done = []
    containers = [spec.kubernetes.container] if spec.kubernetes.container else None
    for ref in r.deployments:
        ns, name = ref.split("/", 1)
        if wrap(apps, core, ns, name, hp.image, containers, hp.namespace, owner=r.owner) is not None:
            done.append(ref)
    for ref in r.deployments:  # also one another fault or hand prepared meanwhile: its pods are changing too
        wait_rollout(apps, *ref.split("/", 1), r.timeout_s)
    pods = choose(core, spec.kubernetes)
    bare = [f"{p.namespace}/{p.pod}" for p in pods if not p.container_id]
    if bare:
        raise RuntimeError(f"gpu.cuda_fault: after the rollout, pod(s) {', '.join(bare)} have no container ID yet")
    new = hp.model_copy(update={"node": pods[0].node, "targets": pods})
    return {"restart": r.model_copy(update={"deployments": done, "placement": new}).to_json()}, new


def read_restart(type_name: str, record: Obj) -> PodRestartRecord | None:
    """The record's `restart` part as the fault family's PodRestartRecord (RecordError naming each wrong field,
    before anything is undone); None without one."""
    if not isinstance(record, dict) or "restart" not in record:
        return None
    return injector_class(type_name).read_record_as(PodRestartRecord, record["restart"])


def after_restart(type_name: str, record: Obj, placement: Obj) -> tuple[PodRestartRecord | None, Obj]:
    """(the record's restart part, read_restart's; the placement to act on: the helpers' on the pods a restart
    chose, else `placement`)."""
    restart = read_restart(type_name, record)
    return restart, (restart.placement.to_json() if restart and restart.placement else None) or placement


def undo(restart: PodRestartRecord | None, hp: HelperPlacement) -> None:
    """After the pods are disarmed: restore each Deployment the restart record names whose annotation this fault
    wrote (a second rollout), and wait for those rollouts (RolloutStalled naming one that does not finish).
    Idempotent: a Deployment restored already, or prepared by someone else, is left as it is."""
    if restart is None:
        return
    apps, core = _apis(hp)
    for ref in restart.deployments:
        ns, name = ref.split("/", 1)
        try:
            restored = restore(apps, core, ns, name, hp.namespace, owner=restart.owner)
        except WrapRefused:  # the Deployment is gone: nothing to restore
            continue
        if restored is not None:  # None: restored already, or prepared by another: not this fault's rollout
            wait_rollout(apps, ns, name, restart.timeout_s)
