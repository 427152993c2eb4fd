"""Revert records kept in the cluster: one ConfigMap per run (label chaoskit.io/run), one key per node of a fault.

So `chaoskit rollback` from any machine with access to the cluster can finish a run whose host crashed: each
key holds the fault's type, spec, revert record (of each pod of that node) and placement as JSON; it is removed
once reverted there, and the ConfigMap is deleted with its last key (unless written to since).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

RUN_LABEL = "chaoskit.io/run"
MANAGED_LABEL = "app.kubernetes.io/managed-by"
MERGE_PATCH = "application/merge-patch+json"


def dns_label(text: str, limit: int = 63) -> str:
    """A DNS-1123 label from any text (lowercase alphanumerics and '-', at most `limit` characters)."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return s[:limit].rstrip("-") or "x"


def configmap_name(run_id: str) -> str:
    return dns_label(f"chaoskit-run-{run_id}", 253)


@dataclass(frozen=True)
class StoredFault:
    run_id: str
    key: str
    request: dict[str, Any]  # type, spec, record, placement


class RevertStore:
    """The ConfigMap of one run in `namespace`, through a kubernetes CoreV1Api."""

    def __init__(self, core: Any, namespace: str, run_id: str):
        self.core, self.namespace, self.run_id = core, namespace, run_id
        self.name = configmap_name(run_id)

    def put(self, key: str, request: dict[str, Any]) -> None:
        """Write (or overwrite) one fault's entry; creates the ConfigMap on first use."""
        self.put_many({key: request})

    def put_many(self, entries: dict[str, dict[str, Any]]) -> None:
        """Write (or overwrite) several entries in one merge patch; creates the ConfigMap on first use (one
        created meanwhile by another fault of the run: patched after all)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        data = {f"{key}.json": json.dumps(request, sort_keys=True) for key, request in entries.items()}
        if not data:
            return
        for attempt in range(2):
            try:
                self.core.patch_namespaced_config_map(self.name, self.namespace, {"data": data},
                                                      _content_type=MERGE_PATCH, _preload_content=False)
                return  # the answer (the whole ConfigMap: every node's records) is not read into models
            except ApiException as e:
                if e.status != 404:
                    raise
            labels = {RUN_LABEL: dns_label(self.run_id), MANAGED_LABEL: "chaoskit"}
            body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=self.name, labels=labels,
                                                                   annotations={"chaoskit.io/run-id": self.run_id}),
                                      data=data)
            try:
                self.core.create_namespaced_config_map(self.namespace, body)
                return
            except ApiException as e:
                if e.status != 409 or attempt:
                    raise

    def get(self, key: str) -> dict[str, Any] | None:
        data = self._data()
        raw = data.get(f"{key}.json") if data is not None else None
        return json.loads(raw) if raw else None

    def remove(self, key: str) -> None:
        """Drop one entry (idempotent); delete the ConfigMap when it holds no more."""
        self.remove_many([key])

    def remove_many(self, keys: list[str]) -> None:
        """Drop entries in one merge patch (idempotent); delete the ConfigMap when it holds no more — unless
        another fault of the run wrote to it since (a resourceVersion precondition)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        if not keys:
            return
        try:
            cm = self.core.patch_namespaced_config_map(self.name, self.namespace,
                                                       {"data": {f"{k}.json": None for k in keys}},
                                                       _content_type=MERGE_PATCH)
        except ApiException as e:
            if e.status == 404:
                return
            raise
        if cm.data:
            return
        keep_newer = client.V1DeleteOptions(preconditions=client.V1Preconditions(
            resource_version=cm.metadata.resource_version))
        try:
            self.core.delete_namespaced_config_map(self.name, self.namespace, body=keep_newer)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def raw(self) -> dict[str, str] | None:
        """The ConfigMap's data (KEY.json -> JSON text), None if there is none."""
        return self._data()

    def _data(self) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(cm.data or {})


def stored_faults(core: Any, namespace: str) -> list[StoredFault]:
    """Every fault any run left recorded in `namespace` (for a rollback from another machine)."""
    cms = core.list_namespaced_config_map(namespace, label_selector=f"{MANAGED_LABEL}=chaoskit").items
    out = []
    for cm in cms:
        run_id = (cm.metadata.annotations or {}).get("chaoskit.io/run-id", "")
        for name, raw in sorted((cm.data or {}).items()):
            out.append(StoredFault(run_id, name.removesuffix(".json"), json.loads(raw)))
    return out
