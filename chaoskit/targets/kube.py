"""Resolve a Kubernetes target (namespace + label selector + mode) into plain-JSON pod placements.

`target: {kubernetes: {namespace, selector, container, mode: one|all|fixed|percent, value}}` -> the Running
pods it means, each as a Placement (pod name + UID, node, container name + ID), chosen deterministically from a
seed. The cluster is reached through a kubeconfig (or the pod's service account in a cluster); a host with
neither fails preflight (exit 4) with the reason.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from chaoskit.errors import PreflightError
from chaoskit.model.types import StrictModel

Mode = Literal["one", "all", "fixed", "percent"]


class KubeCluster(StrictModel):
    """How to reach the API server: a kubeconfig file (default $KUBECONFIG, then ~/.kube/config) and context,
    or the service account of the pod chaoskit runs in."""

    kubeconfig: str | None = Field(None, description="kubeconfig path (default: $KUBECONFIG, ~/.kube/config)")
    context: str | None = Field(None, description="kubeconfig context (default: its current-context)")


class KubePods(KubeCluster):
    """Pods by namespace and labels."""

    namespace: str = Field("default", min_length=1, description="namespace of the pods")
    selector: dict[str, str] = Field(min_length=1, description="labels the pods carry, e.g. {app: triton}")

    def label_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))

    def describe(self) -> str:
        return f"pods {self.label_selector()} in namespace {self.namespace}"


# mode -> (value needed, check of the value, what is expected)
_MODES: dict[str, tuple[bool, Any, str]] = {
    "one": (False, None, ""),
    "all": (False, None, ""),
    "fixed": (True, lambda v: v >= 1 and float(v).is_integer(), "a whole number of pods >= 1"),
    "percent": (True, lambda v: 0 < v <= 100, "a percentage in (0, 100]"),
}


class KubeSelector(KubePods):
    """The pods a fault acts on."""

    container: str | None = Field(None, min_length=1, description="container name (default: the pod's first)")
    mode: Mode = Field("one", description="one pod, all, a fixed number (value) or a percent (value) of them")
    value: float | None = Field(None, description="for fixed: how many pods; for percent: which share")
    seed: int = Field(0, description="the choice among matching pods is the same for the same seed")
    node: str | None = Field(None, min_length=1, description="only the matching pods on this node (e.g. a GPU "
                                                              "node whose health pipeline is under test)")

    @model_validator(mode="after")
    def _value_fits_mode(self) -> Self:
        needed, ok, what = _MODES[self.mode]
        if needed and (self.value is None or not ok(self.value)):
            raise ValueError(f"mode {self.mode}: value must be {what} (got {self.value})")
        if not needed and self.value is not None:
            raise ValueError(f"mode {self.mode}: takes no value")
        return self


class KubeHelper(StrictModel):
    """The helper pods that run a node-level fault on the chosen pods' nodes (deploy/k8s/chaoskit/)."""

    namespace: str = Field("chaoskit", min_length=1, description="where helper pods and the run's ConfigMap live")
    image: str = Field("chaoskit:latest", min_length=1, description="the chaoskit image (deploy/k8s/chaoskit/"
                                                                    "Dockerfile)")
    service_account: str = Field("chaoskit-helper", min_length=1, description="the helper pods' ServiceAccount")
    deadline_s: int = Field(120, ge=10, le=3600, description="activeDeadlineSeconds of each helper pod")
    runtime_class: str | None = Field(None, min_length=1, description="runtimeClassName of a GPU fault's helper "
                                      "(e.g. nvidia; default: the node's default runtime, which must inject GPUs)")


class KubeNodeSelector(KubeSelector):
    """The pods whose namespaces, cgroups or processes a node-level fault acts on, and its helper pods."""

    helper: KubeHelper = Field(default_factory=KubeHelper, description="helper pod settings")


class KubeTargetSpec(StrictModel):
    kubernetes: KubeSelector = Field(description="pods chosen by namespace, labels and mode")


