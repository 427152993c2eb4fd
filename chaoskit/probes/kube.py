"""kube.pods probe: how many pods of a selector exist, run and are ready, their restarts and events by reason."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Literal

from pydantic import Field

from chaoskit.errors import PreflightError
from chaoskit.model.types import StrictModel
from chaoskit.probes.base import Probe, ProbeSpecBase
from chaoskit.targets.kube import KubePods, api_client, resolve_cluster


class KubePodsTarget(StrictModel):
    kubernetes: KubePods = Field(description="namespace, selector (kubeconfig, context)")


class KubePodsProbeSpec(ProbeSpecBase):
    type: Literal["kube.pods"]
    target: KubePodsTarget = Field(description="kubernetes: namespace, selector (kubeconfig, context)")
    expect_keys: ClassVar[tuple[str, ...]] = ("pods", "running", "ready", "not_ready", "restarts", "events.")

    def pods(self) -> KubePods:
        return self.target.kubernetes


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def pod_counts(pods: list[Any]) -> dict[str, int]:
    running = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    ready = sum(1 for p in running if _ready(p))
    restarts = sum(s.restart_count or 0 for p in pods for s in (p.status.container_statuses or []))
    return {"pods": len(pods), "running": len(running), "ready": ready, "not_ready": len(pods) - ready,
            "restarts": restarts}


def events_by_reason(events: list[Any], pod_names: set[str], asked: list[str]) -> dict[str, int]:
    """`events.REASON` -> sum of counts of the events about these pods; a reason named in expect is 0 if absent."""
    out = {f"events.{r}": 0 for r in asked}
    for e in events:
        obj = e.involved_object
        if obj is not None and obj.kind == "Pod" and obj.name in pod_names and e.reason:
            key = f"events.{e.reason}"
            out[key] = out.get(key, 0) + (e.count or 1)
    return out


class KubePodsProbe(Probe):
    type: ClassVar[str] = "kube.pods"
    host_needs: ClassVar[frozenset[str]] = frozenset({"kube"})
    summary: ClassVar[str] = "Kubernetes pods of a selector: count, running, ready, restarts, events by reason"
    Spec = KubePodsProbeSpec
    spec: KubePodsProbeSpec

    def __init__(self, spec: Any):
        super().__init__(spec)
        self._core: Any = None

    def _api(self) -> Any:
        if self._core is None:
            from kubernetes import client

            self._core = client.CoreV1Api(api_client(resolve_cluster(self.spec.pods())))
        return self._core

    def preflight(self) -> None:
        try:
            self._api()
        except PreflightError as e:
            raise PreflightError(f"probe {self.spec.name} (kube.pods): {e}") from None

    def _measure(self) -> dict[str, Any]:
        target, core = self.spec.pods(), self._api()
        pods = core.list_namespaced_pod(target.namespace, label_selector=target.label_selector()).items
        events = core.list_namespaced_event(target.namespace).items
        asked = [k.split(".", 1)[1] for k in self.spec.flat_expect() if k.startswith("events.")]
        return {**pod_counts(pods), **events_by_reason(events, {p.metadata.name for p in pods}, asked)}

    async def measure(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._measure)
