"""Take one sample of a probe (with its timeout) and judge it against the probe's tolerances; the values of
the before phase are kept as the baselines that tolerances like `< 3x baseline` compare with later."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from chaoskit.model.enums import Phase, Verdict
from chaoskit.model.events import Sample
from chaoskit.model.tolerance import Tolerance
from chaoskit.probes.base import Probe


class Baselines:
    """Each probe's measured values in the before phase of a run: what `baseline` means in its tolerances."""

    def __init__(self) -> None:
        self._values: dict[str, dict[str, Any]] = {}
        self._errors: dict[str, str] = {}

    def record(self, probe: str, values: dict[str, Any] | None, error: str | None = None) -> None:
        if values is None:
            self._errors[probe] = error or "no values"
        else:
            self._values[probe] = dict(values)

    def get(self, probe: str, key: str) -> tuple[float | None, str]:
        """(the before value of probe's key, "") or (None, why there is none)."""
        if probe in self._errors:
            return None, f"no baseline: the before sample of {probe} was an error ({self._errors[probe]})"
        if probe not in self._values:
            return None, f"no baseline: {probe} was not sampled in the before phase"
        if key not in self._values[probe]:
            return None, f"no baseline: {key} was not measured in the before phase"
        value = _number(self._values[probe][key])
        if value is None:
            return None, f"no baseline: {key} was {self._values[probe][key]!r} in the before phase, not a number"
        return value, ""


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        f = float(v)
    except ValueError:
        return None
    return None if math.isnan(f) else f


def _judge(tol: Tolerance, value: Any, phase: Phase, probe: str, key: str,
           baselines: Baselines | None) -> tuple[bool, str]:
    if not tol.relative:
        return tol.check(value)
    if phase == Phase.BEFORE:  # the baseline itself: comparing it with itself says nothing
        num = _number(value)
        if num is None:
            return False, f"{value!r} is not a number: no baseline for '{tol}'"
        return True, f"{num:g} baseline measured (later samples: {tol}, {tol.value.resolve(num)[1]})"
    base, why = (baselines.get(probe, key) if baselines is not None
                 else (None, f"no baseline: {probe} was not sampled in the before phase"))
    if base is None:
        return False, f"{value!r} {tol}: {why}"
    return tol.check(value, base)


async def take_sample(probe: Probe, phase: Phase, baselines: Baselines | None = None,
                      measure: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> Sample:
    """Never raises (except cancellation): exceptions and timeouts become `error` samples. A before sample is
    recorded into `baselines`; later samples judge baseline tolerances against it. `measure` (default
    probe.measure) is what takes the values, e.g. a continuous probe's final sample of a span."""
    spec = probe.spec
    t, t0 = time.time(), time.perf_counter()
    try:
        # asyncio.timeout, not wait_for: 3.11's wait_for returns an answer that lands in the same tick as a
        # cancel and drops the cancel, so a stopped sampler went on sampling and the run never ended
        async with asyncio.timeout(spec.timeout):
            values = await (measure or probe.measure)()
    except TimeoutError:
        error = f"timed out after {spec.timeout:g}s"
    except asyncio.CancelledError:
        raise
    except Exception as e:
        error = f"{type(e).__name__}: {e}".strip()
    else:
        error = None
    if phase == Phase.BEFORE and baselines is not None:
        baselines.record(spec.name, None if error else values, error)
    if error is not None:
        return Sample(t=t, probe=spec.name, phase=phase, verdict=Verdict.ERROR, error=error, duration_ms=_ms(t0))
    judged: list[tuple[bool, str]] = []
    for key, tol in spec.flat_expect().items():
        if key not in values:
            judged.append((False, f"{key}: {probe.missing(key, values)}"))
            continue
        passed, why = _judge(tol, values[key], phase, spec.name, key, baselines)
        judged.append((passed, f"{key}: {why}"))
    ok = all(passed for passed, _ in judged)
    details = [text for passed, text in judged if not passed] + [text for passed, text in judged if passed]
    kept = {k: (v[:200] if isinstance(v, str) else v) for k, v in values.items()}  # failing clauses first
    return Sample(t=t, probe=spec.name, phase=phase, verdict=Verdict.OK if ok else Verdict.FAIL, values=kept,
                  details=details, duration_ms=_ms(t0))


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
