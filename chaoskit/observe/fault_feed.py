"""Hands each fault's apply and revert, as the journal gets them, to the probes that judge fault windows."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from chaoskit.model.events import Event, FaultApplied, FaultReverted
from chaoskit.probes.base import Probe


class FaultFeed:
    """A Journal sink: `probes()` gives the run's probe instances (they exist once its preflight ran)."""

    def __init__(self, probes: Callable[[], Iterable[object]]):
        self.probes = probes

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, (FaultApplied, FaultReverted)):
            for probe in self.probes():
                if isinstance(probe, Probe):
                    probe.note_fault(ev)
