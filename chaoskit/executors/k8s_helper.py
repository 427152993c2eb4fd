"""The k8s-helper executor: a node-level fault's verbs run in short-lived helper pods, one per node of its pods.

One helper pod per node applies, observes or reverts the fault on every chosen pod of that node, and the
nodes' helpers run at once (k8s_pods.run_helpers). Each node's share of the fault (its pods' revert records)
is also kept in the cluster under its own key (RevertStore), so a rollback from any machine finishes the run
after a crash; the key is removed once reverted. Records are signed and checked (k8s_records: an HMAC with the
installation's key): one that does not check is refused, never executed.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel

from chaoskit.executors import k8s_cuda_restart as cuda_restart
from chaoskit.executors.base import Placement, Record
from chaoskit.executors.k8s_pods import (
    GPU_ENV,
    REQUEST_ENV,
    HelperFailed,
    HelperJob,
    HelperPlacement,
    delete_quietly,
    grants,
    helper_pod,
    placed,
    run_helpers,
)
from chaoskit.executors.k8s_records import SignedRecords, checked_faults
from chaoskit.executors.revert_store import configmap_name
from chaoskit.injectors import Injector
from chaoskit.targets.kube import ClusterRef, api_client
from chaoskit.targets.kube import Placement as Pod

__all__ = ["GPU_ENV", "REQUEST_ENV", "HelperFailed", "HelperPlacement", "K8sHelperExecutor", "NodePart", "Replayed",
           "grants", "helper_pod", "replay_cluster", "revert_parts", "wire_spec"]
ERRORS_SHOWN = 3  # of the nodes whose helper failed, the first few are named in the error


@dataclass(frozen=True)
class NodePart:
    """One node's share of a fault: its placement (own key), the fault type, its revert record (None: nothing
    was applied there) and the helper pod that holds it."""

    hp: HelperPlacement
    type: str
    record: Record | None
    holder: str | None = None


class K8sHelperExecutor:
    """A fault on pods runs in one helper pod per node; the ledger record holds each pod's revert record
    (`pods`: key, node, pod, record, holder), and the cluster's RevertStore holds each node's share too, so a
    fault whose apply failed halfway, or whose host crashed, is still reverted on every node that has it."""

    name: ClassVar[str] = "k8s-helper"

    def preflight(self, injector: Injector) -> None:
        """The target layer chose the pods and the helper checks the node before applying; a gpu.cuda_fault's
        pods (or with prepare: restart, their Deployments) are checked here."""
        cuda_restart.preflight(injector)

    def plan(self, injector: Injector) -> list[str]:
        hp = placed(injector)
        needs = injector.node_helper
        caps = ", ".join(needs.capabilities) or "none"
        host = "".join(f", the host's {p} mounted" for p in needs.host_paths)
        if needs.gpu:
            host += ", every GPU of the node" + (f" (runtime class {hp.runtime_class})" if hp.runtime_class else "")
        spec = injector.spec.model_dump(mode="json", by_alias=True, exclude_defaults=True,
                                        exclude={"type", "target", "kubernetes"})
        nodes = hp.per_node()

        def does(pods: str) -> str:  # a fault may say itself what it does there (the proxies)
            return injector.node_plan(pods) or f"applies {injector.type} {json.dumps(spec, sort_keys=True)} to {pods}"

        lines = [f"on node {one.node}: a helper pod ({hp.image}, hostPID, capabilities {caps}{host}) "
                 f"{does(_pods_text(one.pods()))}" for one in nodes]
        return [*cuda_restart.plan(injector), *lines,
                f"revert: a helper pod on each node ({len(nodes)}), from the record (also kept in ConfigMap "
                f"{hp.namespace}/{configmap_name(hp.run_id)})"]

    def prepare(self, injector: Injector) -> Record:
        # each helper prepares on its node; until then there is nothing to undo but a gpu.cuda_fault's restart
        return {"pods": [], **cuda_restart.prepared(injector)}

    def apply(self, injector: Injector, record: Record, placement: Placement) -> Record:
        hp, core = self._open(placement)
        store = SignedRecords(core, hp.namespace, hp.run_id)
        if not hp.targets:  # one fault on one node, its record prepared by the caller
            return self._apply_nodes(core, store, injector, [(hp, record)])[0][1]
        restart, hp = cuda_restart.roll_out(injector, record, hp)  # a gpu.cuda_fault's prepare: restart: new pods
        done = self._apply_nodes(core, store, injector, [(one, {}) for one in hp.per_node()])
        return {"pods": [{"key": one.key, "node": one.node, "pod": p["pod"], "record": p["record"], "holder": holder}
                         for one, final, holder in done for p in final.get("pods", [])], **restart}

    @staticmethod
    def _apply_nodes(core: Any, store: SignedRecords, injector: Injector,
                     parts: list[tuple[HelperPlacement, Record]]) -> list[tuple[HelperPlacement, Record, str | None]]:
        """Apply on every node at once: all keys written `applying` (one patch) before any helper runs, each
        rewritten `applied` with its record as its helper answers. HelperFailed naming the nodes that failed once
        every helper answered (those applied stay recorded: the revert finds them)."""
        spec = wire_spec(injector.spec)
        jobs = [HelperJob(one, {"type": injector.type, "spec": spec, "record": rec, "placement": one.to_json(),
                                "hold_s": one.hold_s}) for one, rec in parts]
        who = {"host": socket.gethostname(), "applied_at": time.time()}  # what `chaoskit status --cluster` shows
        store.put_many({j.hp.key: {**j.request, **who, "state": "applying"} for j in jobs})
        done: dict[str, tuple[HelperPlacement, Record, str | None]] = {}
        failed = []
        for job, out in run_helpers(core, "apply", jobs):
            if isinstance(out, HelperFailed):
                failed.append(str(out))
                continue
            store.put(job.hp.key, {**job.request, **who, "record": out["record"], "state": "applied",
                                   "holder": out.get("holder")})
            done[job.hp.key] = (job.hp, out["record"], out.get("holder"))
        if failed:
            raise HelperFailed(_failures("apply", failed, len(jobs)))
        return [done[j.hp.key] for j in jobs]  # in the nodes' order, whichever answered first

    def revert(self, type_name: str, record: Record, placement: Placement) -> None:
        restart, placement = cuda_restart.after_restart(type_name, record, placement)  # checked before any undo
        hp, core = self._open(placement)
        self.revert_from(core, hp, type_name, record, SignedRecords(core, hp.namespace, hp.run_id))
        cuda_restart.undo(restart, hp)  # once disarmed: the Deployments it prepared

    @classmethod
    def revert_from(cls, core: Any, hp: HelperPlacement, type_name: str, record: Record,
                    store: SignedRecords) -> None:
        """Revert on every node that has the fault, at once; a record of the cluster's that does not check:
        RecordRefused. The keys of the nodes reverted are removed; HelperFailed naming those that failed."""
        parts = cls._parts(store, hp, type_name, record)
        failed = revert_parts(core, parts)
        store.remove_many([p.hp.key for i, p in enumerate(parts) if i not in failed])
        if failed:
            raise HelperFailed(_failures("revert", list(failed.values()), len(parts)))

    def observe(self, type_name: str, record: Record, placement: Placement) -> bool:
        return bool(self.observe_details(type_name, record, placement).get("in_effect"))

    def observe_details(self, type_name: str, record: Record, placement: Placement) -> dict[str, Any]:
        """Per pod (`NODE/POD`) what its fault is doing, from one observe helper per node."""
        hp, core = self._open(cuda_restart.after_restart(type_name, record, placement)[1])
        parts = [p for p in self._parts(SignedRecords(core, hp.namespace, hp.run_id), hp, type_name, record)
                 if p.record]  # an empty record: nothing was applied there
        jobs = [HelperJob(p.hp, {"type": type_name, "record": p.record, "placement": p.hp.to_json()}) for p in parts]
        per_pod: dict[str, dict[str, Any]] = {}
        failed = []
        for job, out in run_helpers(core, "observe", jobs):
            if isinstance(out, HelperFailed):
                failed.append(str(out))  # raised once every helper answered: none is left behind
                continue
            one = job.hp
            if one.on_node:
                for pod, details in (out.get("details") or {}).get("pods", {}).items():
                    per_pod[f"{one.node}/{pod}"] = details
            else:
                pod = one.target.pod if one.target is not None else ""
                per_pod[f"{one.node}/{pod}"] = {**out.get("details", {}), "in_effect": bool(out.get("in_effect"))}
        if failed:
            raise HelperFailed(_failures("observe", failed, len(jobs)))
        if not hp.targets:
            return next(iter(per_pod.values()), {"in_effect": False})
        return {"in_effect": any(d.get("in_effect") for d in per_pod.values()), "pods": per_pod}

    @staticmethod
    def _parts(store: SignedRecords, hp: HelperPlacement, type_name: str, record: Record) -> list[NodePart]:
        """Each node's share: from the ledger's record, else the cluster's copy of an applied one (one read of
        the ConfigMap; RecordRefused if it does not check), else nothing (never applied there: a helper whose
        apply failed reverted itself)."""
        if not hp.targets or hp.on_node:  # one node's entry (a rollback from the cluster's records)
            return [NodePart(hp, type_name, record or None, (store.get(hp.key) or {}).get("holder"))]
        known: dict[str, list[dict[str, Any]]] = {}
        for p in record.get("pods", []):
            known.setdefault(p["key"], []).append(p)
        nodes = hp.per_node()
        stored = store.get_many([one.key for one in nodes if one.key not in known])
        parts = []
        for one in nodes:
            if one.key in known:
                pods = known[one.key]
                parts.append(NodePart(one, type_name, {"pods": [{"pod": p["pod"], "record": p["record"]} for p in pods]},
                                      pods[0].get("holder")))
                continue
            entry = stored.get(one.key) or {}
            applied = entry.get("state") == "applied"
            parts.append(NodePart(one, type_name, entry.get("record") if applied else None,
                                  entry.get("holder") if applied else None))
        return parts

    @staticmethod
    def _open(placement: Placement) -> tuple[HelperPlacement, Any]:
        from kubernetes import client

        if not placement:
            raise ValueError("k8s-helper: the ledger entry has no placement (node, cluster)")
        hp = HelperPlacement.from_json(placement)
        return hp, client.CoreV1Api(api_client(hp.cluster))


def revert_parts(core: Any, parts: list[NodePart]) -> dict[int, str]:
    """Revert every node's share at once (one revert helper per node that has a record), then delete its
    holder (whose own revert on SIGTERM then finds nothing left to undo). {index in parts: why} of those that
    failed (their holders are kept)."""
    jobs = {i: HelperJob(p.hp, {"type": p.type, "record": p.record, "placement": p.hp.to_json()})
            for i, p in enumerate(parts) if p.record}
    index = {id(job): i for i, job in jobs.items()}
    failed: dict[int, str] = {}
    for job, out in run_helpers(core, "revert", list(jobs.values())):
        if isinstance(out, HelperFailed):
            failed[index[id(job)]] = str(out)
    for i, p in enumerate(parts):
        if p.holder and i not in failed:
            delete_quietly(core, p.holder, p.hp.namespace)
    return failed


def wire_spec(spec: BaseModel) -> dict[str, Any]:
    """The spec as a helper's agent validates it again: plain JSON (a Percent writes itself as '5%')."""
    return spec.model_dump(mode="json", by_alias=True)


