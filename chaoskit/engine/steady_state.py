"""Take one sample of a probe (with its timeout) and judge it against the probe's tolerances; the values of
the before phase are kept as the baselines that tolerances like `< 3x baseline` compare with later."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from chaoskit.model.enums import Phase, Verdict
from chaoskit.model.events import Judgement, Sample
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
           baselines: Baselines | None) -> Judgement:
    """The judgement of one key: the outcome with the number the value was compared with (a baseline resolved)."""
    shown = value[:200] if isinstance(value, str) else value
    made = {"key": key, "rule": str(tol), "value": shown}
    if not tol.relative:
        ok, why = tol.check(value)
        return Judgement(**made, **_fixed_bounds(tol), outcome="ok" if ok else "fail", why=why)
    num = _number(value)
    if phase == Phase.BEFORE:  # the baseline itself: comparing it with itself says nothing
        if num is None:
            return Judgement(**made, outcome="fail", why=f"{value!r} is not a number: no baseline for '{tol}'")
        return Judgement(**made, baseline=num, outcome="ok",
                         why=f"{num:g} baseline measured (later samples: {tol}, {tol.value.resolve(num)[1]})")
    base, missing = (baselines.get(probe, key) if baselines is not None
                     else (None, f"no baseline: {probe} was not sampled in the before phase"))
    if base is None:
        return Judgement(**made, outcome="fail", why=f"{value!r} {tol}: {missing}")
    ok, why = tol.check(value, base)
    return Judgement(**made, threshold=tol.value.resolve(base)[0], baseline=base, outcome="ok" if ok else "fail",
                     why=why)


def _fixed_bounds(tol: Tolerance) -> dict[str, float]:
    """The fixed numbers a rule compares with: a comparison's number, a range's bounds (none for a pattern)."""
    if tol.kind == "range":
        return {"low": tol.low, "high": tol.high}
    if tol.kind in ("cmp", "eq") and isinstance(tol.value, (int, float)) and not isinstance(tol.value, bool):
        return {"threshold": float(tol.value)}
    return {}


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
    judged = [_judge(tol, values[key], phase, spec.name, key, baselines) if key in values
              else Judgement(key=key, rule=str(tol), outcome="fail", why=probe.missing(key, values))
              for key, tol in spec.flat_expect().items()]
    ok = all(j.ok for j in judged)
    # the same judgements in words (failing ones first), for readers of journals that predate `judgements`
    details = [f"{j.key}: {j.why}" for j in judged if not j.ok] + [f"{j.key}: {j.why}" for j in judged if j.ok]
    kept = {k: (v[:200] if isinstance(v, str) else v) for k, v in values.items()}
    return Sample(t=t, probe=spec.name, phase=phase, verdict=Verdict.OK if ok else Verdict.FAIL, values=kept,
                  details=details, duration_ms=_ms(t0), judgements=judged)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
