"""Arrival schedules: the intended send offsets (seconds from start) of an open-loop run."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from chaoskit.errors import ChaoskitError

if TYPE_CHECKING:
    from chaoskit.load.spec import LoadSpec


def offsets(arrival: str, rate: float, duration: float, seed: int = 0, burstiness: float = 1.0,
            ramp_to: float | None = None, trace: str | None = None) -> list[float]:
    return list(iter_offsets(arrival, rate, duration, seed, burstiness, ramp_to, trace))


def schedule(spec: LoadSpec, duration: float) -> Iterator[float]:
    """The intended send offsets of a load spec's schedule, up to `duration` (inf: open-ended; a ramp still takes
    spec.duration, then holds ramp_to)."""
    return iter_offsets(spec.arrival, spec.rate, duration, spec.seed, spec.burstiness, spec.ramp_to, spec.trace,
                        ramp_s=spec.duration)


class ScheduleClock:
    """How many sends the schedule held before a time (seconds from its start), counted incrementally: asked
    for increasing times, it walks the schedule once, so an open-ended run's windows cost what they hold."""

    def __init__(self, offsets: Iterator[float]):
        self._offsets = offsets
        self._next: float | None = next(self._offsets, None)
        self._seen = 0

    def due_before(self, t: float) -> int:
        """Sends due in [previous t, t)."""
        start = self._seen
        while self._next is not None and self._next < t:
            self._seen += 1
            self._next = next(self._offsets, None)
        return self._seen - start


def iter_offsets(arrival: str, rate: float, duration: float, seed: int = 0, burstiness: float = 1.0,
                 ramp_to: float | None = None, trace: str | None = None,
                 ramp_s: float | None = None) -> Iterator[float]:
    """constant: every 1/rate; poisson: exponential gaps; gamma: gaps with squared CV = burstiness
    (1 = Poisson, > 1 burstier); ramp: rate grows linearly to ramp_to over ramp_s (default: duration), then
    holds; replay: offsets from a file. Lazy, so an open-ended (continuous) run costs no memory."""
    ramp_s = duration if ramp_s is None else ramp_s
    rng = random.Random(seed)
    if arrival == "replay":
        yield from _replay(trace, duration)
        return
    n = 0
    t = 0.0
    while True:
        if arrival == "constant":
            t = n / rate
        elif arrival == "poisson":
            t += rng.expovariate(rate)
        elif arrival == "gamma":
            shape = 1.0 / burstiness
            t += rng.gammavariate(shape, 1.0 / (rate * shape))
        elif arrival == "ramp":
            end = ramp_to if ramp_to is not None else rate
            now = rate + (end - rate) * min(1.0, t / ramp_s)
            t += 1.0 / max(now, 1e-9)
        else:
            raise ChaoskitError(f"unknown arrival {arrival!r}: constant, poisson, gamma, ramp or replay")
        if t >= duration:
            return
        n += 1
        yield t


def _replay(trace: str | None, duration: float) -> list[float]:
    """A trace file: one offset (seconds) per line, or JSON lines with "t" (seconds) or "timestamp"."""
    if not trace:
        raise ChaoskitError("arrival replay needs a trace file")
    try:
        lines = Path(trace).read_text().splitlines()
    except OSError as e:
        raise ChaoskitError(f"trace {trace}: {e.strerror}") from None
    times = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            times.append(float(json.loads(line)["t"] if line.startswith("{") else line))
        except (ValueError, KeyError, TypeError):
            raise ChaoskitError(f"{trace}:{n}: expected a number of seconds or {{\"t\": seconds}}") from None
    if not times:
        raise ChaoskitError(f"{trace}: no arrivals")
    base = min(times)
    return sorted(t - base for t in times if t - base < duration)
