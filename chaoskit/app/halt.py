"""The halt levers (`chaoskit halt`): this host's (a state-directory file), a cluster's, and a run that obeys them."""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from chaoskit.errors import PreflightError
from chaoskit.executors.k8s_halt import HALT_NAMESPACE, HaltLever, read_lever
from chaoskit.paths import state_dir
from chaoskit.targets.kube import ClusterRef, KubeCluster, KubeNodeSelector, resolve_cluster

if TYPE_CHECKING:
    from chaoskit.engine.runner import Runner
    from chaoskit.experiment.models import Experiment

log = logging.getLogger(__name__)
HOST_LEVER = "halt.json"


def host_lever_path() -> Path:
    return state_dir() / HOST_LEVER


def operator() -> str:
    """Who pulls a lever: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def new_lever(reason: str) -> HaltLever:
    """A lever pulled now by this operator; `reason` on one line."""
    return HaltLever(operator(), time.time(), " ".join(reason.split()) or "no reason given")


def read_host_lever() -> HaltLever | None:
    """This host's lever, or None. A lever file that cannot be read as one still halts (its reason says so)."""
    path = host_lever_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        data = {"reason": f"the lever file {path} is unreadable ({type(e).__name__}); remove it with "
                          "chaoskit halt --release"}
    return HaltLever.from_data(data if isinstance(data, dict) else {}, f"on host {socket.gethostname()}")


def pull_host_lever(lever: HaltLever) -> Path:
    """Write the lever atomically (a run never reads half of it); PreflightError if this user cannot."""
    path = host_lever_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{HOST_LEVER}.{os.getpid()}")
        tmp.write_text(json.dumps(lever.to_data()))
        tmp.replace(path)
    except OSError as e:
        hint = " (runs as root keep their state in /var/lib/chaoskit: pull it as root)" if os.geteuid() else ""
        raise PreflightError(f"cannot pull this host's halt lever {path}: {e.strerror or e}{hint}") from None
    return path


def release_host_lever() -> bool:
    """Remove this host's lever; False if it was not pulled. PreflightError if this user cannot."""
    path = host_lever_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise PreflightError(f"cannot release this host's halt lever {path}: {e.strerror or e}") from None
    return True


@dataclass(frozen=True)
class ClusterLevers:
    """Where a run looks for a cluster's lever: the cluster and the namespaces (`chaoskit`, and its helpers')."""

    cluster: ClusterRef
    namespaces: tuple[str, ...]


def _kube_targets(obj: Any) -> Iterator[KubeCluster]:
    if isinstance(obj, KubeCluster):
        yield obj
    if isinstance(obj, BaseModel):
        for name in type(obj).model_fields:
            yield from _kube_targets(getattr(obj, name))
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _kube_targets(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _kube_targets(item)


def clusters_of(exp: Experiment) -> list[ClusterLevers]:
    """The clusters the experiment's faults act on (a `kubernetes:` target), each with its lever namespaces. A
    cluster that cannot be resolved here is left out: the run's preflight fails on it anyway (exit 4)."""
    found: dict[ClusterRef, set[str]] = {}
    for target in _kube_targets(exp.method):  # inject, fallback and parallel steps alike
        try:
            ref = resolve_cluster(target)
        except PreflightError:
            continue
        namespaces = found.setdefault(ref, {HALT_NAMESPACE})
        if isinstance(target, KubeNodeSelector):
            namespaces.add(target.helper.namespace)
    return [ClusterLevers(ref, tuple(sorted(ns))) for ref, ns in found.items()]


@dataclass
class Levers:
    """The levers one run obeys: this host's, and those of the clusters its faults act on."""

    clusters: list[ClusterLevers] = field(default_factory=list)
    _cores: dict[ClusterRef, Any] = field(default_factory=dict)
    _failing: set[str] = field(default_factory=set)  # levers that could not be read (said once)

    def check(self, note: Callable[[str], None] | None = None) -> HaltLever | None:
        """The first pulled lever, or None. A cluster lever that cannot be read is said once (`note`) and skipped."""
        lever = read_host_lever()
        for c in self.clusters:
            for ns in c.namespaces:
                lever = lever or self._read(c.cluster, ns, note)
        return lever

    def _read(self, ref: ClusterRef, namespace: str, note: Callable[[str], None] | None) -> HaltLever | None:
        from kubernetes import client

        where = f"in cluster {ref.context or ref.kubeconfig or 'in-cluster'} namespace {namespace}"
        try:
            if ref not in self._cores:
                from chaoskit.targets.kube import api_client

                self._cores[ref] = client.CoreV1Api(api_client(ref))
            return read_lever(self._cores[ref], namespace, where)
        except Exception as e:  # RBAC, an unreachable API server: the run's own API calls fail and say so
            if where not in self._failing:
                self._failing.add(where)
                (note or log.warning)(f"cannot read the halt lever {where}: {type(e).__name__}: {str(e)[:200]}")
            return None


def refuse_if_halted(levers: Levers, note: Callable[[str], None]) -> None:
    """PreflightError (exit 4) naming who pulled which lever, when and why, if one is pulled."""
    lever = levers.check(note)
    if lever is not None:
        release = "chaoskit halt --release" + (" --cluster" if lever.where.startswith("in cluster") else "")
        raise PreflightError(f"chaoskit is halted {lever.describe()}; no run starts until it is released "
                             f"({release})")



async def watch(runner: Runner, levers: Levers, every: float, note: Callable[[str], None]) -> None:
    """Look at the levers every `every` seconds until the run ends; halt it (Runner.halt) at the first pulled one."""
    while not runner.status.terminal:
        try:
            lever = await asyncio.to_thread(levers.check, note)
        except Exception as e:  # never let a bad look end the watch: the next one may succeed
            log.warning("looking at the halt levers: %s: %s", type(e).__name__, e)
            lever = None
        if lever is not None:
            runner.halt(f"halted: {lever.reason}", lever.describe())
            return
        await asyncio.sleep(every)

@dataclass(frozen=True)
class Cluster:
    """A cluster `chaoskit halt|status --cluster` acts on: its name for messages, its CoreV1Api, the namespace."""

    name: str
    core: Any
    namespace: str


def open_cluster(kubeconfig: str | None, context: str | None, namespace: str) -> Cluster:
    """The cluster of a kubeconfig (default $KUBECONFIG, ~/.kube/config, the pod's service account); PreflightError
    (exit 4) if there is none or it cannot be used."""
    from kubernetes import client

    from chaoskit.targets.kube import api_client

    ref = resolve_cluster(KubeCluster(kubeconfig=kubeconfig, context=context))
    return Cluster(ref.context or ref.kubeconfig or "in-cluster", client.CoreV1Api(api_client(ref)), namespace)


def in_cluster(cluster: Cluster, what: str, call: Callable[[], Any]) -> Any:
    """call(), its API errors (RBAC, unreachable) a PreflightError (exit 4) saying what could not be done where."""
    try:
        return call()
    except PreflightError:
        raise
    except Exception as e:
        raise PreflightError(f"cannot {what} in cluster {cluster.name} namespace {cluster.namespace}: "
                             f"{type(e).__name__}: {str(e)[:300]}") from None
