"""Classes registered through an entry-point group (chaoskit.probes, chaoskit.injectors), by their `type`."""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(LookupError):
    """An entry point that does not name a class of its group, or names it under another type."""


class Registry(Generic[T]):
    """The classes of one entry-point group: name = the class's `type`, value = `module:Class`. Each is imported
    when first asked for (a revert in a fresh process imports its own fault family only); the bundled ones are
    registered by chaoskit's own pyproject.toml like any other package's."""

    def __init__(self, group: str, base: type[T]):
        self.group, self.base = group, base
        self.named = cache(self._named)
        self.get = cache(self._get)

    def _named(self) -> dict[str, EntryPoint]:
        """Every entry point of the group by name: chaoskit's own first, in its pyproject's order, then those of
        other packages in the order of the import path."""
        found: dict[str, EntryPoint] = {}
        for ep in sorted(entry_points(group=self.group), key=lambda ep: _package(ep) != "chaoskit"):
            other = found.setdefault(ep.name, ep)
            if other.value != ep.value:
                raise RegistryError(f"entry point group {self.group}: '{ep.name}' is registered twice "
                                    f"({other.value} and {ep.value})")
        if not found:
            raise RegistryError(f"entry point group {self.group} is empty: chaoskit is not installed "
                                "(pip install -e . in a checkout)")
        return found

    def _get(self, type_name: str) -> type[T]:
        ep = self.named().get(type_name)
        if ep is None:
            raise KeyError(type_name)
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise RegistryError(f"entry point {self.group} '{type_name}' = {ep.value}: not a {self.base.__name__}")
        if getattr(cls, "type", None) != type_name:
            raise RegistryError(f"entry point {self.group} '{type_name}' = {ep.value}: its type is "
                                f"{getattr(cls, 'type', None)!r}, not {type_name!r}")
        return cls

    def all(self) -> tuple[type[T], ...]:
        """Every registered class, chaoskit's own first."""
        return tuple(self.get(name) for name in self.named())


def _package(ep: EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else None
