"""Registry of probes (steady-state measurements): the entry points of group `chaoskit.probes`, keyed by `type`."""

from __future__ import annotations

from functools import cache

from chaoskit.probes.base import Probe
from chaoskit.probes.registry import Registry

GROUP = "chaoskit.probes"


@cache
def _registry() -> Registry[Probe]:
    return Registry(GROUP, Probe)


def probe_class(type_name: str) -> type[Probe]:
    """The probe class of a type (KeyError if none is registered)."""
    return _registry().get(type_name)


def __getattr__(name: str) -> object:
    if name == "PROBES":
        return _registry().all()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GROUP", "PROBES", "Probe", "probe_class"]  # noqa: F822 (PROBES comes from __getattr__)
