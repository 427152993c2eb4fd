"""Kubernetes API faults: pod.delete (graceful), pod.kill (forced, grace 0) and deployment.scale.

They run where chaoskit runs (executor `local`), through the API server. A deleted pod is an event: its
controller recreates it, so revert only records what was deleted. deployment.scale's revert restores the
recorded replica count if the deployment still has ours.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar, Literal

from pydantic import Field

from chaoskit.errors import PreflightError
from chaoskit.injectors.base import FaultContext, Injector, RevertRecord
from chaoskit.injectors.placement import DeploymentPlacement, PodsPlacement
from chaoskit.model.types import Duration, StrictModel
from chaoskit.targets.kube import (
    ClusterRef,
    KubeCluster,
    KubeTargetSpec,
    Placement,
    api_client,
    choose,
    resolve_cluster,
)

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


def _apis(cluster: ClusterRef) -> tuple[Any, Any]:
    """(CoreV1Api, AppsV1Api) for a record's cluster."""
    from kubernetes import client

    api = api_client(cluster)
    return client.CoreV1Api(api), client.AppsV1Api(api)


def _is_not_found(e: Exception) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(e, ApiException) and e.status == 404


class PodDeleteSpec(StrictModel):
    type: Literal["pod.delete"]
    target: KubeTargetSpec = Field(description="kubernetes: namespace, selector, mode, value")
    grace_period: Duration | None = Field(None, ge=0, description="termination grace period (default: the pod's "
                                                                  "own terminationGracePeriodSeconds)")


class PodKillSpec(StrictModel):
    type: Literal["pod.kill"]
    target: KubeTargetSpec = Field(description="kubernetes: namespace, selector, mode, value")


class DeletedPod(RevertRecord):
    """One pod a deletion chose (after apply: one it deleted), as Placement.to_json writes it."""

    namespace: str = Field(min_length=1)
    pod: str = Field(min_length=1)
    uid: str = Field(min_length=1)
    node: str = ""
    container: str = ""
    container_id: str = ""


class PodDeletionRecord(RevertRecord):
    """pod.delete's and pod.kill's record: the cluster, the grace period, the pods. Revert does nothing with it (a
    deleted pod is an event: its controller recreates it); it reads back only so that revert and observe name
    the pods they report, and a foreign record is refused like any other family's."""

    cluster: ClusterRef
    grace_period_s: int | None = Field(None, ge=0)
    pods: list[DeletedPod] = Field(default_factory=list)
    deleted_at: float | None = None


class _PodDeletion(Injector[Any, PodDeletionRecord]):
    """Delete the chosen pods (UID precondition: a pod recreated under the same name is never deleted)."""

    Record = PodDeletionRecord

    def __init__(self, spec: Any, ctx: FaultContext | None = None):
        super().__init__(spec, ctx)
        self._chosen: list[Placement] | None = None
        self._cluster: ClusterRef | None = None

    def grace_seconds(self) -> int | None:
        raise NotImplementedError

    def _targets(self) -> list[Placement]:
        if self._chosen is None:  # chosen once: plan, ledger and apply name the same pods
            self._cluster = resolve_cluster(self.spec.target.kubernetes)
            core, _ = _apis(self._cluster)
            self._chosen = choose(core, self.spec.target.kubernetes)
        return self._chosen

    def preflight(self) -> None:
        try:
            self._targets()
        except PreflightError as e:
            raise PreflightError(f"{self.type}: {e}") from None

    def _how(self) -> str:
        g = self.grace_seconds()
        return "forced (grace period 0)" if g == 0 else "graceful (the pod's grace period)" if g is None \
            else f"graceful (grace period {g}s)"

    def plan(self) -> list[str]:
        return [f"delete pod {p.namespace}/{p.pod} (uid {p.uid}, node {p.node}) {self._how()}; its controller "
                "recreates it, nothing to revert" for p in self._targets()]

    def placement(self) -> PodsPlacement:
        return PodsPlacement(cluster=self._cluster_ref(), pods=self._targets())

    def _cluster_ref(self) -> ClusterRef:
        self._targets()
        assert self._cluster is not None
        return self._cluster

    def prepare(self) -> PodDeletionRecord:
        return PodDeletionRecord(cluster=self._cluster_ref(), grace_period_s=self.grace_seconds(),
                                 pods=[DeletedPod.model_validate(p.to_json()) for p in self._targets()])

    def apply(self, record: PodDeletionRecord) -> PodDeletionRecord:
        core, _ = _apis(record.cluster)
        deleted = [p for p in record.pods if _delete_pod(core, p, record.grace_period_s)]
        if not deleted:
            raise RuntimeError(f"{self.type}: every chosen pod was gone before it could be deleted")
        return record.model_copy(update={"pods": deleted, "deleted_at": time.time()})

    @classmethod
    def revert(cls, record: PodDeletionRecord) -> None:
        r = record
        log.info("%s: nothing to revert; deleted %s (their controllers recreate them)", cls.type,
                 ", ".join(p.pod for p in r.pods))

    @classmethod
    def observe(cls, record: PodDeletionRecord) -> bool:
        return False  # an event, not a state

    @classmethod
    def observe_details(cls, record: PodDeletionRecord) -> dict[str, Any]:
        r = record
        return {"in_effect": False, "deleted": [f"{p.namespace}/{p.pod}" for p in r.pods],
                "grace_period_s": r.grace_period_s}


