"""Registry of executors by the name a ledger entry records (`local`, `k8s-helper`)."""

from __future__ import annotations

from chaoskit.executors.base import Executor, Placement, Record, UnknownExecutor

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


def route_of(injector: object) -> tuple[str, Placement]:
    """(executor name, placement) an injector asks for: `local` and none unless it says otherwise."""
    name = getattr(injector, "executor_name", LOCAL)
    placement = getattr(injector, "placement", None)
    return name, placement() if callable(placement) else None


__all__ = ["K8S_HELPER", "LOCAL", "NAMES", "Executor", "Placement", "Record", "UnknownExecutor", "get_executor",
           "route_of"]
