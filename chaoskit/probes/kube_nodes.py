"""kube.nodes probe: the chosen nodes' conditions, taints, cordon state and GPUs (allocatable, allocated, DRA device
taints), optionally where a set of pods runs, and stages (detect, cordon, drain ...) timed from each fault."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, field_validator, model_validator

from chaoskit.errors import PreflightError
from chaoskit.model.events import Event, FaultApplied, FaultReverted
from chaoskit.model.tolerance import Tolerance, parse_tolerance
from chaoskit.model.types import Duration, StrictModel, ToleranceSpec
from chaoskit.probes.base import Probe, ProbeSpecBase
from chaoskit.probes.kube import pod_counts
from chaoskit.targets.kube import KubeCluster, api_client, resolve_cluster

NODE_KEYS = ("nodes", "ready", "not_ready", "cordoned", "tainted", "flagged", "gpu_allocatable", "gpu_allocated",
             "gpu_free", "device_taints", "pods", "pods_ready", "pods_on_nodes")
COUNTED = ("condition.", "taint.")  # a condition or taint named in expect or a stage but on no node counts 0
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")


class KubeNodes(KubeCluster):
    """Nodes by name or labels (neither: every node), and optionally the pods whose placement is followed."""

    names: list[str] | None = Field(None, min_length=1, description="the nodes, by name")
    selector: dict[str, str] | None = Field(None, min_length=1, description="or the nodes carrying these labels")
    pods: dict[str, Any] | None = Field(None, description="{namespace, selector}: pods counted (pods, pods_ready) "
                                        "and where they run (pods_on_nodes: on the chosen nodes)")
    gpu_resource: str = Field("nvidia.com/gpu", min_length=1, description="the extended resource counted as GPUs")
    problem_conditions: list[str] = Field(default_factory=list, description="node condition types that mean a GPU "
                                          "problem (your health pipeline's): `flagged` counts nodes with one True")
    problem_taints: list[str] = Field(default_factory=list, description="taint keys that mean a GPU problem: "
                                      "`flagged` counts nodes carrying one too")

    @model_validator(mode="after")
    def _one(self) -> Self:
        if self.names is not None and self.selector is not None:
            raise ValueError("give names or selector, not both (neither: every node)")
        if self.pods is not None and not isinstance(self.pods.get("selector"), dict):
            raise ValueError("pods: needs selector: {label: value} (and namespace, default 'default')")
        return self

    def describe(self) -> str:
        if self.names:
            return f"nodes {', '.join(self.names)}"
        return f"nodes {','.join(f'{k}={v}' for k, v in sorted(self.selector.items()))}" if self.selector \
            else "every node"


class Stage(StrictModel):
    """A point the pipeline must reach: the first sample where every `when` tolerance holds, timed from each
    fault's apply (or revert), within a deadline."""

    name: str = Field(pattern=r"^[A-Za-z0-9_\-]+$", description="its key: stage_s.NAME is the time it took")
    when: dict[str, ToleranceSpec] = Field(min_length=1, description="tolerances on this probe's values, all true, "
                                           "e.g. {cordoned: '>= 1'}")
    within: Duration = Field(gt=0, description="the deadline, from the fault's apply (or revert)")
    after: Literal["apply", "revert"] = Field("apply", description="which end of the fault window starts the clock")

    @field_validator("when")
    @classmethod
    def _keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key not in NODE_KEYS and not key.startswith((*COUNTED, "condition_age_s.")):
                raise ValueError(f"when: unknown key '{key}'; it measures: {', '.join(NODE_KEYS)}, condition.TYPE, "
                                 "taint.KEY, condition_age_s.TYPE")
        return v

    def rules(self) -> dict[str, Tolerance]:
        return {k: parse_tolerance(t) for k, t in self.when.items()}


class KubeNodesTarget(StrictModel):
    kubernetes: KubeNodes = Field(default_factory=KubeNodes, description="names or selector (kubeconfig, context)")


