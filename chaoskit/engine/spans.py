"""The continuous probes judged in the current span of faults in effect: begun at their first judged sample,
cut where the span ends (before its revert) so each one's final sample ends there, stopped at the end of their
last phase."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from chaoskit.engine.steady_state import Baselines, take_sample
from chaoskit.model.enums import Phase, Verdict
from chaoskit.model.events import Sample
from chaoskit.probes.base import Probe
from chaoskit.probes.continuous import Continuous


@dataclass(frozen=True)
class Cut:
    """A continuous probe cut at the end of a span; `error`: why the cut failed (its final sample is that)."""

    probe: Probe
    continuous: Continuous  # the same probe: what cuts and ends its measurement
    error: str | None


@dataclass
class Spans:
    open: dict[str, tuple[Probe, Continuous]] = field(default_factory=dict)  # judged in the current span
    finished: set[str] = field(default_factory=set)  # their last phase has ended (their load stopped)

    def begin(self, probe: Probe, continuous: Continuous) -> None:
        """What this sample and the later ones of `probe` report is the span's."""
        if probe.spec.name not in self.open:
            self.open[probe.spec.name] = (probe, continuous)
            continuous.begin_phase()

    async def cut(self, stop_last: bool, sampled_after: set[str]) -> list[Cut]:
        """The span ends, before its revert: cut each probe judged in it there (each answers within ms). With
        stop_last (the method's last fault has ended), a probe not in `sampled_after` also stops sending."""
        spans = sorted(self.open.items())
        self.open.clear()
        stops = [stop_last and name not in sampled_after for name, _ in spans]
        self.finished.update(name for (name, _), stop in zip(spans, stops, strict=True) if stop)
        cuts = await asyncio.gather(*(c.cut(stop) for (_, (_, c)), stop in zip(spans, stops, strict=True)),
                                    return_exceptions=True)
        out: list[Cut] = []
        for (_, (p, c)), cut in zip(spans, cuts, strict=True):
            if isinstance(cut, asyncio.CancelledError):
                raise cut
            out.append(Cut(p, c, f"the final sample could not be cut: {type(cut).__name__}: {cut}"
                           if isinstance(cut, BaseException) else None))
        return out


async def final_samples(cuts: list[Cut], baselines: Baselines) -> list[Sample]:
    """Each cut probe's final sample of the span (the last partial window; over: phase, the whole span)."""
    async def one(cut: Cut) -> Sample:
        if cut.error is not None:
            return Sample(probe=cut.probe.spec.name, phase=Phase.DURING, verdict=Verdict.ERROR, t=time.time(),
                          error=cut.error)
        return await take_sample(cut.probe, Phase.DURING, baselines, measure=cut.continuous.end_phase)

    return list(await asyncio.gather(*(one(c) for c in cuts)))
