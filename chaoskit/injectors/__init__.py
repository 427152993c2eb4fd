"""Registry of injectors (fault families): the entry points of group `chaoskit.injectors`, keyed by `type`.

Nothing is imported here until asked for, so a helper process that imports a module of this package (llm.proxy's
server) starts without the fault families (pydantic, aiohttp)."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chaoskit.injectors.base import Injector
    from chaoskit.probes.registry import Registry

GROUP = "chaoskit.injectors"


@cache
def _registry() -> Registry[Injector]:
    from chaoskit.injectors.base import Injector
    from chaoskit.probes.registry import Registry

    return Registry(GROUP, Injector)


def _all() -> tuple[type[Injector], ...]:
    """The fault families an experiment may name (internal ledger-only types left out)."""
    return tuple(cls for cls in _registry().all() if not cls.internal)


def injector_class(type_name: str) -> type[Injector]:
    """The class behind a ledger entry's type: an experiment's injectors, or an internal one (KeyError if none)."""
    return _registry().get(type_name)


def __getattr__(name: str) -> object:
    if name == "INJECTORS":
        return _all()
    if name == "Injector":
        from chaoskit.injectors.base import Injector

        return Injector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GROUP", "INJECTORS", "Injector", "injector_class"]  # noqa: F822 (INJECTORS, Injector: __getattr__)