def _delete_pod(core: Any, pod: DeletedPod, grace: int | None) -> bool:
    """Delete one pod if it is still the one chosen (same UID); False if it is already gone."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.uid), grace_period_seconds=grace)
    try:
        core.delete_namespaced_pod(pod.pod, pod.namespace, body=body, grace_period_seconds=grace)
    except ApiException as e:
        if e.status in (404, 409):  # gone, or replaced by a pod of the same name (another UID)
            log.info("pod %s/%s already gone (%s)", pod.namespace, pod.pod, e.status)
            return False
        raise
    return True


class PodDelete(_PodDeletion):
    type: ClassVar[str] = "pod.delete"
    host_needs: ClassVar[frozenset[str]] = frozenset({"kube"})
    summary: ClassVar[str] = "delete Kubernetes pods gracefully (their controller recreates them)"
    Spec = PodDeleteSpec
    spec: PodDeleteSpec

    def grace_seconds(self) -> int | None:
        return None if self.spec.grace_period is None else round(self.spec.grace_period)


class PodKill(_PodDeletion):
    type: ClassVar[str] = "pod.kill"
    host_needs: ClassVar[frozenset[str]] = frozenset({"kube"})
    summary: ClassVar[str] = "kill Kubernetes pods: forced deletion, grace period 0 (like SIGKILL)"
    Spec = PodKillSpec
    spec: PodKillSpec

    def grace_seconds(self) -> int | None:
        return 0


class KubeDeployment(KubeCluster):
    namespace: str = Field("default", min_length=1, description="namespace of the deployment")
    deployment: str = Field(min_length=1, description="deployment name")


class DeploymentTargetSpec(StrictModel):
    kubernetes: KubeDeployment = Field(description="namespace and deployment")


class DeploymentScaleSpec(StrictModel):
    type: Literal["deployment.scale"]
    target: DeploymentTargetSpec = Field(description="kubernetes: namespace, deployment")
    replicas: int = Field(ge=0, description="replica count during the fault (0 takes every pod away)")


def _replicas(apps: Any, namespace: str, name: str) -> int:
    return apps.read_namespaced_deployment_scale(name, namespace).spec.replicas or 0


def _scale(apps: Any, namespace: str, name: str, replicas: int) -> None:
    apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}},
                                           _content_type=MERGE_PATCH)


class ScaleRecord(RevertRecord):
    """deployment.scale's record: the cluster, the deployment, the count it had and the count it was given."""

    cluster: ClusterRef
    namespace: str = Field(min_length=1)
    deployment: str = Field(min_length=1)
    previous_replicas: int = Field(ge=0)
    replicas: int = Field(ge=0)


class DeploymentScale(Injector[DeploymentScaleSpec, ScaleRecord]):
    type: ClassVar[str] = "deployment.scale"
    host_needs: ClassVar[frozenset[str]] = frozenset({"kube"})
    summary: ClassVar[str] = "scale a Kubernetes deployment (revert: the replica count it had)"
    Spec = DeploymentScaleSpec
    spec: DeploymentScaleSpec
    Record = ScaleRecord

    def __init__(self, spec: Any, ctx: FaultContext | None = None):
        super().__init__(spec, ctx)
        self._before: tuple[ClusterRef, int] | None = None

    def _current(self) -> tuple[ClusterRef, int]:
        if self._before is None:
            t = self.spec.target.kubernetes
            ref = resolve_cluster(t)
            _, apps = _apis(ref)
            try:
                self._before = ref, _replicas(apps, t.namespace, t.deployment)
            except Exception as e:
                if _is_not_found(e):
                    raise PreflightError(f"no deployment {t.namespace}/{t.deployment}") from None
                raise
        return self._before

    def preflight(self) -> None:
        try:
            self._current()
        except PreflightError as e:
            raise PreflightError(f"{self.type}: {e}") from None

    def plan(self) -> list[str]:
        t, (_, before) = self.spec.target.kubernetes, self._current()
        return [f"scale deployment {t.namespace}/{t.deployment} from {before} to {self.spec.replicas} replicas; "
                f"revert: back to {before}"]

    def placement(self) -> DeploymentPlacement:
        t = self.spec.target.kubernetes
        return DeploymentPlacement(cluster=self._current()[0], namespace=t.namespace, deployment=t.deployment)

    def prepare(self) -> ScaleRecord:
        ref, before = self._current()
        t = self.spec.target.kubernetes
        return ScaleRecord(cluster=ref, namespace=t.namespace, deployment=t.deployment,
                           previous_replicas=before, replicas=self.spec.replicas)

    def apply(self, record: ScaleRecord) -> ScaleRecord:
        _, apps = _apis(record.cluster)
        _scale(apps, record.namespace, record.deployment, record.replicas)
        return record

    @classmethod
    def revert(cls, record: ScaleRecord) -> None:
        """Back to the previous count if the deployment still has ours; gone or changed by someone else
        (an operator, an HPA) is left alone."""
        r = record
        _, apps = _apis(r.cluster)
        try:
            now = _replicas(apps, r.namespace, r.deployment)
        except Exception as e:
            if _is_not_found(e):
                return
            raise
        if now == r.replicas and now != r.previous_replicas:
            _scale(apps, r.namespace, r.deployment, r.previous_replicas)
        elif now != r.previous_replicas:
            log.warning("deployment %s/%s has %d replicas, not our %d: someone else scaled it; left alone",
                        r.namespace, r.deployment, now, r.replicas)

    @classmethod
    def observe(cls, record: ScaleRecord) -> bool:
        r = record
        _, apps = _apis(r.cluster)
        try:
            now = _replicas(apps, r.namespace, r.deployment)
        except Exception as e:
            if _is_not_found(e):
                return False
            raise
        return now == r.replicas != r.previous_replicas