def _failures(verb: str, failed: list[str], of: int) -> str:
    more = f" (and {len(failed) - ERRORS_SHOWN} more)" if len(failed) > ERRORS_SHOWN else ""
    return f"{verb} failed on {len(failed)} of {of} node(s): " + "; ".join(failed[:ERRORS_SHOWN]) + more


def _pods_text(pods: list[Pod]) -> str:
    """`pod NS/POD container C`, or `3 pods NS/A, NS/B, NS/C container C`."""
    if not pods:
        return "its target"
    names = ", ".join(f"{p.namespace}/{p.pod}" for p in pods)
    return f"{'pod' if len(pods) == 1 else f'{len(pods)} pods'} {names} container {pods[0].container}"


@dataclass(frozen=True)
class Replayed:
    """One fault's share recorded in the cluster, after `rollback --cluster`: reverted (error None), failed,
    or refused (its record does not check: nothing was run for it)."""

    key: str
    configmap: str
    error: str | None = None
    refused: bool = False


def replay_cluster(cluster: ClusterRef, namespace: str = "chaoskit") -> list[Replayed]:
    """Revert every fault recorded in the cluster's ConfigMaps (a run whose host is gone) whose record checks,
    every node at once; refuse the others (k8s_records.RecordRefused). KeyUnavailable if the key Secret cannot
    be read."""
    from kubernetes import client

    core = client.CoreV1Api(api_client(cluster))
    key, faults = checked_faults(core, namespace)
    out: dict[tuple[str, str], Replayed] = {}  # (ConfigMap, key) ->
    parts: list[tuple[NodePart, str]] = []  # (a node's share, its ConfigMap)
    for fault in faults:
        req = fault.request
        if req is None:  # refused: nothing runs on the node for it, and its ConfigMap is kept for a look
            out[(fault.configmap, fault.key)] = Replayed(fault.key, fault.configmap, fault.refused, refused=True)
            continue
        if not req.get("record"):  # still `applying`: its host stopped before the helper's answer was written back
            node = (req.get("placement") or {}).get("node", "?")
            out[(fault.configmap, fault.key)] = Replayed(fault.key, fault.configmap, (
                f"state unknown: the fault was being applied on node {node} when its host stopped, and its revert "
                "record never came back; check that node (an apply helper pod still there has the record in its "
                "log) and delete the key once it is clean"))
            continue  # kept: nothing says it is gone
        try:
            hp = HelperPlacement.from_json({**req["placement"], "cluster": cluster.to_json(), "key": fault.key})
            parts.append((NodePart(hp, req["type"], req.get("record") or None, req.get("holder")), fault.configmap))
        except Exception as e:  # one record's failure never stops the others
            out[(fault.configmap, fault.key)] = Replayed(fault.key, fault.configmap, f"{type(e).__name__}: {e}")
    failed = revert_parts(core, [p for p, _ in parts])
    done: dict[str, list[str]] = {}  # run id -> keys reverted
    for i, (p, configmap) in enumerate(parts):
        out[(configmap, p.hp.key)] = Replayed(p.hp.key, configmap, failed.get(i))
        if i not in failed:
            done.setdefault(p.hp.run_id, []).append(p.hp.key)
    for run_id, keys in done.items():
        SignedRecords(core, namespace, run_id, key).remove_many(keys)
    return [out[(f.configmap, f.key)] for f in faults]