class KubeNodesProbeSpec(ProbeSpecBase):
    type: Literal["kube.nodes"]
    target: KubeNodesTarget = Field(default_factory=KubeNodesTarget, description="kubernetes: the nodes")
    stages: list[Stage] = Field(default_factory=list, description="points the health pipeline must reach after "
                                "each fault, in any order; a stage missed is named in `late`")
    steps: list[str] = Field(default_factory=list, description="the method steps whose faults start the stages' "
                             "clocks; default: every fault")
    expect_keys: ClassVar[tuple[str, ...]] = (*NODE_KEYS, "late", "overdue", "waiting", "condition.", "taint.",
                                              "condition_age_s.", "stage_s.")

    @model_validator(mode="before")
    @classmethod
    def _default_expect(cls, data: Any) -> Any:
        """With stages and no `expect`: no stage late, none awaited once the faults are reverted."""
        if isinstance(data, dict) and data.get("stages") and "expect" not in data:
            return {**data, "expect": {"late": "~ ^$", "waiting": "== 0"}}
        return data

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [s.name for s in self.stages]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"stages: {', '.join(dupes)} named twice")
        return self

    def counted_keys(self) -> set[str]:
        keys = set(self.flat_expect()) | {k for s in self.stages for k in s.when}
        return {k for k in keys if k.startswith(COUNTED)}


@dataclass
class StageTrack:
    """One stage over one fault window."""

    stage: Stage
    fault: int
    step: str
    applied_at: float
    reverted_at: float | None = None
    reached_at: float | None = None
    late: str | None = None

    @property
    def start(self) -> float | None:
        return self.applied_at if self.stage.after == "apply" else self.reverted_at

    @property
    def took(self) -> float | None:
        return None if self.reached_at is None or self.start is None else round(self.reached_at - self.start, 3)

    def read(self, t: float, values: dict[str, Any]) -> None:
        start = self.start
        if start is None or t < start or self.late is not None:
            return
        if self.reached_at is None and all(tol.check(values.get(k))[0] for k, tol in self.stage.rules().items()):
            self.reached_at = t
        if (self.reached_at or t) > start + self.stage.within:
            seen = f"reached {self.took:g}s after" if self.reached_at else "not reached"
            self.late = (f"{self.stage.name}: {seen} fault #{self.fault} {self.step}'s {self.stage.after} "
                         f"(within {self.stage.within:g}s)")

    @property
    def undecided(self) -> bool:
        return self.late is None and self.reached_at is None


def _since(ts: Any, now: float) -> float | None:
    if isinstance(ts, datetime):
        return round(now - ts.timestamp(), 3)
    return None


def flagged(node: Any, target: KubeNodes) -> bool:
    """A problem condition True or a problem taint on the node (the target's lists)."""
    return any(c.type in target.problem_conditions and c.status == "True" for c in node.status.conditions or []) \
        or any(t.key in target.problem_taints for t in node.spec.taints or [])


def node_values(nodes: list[Any], target: KubeNodes, counted: set[str], now: float) -> dict[str, Any]:
    """Counts over the nodes: ready, cordoned, tainted, flagged, per condition type and taint key, GPUs."""
    gpu = target.gpu_resource
    out: dict[str, Any] = {"nodes": len(nodes), "ready": 0, "cordoned": 0, "tainted": 0, "gpu_allocatable": 0,
                           "flagged": sum(flagged(n, target) for n in nodes)}
    out.update({k: 0 for k in counted})
    for n in nodes:
        conds = n.status.conditions or []
        out["ready"] += any(c.type == "Ready" and c.status == "True" for c in conds)
        out["cordoned"] += bool(n.spec.unschedulable)
        taints = n.spec.taints or []
        out["tainted"] += any(t.effect in SCHEDULING_EFFECTS for t in taints)
        for key in {t.key for t in taints}:
            out[f"taint.{key}"] = out.get(f"taint.{key}", 0) + 1
        for c in conds:
            out[f"condition.{c.type}"] = out.get(f"condition.{c.type}", 0) + (c.status == "True")
            age = _since(c.last_transition_time, now)
            key = f"condition_age_s.{c.type}"
            if age is not None and (key not in out or age < out[key]):
                out[key] = age
        out["gpu_allocatable"] += int(float((n.status.allocatable or {}).get(gpu, 0) or 0))
    out["not_ready"] = len(nodes) - out["ready"]
    return out


def gpus_requested(pod: Any, gpu: str) -> int:
    return sum(int(float(((c.resources and c.resources.requests) or {}).get(gpu, 0) or 0))
               for c in pod.spec.containers or [])


def device_taint_count(slices: list[dict[str, Any]], nodes: set[str]) -> int:
    """Taints on the devices of the nodes' DRA ResourceSlices (resource.k8s.io v1; v1beta1's basic.taints too)."""
    total = 0
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("nodeName") in nodes:
            for d in spec.get("devices") or []:
                total += len(d.get("taints") or (d.get("basic") or {}).get("taints") or [])
    return total


