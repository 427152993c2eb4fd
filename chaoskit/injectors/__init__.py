"""Registry of injectors (fault families), keyed by their `type` string."""

from __future__ import annotations

from functools import cache

from chaoskit.injectors.base import Injector


@cache
def _all() -> tuple[type[Injector], ...]:
    from chaoskit.injectors.cpu import CpuStress, CpuThrottle
    from chaoskit.injectors.disk import DiskThrottle
    from chaoskit.injectors.diskfill import DiskFill
    from chaoskit.injectors.exec import Exec
    from chaoskit.injectors.firewall import Drop, Partition
    from chaoskit.injectors.flood import Flood
    from chaoskit.injectors.gpu import GpuMemoryPressure
    from chaoskit.injectors.kube import DeploymentScale, PodDelete, PodKill
    from chaoskit.injectors.llm_proxy import LlmProxy
    from chaoskit.injectors.memlimit import MemoryLimit
    from chaoskit.injectors.memory import MemoryPressure
    from chaoskit.injectors.mig import MigReconfigure
    from chaoskit.injectors.network import Bandwidth, Netem
    from chaoskit.injectors.process import ProcessSignal
    from chaoskit.injectors.proxy import Proxy
    from chaoskit.injectors.xid import XidEvent

    return (
        ProcessSignal, MemoryPressure, DiskThrottle, DiskFill, Netem, Bandwidth, Drop, Partition, Proxy,
        GpuMemoryPressure, XidEvent, MigReconfigure, CpuThrottle, CpuStress, Flood, MemoryLimit, LlmProxy, PodDelete,
        PodKill, DeploymentScale, Exec,
    )


def __getattr__(name: str) -> object:
    """INJECTORS is imported on first use, so a helper process run from this package (`python -m
    chaoskit.injectors.proxy_server`) does not import every fault family first (1.3 s, aiohttp, pydantic)."""
    if name == "INJECTORS":
        return _all()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def injector_class(type_name: str) -> type[Injector]:
    """The class behind a ledger entry's type: an experiment's injectors, or an internal one."""
    from chaoskit.injectors.reference import ReferenceDeployment, ReferenceGateway

    for cls in (*_all(), ReferenceDeployment, ReferenceGateway):
        if cls.type == type_name:
            return cls
    raise KeyError(type_name)


__all__ = ["INJECTORS", "Injector", "injector_class"]  # noqa: F822 (INJECTORS comes from __getattr__)
