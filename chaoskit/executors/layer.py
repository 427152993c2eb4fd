"""The target layer: where a fault lands and which executor runs it, decided at preflight for the plan and again
when the step starts (so the ledger, apply and revert see the same).

A fault that stays on this host (`local`) gets its spec's target resolved into a typed record
(targets.local: processes, a network namespace, cgroup members, a GPU), which the ledger keeps as its placement.
A node-level fault (network, the proxies' interception, process.signal, the cpu, memory and disk limits, GPU
memory pressure) whose spec targets `kubernetes:` pods runs through the k8s-helper executor: the chosen pods (namespace, name, UID, node,
container ID) become its placement, and on each node the helper pod turns the target into that container's PIDs,
for a cgroup limit into the container's own cgroup, or for a GPU fault into the GPU it was given
(`localize_on_node`), and runs the same injector code, which resolves its local target there. What a fault can
do is declared on its class: its executors, its `kubernetes:` target field, what its helper pod is granted.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import K8S_HELPER, Injector
from chaoskit.targets.kube import KubeNodeSelector


def node_selector(inj: Injector) -> KubeNodeSelector | None:
    """The `kubernetes:` pod target of a fault that can run in a helper pod, at its class's target_field (None:
    the fault stays on this host)."""
    if K8S_HELPER not in inj.executors or not inj.target_field:
        return None
    holder: Any = inj.spec
    for name in inj.target_field.split("."):
        holder = getattr(holder, name, None)
    return holder if isinstance(holder, KubeNodeSelector) else None


def place(inj: Injector) -> None:
    """Resolve a fault's target into its context: the typed local target, or for a Kubernetes node target the
    pods chosen now and a k8s-helper placement. PreflightError (exit 4) if the target means nothing here, the
    cluster cannot be reached or the pods do not qualify."""
    selector = node_selector(inj)
    if selector is None:
        try:
            inj.ctx.target = inj.resolve_target()
        except (OSError, ValueError) as e:  # the host changed under it (a process gone mid-read ...)
            raise PreflightError(f"{inj.type}: cannot resolve its target: {type(e).__name__}: {e}") from None
        return
    from kubernetes import client

    from chaoskit.injectors.placement import HelperPlacement
    from chaoskit.targets.kube import api_client, choose, resolve_cluster

    try:
        cluster = resolve_cluster(selector)
        pods = choose(client.CoreV1Api(api_client(cluster)), selector)
    except PreflightError as e:
        raise PreflightError(f"{inj.type}: {e}") from None
    unstarted = [p.pod for p in pods if not p.container_id]
    if unstarted:
        raise PreflightError(f"{inj.type}: container {pods[0].container} has no container ID yet in pod(s) "
                             f"{', '.join(unstarted)} (not started)")
    helper = selector.helper
    inj.ctx.executor = K8S_HELPER
    inj.ctx.placement = HelperPlacement(
        cluster=cluster, node=pods[0].node, run_id=inj.ctx.run_id or "adhoc", namespace=helper.namespace,
        image=helper.image, service_account=helper.service_account, deadline_s=helper.deadline_s,
        runtime_class=helper.runtime_class, targets=pods, hold_s=inj.ctx.lifetime_s)


def localize(spec: dict[str, Any], pids: list[int] | None = None, cgroup: str | None = None,
             field: str | None = None) -> dict[str, Any]:
    """The spec a helper applies on the node: its `kubernetes:` target (at `field`, the class's target_field;
    default `target.kubernetes` or `kubernetes`) replaced by the container's processes: in a nested target (a
    network namespace: `target`, `intercept.target`) the PID of its init, pids[0]; at the top (process.signal)
    every one of them; or for a cgroup fault by the container's own cgroup (relative to the hierarchy's root)."""
    out = copy.deepcopy(spec)
    *up, last = (field or _default_field(out)).split(".")
    parent: Any = out
    for name in up:
        parent = parent.get(name) if isinstance(parent, dict) else None
    if not isinstance(parent, dict) or last not in parent:
        raise ValueError("the spec has no kubernetes: target to localize")
    if up and pids:
        del parent[last]
        parent["pid"] = pids[0]
    elif not up and (pids or cgroup):
        del parent[last]
        parent.update({"cgroup": cgroup} if cgroup else {"pid": pids})
    else:
        raise ValueError("the spec has no kubernetes: target to localize")
    return out


def _default_field(spec: dict[str, Any]) -> str:
    """Where a spec without a declared target_field has its `kubernetes:` target."""
    target = spec.get("target")
    return "target.kubernetes" if isinstance(target, dict) and "kubernetes" in target else "kubernetes"


def localize_on_node(cls: type[Injector], spec: dict[str, Any], container_id: str) -> BaseModel:
    """The fault's spec as applied on this node (its Spec), localize()d with what this node knows of the
    container: what the fault's own on_node() makes of it (its GPU), else its cgroup for a fault that limits a
    whole cgroup, else its processes (ContainerNotFound if it is not here)."""
    from chaoskit.targets.container import container_cgroup, container_pids

    own = cls.on_node(cls.Spec.model_validate(spec), container_id)
    if own is not None:
        return own
    hier = cls.cgroup_hierarchy()
    if hier is None:
        return cls.Spec.model_validate(localize(spec, container_pids(container_id), field=cls.target_field))
    out = localize(spec, cgroup=str(container_cgroup(hier.root, container_id).relative_to(hier.root)),
                   field=cls.target_field)
    if isinstance(out.get("path"), str):  # a path as the container sees it: through its init's root
        out["path"] = f"/proc/{container_pids(container_id)[0]}/root/{out['path'].lstrip('/')}"
    return cls.Spec.model_validate(out)