@dataclass(frozen=True)
class ClusterRef:
    """The resolved way to the API server, as JSON in revert records (a fresh process reaches the same one)."""

    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ClusterRef:
        return cls(d.get("kubeconfig"), d.get("context"), bool(d.get("in_cluster")))


@dataclass(frozen=True)
class Placement:
    """One chosen pod: where a fault acts."""

    namespace: str
    pod: str
    uid: str
    node: str
    container: str
    container_id: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Placement:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def resolve_cluster(cluster: KubeCluster) -> ClusterRef:
    """Which kubeconfig (or in-cluster service account) to use; PreflightError naming what was looked for."""
    if cluster.kubeconfig:
        path = Path(cluster.kubeconfig).expanduser()
        if not path.is_file():
            raise PreflightError(f"kubernetes: kubeconfig {path} does not exist")
        return ClusterRef(str(path.resolve()), cluster.context)
    env = os.environ.get("KUBECONFIG", "")
    files = [p for p in env.split(os.pathsep) if p and Path(p).is_file()]
    if files:
        return ClusterRef(os.pathsep.join(str(Path(p).resolve()) for p in files), cluster.context)
    default = Path.home() / ".kube" / "config"
    if not env and default.is_file():
        return ClusterRef(str(default), cluster.context)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return ClusterRef(None, None, in_cluster=True)
    looked = f"$KUBECONFIG ({env})" if env else f"$KUBECONFIG (unset), {default}"
    raise PreflightError(f"kubernetes: no kubeconfig found ({looked}) and not running in a pod "
                         "($KUBERNETES_SERVICE_HOST unset); set kubeconfig: in the target or export KUBECONFIG")


def api_client(ref: ClusterRef) -> Any:
    """A kubernetes ApiClient for `ref`; PreflightError if the kubeconfig cannot be used (bad context ...)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if ref.in_cluster:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        return config.new_client_from_config(config_file=ref.kubeconfig, context=ref.context)
    except (ConfigException, OSError, ValueError) as e:
        raise PreflightError(f"kubernetes: cannot use {ref.kubeconfig or 'the in-cluster config'}: {e}") from None


def how_many(mode: str, value: float | None, matching: int) -> int:
    """Pods a mode asks for out of `matching`: one 1, all every one, fixed `value`, percent ceil(value%)."""
    if mode == "one":
        return 1
    if mode == "all":
        return matching
    if mode == "fixed":
        return int(value or 0)
    return math.ceil((value or 0) * matching / 100)


def running_pods(core: Any, target: KubePods) -> list[Any]:
    """Pods matching the selector that are Running and not being deleted, by name."""
    pods = core.list_namespaced_pod(target.namespace, label_selector=target.label_selector()).items
    live = [p for p in pods if p.status and p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    return sorted(live, key=lambda p: p.metadata.name)


def choose(core: Any, target: KubeSelector) -> list[Placement]:
    """The placements the target means now; PreflightError if nothing (or too little) matches."""
    pods = [p for p in running_pods(core, target) if target.node is None or p.spec.node_name == target.node]
    if not pods:
        on = f" on node {target.node}" if target.node else ""
        raise PreflightError(f"kubernetes: no Running pod matches {target.describe()}{on}")
    k = how_many(target.mode, target.value, len(pods))
    if k > len(pods):
        raise PreflightError(f"kubernetes: mode fixed asks for {k} pods but only {len(pods)} Running pods match "
                             f"{target.describe()}")
    chosen = sorted(random.Random(target.seed).sample(pods, k), key=lambda p: p.metadata.name)
    return [placement(p, target.container) for p in chosen]


def placement(pod: Any, container: str | None) -> Placement:
    names = [c.name for c in pod.spec.containers]
    name = container or names[0]
    if name not in names:
        raise PreflightError(f"kubernetes: pod {pod.metadata.name} has no container '{name}' "
                             f"(it has {', '.join(names)})")
    status = next((s for s in pod.status.container_statuses or [] if s.name == name), None)
    return Placement(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid, pod.spec.node_name or "",
                     name, (status.container_id if status else None) or "")
