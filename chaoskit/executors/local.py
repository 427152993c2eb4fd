"""The local executor: the injector's own code in this process (every fault before Kubernetes)."""

from __future__ import annotations

from typing import Any, ClassVar

from chaoskit.executors.base import Placement, Record
from chaoskit.injectors import Injector, injector_class


class LocalExecutor:
    name: ClassVar[str] = "local"

    def preflight(self, injector: Injector) -> None:
        injector.preflight()

    def plan(self, injector: Injector) -> list[str]:
        return injector.plan()

    def prepare(self, injector: Injector) -> Record:
        return injector.prepare()

    def apply(self, injector: Injector, record: Record, placement: Placement) -> Record:
        return injector.apply(record)

    def revert(self, type_name: str, record: Record, placement: Placement) -> None:
        injector_class(type_name).revert(record)

    def observe(self, type_name: str, record: Record, placement: Placement) -> bool:
        return bool(injector_class(type_name).observe(record))

    def observe_details(self, type_name: str, record: Record, placement: Placement) -> dict[str, Any]:
        return injector_class(type_name).observe_details(record)
