"""The local executor: the injector's own code in this process (every fault before Kubernetes). The ledger's plain
JSON record becomes the family's typed Record here (from_ledger), and the Record JSON again (to_ledger)."""

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
        return type(injector).to_ledger(injector.prepare())

    def apply(self, injector: Injector, record: Record, placement: Placement) -> Record:
        cls = type(injector)
        return cls.to_ledger(injector.apply(cls.from_ledger(record)))

    def revert(self, type_name: str, record: Record, placement: Placement) -> None:
        cls = injector_class(type_name)
        cls.revert(cls.from_ledger(record))

    def observe(self, type_name: str, record: Record, placement: Placement) -> bool:
        cls = injector_class(type_name)
        return bool(cls.observe(cls.from_ledger(record)))

    def observe_details(self, type_name: str, record: Record, placement: Placement) -> dict[str, Any]:
        cls = injector_class(type_name)
        return cls.observe_details(cls.from_ledger(record))
