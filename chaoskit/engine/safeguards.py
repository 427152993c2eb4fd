"""Safeguards: when a sample trips one, latency rules that trip as soon as their threshold passes, and how often a
run looks at the halt levers (`chaoskit halt`). Rules compare with fixed numbers (parse_rule refuses `baseline`);
the sample's own tolerances may use it."""

from __future__ import annotations

import asyncio

from chaoskit.engine.steady_state import Baselines, take_sample
from chaoskit.experiment.models import Experiment, Safeguard
from chaoskit.model.enums import Phase, Verdict
from chaoskit.model.events import Sample
from chaoskit.probes import Probe

LATENCY_METRICS = ("latency_ms", "duration_ms")  # what a probe answer's own lateness already decides
HALT_EVERY_S = (0.25, 1.0)  # the halt levers are looked at every safeguard interval, within these bounds


def halt_interval(exp: Experiment) -> float:
    """How often a run looks at the halt levers: its shortest safeguard or `during` interval, at least every
    second (a run without safeguards still stops within one) and at most four times a second (each look at a
    cluster's lever is one API call)."""
    during = exp.steady_state.during
    every = [g.every for g in exp.safeguards if g.every] + ([during.every] if during else [])
    return max(HALT_EVERY_S[0], min([HALT_EVERY_S[1], *every]))


def latency_bound(guards: list[Safeguard]) -> tuple[float, str] | None:
    """(seconds, rule) of the tightest `latency_ms > X` / `duration_ms >= X` rule among the safeguards."""
    bounds = [(rule.tolerance.value / 1000, str(rule)) for g in guards for rule in g.rules()
              if rule.metric in LATENCY_METRICS and rule.tolerance.kind == "cmp" and rule.tolerance.op in (">", ">=")
              and isinstance(rule.tolerance.value, float)]
    return min(bounds) if bounds else None


def tripped(guard: Safeguard, sample: Sample) -> str | None:
    if sample.verdict is Verdict.ERROR:
        return f"{sample.probe}: probe error ({sample.error})" if guard.on_error == "abort" else None
    for rule in guard.rules():
        ok, why = rule.matches(sample.values)
        if ok:
            return f"safeguard {sample.probe}: {why}"
    return None


async def take_guarded(probe: Probe, phase: Phase, guards: list[Safeguard],
                       baselines: Baselines | None = None) -> Sample | str:
    """A sample, or the trip reason of a safeguard latency rule (`latency_ms > 300`) whose threshold passed
    without an answer: the rule is decided then, not when the probe's timeout ends."""
    bound = latency_bound(guards)
    task = asyncio.ensure_future(take_sample(probe, phase, baselines))
    try:
        if bound is not None:
            done, _ = await asyncio.wait({task}, timeout=bound[0])
            if not done:
                return f"safeguard {probe.spec.name}: {bound[1]}: no answer after {bound[0] * 1000:g} ms"
        return await task
    finally:
        if not task.done():
            task.cancel()
