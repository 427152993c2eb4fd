"""A fault as a run applied it: when it was applied and reverted, what observe() saw, and which of its target
processes exited while it was in effect (the engine keeps it up to date; the report rebuilds it from events)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaoskit.model.events import FaultApplied, TargetExited


@dataclass
class AppliedFault:
    id: int
    step: str
    type: str
    duration_s: float | None = None
    applied_at: float | None = None
    reverted_at: float | None = None
    apply_ms: float | None = None
    observed: dict[str, Any] = field(default_factory=dict)  # when (applied, before_revert) -> observe() details
    revert_error: str | None = None
    exits: list[TargetExited] = field(default_factory=list)  # target processes that exited while it was in effect

    @classmethod
    def from_event(cls, ev: FaultApplied) -> AppliedFault:
        return cls(ev.id, ev.step, ev.type, ev.duration_s, ev.applied_at or ev.t, None, ev.apply_ms)

    def applied_event(self, executor: str | None = None, placement: Any = None) -> FaultApplied:
        return FaultApplied(id=self.id, step=self.step, type=self.type, duration_s=self.duration_s,
                            applied_at=self.applied_at, reverted_at=self.reverted_at, apply_ms=self.apply_ms,
                            executor=executor if placement is not None else None, placement=placement)

    def to_json(self) -> dict[str, Any]:
        """As summary.json lists it."""
        out: dict[str, Any] = {"id": self.id, "step": self.step, "type": self.type, "duration_s": self.duration_s,
                               "applied_at": self.applied_at, "reverted_at": self.reverted_at,
                               "apply_ms": self.apply_ms}
        out.update({f"observed_{when}": details for when, details in self.observed.items()})
        if self.exits:
            out["exited"] = [e.fields() for e in self.exits]
        if self.revert_error is not None:
            out["revert_error"] = self.revert_error
        return out
