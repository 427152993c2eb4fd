"""Registry of executors by the name a ledger entry records (`local`, `k8s-helper`)."""

from __future__ import annotations

from chaoskit.executors.base import Executor, Placement, Record, UnknownExecutor
from chaoskit.injectors.base import Injector

LOCAL = "local"
K8S_HELPER = "k8s-helper"
NAMES = (LOCAL, K8S_HELPER)


def get_executor(name: str) -> Executor:
    """The executor a ledger entry names; UnknownExecutor for any other name. The Kubernetes one is imported
    only when asked for (the client is heavy and local runs never need it)."""
    if name == LOCAL:
        from chaoskit.executors.local import LocalExecutor

        return LocalExecutor()
    if name == K8S_HELPER:
        from chaoskit.executors.k8s_helper import K8sHelperExecutor

        return K8sHelperExecutor()
    raise UnknownExecutor(f"unknown executor '{name}' (known: {', '.join(NAMES)}; ledger written by a newer "
                          "chaoskit?)")


def route_of(injector: Injector) -> tuple[str, Placement]:
    """(executor name, placement) of a fault: what the target layer put in its context (`local` unless a
    node-level fault targets Kubernetes pods); a Kubernetes API fault (pod.delete) names its pods itself."""
    placement = injector.placement()
    return injector.ctx.executor, placement.to_json() if placement is not None else None


__all__ = ["K8S_HELPER", "LOCAL", "NAMES", "Executor", "Placement", "Record", "UnknownExecutor", "get_executor",
           "route_of"]
