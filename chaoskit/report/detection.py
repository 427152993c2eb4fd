"""Time to detect and to resolve each fault (MTTD/MTTR), per alert an alert probe expects, from its samples and
the fault windows; and the expected alerts that were active before any fault (noisy rules)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from statistics import mean
from typing import Any

from pydantic import ValidationError

from chaoskit.model.events import Sample
from chaoskit.model.faults import AppliedFault
from chaoskit.probes import probe_class
from chaoskit.probes.alert import ACTIVE, Track
from chaoskit.probes.base import AlertWatch, ProbeSpecBase


@dataclass(frozen=True)
class AlertOutcome:
    """One expected alert over one fault window."""

    probe: str
    alert: str
    fault: int
    step: str
    detect_within: float
    resolve_within: float
    detect_s: float | None  # apply -> the first sample that saw it firing
    resolve_s: float | None  # revert -> the first sample that saw it gone
    detected: str  # detected | late | already firing | missed | not seen
    resolved: str  # resolved | late | not resolved | not seen | not reverted | -

    def text(self) -> str:
        """`ChaosFault (alerts): detected in 2.1s (≤ 30s), resolved in 1s (≤ 120s)`."""
        d = (f"{self.detected} in {self.detect_s:g}s" if self.detect_s is not None and self.detected != "already firing"
             else self.detected) + f" (≤ {self.detect_within:g}s)"
        r = (f"{self.resolved} in {self.resolve_s:g}s" if self.resolve_s is not None else self.resolved)
        return f"{self.alert} ({self.probe}): {d}" + ("" if self.resolved == "-" else
                                                      f", {r} (≤ {self.resolve_within:g}s)")


@dataclass(frozen=True)
class Noisy:
    """An expected alert seen active before any fault was applied."""

    probe: str
    alert: str
    t: float
    state: str


@dataclass(frozen=True)
class Detection:
    outcomes: list[AlertOutcome] = field(default_factory=list)
    noisy: list[Noisy] = field(default_factory=list)

    @property
    def mttd_s(self) -> float | None:
        values = [o.detect_s for o in self.outcomes if o.detected in ("detected", "late") and o.detect_s is not None]
        return round(mean(values), 3) if values else None

    @property
    def mttr_s(self) -> float | None:
        values = [o.resolve_s for o in self.outcomes if o.resolved in ("resolved", "late") and o.resolve_s is not None]
        return round(mean(values), 3) if values else None

    def of_fault(self, fault: int) -> list[AlertOutcome]:
        return [o for o in self.outcomes if o.fault == fault]

    def to_json(self) -> dict[str, Any]:
        return {"mttd_s": self.mttd_s, "mttr_s": self.mttr_s, "alerts": [asdict(o) for o in self.outcomes],
                "noisy": [asdict(n) for n in self.noisy]}


def alert_watches(document: Any) -> list[AlertWatch]:
    """The alerts the experiment's probes (as run) expect the faults to raise: each probe spec's alert_watch (a
    probe of an unknown type, or one that does not read back, is left out)."""
    steady = document.get("steadyState") if isinstance(document, dict) else None
    probes = (steady.get("probes") if isinstance(steady, dict) else None) or []
    out = []
    for p in probes:
        try:
            spec = probe_class(p["type"]).Spec.model_validate(p)
        except (TypeError, LookupError, ValidationError):  # not a probe map, an unknown type, a spec failing now
            continue
        if isinstance(spec, ProbeSpecBase) and (watch := spec.alert_watch()) is not None:
            out.append(watch)
    return out


def readings(samples: list[Sample], probe: str, key: str) -> list[tuple[float, str]]:
    """(when the answer came, pending|firing|inactive) of each sample of `probe` that read the alert."""
    out = []
    for s in samples:
        state = s.values.get(f"state.{key}") if s.probe == probe else None
        if isinstance(state, str):
            out.append((s.t + s.duration_ms / 1000, "inactive" if state == "resolved" else state))
    return sorted(out)


def _outcome(watch: AlertWatch, track: Track, seen: list[tuple[float, str]]) -> AlertOutcome:
    last = seen[-1][0] if seen else 0.0
    if track.before == "firing":
        detected = "already firing"
    elif track.detect_s is not None:
        detected = "detected" if track.detect_s <= track.detect_within else "late"
    else:
        detected = "missed" if last > track.applied_at + track.detect_within else "not seen"
    if track.detect_s is None:
        resolved = "-"
    elif track.resolve_s is not None:
        resolved = "resolved" if track.resolve_s <= track.resolve_within else "late"
    elif track.reverted_at is None:
        resolved = "not reverted"
    else:
        resolved = "not resolved" if last > track.reverted_at + track.resolve_within else "not seen"
    return AlertOutcome(watch.probe, track.alert, track.fault, track.step, track.detect_within, track.resolve_within,
                        track.detect_s, track.resolve_s, detected, resolved)


def detection(document: Any, faults: list[AppliedFault], samples: list[Sample]) -> Detection:
    """Each alert probe's expected alerts against each fault window it watches."""
    first = min((f.applied_at for f in faults if f.applied_at is not None), default=None)
    outcomes, noisy = [], []
    for watch in alert_watches(document):
        windows = [f for f in faults if f.applied_at is not None and (not watch.steps or f.step in watch.steps)]
        for key in watch.alerts:
            seen = readings(samples, watch.probe, key)
            early = next(((t, s) for t, s in seen if s in ACTIVE and (first is None or t < first)), None)
            if early is not None:
                noisy.append(Noisy(watch.probe, key, *early))
            for f in windows:
                assert f.applied_at is not None
                track = Track(key, f.id, f.step, f.applied_at, watch.detect_within, watch.resolve_within,
                              reverted_at=f.reverted_at)
                for t, state in seen:
                    track.read(t, state)
                outcomes.append(_outcome(watch, track, seen))
    return Detection(outcomes, noisy)
