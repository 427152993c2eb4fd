"""The executor contract: where an injector's verbs run (this host, a helper pod on a Kubernetes node)."""

from __future__ import annotations

from typing import Any, Protocol

from chaoskit.injectors.base import Injector

Record = dict[str, Any]
Placement = dict[str, Any] | None  # plain JSON from the target layer, written into the ledger entry


class UnknownExecutor(LookupError):
    """A ledger entry names an executor this chaoskit does not have (written by a newer version?)."""


class Executor(Protocol):
    """Runs the verbs of one fault at its placement (injector.ctx.placement for preflight / plan / prepare).
    `revert` and `observe` work from the ledger entry alone (type, record, placement), in a fresh process."""

    name: str

    def preflight(self, injector: Injector) -> None: ...

    def plan(self, injector: Injector) -> list[str]: ...

    def prepare(self, injector: Injector) -> Record: ...

    def apply(self, injector: Injector, record: Record, placement: Placement) -> Record: ...

    def revert(self, type_name: str, record: Record, placement: Placement) -> None: ...

    def observe(self, type_name: str, record: Record, placement: Placement) -> bool: ...

    def observe_details(self, type_name: str, record: Record, placement: Placement) -> dict[str, Any]: ...
