"""Where a fault runs, as typed records: a helper pod's placement on a Kubernetes node, the pods or Deployment a
Kubernetes API fault names, a local fault's resolved target. The ledger entry keeps their JSON (to_json; read back
with model_validate / from_json)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from chaoskit.targets.kube import ClusterRef
from chaoskit.targets.kube import Placement as Pod

if TYPE_CHECKING:
    from chaoskit.targets.local import LocalTarget

KEY_NODE_CHARS = 200  # of a node's name in its ConfigMap key (KEY-NODE.json stays within 253 characters)


class PlacementRecord(BaseModel):
    """A placement as the ledger entry keeps it (plain JSON). Keys the model does not name are left alone when it
    is read back (a newer chaoskit may write more)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class HelperPlacement(PlacementRecord):
    """Where and how a helper pod runs (the k8s-helper executor): enough for a fresh process."""

    cluster: ClusterRef
    node: str
    run_id: str
    namespace: str = "chaoskit"  # where helper pods and the run's ConfigMap live
    image: str = "chaoskit:latest"
    service_account: str = "chaoskit-helper"
    deadline_s: int = 120
    key: str = Field(default_factory=lambda: uuid.uuid4().hex[:10])  # this fault's key in the run's ConfigMap
    target: Pod | None = None  # one pod the fault acts on (a record written before helpers per node)
    targets: list[Pod] | None = None  # the chosen pods (targets.kube.Placement): of the fault, or
    on_node: bool = False  # ... True: of this one node (one helper's share of the fault, its own key)
    hold_s: float = 0.0  # > 0: the apply helper stays, and reverts on SIGTERM or once this long has passed
    runtime_class: str | None = None  # of a GPU fault's helper (the NVIDIA container runtime's class)

    def per_node(self) -> list[HelperPlacement]:
        """One placement per node of the chosen pods (its pods, its own ConfigMap key KEY-NODE), nodes in the
        order of their first pod; itself if it is one node's share already or names no pods."""
        if not self.targets or self.on_node:
            return [self]
        by_node: dict[str, list[Pod]] = {}
        for t in self.targets:
            by_node.setdefault(t.node, []).append(t)
        return [self.model_copy(update={"node": node, "targets": pods, "target": None, "on_node": True,
                                        "key": f"{self.key}-{node[:KEY_NODE_CHARS]}"})
                for node, pods in by_node.items()]

    def pods(self) -> list[Pod]:
        """The pods this placement names (none for a fault on one node without a pod target)."""
        return list(self.targets or ([self.target] if self.target else []))

    @classmethod
    def from_json(cls, d: object) -> HelperPlacement:
        """Read back from the ledger entry's (or a helper request's) JSON."""
        return cls.model_validate(d)


class PodsPlacement(PlacementRecord):
    """A Kubernetes API fault on chosen pods (pod.delete): the cluster and the pods."""

    cluster: ClusterRef
    pods: list[Pod]


class DeploymentPlacement(PlacementRecord):
    """A Kubernetes API fault on one Deployment (its scale): the cluster, the Deployment's namespace and name."""

    cluster: ClusterRef
    namespace: str
    deployment: str


@dataclass(frozen=True)
class LocalPlacement:
    """A fault on this host: the local target the layer resolved (the ledger keeps {"target": its JSON})."""

    target: LocalTarget

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target.to_json()}


FaultPlacement = PlacementRecord | LocalPlacement  # what Injector.placement gives the ledger entry
