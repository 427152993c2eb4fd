"""Continuous probes: samples report consecutive stretches of one running measurement, cut where a fault ends."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Continuous(ABC):
    """Mixed into a Probe whose samples each report what one running measurement (a continuous slo load)
    completed since the previous sample. When a span with a fault in effect ends, the runner cuts the
    measurement there, before the revert (`cut`), then takes one final sample of what the periodic samples left
    (`end_phase`), so the span's last partial window is judged too. With `over_phase` the periodic samples of
    the span are interim and the final sample judges the whole span at once."""

    @property
    @abstractmethod
    def is_continuous(self) -> bool:
        """Whether this instance measures continuously (an slo probe only in mode continuous)."""

    @property
    def over_phase(self) -> bool:
        """Judged once over the whole span (`over: phase`) rather than per sample."""
        return False

    @property
    @abstractmethod
    def loads_started(self) -> int:
        """Loads started so far: a sample during which this changed reports a load started after a cut."""

    @abstractmethod
    def begin_phase(self) -> None:
        """The span's first judged sample is about to be taken: what it and later samples report belongs to it."""

    @abstractmethod
    async def cut(self, stop: bool) -> None:
        """Cut the measurement now (stop: and send nothing more: the probe's last phase has ended)."""

    @abstractmethod
    async def end_phase(self) -> dict[str, Any]:
        """The final sample's values: what the cut left (over_phase: the whole span's). After a stopping cut
        this first waits for the requests still in flight."""