class KubeNodesProbe(Probe):
    type: ClassVar[str] = "kube.nodes"
    summary: ClassVar[str] = ("Kubernetes nodes: conditions, taints, cordon, GPUs allocatable/allocated, DRA device "
                              "taints; stages of the health pipeline timed from each fault")
    host_needs: ClassVar[frozenset[str]] = frozenset({"kube"})
    Spec = KubeNodesProbeSpec
    spec: KubeNodesProbeSpec

    def __init__(self, spec: Any):
        super().__init__(spec)
        self._client: Any = None
        self._lock = threading.Lock()  # faults are journaled from revert threads
        self._tracks: list[StageTrack] = []
        self._open: set[int] = set()

    def _api(self) -> Any:
        if self._client is None:
            self._client = api_client(resolve_cluster(self.spec.target.kubernetes))
        return self._client

    def preflight(self) -> None:
        try:
            self._api()
        except PreflightError as e:
            raise PreflightError(f"probe {self.spec.name} (kube.nodes): {e}") from None

    def note_fault(self, ev: Event) -> None:
        """A fault applied (new stage clocks) or reverted (the clocks of stages timed from the revert)."""
        with self._lock:
            if isinstance(ev, FaultApplied) and (not self.spec.steps or ev.step in self.spec.steps):
                self._open.add(ev.id)
                self._tracks += [StageTrack(s, ev.id, ev.step, ev.applied_at or ev.t) for s in self.spec.stages]
            elif isinstance(ev, FaultReverted) and ev.id in self._open:
                self._open.discard(ev.id)
                for t in self._tracks:
                    if t.fault == ev.id:
                        t.reverted_at = ev.t

    def _nodes(self, core: Any) -> list[Any]:
        target = self.spec.target.kubernetes
        if target.names:
            return [core.read_node(n) for n in target.names]
        selector = ",".join(f"{k}={v}" for k, v in sorted((target.selector or {}).items()))
        return core.list_node(label_selector=selector or None).items

    def _measure(self) -> dict[str, Any]:
        from kubernetes import client

        target, core, now = self.spec.target.kubernetes, client.CoreV1Api(self._api()), time.time()
        nodes = self._nodes(core)
        names = {n.metadata.name for n in nodes}
        out = node_values(nodes, target, self.spec.counted_keys(), now)
        on_nodes = [p for name in sorted(names) for p in core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={name}").items if p.status.phase not in ("Succeeded", "Failed")]
        out["gpu_allocated"] = sum(gpus_requested(p, target.gpu_resource) for p in on_nodes)
        out["gpu_free"] = out["gpu_allocatable"] - out["gpu_allocated"]
        if target.pods is not None:
            pods = core.list_namespaced_pod(target.pods.get("namespace", "default"), label_selector=",".join(
                f"{k}={v}" for k, v in sorted(target.pods["selector"].items()))).items
            counts = pod_counts(pods)
            out.update(pods=counts["pods"], pods_ready=counts["ready"], pods_on_nodes=sum(
                1 for p in pods if p.spec.node_name in names and p.metadata.deletion_timestamp is None))
        if (taints := self._device_taints(names)) is not None:
            out["device_taints"] = taints
        return out

    def _device_taints(self, names: set[str]) -> int | None:
        """None where the cluster serves no DRA ResourceSlices."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            data = client.CustomObjectsApi(self._api()).list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices")
        except ApiException as e:
            if e.status in (403, 404):
                return None
            raise
        return device_taint_count(data.get("items") or [], names)

    async def measure(self) -> dict[str, Any]:
        values = await asyncio.to_thread(self._measure)
        now = time.time()
        with self._lock:
            for t in self._tracks:
                t.read(now, values)
            late = [t.late for t in self._tracks if t.late is not None]
            values["late"], values["overdue"] = "; ".join(late), len(late)
            values["waiting"] = 0 if self._open else sum(t.undecided for t in self._tracks)
            for s in self.spec.stages:
                latest = [t for t in self._tracks if t.stage.name == s.name and t.took is not None][-1:]
                if latest:
                    values[f"stage_s.{s.name}"] = latest[0].took
        return values

    def missing(self, key: str, values: dict[str, Any]) -> str:
        if key.startswith("stage_s."):
            return "not reached yet"
        if key == "device_taints":
            return "not measured: the cluster serves no DRA ResourceSlices (resource.k8s.io/v1)"
        return "not measured"
