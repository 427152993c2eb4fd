"""The cluster's halt lever (ConfigMap `chaoskit-halt`), and the runs its revert records say are in progress.

`chaoskit halt --cluster` creates the ConfigMap (who, when, why); every run that reaches the cluster looks at it
at each safeguard interval and aborts while it exists; `--release` deletes it. It carries no
`app.kubernetes.io/managed-by` label: that label marks a run's revert records (revert_store), which a rollback
replays. A helper pod that holds a fault on a node reads it too (chaoskit.agent), through `in_cluster_core`: the
service account token its pod spec mounts (k8s_pods.API_DIR), nothing else.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from chaoskit.executors.k8s_records import KeyUnavailable, RecordRefused, read_key, verify
from chaoskit.executors.revert_store import MANAGED_LABEL

HALT_CONFIGMAP = "chaoskit-halt"
HALT_NAMESPACE = "chaoskit"
ROLE_LABEL = "chaoskit.io/role"
READ_TIMEOUT_S = 2.0  # one look at the lever: a slow API server must not hold up a run's safeguard loop
TOKEN_FILE, CA_FILE = "token", "ca.crt"  # in a service account volume (the kubelet's, or a projected one)


@dataclass(frozen=True)
class HaltLever:
    """A pulled lever: who pulled it (user@host), when (epoch seconds), why; `where` is filled in on reading."""

    by: str
    at: float
    reason: str
    where: str = ""

    def to_data(self) -> dict[str, str]:
        return {"by": self.by, "at": repr(self.at), "reason": self.reason}

    @classmethod
    def from_data(cls, data: dict[str, Any], where: str) -> HaltLever:
        try:
            at = float(data.get("at", 0))
        except (TypeError, ValueError):
            at = 0.0  # a hand-made lever still halts; only its time is unknown
        return cls(str(data.get("by") or "unknown"), at, str(data.get("reason") or "no reason given"), where)

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at)) if self.at else "an unknown time"

    def describe(self) -> str:
        """`on host H by user@host at TIME: WHY` (or `in cluster C namespace N ...`)."""
        return f"{self.where} by {self.by} at {self.when()}: {self.reason}"


def read_lever(core: Any, namespace: str = HALT_NAMESPACE, where: str = "") -> HaltLever | None:
    """The cluster's lever, or None when it is not pulled. API errors other than 404 propagate."""
    from kubernetes.client.exceptions import ApiException

    try:
        cm = core.read_namespaced_config_map(HALT_CONFIGMAP, namespace, _request_timeout=READ_TIMEOUT_S)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return HaltLever.from_data(dict(cm.data or {}), where or f"in namespace {namespace}")


def in_cluster_core(credentials: str) -> Any:
    """A CoreV1Api from inside a pod: the kubernetes client's in-cluster loader (the API server from
    $KUBERNETES_SERVICE_HOST/PORT, over HTTPS), with the token and CA of the service account volume mounted at
    `credentials` (re-read every minute: the kubelet rotates a projected token). ConfigException if not in a pod."""
    from kubernetes import client
    from kubernetes.config.incluster_config import InClusterConfigLoader

    cfg = client.Configuration()
    InClusterConfigLoader(token_filename=f"{credentials}/{TOKEN_FILE}",
                          cert_filename=f"{credentials}/{CA_FILE}").load_and_set(cfg)
    return client.CoreV1Api(client.ApiClient(cfg))


def pull_lever(core: Any, lever: HaltLever, namespace: str = HALT_NAMESPACE) -> None:
    """Create the lever (or overwrite who/when/why of one already pulled)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=HALT_CONFIGMAP, labels={ROLE_LABEL: "halt"}),
                              data=lever.to_data())
    try:
        core.create_namespaced_config_map(namespace, body)
    except ApiException as e:
        if e.status != 409:
            raise
        core.patch_namespaced_config_map(HALT_CONFIGMAP, namespace, {"data": lever.to_data()},
                                         _content_type="application/merge-patch+json")


def release_lever(core: Any, namespace: str = HALT_NAMESPACE) -> bool:
    """Delete the lever; False if it was not pulled."""
    from kubernetes.client.exceptions import ApiException

    try:
        core.delete_namespaced_config_map(HALT_CONFIGMAP, namespace)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


@dataclass(frozen=True)
class ClusterFault:
    """One fault a run keeps recorded in the cluster (a key of its revert ConfigMap)."""

    type: str
    node: str
    pod: str  # the pods of that node it acts on, comma-separated
    state: str  # applying | applied


@dataclass(frozen=True)
class ClusterRun:
    """A run with faults recorded in the cluster: its id, the host that applied them, since when (epoch)."""

    run_id: str
    host: str
    since: float | None
    faults: tuple[ClusterFault, ...]

    @property
    def experiment(self) -> str:
        """The experiment's name, as the run id carries it (`YYYYmmddTHHMMSS-NAME-xxxxxx`); "" for another id."""
        parts = self.run_id.split("-")
        return "-".join(parts[1:-1]) if len(parts) >= 3 else ""


def cluster_runs(core: Any, namespace: str = HALT_NAMESPACE) -> list[ClusterRun]:
    """Every run whose revert records are in `namespace` (faults that may be in effect on the cluster's nodes).
    A record that fails its MAC check is listed as it claims, its state saying that rollback --cluster refuses it."""
    cms = core.list_namespaced_config_map(namespace, label_selector=f"{MANAGED_LABEL}=chaoskit").items
    try:
        key, unchecked = (read_key(core, namespace) if any(cm.data for cm in cms) else None), ""
    except KeyUnavailable as e:  # status still lists what the records claim
        key, unchecked = None, f"unchecked: {e}"
    runs = []
    for cm in cms:
        requests = [_claimed(key, unchecked, namespace, cm.metadata.name, name.removesuffix(".json"), raw)
                    for name, raw in sorted((cm.data or {}).items())]
        faults = tuple(ClusterFault(str(r.get("type", "?")), str((r.get("placement") or {}).get("node", "?")),
                                    _pods(r.get("placement") or {}), str(r.get("state", "?"))) for r in requests)
        times = [r["applied_at"] for r in requests if isinstance(r.get("applied_at"), (int, float))]
        created = cm.metadata.creation_timestamp
        since = min(times) if times else (created.timestamp() if created is not None else None)
        hosts = sorted({str(r["host"]) for r in requests if r.get("host")})
        runs.append(ClusterRun((cm.metadata.annotations or {}).get("chaoskit.io/run-id", cm.metadata.name),
                               ", ".join(hosts) or "unknown", since, faults))
    return runs


def _pods(placement: dict[str, Any]) -> str:
    """The pods a record's share of a fault acts on (`web-0, web-3`), "" for none."""
    pods = placement.get("targets") or ([placement["target"]] if placement.get("target") else [])
    return ", ".join(str(p.get("pod", "?")) for p in pods if isinstance(p, dict))


def _claimed(key: bytes | None, unchecked: str, namespace: str, configmap: str, entry: str,
             raw: str) -> dict[str, Any]:
    """What one record says; its state REFUSED (or unchecked) when it does not check (k8s_records.verify)."""
    try:
        return verify(key, namespace, configmap, entry, raw)
    except RecordRefused as e:
        why = str(e).split(".json ", 1)[-1].split(":", 1)[0]  # fails its MAC check, carries no MAC, ...
        refused = unchecked or f"REFUSED by rollback --cluster: {why}"
    try:
        claimed = json.loads(raw)
    except ValueError:
        claimed = None
    return {**(claimed if isinstance(claimed, dict) else {}), "state": refused}
